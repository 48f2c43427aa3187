"""The query exports in tvr's cache (tvr.search.query_encoder: TorchScript; tvr.search.numpy_query: numpy data) are
read like every other file tvr reads: only from a cache no other user can write (the cache root and every folder
above it included), from the very descriptor that was checked (a file swapped after the check is not the one
loaded), never blocking on a FIFO, within the sizes and SHA-256 digests recorded when tvr wrote them, with the shapes
and fields the reader computes with. Anything else is one warning naming the file, and the search goes on with the
full model, giving its answers. A write that fails under the cache (a full disk) is one warning too: no abort, no
temporary left behind."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from search_fixtures import index_args
from test_numpy_query import _two_tower
from test_query_encoder import CAPTIONS
from test_search import OPTIONS
from torch import nn

import tvr.search.numpy_query as numpy_query
import tvr.search.query_encoder as query_encoder
from tvr.search import open_index
from tvr.search.build import build_index
from tvr.search.encoders import CheckpointEncoder
from tvr.search.numpy_export import export_numpy_query
from tvr.search.numpy_query import NumpyQueryEncoder, load_numpy_query_encoder, numpy_export_folder
from tvr.search.query_encoder import PROBE_TEXTS, QueryEncoder, export_folder, export_query_encoder, load_query_encoder
from tvr.utils.io import is_temporary_name


@pytest.fixture(autouse=True, scope="module")
def _conse_cache(tmp_path_factory: pytest.TempPathFactory):
    """ConSE's class-embedding cache files of these tests go to a temporary folder, never the user's home."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TVR_CACHE_DIR", str(tmp_path_factory.mktemp("tvr-cache")))
        yield


def _use_export_root(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setattr(query_encoder, "export_root", lambda: root)
    monkeypatch.setattr(numpy_query, "export_root", lambda: root)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tvr")]


def _temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if is_temporary_name(p.name)] if folder.exists() else []


def _in_child(fn, seconds: float) -> tuple[str, list[str]]:
    """``fn()`` run in a forked child (a read blocked inside torch holds the GIL, so no thread of this process could
    time it out): (the type name of what it returned, the warnings tvr logged); fails when it is still running
    after ``seconds``."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def run() -> None:
        logged: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: logged.append(record.getMessage())
        logging.getLogger("tvr").addHandler(handler)
        send.send((type(fn()).__name__, logged))

    child = context.Process(target=run)
    child.start()
    child.join(seconds)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"still blocked after {seconds} s")
    assert child.exitcode == 0
    return receive.recv()


def _rewrite(folder: Path, name: str, data: bytes) -> None:
    """Replace a file of an export, and its record in meta.json as tvr writes it: what a user who can write the
    folder could do."""
    (folder / name).write_bytes(data)
    meta_file = folder / "meta.json"
    meta = json.loads(meta_file.read_text())
    if isinstance(meta.get("files"), dict):
        meta["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        meta_file.write_text(json.dumps(meta))


def _edit_meta(folder: Path, change) -> None:
    meta_file = folder / "meta.json"
    meta = json.loads(meta_file.read_text())
    change(meta)
    meta_file.write_text(json.dumps(meta))


# --------------------------------------------------------------------------------------------- TorchScript export


@pytest.fixture
def torch_export(search_index: Path, search_setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The session index's TorchScript export, copied into a cache of this test (``tmp_path/cache``)."""
    stamp = json.loads((search_index / "settings.json").read_text())["model"]
    session_copy = export_folder(stamp)
    root = tmp_path / "cache" / "query-encoders"
    _use_export_root(monkeypatch, root)
    shutil.copytree(session_copy, export_folder(stamp))
    assert isinstance(load_query_encoder(stamp), QueryEncoder)
    return SimpleNamespace(stamp=stamp, folder=export_folder(stamp), root=root, index=search_index, setup=search_setup)


@pytest.mark.parametrize("level", ["cache root", "folder above the cache root"])
def test_an_export_under_a_folder_others_can_write_is_not_run(torch_export, level: str, caplog) -> None:
    """Whoever can write the cache root or a folder above it can swap the export folder between a check and the
    load (rename it away, put theirs in its place): such an export is not run (as ssh refuses a key file under a
    folder others can write); a sticky folder that others can write (/tmp) but not rename in is fine."""
    writable = torch_export.root.parent if level == "cache root" else torch_export.root.parent.parent
    mode = writable.stat().st_mode & 0o7777
    writable.chmod(0o777)
    try:
        assert load_query_encoder(torch_export.stamp) is None
        (warning,) = _warnings(caplog)
        assert str(writable) in warning and "write" in warning
        writable.chmod(0o1777)  # sticky: others may add names, not replace ours
        assert isinstance(load_query_encoder(torch_export.stamp), QueryEncoder)
    finally:
        writable.chmod(mode)


class _Planted(nn.Module):
    """Another user's TorchScript: what tvr must never run."""

    def __init__(self) -> None:
        super().__init__()
        self.planted = 1

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor]:
        return (ids.float(),)


def test_the_torchscript_loaded_is_the_file_that_was_checked(torch_export, tmp_path: Path, monkeypatch) -> None:
    """text.pt swapped for another file after tvr checked it and before torch loads it: torch loads the bytes tvr
    checked, and the next load refuses the swapped file (its digest is not the one recorded)."""
    planted = tmp_path / "planted.pt"
    torch.jit.save(torch.jit.script(_Planted()), str(planted))
    real_load = torch.jit.load
    swaps = []

    def swap_then_load(f, *args, **kwargs):
        if not swaps:
            os.replace(planted, torch_export.folder / "text.pt")
            swaps.append(True)
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch.jit, "load", swap_then_load)
    encoder = load_query_encoder(torch_export.stamp)
    assert swaps and (encoder is None or not hasattr(encoder.text_path, "planted"))
    assert load_query_encoder(torch_export.stamp) is None


def _fifo_does_not_block(folder: Path, name: str, load) -> None:
    """``name`` replaced by a FIFO (no writer ever comes): ``load()`` returns None at once, with one warning."""
    fifo = folder / name
    fifo.unlink()
    os.mkfifo(fifo)
    returned, (warning,) = _in_child(load, 60)
    assert returned == "NoneType"
    assert name in warning and "FIFO" in warning


@pytest.mark.parametrize("name", ["text.pt", "head.pt", "vocab.json"])
def test_a_fifo_in_the_export_does_not_block_the_search(torch_export, name: str) -> None:
    _fifo_does_not_block(torch_export.folder, name, lambda: load_query_encoder(torch_export.stamp))


def test_an_export_whose_meta_is_not_what_tvr_writes_is_one_warning(torch_export, caplog) -> None:
    _edit_meta(torch_export.folder, lambda meta: meta.update(stamp=[]))
    assert load_query_encoder(torch_export.stamp) is None
    (warning,) = _warnings(caplog)
    assert "meta.json" in warning


# --------------------------------------------------------------------------------------------- numpy export


@pytest.fixture(scope="module")
def numpy_built(search_setup, tmp_path_factory: pytest.TempPathFactory):
    """A tiny two-tower ConSE index and its numpy query side (in the session's export folder)."""
    encoder = _two_tower(False)
    index = tmp_path_factory.mktemp("numpy-export") / "idx"
    build_index(search_setup.videos, index, encoder, OPTIONS)
    folder = export_numpy_query(encoder, list(PROBE_TEXTS))
    assert folder is not None
    return SimpleNamespace(encoder=encoder, index=index, folder=folder)


@pytest.fixture
def numpy_export(numpy_built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``numpy_built``'s numpy query side copied into a cache of this test."""
    root = tmp_path / "cache" / "query-encoders"
    _use_export_root(monkeypatch, root)
    stamp = numpy_built.encoder.stamp()
    shutil.copytree(numpy_built.folder, numpy_export_folder(stamp))
    assert isinstance(load_numpy_query_encoder(stamp), NumpyQueryEncoder)
    return SimpleNamespace(**vars(numpy_built), stamp=stamp, export=numpy_export_folder(stamp), root=root)


def _falls_back_to_the_model(ns, caplog, name: str) -> None:
    """Opening the index for a search without torch warns once, naming ``name``, and answers as the model does."""
    caplog.clear()
    caplog.set_level(logging.WARNING)
    quick = open_index(ns.index, without_torch=True)
    assert not isinstance(quick.encoder, NumpyQueryEncoder)
    (warning,) = _warnings(caplog)
    assert name in warning, warning
    full = open_index(ns.index, encoder=ns.encoder)
    for text in CAPTIONS[:4]:
        assert quick.search(text, k=3) == full.search(text, k=3), text


def _weights(ns) -> dict[str, np.ndarray]:
    with np.load(ns.export / "weights.npz", allow_pickle=False) as weights:
        return {name: weights[name] for name in weights.files}


def _npz(arrays: dict[str, np.ndarray], compressed: bool = False) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["weights.npz", "tokenizer.json"])
def test_a_fifo_in_the_numpy_export_does_not_block_the_search(numpy_export, name: str) -> None:
    _fifo_does_not_block(numpy_export.export, name, lambda: load_numpy_query_encoder(numpy_export.stamp))


@pytest.mark.parametrize("recorded", [False, True], ids=["as-found", "record-rewritten"])
def test_a_weights_bomb_is_refused_before_it_inflates(numpy_export, recorded: bool, caplog) -> None:
    """A weights.npz of a few hundred kB whose deflated member inflates to 256 MB: refused before it inflates,
    whether or not its size and digest were rewritten into meta.json too."""
    weights = _weights(numpy_export)
    weights["bert.embeddings.word_embeddings.weight"] = np.zeros((64 << 20,), dtype=np.float32)
    data = _npz(weights, compressed=True)
    assert len(data) < 4 << 20
    if recorded:
        _rewrite(numpy_export.export, "weights.npz", data)
    else:
        (numpy_export.export / "weights.npz").write_bytes(data)
    tracemalloc.start()
    try:
        assert load_numpy_query_encoder(numpy_export.stamp) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB allocated"
    (warning,) = _warnings(caplog)
    assert "weights.npz" in warning


def test_weights_of_the_wrong_shape_are_refused_when_opened(numpy_export, caplog) -> None:
    weights = _weights(numpy_export)
    name = "bert.encoder.layer.0.intermediate.dense.weight"
    weights[name] = np.ascontiguousarray(weights[name].T)
    _rewrite(numpy_export.export, "weights.npz", _npz(weights))
    _falls_back_to_the_model(numpy_export, caplog, name)


def _more_layers(meta: dict) -> None:
    meta["tower"]["layers"] += 5


@pytest.mark.parametrize(
    "change",
    [lambda meta: meta.update(stamp=[]), _more_layers, "heads"],
    ids=["stamp-not-an-object", "more-layers-than-stored", "heads-not-dividing-the-width"],
)
def test_numpy_metadata_that_does_not_fit_is_refused_when_opened(numpy_export, change, caplog) -> None:
    if change == "heads":
        width = _weights(numpy_export)["bert.embeddings.word_embeddings.weight"].shape[1]

        def change(meta: dict) -> None:
            meta["tower"]["heads"] = width + 1

    _edit_meta(numpy_export.export, change)
    _falls_back_to_the_model(numpy_export, caplog, "meta.json")


@pytest.mark.parametrize("edit", ["scaled", "nan"])
def test_edited_weights_do_not_change_the_rankings(numpy_export, edit: str, caplog) -> None:
    """Weights edited after tvr wrote them (rescaled: other rankings; a NaN: no hits at all) are refused by their
    digest: the search answers as the model does."""
    weights = _weights(numpy_export)
    name = "bert.embeddings.word_embeddings.weight"
    if edit == "scaled":
        weights[name] = weights[name] * np.random.default_rng(0).uniform(0.0, 2.0, weights[name].shape).astype(
            np.float32
        )
    else:
        weights["bert.embeddings.LayerNorm.weight"] = np.full_like(weights["bert.embeddings.LayerNorm.weight"], np.nan)
    (numpy_export.export / "weights.npz").write_bytes(_npz(weights))
    _falls_back_to_the_model(numpy_export, caplog, "weights.npz")


def test_a_numpy_export_others_can_write_is_not_used(numpy_export, caplog) -> None:
    numpy_export.export.chmod(0o777)
    _falls_back_to_the_model(numpy_export, caplog, str(numpy_export.export))


# --------------------------------------------------------------------------------------------- a full disk


def _limited(limit: int):
    def apply() -> None:  # writes past `limit` bytes fail with EFBIG (Python ignores SIGXFSZ), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
@pytest.mark.parametrize("command", ["search", "index"])
def test_a_write_that_fails_under_the_cache_is_a_warning(command: str, search_setup, search_index, tmp_path) -> None:
    """``tvr search`` / ``tvr index`` in a process whose writes fail past 1 MB (the 6 MB text.pt fails mid-write,
    which used to abort the process with SIGABRT and a C++ backtrace from inside torch.jit.save): the command
    answers, a warning names the export, and no temporary is left in the cache."""
    cache = tmp_path / "cache"
    if command == "search":
        args = ["search", str(search_index), "a magenta screen", "-k", "1", "--json"]
    else:
        args = index_args(search_setup.videos, tmp_path / "idx", search_setup.checkpoint)
    env = {**os.environ, "TVR_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "tvr", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        preexec_fn=_limited(1 << 20),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if command == "search":
        assert json.loads(done.stdout)[0]["video"] == "sub/magenta.mp4"
    assert "query" in done.stderr and "File too large" in done.stderr and "Traceback" not in done.stderr
    assert _temporaries(cache) == []


@pytest.mark.parametrize("kind", ["torchscript", "numpy"])
def test_a_full_disk_while_exporting_is_one_warning(
    kind: str, numpy_built, search_setup, tmp_path, monkeypatch, caplog
):
    """Every file of an export is written by one writer: a disk that fills up under the cache is one warning naming
    the file, the search goes on, no temporary is left."""
    from tvr.utils import io as tvr_io

    root = tmp_path / "cache" / "query-encoders"
    _use_export_root(monkeypatch, root)
    encoder = numpy_built.encoder if kind == "numpy" else CheckpointEncoder(search_setup.checkpoint)
    real_fsync = tvr_io.fsync_path

    def full(path) -> None:
        if Path(path).is_relative_to(root):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(path)

    monkeypatch.setattr(tvr_io, "fsync_path", full)
    caplog.set_level(logging.WARNING)
    if kind == "numpy":
        assert export_numpy_query(encoder, list(PROBE_TEXTS)) is None
    else:
        assert export_query_encoder(encoder) is None
    warnings = _warnings(caplog)
    assert warnings and all("No space left on device" in w and str(root) in w for w in warnings), warnings
    assert _temporaries(root) == [] and not (root.exists() and any(root.iterdir()))
