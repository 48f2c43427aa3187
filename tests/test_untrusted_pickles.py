"""Pickles from elsewhere are scanned before anything unpickles them: nesting, memo indices, lengths, zip members
and tensor extents are bounded; every pickle-reading path goes through the scan; the benign files tvr and torch
write pass it unchanged."""

from __future__ import annotations

import ast
import collections
import io
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from annotation_fixtures import write_msvd
from typer.testing import CliRunner

from tvr.cli import app
from tvr.config import DataConfig
from tvr.data.annotations import AnnotationError, clear_cache, load_split
from tvr.models.backbones.clip.convert_openai import ConversionError, load_openai_state_dict
from tvr.models.backbones.clip.torchscript_reader import TorchScriptArchiveError, read_torchscript_state_dict
from tvr.models.checkpoint import CheckpointError, read_checkpoint
from tvr.train.checkpoint import save_checkpoint
from tvr.utils.pickle_scan import HANDLED, MAX_NESTING, PickleRefusedError, scan_pickle
from tvr.utils.torch_files import INFLATION_FLOOR, TorchFileError, load_torch_file

REPO = Path(__file__).resolve().parents[1]
#: a dict whose key is a tuple nested a million deep: hashing it overflows the C stack (SIGSEGV)
NESTED_KEY = b"\x80\x02})" + b"\x85" * 10**6 + b"]s."
#: an empty list stored at memo index 2**27: the C unpickler sizes its memo table to it (2 GB)
MEMO_BOMB = b"\x80\x02]r\x00\x00\x00\x08."


def _refused(data: bytes, match: str) -> None:
    with pytest.raises(PickleRefusedError, match=match):
        scan_pickle(data, "x.pkl")


# --------------------------------------------------------------------------------------------- the scan


def test_the_scan_models_every_opcode() -> None:
    assert HANDLED == {op.name for op in pickletools.opcodes}


def test_nesting_memo_and_lengths_are_bounded() -> None:
    _refused(NESTED_KEY, rf"x.pkl: objects nested more than {MAX_NESTING} levels deep \(at byte {3 + MAX_NESTING}\)")
    _refused(MEMO_BOMB, r"memo index 134217728 is out of range for a stream of 3 opcodes")
    _refused(b"\x80\x02h\x01.", "memo index 1 is read before it is stored")
    _refused(b"\x80\x04\x95" + (10**9).to_bytes(8, "little") + b"N.", "a frame of 1000000000 bytes in a stream with 2")
    _refused(b"\x80\x02X\x00\x00\x00\x10abc.", r"not a readable pickle \(expected 268435456 bytes")
    _refused(b"\x80\x02N", "pickle exhausted before seeing STOP")
    _refused(b"\x80\x02NN.", "stops with objects or marks left")
    _refused(b"\x80\x02a.", "takes an object from an empty stack")
    # a protocol-0 stream nests as well (torch's unpickler reads it without a PROTO opcode)
    _refused(b"(" * 300 + b"t" * 300 + b".", "nested more than")
    deep_but_allowed = b"\x80\x02N" + b"\x85" * MAX_NESTING + b"."  # None in MAX_NESTING tuples
    assert scan_pickle(deep_but_allowed, "x") == len(deep_but_allowed)
    _refused(b"\x80\x02N" + b"\x85" * (MAX_NESTING + 1) + b".", "nested more than")


def test_a_container_changed_after_it_was_placed_is_refused() -> None:
    """The one way a stream could nest deeper than the scan's heights: fill a container after another holds it
    (a cycle is the benign case); a call's result may be its argument (TorchScript's list helpers), so it counts."""
    cycle: list = []
    cycle.append(cycle)
    _refused(pickle.dumps(cycle, protocol=2), "changed after it was placed in another")
    grow_later = (
        b"\x80\x02]q\x00"  # L = [] (memo 0)
        b"]q\x01h\x00a"  # X = [L] (memo 1)
        b"0h\x00]a."  # drop X; L.append([]): L is in X already
    )
    _refused(grow_later, "changed after it was placed")
    through_a_call = (
        b"\x80\x02]q\x00"  # L = []
        b"]h\x00a0"  # [L], dropped: L is placed once
        b"ctorch.jit._pickle\nbuild_intlist\nh\x00\x85R"  # R = build_intlist(L): R may be L
        b"]a."  # R.append([]) changes L, which another list holds
    )
    _refused(through_a_call, "changed after it was placed")
    fresh_call = b"\x80\x02ctorch.jit._pickle\nbuild_intlist\n]\x85R]a."  # build_intlist([]).append([]): fine
    assert scan_pickle(fresh_call, "x") == len(fresh_call)
    # one call on the results of 200 others stands for all of them (any could be returned): bounded, so the scan
    # stays linear in the stream
    wide = b"\x80\x02cbuiltins\nprint\n(" + b"cbuiltins\nlist\n)R" * 200 + b"tR."  # print(*200 lists)
    _refused(wide, "may stand for more than 256 earlier objects")
    narrow = b"\x80\x02cbuiltins\nprint\n(" + b"cbuiltins\nlist\n)R" * 100 + b"tR."
    assert scan_pickle(narrow, "x") == len(narrow)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_ordinary_pickles_pass_in_every_protocol(protocol: int) -> None:
    shared = ("shared", 1)
    value = {
        "a": [1, 2.5, None, True, "text", b"bytes", bytearray(b"ba")],
        "nested": {"x": (1, (2, (3, [4, {5: "five"}])))},
        "shared": [shared, shared],
        "set": {1, 2},
        "frozen": frozenset({3}),
        "od": collections.OrderedDict(b=2, a=1),
        "long": 2**100,
        "many": list(range(3000)),
    }
    data = pickle.dumps(value, protocol=protocol)
    assert scan_pickle(data, "x") == len(data) and pickle.loads(data) == value


def test_the_scan_reads_a_file_in_place_and_stops_at_the_stop(tmp_path: Path) -> None:
    first, second = pickle.dumps([1, 2], protocol=2), pickle.dumps({"k": "v"}, protocol=2)
    with io.BytesIO(first + second + b"raw bytes after") as stream:
        assert scan_pickle(stream, "x") == len(first) and stream.tell() == len(first)
        assert scan_pickle(stream, "x") == len(first) + len(second)


# --------------------------------------------------------------------------------------------- torch.save files


def _rewrite_archive(src: Path, dst: Path, replace: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> None:
    """``src`` (a torch.save zip) with the members ``replace`` names (relative to its folder) replaced or added."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", compression) as new:
        root = old.namelist()[0].split("/", 1)[0]
        for info in old.infolist():
            rel = info.filename.split("/", 1)[1]
            new.writestr(info.filename, replace.pop(rel, old.read(info)))
        for rel, data in replace.items():
            new.writestr(f"{root}/{rel}", data)


class _StorageRef:
    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _TensorPickler(pickle.Pickler):
    """Writes a tensor the way torch.save does, with whatever size, stride and storage length it is told."""

    def persistent_id(self, obj: object) -> object:
        return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel) if isinstance(obj, _StorageRef) else None


class _Tensor:
    def __init__(self, key: str, numel: int, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.args = (_StorageRef(key, numel), 0, size, stride, False, collections.OrderedDict())

    def __reduce__(self) -> tuple:
        return torch._utils._rebuild_tensor_v2, self.args


def _crafted_archive(path: Path, obj: object, storages: dict[str, bytes]) -> Path:
    data = io.BytesIO()
    _TensorPickler(data, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w") as archive:
        for name, value in {"data.pkl": data.getvalue(), "byteorder": b"little", "version": b"3\n"}.items():
            archive.writestr(f"a/{name}", value)
        for key, raw in storages.items():
            archive.writestr(f"a/data/{key}", raw)
    return path


def test_benign_torch_files_load_unchanged(tmp_path: Path) -> None:
    linear = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(linear.parameters())
    linear(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    shared = torch.nn.Parameter(torch.randn(3))
    value = {
        "model": linear.state_dict(),
        "optimizer": optimizer.state_dict(),
        "tied": [shared, shared],
        "view": torch.arange(10.0)[2:7],
        "config": {"a": {"b": [1, (2, 3)]}, "dtype": torch.float16, "size": torch.Size([2, 3])},
        "rng": torch.get_rng_state(),
        "empty": torch.zeros(0, 5),
    }
    for zipped in (True, False):
        path = tmp_path / f"file-{zipped}.pt"
        torch.save(value, path, _use_new_zipfile_serialization=zipped)
        loaded = load_torch_file(path, mmap=zipped)
        assert torch.equal(loaded["view"], value["view"]) and loaded["config"] == value["config"]
        assert loaded["tied"][0] is loaded["tied"][1]
        assert all(torch.equal(loaded["model"][k], v) for k, v in value["model"].items())


def test_torch_files_that_bomb_or_lie_are_refused_before_torch_reads_them(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.randn(3, 4)}, good)
    cases = {
        "nested.pt": ({"data.pkl": NESTED_KEY}, zipfile.ZIP_STORED, "good/data.pkl\\): objects nested more than"),
        "memo.pt": ({"data.pkl": MEMO_BOMB}, zipfile.ZIP_STORED, "memo index 134217728 is out of range"),
        "byteorder.pt": ({"byteorder": b"x" * (1 << 20)}, zipfile.ZIP_DEFLATED, "byteorder holds 1,048,576 bytes"),
        "endian.pt": ({"byteorder": b"middle"}, zipfile.ZIP_STORED, "byteorder is b'middle'"),
        "inflate.pt": (
            {"data/0": bytes(8 * INFLATION_FLOOR)},
            zipfile.ZIP_DEFLATED,
            r"member good/data/0 inflates from [\d,]+ to 8,388,608 bytes",
        ),
    }
    for name, (replace, compression, message) in cases.items():
        path = tmp_path / name
        _rewrite_archive(good, path, replace, compression)
        assert path.stat().st_size < 1_100_000  # small: 1 MB for the million-deep tuple, a few kB otherwise
        with pytest.raises(PickleRefusedError, match=message):
            load_torch_file(path)
        with pytest.raises(CheckpointError, match=message):
            read_checkpoint(path)
    # the unzipped format is scanned too, pickle by pickle
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + NESTED_KEY)
    with pytest.raises(PickleRefusedError, match=r"legacy.pt \(pickle 2 of a torch.save file\): objects nested"):
        load_torch_file(legacy)
    # a protocol-0 stream torch would unpickle without a PROTO opcode
    (tmp_path / "p0.pt").write_bytes(b"(" * 300 + b"t" * 300 + b".")
    with pytest.raises(TorchFileError, match=r"p0.pt: a text file \(starting b.\(\(\(.*expected a torch.save file"):
        load_torch_file(tmp_path / "p0.pt")
    # a TorchScript archive is never given to torch.load (which would warn, then refuse or run it)
    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(scripted))
    with pytest.raises(PickleRefusedError, match="a TorchScript archive, not a torch.save file"):
        load_torch_file(scripted)


def test_a_tensor_with_more_elements_than_its_storage_is_refused(tmp_path: Path) -> None:
    fine = _crafted_archive(tmp_path / "fine.pt", {"w": _Tensor("0", 4, (2, 2), (2, 1))}, {"0": bytes(16)})
    assert torch.equal(load_torch_file(fine)["w"], torch.zeros(2, 2))
    # a stride-0 tensor stands for 2.56 billion elements on one stored value: whatever is sized from it allocates
    wide = _crafted_archive(tmp_path / "wide.pt", {"w": _Tensor("0", 1, (40_000_000, 64), (0, 0))}, {"0": bytes(4)})
    with pytest.raises(
        PickleRefusedError, match=r"shape \(40000000, 64\) \(stride \(0, 0\)\) stands on a storage of 1"
    ):
        load_torch_file(wide)
    # a size torch cannot even compute: one line, no C++ backtrace
    huge = _crafted_archive(tmp_path / "huge.pt", {"w": _Tensor("0", 4, (2**63 - 1,), (1,))}, {"0": bytes(16)})
    with pytest.raises(TorchFileError) as info:
        load_torch_file(huge)
    assert "\n" not in str(info.value) and "overflow" in str(info.value)


# --------------------------------------------------------------------------------------------- TorchScript


def _nested_modules(depth: int) -> bytes:
    """A TorchScript module tree ``depth`` modules deep (each the only submodule of the one above)."""
    head = b"\x80\x02"
    for _ in range(depth):  # object, its state dict, the key of its child: left on the stack
        head += b"c__torch__\nM\n)\x81}X\x01\x00\x00\x00c"
    inner = b"c__torch__\nM\n)\x81}b"
    return head + inner + b"sb" * depth + b"."


def test_a_torchscript_archive_nested_thousands_of_modules_deep_is_refused_in_a_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("m/data.pkl", _nested_modules(5_000))  # 1000 already broke the recursion limit
        archive.writestr("m/code/__torch__.py", "class M(Module):\n  __parameters__ = []\n  __buffers__ = []\n")
    with pytest.raises(TorchScriptArchiveError, match=r"deep.pt \(m/data.pkl\): objects nested more than 200") as info:
        read_torchscript_state_dict(path)
    assert str(info.value).count(str(path)) == 1
    shallow = tmp_path / "shallow.pt"
    with zipfile.ZipFile(shallow, "w") as archive:
        archive.writestr("m/data.pkl", _nested_modules(20))
        archive.writestr("m/code/__torch__.py", "class M(Module):\n  __parameters__ = []\n  __buffers__ = []\n")
    assert read_torchscript_state_dict(shallow) == {}


def test_a_memory_error_while_unpickling_names_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that runs out of memory said "unreadable ()" (a MemoryError has no message)."""
    import tvr.models.backbones.clip.torchscript_reader as reader

    path = tmp_path / "m.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("m/data.pkl", pickle.dumps({}, protocol=2))
        archive.writestr("m/code/__torch__.py", "class M(Module):\n  __parameters__ = []\n  __buffers__ = []\n")

    def out_of_memory(self):
        raise MemoryError

    monkeypatch.setattr(reader._Unpickler, "load", out_of_memory)
    with pytest.raises(
        TorchScriptArchiveError, match=r"m.pt: the archive's module pickle is unreadable \(MemoryError\)"
    ):
        read_torchscript_state_dict(path)


def test_torch_warnings_never_come_before_a_refusal(tmp_path: Path) -> None:
    import warnings

    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(scripted))
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.zeros(2)}, plain, _use_new_zipfile_serialization=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError, match="a TorchScript archive, not a torch.save file"):
            read_checkpoint(scripted)
        assert torch.equal(load_torch_file(plain)["w"], torch.zeros(2))
    assert [str(w.message) for w in caught] == []


def test_torchscript_errors_name_the_file_once(tmp_path: Path) -> None:
    path = tmp_path / "ViT-B-32.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("m/data.pkl", b"\x80\x02c__torch__\nM\n)\x81}X\x01\x00\x00\x00wctorch\nFloatStorage\n.")
        archive.writestr("m/code/__torch__.py", 'class M(Module):\n  __parameters__ = ["w"]\n  __buffers__ = []\n')
    with pytest.raises(ConversionError) as info:
        load_openai_state_dict(path)
    assert str(info.value).count(str(path)) == 1, str(info.value)
    missing = tmp_path / "missing-storage.pt"
    data = (
        b"\x80\x02c__torch__\nM\n)\x81}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n"
        b"((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ"
        b"K\x00K\x04\x85K\x01\x85\x89tRsb."
    )
    with zipfile.ZipFile(missing, "w") as archive:
        archive.writestr("m/data.pkl", data)
        archive.writestr("m/code/__torch__.py", 'class M(Module):\n  __parameters__ = ["w"]\n  __buffers__ = []\n')
    with pytest.raises(ConversionError, match="storage '0' is referenced but not in the archive") as info:
        load_openai_state_dict(missing)
    assert str(info.value).count(str(missing)) == 1, str(info.value)


def test_a_torchscript_storage_deflated_a_thousandfold_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt"
    numel = 4 * INFLATION_FLOOR
    data = (
        b"\x80\x02c__torch__\nM\n)\x81}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n"
        b"((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ"
        + numel.to_bytes(4, "little")
        + b"tQK\x00J"
        + numel.to_bytes(4, "little")
        + b"\x85K\x01\x85\x89tRsb."
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("m/data.pkl", data)
        archive.writestr("m/code/__torch__.py", 'class M(Module):\n  __parameters__ = ["w"]\n  __buffers__ = []\n')
        archive.writestr("m/data/0", bytes(4 * numel))
    assert path.stat().st_size < 100_000
    with pytest.raises(TorchScriptArchiveError, match=r"member m/data/0 inflates from [\d,]+ to 16,777,216 bytes"):
        read_torchscript_state_dict(path)


# --------------------------------------------------------------------------------------------- MSVD captions


def test_msvd_captions_are_scanned_before_they_are_unpickled(tmp_path: Path) -> None:
    write_msvd(tmp_path, ["a"], ["b"], ["c"])
    for data, message in ((MEMO_BOMB, "memo index 134217728 is out of range"), (NESTED_KEY, "nested more than")):
        (tmp_path / "raw-captions.pkl").write_bytes(data)
        clear_cache()
        with pytest.raises(AnnotationError, match=f"raw-captions.pkl: .*{message}.*expected a pickled dict"):
            load_split(DataConfig(dataset="msvd", annotations=str(tmp_path)), "train")


# --------------------------------------------------------------------------------------------- whole commands


def test_the_nested_pickle_is_a_one_line_refusal_not_a_crash(tmp_path: Path) -> None:
    """Such a raw-captions.pkl (``tvr check-data``) or checkpoint (``tvr eval``) killed the process with SIGSEGV
    (rc 139); run in a child process so that a crash fails this test instead of ending the test run."""
    captions = tmp_path / "msvd"
    write_msvd(captions, ["a"], ["b"], ["c"])
    (captions / "raw-captions.pkl").write_bytes(NESTED_KEY)
    checkpoint, bad = tmp_path / "best.pt", tmp_path / "bad.pt"
    save_checkpoint(checkpoint, torch.nn.Linear(2, 2), state={})
    _rewrite_archive(checkpoint, bad, {"data.pkl": NESTED_KEY})
    hf_folder = tmp_path / "hf-clip"  # transformers torch.loads a folder's pytorch_model.bin itself
    from transformers import CLIPConfig

    CLIPConfig().save_pretrained(hf_folder)
    shutil.copy(bad, hf_folder / "pytorch_model.bin")
    script = (
        "from tvr.config import DataConfig\n"
        "from tvr.data.annotations import load_split\n"
        "from tvr.models.checkpoint import read_checkpoint\n"
        "from tvr.models.backbones.clip.modeling import load_clip_model\n"
        f"for load in (lambda: load_split(DataConfig(dataset='msvd', annotations={str(captions)!r}), 'train'),\n"
        f"             lambda: read_checkpoint({str(bad)!r}),\n"
        f"             lambda: load_clip_model({str(hf_folder)!r})):\n"
        "    try:\n"
        "        load()\n"
        "    except Exception as exc:\n"
        "        print('REFUSED', type(exc).__name__, str(exc), flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -11: SIGSEGV
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all("nested more than 200 levels deep" in line for line in lines), done.stdout
    assert [line.split()[1] for line in lines] == ["AnnotationError", "CheckpointError", "ConfigError"]
    result = CliRunner().invoke(app, ["eval", "--checkpoint", str(bad), "--out", str(tmp_path / "ev")])
    assert result.exit_code == 2 and "nested more than 200 levels deep" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "ev" / "metrics.json").exists()


# --------------------------------------------------------------------------------------------- every path


def _calls(tree: ast.AST) -> set[str]:
    """Every dotted name used in ``tree`` (``torch.jit.load``, ``pickle.Unpickler``, …)."""
    names = set()
    for node in ast.walk(tree):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if parts and isinstance(node, ast.Name):
            names.add(".".join([node.id, *reversed(parts)]))
    return names


def test_every_pickle_reader_goes_through_the_scan() -> None:
    """``torch.load`` only in tvr/utils/torch_files.py, which scans first; ``pickle.Unpickler`` only in modules that
    call ``scan_pickle`` / ``read_archive_pickle`` on the bytes first; ``pickle.load(s)`` nowhere; ``torch.jit.load``
    only on the query encoder tvr wrote itself into a private cache (docs/security.md)."""
    unpicklers = {}
    for path in sorted((REPO / "tvr").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _calls(tree)
        rel = path.relative_to(REPO).as_posix()
        if "torch.load" in names:
            assert rel == "tvr/utils/torch_files.py", rel
        if "torch.jit.load" in names:
            assert rel == "tvr/search/query_encoder.py", rel
        assert not names & {"pickle.load", "pickle.loads"}, rel
        if "pickle.Unpickler" in names:
            unpicklers[rel] = path.read_text(encoding="utf-8")
    assert set(unpicklers) == {"tvr/data/formats/msvd.py", "tvr/models/backbones/clip/torchscript_reader.py"}
    assert all("scan_pickle(" in text or "read_archive_pickle(" in text for text in unpicklers.values())


def test_a_checkpoint_config_cannot_size_a_model_without_bound(tmp_path: Path) -> None:
    """A checkpoint carries its config; a tiny CLIP's sizes are capped, so a 40,000,000-word vocabulary (10 GB at
    width 64) is refused before any model is built."""
    from tvr.config import config_from_dict, config_to_dict
    from tvr.pipeline import resolve_config

    values = config_to_dict(resolve_config(config_from_dict({"model": {"clip": "tiny"}})))
    values["model"]["tiny"]["vocab_size"] = 40_000_000
    path = tmp_path / "huge.pt"
    save_checkpoint(path, torch.nn.Linear(2, 2), state={})
    payload = torch.load(path, weights_only=True)
    payload["config"] = values
    torch.save(payload, path)
    result = CliRunner().invoke(app, ["eval", "--checkpoint", str(path), "--out", str(tmp_path / "ev")])
    assert result.exit_code == 2, result.output
    assert "model.tiny.vocab_size = 40000000: expected a number >= 3 and <= 262144" in " ".join(result.output.split())


class _RunsCode:
    """Pickled as a call of os.system: what a hostile checkpoint holds."""

    def __reduce__(self):  # noqa: ANN204
        return (os.system, ("echo pwned",))


class _PlainObject:
    """A class instance: code where a checkpoint holds data."""


@pytest.mark.parametrize(("payload", "named"), [(_RunsCode(), "posix.system"), (_PlainObject(), "_PlainObject")])
def test_a_checkpoint_that_names_code_is_refused_as_such(tmp_path: Path, payload, named: str) -> None:
    """torch's weights-only unpickler refuses it; tvr used to call the file "truncated or corrupt?" and pass on
    torch's advice to load it with weights_only=False. It says what was refused, and never gives that advice."""
    path = tmp_path / "last.pt"
    torch.save({"format": "tvr-checkpoint", "version": 1, "model": {}, "x": payload}, path)
    with pytest.raises(PickleRefusedError, match=rf"^{path}: refused: its pickle names \S*{named}, code") as info:
        load_torch_file(path)
    with pytest.raises(CheckpointError) as checkpoint:
        read_checkpoint(path)
    result = CliRunner().invoke(
        app, ["import-checkpoint", str(path), "-c", "clip4clip/msrvtt", "-o", str(tmp_path / "o")]
    )
    for text in (str(info.value), str(checkpoint.value), result.output):
        flat = " ".join(text.split())
        assert "refused: its pickle names" in flat and named in flat, flat
        assert "weights_only" not in flat and "truncated or corrupt" not in flat and "trusted source" not in flat
    assert result.exit_code == 2 and not (tmp_path / "o").exists()
