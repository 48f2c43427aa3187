"""The shard store: a window's rerank state is one packed record per stored dtype, read back by position exactly as
written, for any rows in any order, and damaged or replaced files are refused with the shard named."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import tvr.search.store as store
from tvr.search.layout import SETTINGS, read_settings
from tvr.search.store import IndexFormatError, ShardReader, gather_state, write_shard
from tvr.types import Sliceable


@dataclasses.dataclass
class MixedState(Sliceable):
    frames: torch.Tensor  # [n, 3, 5] float
    scalar: torch.Tensor  # [n] float
    mask: torch.Tensor  # [n, 3] bool
    count: torch.Tensor  # [n, 2] int64
    absent: torch.Tensor | None = None


def _state(n: int, seed: int) -> MixedState:
    g = torch.Generator().manual_seed(seed)
    return MixedState(
        frames=torch.randn(n, 3, 5, generator=g),
        scalar=torch.randn(n, generator=g),
        mask=torch.rand(n, 3, generator=g) > 0.5,
        count=torch.randint(0, 1000, (n, 2), generator=g),
    )


def _shards(tmp_path: Path, sizes: list[int], half: bool = False) -> tuple[list[ShardReader], list[MixedState]]:
    states, readers = [], []
    for k, n in enumerate(sizes):
        state = _state(n, seed=k)
        path = write_shard(tmp_path, f"s{k}", torch.randn(n, 4), state, [], half=half)
        states.append(state)
        readers.append(ShardReader(path))
    return readers, states


def _expected(states: list[MixedState], shards: np.ndarray, rows: np.ndarray, half: bool) -> MixedState:
    parts = [states[s][torch.tensor([r])] for s, r in zip(shards.tolist(), rows.tolist(), strict=True)]
    out = MixedState.cat(parts)
    if half:
        out = dataclasses.replace(out, frames=out.frames.half(), scalar=out.scalar.half())
    return out


@pytest.mark.parametrize("half", [False, True])
def test_any_rows_in_any_order_come_back_exactly(tmp_path: Path, half: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    readers, states = _shards(tmp_path, [7, 1, 12], half=half)
    assert sorted(p.name for p in (tmp_path / "s0").iterdir()) == ["emb.npy", "meta.json", "state.npy"]
    meta = readers[0].meta
    # one aligned record per window: int64 counts, then the floats, then the uint8 mask
    assert meta["record_bytes"] == -(-(2 * 8 + 16 * (2 if half else 4) + 3) // 8) * 8
    assert [meta["fields"][k]["offset"] for k in ("count", "frames", "scalar")] == [0, 16, 16 + 15 * (2 if half else 4)]
    shards = np.array([2, 0, 2, 2, 1, 0, 2, 0])
    rows = np.array([11, 6, 0, 0, 0, 3, 5, 4])  # unsorted, a repeated row, runs and gaps
    got = gather_state(readers, shards, rows, MixedState)
    want = _expected(states, shards, rows, half)
    for f in ("frames", "scalar", "mask", "count"):
        a, b = getattr(got, f), getattr(want, f)
        assert a.dtype == b.dtype and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert got.absent is None
    # floating fields cast on the way out; masks and counts keep their dtype
    wide = gather_state(readers, shards, rows, MixedState, torch.float32)
    assert wide.frames.dtype == torch.float32 and wide.mask.dtype == torch.bool and wide.count.dtype == torch.int64
    torch.testing.assert_close(wide.frames, want.frames.float(), rtol=0, atol=0)
    # small fields are widened by numpy, large ones by torch: the same bits either way, in every dtype
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        by_numpy = gather_state(readers, shards, rows, MixedState, dtype)
        monkeypatch.setattr(store, "_NUMPY_CAST_ITEMS", 0)
        by_torch = gather_state(readers, shards, rows, MixedState, dtype)
        monkeypatch.undo()
        for f in ("frames", "scalar"):
            a, b = getattr(by_numpy, f), getattr(by_torch, f)
            assert a.dtype == b.dtype == dtype and a.is_contiguous() and b.is_contiguous()
            assert torch.equal(a, getattr(want, f).to(dtype)) and torch.equal(b, a)
    # no rows: empty fields of the right shapes
    empty = gather_state(readers, np.zeros(0, np.int64), np.zeros(0, np.int64), MixedState)
    assert empty.frames.shape == (0, 3, 5) and empty.mask.shape == (0, 3)


def test_one_read_per_run_of_consecutive_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readers, states = _shards(tmp_path, [50])
    calls = []
    real = os.preadv

    def counting(fd: int, buffers: list, offset: int) -> int:
        calls.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(store.os, "preadv", counting, raising=False)
    monkeypatch.setattr(store, "_PREADV", True)
    whole = readers[0].state(np.arange(50), MixedState)
    torch.testing.assert_close(whole.frames, states[0].frames, rtol=0, atol=0)
    assert len(calls) == 1  # the whole shard in one read
    calls.clear()
    got = readers[0].state(np.array([40, 3, 4, 5, 20, 21]), MixedState)
    assert len(calls) == 3  # three runs of consecutive rows
    torch.testing.assert_close(got.count, states[0].count[[40, 3, 4, 5, 20, 21]], rtol=0, atol=0)


def test_without_positional_reads_and_with_few_open_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_PREADV", False)  # the seek + read fallback
    monkeypatch.setattr(store._FILES, "limit", 2)
    readers, states = _shards(tmp_path, [4, 5, 6, 3])
    shards = np.array([3, 0, 1, 2, 1, 0, 3, 2])
    rows = np.array([2, 1, 4, 5, 0, 3, 0, 0])
    for _ in range(3):
        got = gather_state(readers, shards, rows, MixedState)
        torch.testing.assert_close(got.frames, _expected(states, shards, rows, False).frames, rtol=0, atol=0)
        assert len(store._FILES._files) <= 2


def test_a_reader_gone_closes_its_file(tmp_path: Path) -> None:
    readers, _ = _shards(tmp_path, [3])
    state_file = readers[0].state_file
    assert store._FILES.holds(state_file)
    handle = store._FILES.get(state_file)
    del readers, state_file
    gc.collect()
    assert handle.closed


def test_rows_outside_a_shard_are_refused(tmp_path: Path) -> None:
    readers, _ = _shards(tmp_path, [4])
    with pytest.raises(IndexError, match="has 4"):
        gather_state(readers, np.array([0]), np.array([4]), MixedState)


def test_a_truncated_state_file_names_the_shard(tmp_path: Path) -> None:
    _shards(tmp_path, [6])
    path = tmp_path / "s0" / "state.npy"
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 8)
    with pytest.raises(IndexFormatError, match=r"s0.*truncated.*re-embed"):
        ShardReader(tmp_path / "s0")


def test_a_state_file_of_another_dtype_or_an_object_array_is_refused(tmp_path: Path) -> None:
    _shards(tmp_path, [3])
    path = tmp_path / "s0" / "state.npy"
    record = json.loads((tmp_path / "s0" / "meta.json").read_text())["record_bytes"]
    np.save(path, np.zeros((3, record // 8), dtype=np.float64))
    with pytest.raises(IndexFormatError, match="the shard says uint8"):
        ShardReader(tmp_path / "s0")
    np.save(path, np.array([[None] * record] * 3, dtype=object), allow_pickle=True)
    with pytest.raises(IndexFormatError, match="object"):
        ShardReader(tmp_path / "s0")
    np.save(path, np.zeros((3, record - 8), dtype=np.uint8))
    with pytest.raises(IndexFormatError, match=rf"\(3, {record - 8}\), the shard says uint8 \(3, {record}\)"):
        ShardReader(tmp_path / "s0")


def test_a_file_replaced_after_opening_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store._FILES, "limit", 1)  # one handle open at a time: a read reopens the file
    readers, _ = _shards(tmp_path, [5, 2])
    path = tmp_path / "s0" / "state.npy"
    assert not store._FILES.holds(readers[0].state_file)
    replacement = tmp_path / "other.npy"
    np.save(replacement, np.zeros((5, readers[0].record), dtype=np.uint8))
    os.replace(replacement, path)
    with pytest.raises(IndexFormatError, match="changed since the index was opened"):
        readers[0].state(np.arange(5), MixedState)


def test_a_field_layout_of_an_older_format_is_refused(tmp_path: Path) -> None:
    _shards(tmp_path, [2])
    meta_path = tmp_path / "s0" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["record_bytes"]  # version 1: one file per field
    for info in meta["fields"].values():
        if info is not None:
            del info["offset"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="older format"):
        ShardReader(tmp_path / "s0")


def test_an_index_of_format_version_1_asks_for_a_rebuild(tmp_path: Path) -> None:
    (tmp_path / SETTINGS).write_text(json.dumps({"format": "tvr-search-index", "version": 1}))
    with pytest.raises(IndexFormatError, match="version 1, this tvr reads version 2: build the index again"):
        read_settings(tmp_path)


def test_a_field_described_as_objects_or_of_another_shape_is_refused(tmp_path: Path) -> None:
    """A field's dtype comes from meta.json: "object" would make the state's bytes pointers."""
    _shards(tmp_path, [3])
    meta_path = tmp_path / "s0" / "meta.json"
    pristine = json.loads(meta_path.read_text())
    for field, change in (
        ("count", {"dtype": "object"}),
        ("count", {"dtype": "<U2"}),
        ("frames", {"shape": [4, 3, 5]}),
        ("frames", {"shape": [3, -3, 5]}),
        ("frames", {"shape": "3x3x5"}),
    ):
        meta = json.loads(json.dumps(pristine))
        meta["fields"][field].update(change)
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(IndexFormatError, match="not described as this tvr stores it"):
            ShardReader(tmp_path / "s0")
    meta = json.loads(json.dumps(pristine))
    meta["rows"] = "3"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="rows is '3'; expected a count"):
        ShardReader(tmp_path / "s0")


def test_a_state_class_with_other_fields_is_refused_when_the_index_opens(tmp_path: Path) -> None:
    """Another head's state class (an imported Sliceable dataclass with other fields) is refused by name and fields,
    not accepted and then failing in the first query."""

    @dataclasses.dataclass
    class OtherState(Sliceable):
        emb: torch.Tensor

    readers, _ = _shards(tmp_path, [2])
    name = readers[0].meta["state_class"]
    assert store.state_class(name, readers[0].fields) is MixedState
    module = __name__
    globals()["OtherState"] = OtherState
    try:
        with pytest.raises(
            IndexFormatError, match=r"with the fields \['absent', 'count', 'frames', 'mask', 'scalar'\]"
        ):
            store.state_class(f"{module}:OtherState", readers[0].fields)
    finally:
        del globals()["OtherState"]


@pytest.mark.parametrize(
    ("written", "cls_path"),
    [
        ("tvr.models.heads.gare.scoring:GareRerankState", "tvr.methods.gare.scoring:GareRerankState"),
        ("tvr.models.heads.proxy.scoring:ProxyRerankState", "tvr.methods.proxy.scoring:ProxyRerankState"),
        ("tvr.models.heads.gravialign.head:GraviState", "tvr.methods.gravialign.head:GraviState"),
        ("tvr.models.heads.clip4clip.head:Clip4ClipVideoState", "tvr.methods.clip4clip.head:Clip4ClipVideoState"),
    ],
)
def test_an_index_written_before_the_methods_moved_names_its_state_at_the_old_path(written: str, cls_path: str) -> None:
    """Indexes written before issue 50 name a built-in method's rerank state under ``tvr.models.heads``; they open."""
    import importlib

    module_name, _, qualname = cls_path.partition(":")
    expected = getattr(importlib.import_module(module_name), qualname)
    assert store.state_class(written) is expected
    assert store.current_module_name("tvr.models.heads.registry") == "tvr.models.heads.registry"
