"""``torch.save`` files from elsewhere, checked before ``torch.load(weights_only=True)`` reads them.

``weights_only`` limits what a pickle may *name* (tensors, numbers, strings, containers), not how much it may make
the loader allocate or how deep it may nest. :func:`load_torch_file` is the one way tvr reads a ``torch.save`` file
(checkpoints, resumes, feature-cache shards, released weights); before ``torch.load`` runs it checks

* a zip archive (``torch.save``'s format since torch 1.6; :func:`check_archive_members`, shared with the TorchScript
  reader): every member stored or deflated, none inflating more than :data:`MAX_INFLATION` times its compressed size
  beyond :data:`INFLATION_FLOOR` bytes (torch writes members uncompressed, so a deflated gigabyte hiding in a
  megabyte is a bomb, not a checkpoint), the small records (``byteorder``, ``.format_version``, …) small, the
  ``byteorder`` one of ``little`` / ``big``, the pickle ``data.pkl`` at most :data:`MAX_PICKLE_BYTES` and passing
  :func:`tvr.utils.pickle_scan.scan_pickle`; a TorchScript archive is refused here (tvr reads those as data only,
  through :mod:`tvr.models.backbones.clip.torchscript_reader`);
* an older, unzipped ``torch.save`` file: its five pickles (magic number, protocol, system info, the object, the
  storage keys) scanned in place through a memory map; a tar archive (torch 0.1) is refused;
* a model folder another library loads with ``torch.load`` (a HF CLIP folder's ``pytorch_model.bin``, a
  sentence-transformers folder): :func:`check_model_folder` checks its pickled weight files first;

and after it, that no tensor claims more elements than its storage holds (a stride-0 tensor of a few bytes can
otherwise stand for ``(40 000 000, 64)`` and make whatever is sized from it allocate gigabytes). Torch's own errors
are cut to their first line (a C++ error carries its backtrace).
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import re
import tarfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from tvr.utils.errors import UserError, first_line
from tvr.utils.io import describe_start
from tvr.utils.pickle_scan import MAX_NESTING, PickleRefusedError, scan_pickle

#: the pickle of a torch.save archive or a TorchScript module tree (a CLIP archive's is a few hundred kB)
MAX_PICKLE_BYTES = 64 << 20
#: how many times its compressed size a zip member may inflate to, beyond :data:`INFLATION_FLOOR` bytes
MAX_INFLATION = 16
INFLATION_FLOOR = 1 << 20
#: torch's small text records and the most bytes each may hold
SMALL_RECORDS = {
    "byteorder": 16,
    ".format_version": 64,
    ".storage_alignment": 64,
    "version": 64,
    ".data/version": 64,
    ".data/serialization_id": 256,
}
#: pickles at the start of an unzipped torch.save file: magic number, protocol, system info, object, storage keys
_LEGACY_PICKLES = 5


class TorchFileError(UserError, ValueError):
    """A file that is not a ``torch.save`` file, or one torch cannot read (truncated, damaged): ``detail`` says why,
    without the path, for a caller that words the message its own way."""

    def __init__(self, path: str | os.PathLike, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = Path(path)
        self.detail = detail


def archive_root(names: list[str]) -> str:
    """The folder every member of a torch zip archive sits in (``archive/`` for ``torch.save``)."""
    roots = {name.split("/", 1)[0] for name in names}
    return roots.pop() + "/" if len(roots) == 1 and all("/" in name for name in names) else ""


def check_archive_members(archive: zipfile.ZipFile, what: str, archive_bytes: int) -> None:
    """Refuse a torch or TorchScript zip whose members would inflate without bound (see the module docstring)."""
    root = archive_root(archive.namelist())
    total = 0
    for info in archive.infolist():
        name = info.filename
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise PickleRefusedError(
                what,
                f"member {name} is compressed with method {info.compress_type}; torch archives are stored or deflated",
            )
        if info.file_size > INFLATION_FLOOR and info.file_size > MAX_INFLATION * info.compress_size:
            raise PickleRefusedError(
                what,
                f"member {name} inflates from {info.compress_size:,} to {info.file_size:,} bytes; torch "
                f"writes its members uncompressed, and more than {MAX_INFLATION}x is refused as a decompression bomb",
            )
        limit = SMALL_RECORDS.get(name[len(root) :]) if name.startswith(root) else None
        if limit is not None and info.file_size > limit:
            raise PickleRefusedError(what, f"record {name} holds {info.file_size:,} bytes; at most {limit} expected")
        total += info.file_size
    if total > MAX_INFLATION * archive_bytes + INFLATION_FLOOR:
        raise PickleRefusedError(
            what, f"its members add up to {total:,} bytes, more than {MAX_INFLATION}x the {archive_bytes:,}-byte file"
        )
    byteorder = f"{root}byteorder"
    if byteorder in archive.namelist():
        value = archive.read(byteorder)
        if value not in (b"little", b"big"):
            raise PickleRefusedError(what, f"record {byteorder} is {value[:16]!r}; expected b'little' or b'big'")


def read_archive_pickle(archive: zipfile.ZipFile, member: str, what: str, max_depth: int = MAX_NESTING) -> bytes:
    """The bytes of the pickle ``member`` of a checked archive, once they pass :func:`scan_pickle`."""
    info = archive.getinfo(member)
    if info.file_size > MAX_PICKLE_BYTES:
        raise PickleRefusedError(
            what, f"its pickle {member} is {info.file_size:,} bytes; at most {MAX_PICKLE_BYTES >> 20} MiB expected"
        )
    data = archive.read(info)
    scan_pickle(data, f"{what} ({member})", max_depth=max_depth)
    return data


def _is_torchscript(names: list[str], root: str) -> bool:
    return any(name.startswith(f"{root}code/") for name in names) or f"{root}constants.pkl" in names


def check_torch_file(path: str | os.PathLike) -> None:
    """Refuse a file that ``torch.load(weights_only=True)`` should not be given (see the module docstring)."""
    path = Path(path)
    with open(path, "rb") as handle:
        _check_torch_stream(handle, os.fstat(handle.fileno()).st_size, path)


def _check_torch_stream(handle: BinaryIO, size: int, path: str | os.PathLike) -> None:
    """:func:`check_torch_file` on an open file (or bytes in memory) of ``size`` bytes; ``path`` names it."""
    head = handle.read(512)
    if head.startswith(b"PK\x03\x04"):  # how torch.load tells an archive (it never asks zipfile)
        try:
            archive = zipfile.ZipFile(handle)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise TorchFileError(path, f"a damaged zip archive ({first_line(exc)})") from None
        with archive:
            names = archive.namelist()
            root = archive_root(names)
            if _is_torchscript(names, root):
                raise PickleRefusedError(
                    str(path),
                    "a TorchScript archive, not a torch.save file; tvr reads TorchScript only as OpenAI "
                    "CLIP weights (model.clip: FILE.pt, tvr convert-openai), as data",
                )
            if f"{root}data.pkl" not in names:
                raise TorchFileError(path, f"a zip archive without {root}data.pkl; expected a torch.save file")
            check_archive_members(archive, str(path), size)
            read_archive_pickle(archive, f"{root}data.pkl", str(path))
        return
    handle.seek(0)
    if head[:1] != b"\x80":  # torch.save writes protocol 2 or later; anything else is not its file
        if tarfile.is_tarfile(handle):
            raise TorchFileError(path, "a tar archive (torch 0.1's format), which tvr does not read")
        raise TorchFileError(path, f"{describe_start(head)}; expected a torch.save file")
    handle.seek(0)
    # a file on disk is scanned through a memory map (never read whole); bytes in memory as they are
    with contextlib.ExitStack() as stack:
        if isinstance(handle, io.BytesIO):
            stream: Any = handle
        else:
            stream = stack.enter_context(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
        for number in range(_LEGACY_PICKLES):
            scan_pickle(stream, f"{path} (pickle {number + 1} of a torch.save file)")
            if stream.tell() >= size:
                break


#: weight files another library (transformers, sentence-transformers) would give to torch.load in a model folder
_FOLDER_WEIGHTS = ("*.bin", "*.pt", "*.pth")


def check_model_folder(folder: str | os.PathLike) -> None:
    """:func:`check_torch_file` on every pickled weight file in a model folder (and its sub-folders: a
    sentence-transformers model keeps modules there) before a library that calls ``torch.load`` itself reads it;
    safetensors files need no check (no pickle)."""
    folder = Path(folder)
    for pattern in _FOLDER_WEIGHTS:
        for path in sorted(folder.rglob(pattern)):
            if path.is_file():
                check_torch_file(path)


def check_tensor_extents(obj: Any, what: str) -> None:
    """Every tensor in ``obj`` (nested in dicts, lists, tuples) holds at most as many elements as its storage, else
    :class:`~tvr.utils.pickle_scan.PickleRefusedError`."""
    import torch

    pending = [obj]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, torch.Tensor) and item.layout == torch.strided and item.numel():
            elements = item.untyped_storage().nbytes() // max(1, item.element_size())
            if item.numel() > elements:
                raise PickleRefusedError(
                    what,
                    f"a tensor of shape {tuple(item.shape)} (stride {item.stride()}) stands on a storage of "
                    f"{elements} elements; every element of a saved tensor must be stored",
                )


#: what torch's weights-only unpickler names when it refuses a pickle: ``GLOBAL posix.system``
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def weights_only_refusal(message: str) -> str | None:
    """What ``torch.load(weights_only=True)`` refused in a file, in tvr's words, from torch's message; None when the
    message is not such a refusal. Torch's own advice (load with ``weights_only=False``, allow-list the global) is
    left out: tvr reads a checkpoint as data, and no file from elsewhere is worth running code for."""
    if not message.startswith("Weights only load failed"):
        return None
    refused = _REFUSED_GLOBAL.search(message)
    if refused:
        return (
            f"refused: its pickle names {refused.group(1)}, code (a function or class) where a checkpoint holds data "
            "only; tvr reads tensors, numbers, strings and containers, and nothing else from a file"
        )
    return "refused: its pickle holds something other than tensors, numbers, strings and containers"


def load_torch_file(path: str | os.PathLike, *, mmap: bool = False) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)`` of a file that passed
    :func:`check_torch_file`, its tensors checked by :func:`check_tensor_extents`. A file refused as unsafe (by the
    checks, or by the weights-only unpickler: a pickle naming a class or function) raises
    :class:`~tvr.utils.pickle_scan.PickleRefusedError` (its message names the file and the problem); one that is not
    a torch.save file or that torch cannot read, :class:`TorchFileError` (``detail``: the first line of torch's
    message, or what the file looks like)."""
    check_torch_file(path)
    return _load_checked(path, path, mmap)


def load_torch_bytes(data: bytes, what: str | os.PathLike) -> Any:
    """:func:`load_torch_file` of a file already read into memory (``what`` names it in messages): for a caller
    that checked the file on the descriptor it read it from, and must load those very bytes."""
    _check_torch_stream(io.BytesIO(data), len(data), what)
    return _load_checked(io.BytesIO(data), what, False)


def _load_checked(source: str | os.PathLike | BinaryIO, what: str | os.PathLike, mmap: bool) -> Any:
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns (with a source line) about files it then reads or refuses
            obj = torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, UnpicklingError, EOFError, MemoryError, …
        refusal = weights_only_refusal(str(exc))
        if refusal is not None:  # a pickle that names code: hostile or foreign, not damaged
            raise PickleRefusedError(str(what), refusal) from None
        raise TorchFileError(what, first_line(exc)) from exc
    check_tensor_extents(obj, str(what))
    return obj


def state_dict_differences(
    own: dict[str, Any], other: dict[str, Any], describe: Any
) -> tuple[list[str], list[str], list[str]]:
    """How a state dict ``other`` fails to fit ``own`` (a module's): (missing keys, unexpected keys, shape
    mismatches), each sorted; a mismatch is worded ``describe(key, other_shape, own_shape)``. Entries of ``other``
    that are not tensors have no shape to compare."""
    missing = sorted(set(own) - set(other))
    unexpected = sorted(set(other) - set(own))
    mismatched = [
        describe(k, tuple(other[k].shape), tuple(own[k].shape))
        for k in sorted(set(own) & set(other))
        if hasattr(other[k], "shape") and tuple(other[k].shape) != tuple(own[k].shape)
    ]
    return missing, unexpected, mismatched
