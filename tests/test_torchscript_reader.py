"""OpenAI's TorchScript archives are read as data: nothing in the file runs (a crafted ``__setstate__`` that writes
a file never executes), the tensors equal ``torch.jit.load``'s on benign archives, unknown pickle names are refused;
``tvr convert-openai`` checks every input before writing, writes 0644 files, has ``--overwrite`` and cleans up after
a killed run."""

from __future__ import annotations

import os
import pickle
import stat
import zipfile
from pathlib import Path

import pytest
import torch
from test_convert_openai import IMAGE, _ScriptableClip, openai_state_dict
from torch import Tensor, nn
from typer.testing import CliRunner

from tvr.cli import app
from tvr.models.backbones.clip.convert_openai import ConversionError, load_openai_state_dict
from tvr.models.backbones.clip.torchscript_reader import (
    TorchScriptArchiveError,
    _rebuild_tensor,
    read_torchscript_state_dict,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _evil_archive(path: Path, marker: Path) -> None:
    """A scripted module whose compiled ``__setstate__`` writes ``marker`` (via torch.from_file) when loaded."""
    source = f"""
import torch
from typing import Tuple
from torch import nn, Tensor

class Evil(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> Tuple[Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[Tensor, bool]) -> None:
        t = torch.from_file({str(marker)!r}, shared=True, size=3, dtype=torch.uint8)
        t.fill_(65)
        self.w = state[0] + t.float() * 0.0
        self.training = state[1]
"""
    module_file = path.parent / "evil_module_src.py"
    module_file.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(module_file), "exec"), namespace)  # TorchScript needs the source file for inspect
    torch.jit.save(torch.jit.script(namespace["Evil"]()), str(path))


def test_a_crafted_setstate_never_runs(tmp_path: Path) -> None:
    archive = tmp_path / "ViT-B-32.pt"
    marker = tmp_path / "pwned"
    _evil_archive(archive, marker)
    with pytest.raises(ConversionError, match="custom state"):
        load_openai_state_dict(archive)
    result = CliRunner().invoke(app, ["convert-openai", str(archive), str(tmp_path / "hf")])
    assert result.exit_code == 2 and "custom state" in result.output
    assert not marker.exists()
    assert not (tmp_path / "hf").exists()
    # the same file does write the marker under torch.jit.load: the test's archive is a real attack
    torch.jit.load(str(archive))
    assert marker.read_bytes() == b"AAA"


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width, bias=False))
        self.attn_mask = torch.triu(torch.ones(3, 3))  # a tensor attribute: not part of the state dict
        self.register_buffer("scale", torch.tensor([2.0], dtype=torch.float16))
        self.steps = 7

    def forward(self, x: Tensor) -> Tensor:
        return self.mlp(self.attn(x)) * self.scale.float() + self.attn_mask.sum() + self.steps


class _Tree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(_Block(4), _Block(4))
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embedding.weight  # tied: one storage, two names
        self.register_buffer("input_resolution", torch.tensor(224))
        self.half_param = nn.Parameter(torch.randn(5, 2).half().t())  # non-contiguous view of its storage

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.blocks(self.embedding(ids))) + self.half_param.float().sum()


def test_tensors_equal_torch_jit_load_on_benign_archives(tmp_path: Path) -> None:
    path = tmp_path / "tree.pt"
    torch.jit.save(torch.jit.script(_Tree()), str(path))
    expected = dict(torch.jit.load(str(path)).state_dict())
    got = read_torchscript_state_dict(path)
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape and got[key].stride() == value.stride()
        assert torch.equal(got[key], value), key
    # the OpenAI layout (fp16 weights, metadata buffers) as the converter reads it
    sd = {k: v.half() for k, v in openai_state_dict().items()}
    sd["input_resolution"] = torch.tensor(IMAGE)
    clip_path = tmp_path / "ViT-tiny.pt"
    torch.jit.save(torch.jit.script(_ScriptableClip(sd)), str(clip_path))
    loaded = load_openai_state_dict(clip_path)
    assert loaded.keys() == sd.keys() and all(torch.equal(loaded[k], sd[k]) for k in sd)


def _archive_with_pickle(path: Path, data: bytes, storages: dict[str, bytes] | None = None) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("m/data.pkl", data)
        archive.writestr("m/constants.pkl", pickle.dumps(()))
        archive.writestr("m/code/__torch__.py", 'class M(Module):\n  __parameters__ = ["w", ]\n  __buffers__ = []\n')
        for key, raw in (storages or {}).items():
            archive.writestr(f"m/data/{key}", raw)


def test_names_outside_a_module_tree_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    # GLOBAL os.system, then call it: what a plain pickle load would run
    payload = (
        b"\x80\x02cos\nsystem\nq\x00X"
        + len(f"touch {marker}").to_bytes(4, "little")
        + f"touch {marker}".encode()
        + b"\x85R."
    )
    path = tmp_path / "m.pt"
    _archive_with_pickle(path, payload)
    with pytest.raises(TorchScriptArchiveError, match=r"refers to os\.system.*refusing"):
        read_torchscript_state_dict(path)
    assert not marker.exists()


def test_a_tensor_reaching_past_its_storage_is_refused() -> None:
    assert torch.equal(_rebuild_tensor(torch.arange(4.0), 1, (3,), (1,)), torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TorchScriptArchiveError, match=r"reaches past its storage of 4 elements"):
        _rebuild_tensor(torch.arange(4.0), 2, (5,), (1,))
    with pytest.raises(TorchScriptArchiveError, match="non-negative"):
        _rebuild_tensor(torch.arange(4.0), 0, (2,), (-1,))


def _scripted_clip(tmp_path: Path) -> Path:
    sd = {k: v.half() for k, v in openai_state_dict().items()}
    path = tmp_path / "ViT-tiny.pt"
    torch.jit.save(torch.jit.script(_ScriptableClip(sd)), str(path))
    return path


def test_convert_openai_checks_the_bpe_first_and_writes_usual_modes(tmp_path: Path) -> None:
    runner = CliRunner()
    src = _scripted_clip(tmp_path)
    out = tmp_path / "hf"
    bad = tmp_path / "bpe.txt.gz"
    bad.write_bytes(b"not gzip at all")
    result = runner.invoke(app, ["convert-openai", str(src), str(out), "--bpe", str(bad)])
    assert result.exit_code == 2 and "bpe.txt.gz" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ViT-tiny.pt", "bpe.txt.gz"]  # nothing written

    # a killed earlier run left its temporary folder; the rerun removes it
    stale = tmp_path / ".hf.tvr-k1ll3d00.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    old = os.umask(0o022)
    try:
        result = runner.invoke(app, ["convert-openai", str(src), str(out)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {
        "config.json": 0o644,
        "model.safetensors": 0o644,
    }

    result = runner.invoke(app, ["convert-openai", str(src), str(out)])
    assert result.exit_code == 2 and "already exists" in result.output and "--overwrite" in result.output
    before = (out / "model.safetensors").stat().st_mtime_ns
    result = runner.invoke(app, ["convert-openai", str(src), str(out), "--overwrite"])
    assert result.exit_code == 0 and (out / "model.safetensors").stat().st_mtime_ns >= before


def test_convert_openai_with_the_real_bpe_writes_the_tokenizer_in_the_same_folder(
    shared_data: Path, tmp_path: Path
) -> None:
    bpe = shared_data / "clip_bpe" / "bpe_simple_vocab_16e6.txt.gz"
    if not bpe.is_file():
        pytest.skip(f"CLIP merges file not found: {bpe}")
    out = tmp_path / "hf"
    result = CliRunner().invoke(app, ["convert-openai", str(_scripted_clip(tmp_path)), str(out), "--bpe", str(bpe)])
    assert result.exit_code == 0, result.output
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= {p.name for p in out.iterdir()}


def test_unreadable_files_get_a_plain_description(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    text = tmp_path / "notes.pt"
    text.write_text("hello, these are notes")
    for path, what in ((empty, "an empty file"), (text, "a text file")):
        with pytest.raises(ConversionError, match=what) as info:
            load_openai_state_dict(path)
        assert "(101)" not in str(info.value)
    lst = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], lst)
    with pytest.raises(ConversionError, match="holds a list; expected a CLIP state dict"):
        load_openai_state_dict(lst)
    emptydict = tmp_path / "emptydict.pt"
    torch.save({}, emptydict)
    with pytest.raises(ConversionError, match="holds an empty dict"):
        load_openai_state_dict(emptydict)


def test_convert_openai_names_the_bad_file_once(tmp_path: Path) -> None:
    """Each refusal names the file once (a text file, a state dict of something else, an archive missing a
    storage the pickle refers to), not ``x.pt: x.pt: …``."""
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    other = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(2)}, other)
    whole = _scripted_clip(tmp_path)
    broken = tmp_path / "broken.pt"
    with zipfile.ZipFile(whole) as source, zipfile.ZipFile(broken, "w") as target:
        dropped = next(n for n in source.namelist() if "/data/" in n)
        for name in source.namelist():
            if name != dropped:
                target.writestr(name, source.read(name))
    for path, what in (
        (text, "not an OpenAI CLIP checkpoint: a text file"),
        (other, "checkpoint has no 'visual.conv1.weight'"),
        (broken, f"storage {dropped.rsplit('/', 1)[1]!r} is referenced but not in the archive"),
    ):
        result = CliRunner().invoke(app, ["convert-openai", str(path), str(tmp_path / "out")])
        said = " ".join(result.output.split())
        assert result.exit_code == 2 and what in said, said
        assert said.count(path.name) == 1, said


@pytest.mark.parametrize("where", ["weights", "config"])
def test_convert_openai_on_a_full_disk_says_so_in_one_line(tmp_path: Path, monkeypatch, where: str) -> None:
    """safetensors reports a full disk as its own error (``SafetensorError: … No space left on device (os error
    28)``), Python's writes as an OSError naming no file: either is one line naming the folder being written and
    its file system, exit 2, and nothing is left behind."""
    import safetensors
    import transformers
    import transformers.modeling_utils as modeling_utils

    src = _scripted_clip(tmp_path)
    out = tmp_path / "hf"
    if where == "weights":

        def full(*args, **kwargs):
            raise safetensors.SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )

        monkeypatch.setattr(modeling_utils, "safe_save_file", full)
    else:

        def full(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(transformers.PretrainedConfig, "save_pretrained", full)
    result = CliRunner().invoke(app, ["convert-openai", str(src), str(out)])
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "no space left" in line and str(out) in line and "file system" in line and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ViT-tiny.pt"]
