"""Read the parameters and buffers of a TorchScript archive without running any of it.

``torch.jit.load`` compiles and runs code from the file: a module's compiled ``__setstate__`` runs while the archive
loads, and it can write any bytes to any path (``torch.from_file(path, shared=True)``). OpenAI published CLIP as
TorchScript archives, so tvr reads them as data instead. An archive is a zip file:

* ``<root>/data.pkl``: a pickle of the module tree, each module an object of a class ``__torch__.<…>.<Name>``
  whose state is a dict of attributes (tensors, plain values, submodules). Tensors are
  ``torch._utils._rebuild_tensor_v2`` calls over storages named by persistent ids
  ``("storage", torch.<Type>Storage, key, location, numel)``;
* ``<root>/data/<key>``: each storage's raw bytes (little-endian);
* ``<root>/code/__torch__/…/<module>.py``: the class definitions, which list each class's ``__parameters__`` and
  ``__buffers__``.

The zip's members are checked before anything is read (:func:`tvr.utils.torch_files.check_archive_members`: no
member inflating far beyond its compressed size, small records small), and the pickle passes the bounded pre-scan
of :mod:`tvr.utils.pickle_scan` (nesting depth, memo indices) before an unpickler that knows a handful of names
(the tensor rebuild functions, storage types, ``collections.OrderedDict``, TorchScript's list/type-tag helpers)
reads it, turning every ``__torch__`` class into an inert record of its state; anything else is refused. A tensor
may not hold more elements than its storage (a stride-0 tensor of one stored value could otherwise stand for a
``(40 000 000, 64)`` embedding, and the model built from its shape for gigabytes). Class definitions are read as
text with a regular expression (the parameter and buffer name lists), never compiled. The result is what
``torch.jit.load(path).state_dict()`` returns: every module's parameters and buffers under their dotted names.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tvr.utils.errors import UserError, first_line
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import check_archive_members, read_archive_pickle

#: storage class name in the pickle -> element type
STORAGE_DTYPES = {
    "HalfStorage": torch.float16,
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}
MAX_CODE_BYTES = 64 << 20
_CLASS = re.compile(r"^class (\w+)\((\w+)\):\n((?:[ \t]+\S.*\n|[ \t]*\n)*)", re.MULTILINE)
_NAME_LIST = r"^[ \t]+{}[ \t]*=[ \t]*\[([^\]]*)\]"


class TorchScriptArchiveError(UserError, ValueError):
    """The file is not a TorchScript archive of the layout read here, or its contents do not fit together."""


def archive_root(names: list[str]) -> str | None:
    """The root folder of a TorchScript archive's members (``<root>/data.pkl`` next to ``<root>/code/``), or None
    when the zip's members are not laid out that way (e.g. a ``torch.save`` file, which has no ``code/``)."""
    roots = {n.split("/", 1)[0] for n in names if n.count("/") == 1 and n.endswith("/data.pkl")}
    for root in sorted(roots):
        if any(n.startswith(f"{root}/code/") for n in names) or f"{root}/constants.pkl" in names:
            return root
    return None


def is_torchscript_archive(path: str | os.PathLike) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive_root(archive.namelist()) is not None
    except (zipfile.BadZipFile, OSError):
        return False


class _ScriptObject:
    """An object of a TorchScript class, as data: its qualified class name and the state it was pickled with.
    Loading sets the state (``__setstate__`` here only records it); no method of the archive's class runs."""

    qualified = ""

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = STORAGE_DTYPES[name]


def _identity(value: Any, *_: Any) -> Any:
    return value


def _check_dims(values: Any, what: str) -> tuple[int, ...]:
    if not isinstance(values, tuple) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise TorchScriptArchiveError(f"a tensor's {what} is {values!r}; expected a tuple of non-negative integers")
    return values


def _rebuild_tensor(storage: Tensor, offset: int, size: Any, stride: Any, *_: Any) -> Tensor:
    """``torch._utils._rebuild_tensor_v2`` over a storage read from the zip, with every index checked."""
    size, stride = _check_dims(size, "size"), _check_dims(stride, "stride")
    if not isinstance(storage, Tensor) or not isinstance(offset, int) or offset < 0 or len(size) != len(stride):
        raise TorchScriptArchiveError("a tensor's storage, offset, size or stride is malformed")
    numel = math.prod(size)
    if numel == 0:
        return storage.new_empty(size)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= storage.numel():
        raise TorchScriptArchiveError(
            f"a tensor of size {size} (stride {stride}, offset {offset}) reaches past its storage of "
            f"{storage.numel()} elements"
        )
    if numel > storage.numel():  # within the storage's extent only by repeating elements (a stride of 0)
        raise TorchScriptArchiveError(
            f"a tensor of size {size} (stride {stride}) has more elements than its storage of {storage.numel()}; "
            "every element of a saved tensor must be stored"
        )
    return storage.as_strided(size, stride, offset)


class _Unpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` knowing only the names a module tree needs (see the module docstring)."""

    _ALLOWED: dict[tuple[str, str], Callable[..., Any] | type] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _identity,
        ("collections", "OrderedDict"): OrderedDict,
        **{
            ("torch.jit._pickle", name): _identity
            for name in (
                "build_intlist",
                "build_doublelist",
                "build_boollist",
                "build_tensorlist",
                "build_genericlist",
                "restore_type_tag",
            )
        },
    }

    def __init__(self, data: bytes, read_storage: Callable[[str, _StorageType, int], Tensor]) -> None:
        super().__init__(io.BytesIO(data))
        self._read_storage = read_storage
        self._classes: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            qualified = f"{module}.{name}"
            if qualified not in self._classes:
                self._classes[qualified] = type("ScriptObject", (_ScriptObject,), {"qualified": qualified})
            return self._classes[qualified]
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise TorchScriptArchiveError(
                f"the archive's pickle refers to {module}.{name}, which a module tree of "
                "parameters does not need; refusing to load it"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageType)
            and isinstance(pid[2], str)
            and isinstance(pid[4], int)
        ):
            raise TorchScriptArchiveError(f"unknown persistent id {pid!r:.80} in the archive's pickle")
        return self._read_storage(pid[2], pid[1], pid[4])


def _class_definitions(archive: zipfile.ZipFile, root: str) -> dict[str, tuple[bool, list[str], list[str]]]:
    """Qualified class name -> (is a Module, parameter names, buffer names), read from the ``code/`` files."""
    classes: dict[str, tuple[bool, list[str], list[str]]] = {}
    prefix = f"{root}/code/"
    total = 0
    for info in archive.infolist():
        if not (info.filename.startswith(prefix) and info.filename.endswith(".py")):
            continue
        total += info.file_size
        if total > MAX_CODE_BYTES:
            raise TorchScriptArchiveError(f"the archive's class definitions exceed {MAX_CODE_BYTES >> 20} MB")
        module = info.filename[len(prefix) : -len(".py")].replace("/", ".")
        text = archive.read(info).decode("utf-8", errors="replace")
        if not text.endswith("\n"):
            text += "\n"
        for match in _CLASS.finditer(text):
            name, base, body = match.groups()
            lists = []
            for field in ("__parameters__", "__buffers__"):
                found = re.search(_NAME_LIST.format(field), body, re.MULTILINE)
                lists.append(re.findall(r'"([^"]*)"', found.group(1)) if found else [])
            classes[f"{module}.{name}"] = (base == "Module", lists[0], lists[1])
    return classes


def read_torchscript_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """The parameters and buffers of the TorchScript archive at ``path`` (``torch.jit.load(path).state_dict()``
    without running the archive's code); raises :class:`TorchScriptArchiveError` naming what does not fit."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise TorchScriptArchiveError(f"{path}: not a zip archive ({exc}), so not a TorchScript file") from None
    try:
        with archive:
            return _read_archive(archive, path)
    except TorchScriptArchiveError as exc:  # raised below without the path: named once, here
        raise TorchScriptArchiveError(f"{path}: {exc}") from None
    except PickleRefusedError as exc:
        raise TorchScriptArchiveError(str(exc)) from None


def _read_archive(archive: zipfile.ZipFile, path: Path) -> dict[str, Tensor]:
    names = archive.namelist()
    root = archive_root(names)
    if root is None:
        raise TorchScriptArchiveError("a zip file without TorchScript's <root>/data.pkl and code/")
    check_archive_members(archive, str(path), path.stat().st_size)
    byteorder = archive.read(f"{root}/byteorder").decode() if f"{root}/byteorder" in names else "little"
    if byteorder != "little":
        raise TorchScriptArchiveError(f"stored {byteorder}-endian; only little-endian archives are read")
    storages: dict[str, Tensor] = {}

    def read_storage(key: str, kind: _StorageType, numel: int) -> Tensor:
        if key in storages:
            return storages[key]
        member = f"{root}/data/{key}"
        itemsize = torch.empty((), dtype=kind.dtype).element_size()
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise TorchScriptArchiveError(f"storage {key!r} is referenced but not in the archive") from None
        if numel < 0 or info.file_size != numel * itemsize:
            raise TorchScriptArchiveError(
                f"storage {key!r} holds {info.file_size} bytes, not {numel} {kind.name} elements"
            )
        raw = bytearray(archive.read(info))
        storages[key] = torch.frombuffer(raw, dtype=kind.dtype) if raw else torch.empty(0, dtype=kind.dtype)
        return storages[key]

    data = read_archive_pickle(archive, f"{root}/data.pkl", str(path))
    try:
        tree = _Unpickler(data, read_storage).load()
    except TorchScriptArchiveError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed pickle raises anything; name the file
        raise TorchScriptArchiveError(f"the archive's module pickle is unreadable ({first_line(exc)})") from None
    classes = _class_definitions(archive, root)
    if not isinstance(tree, _ScriptObject):
        raise TorchScriptArchiveError(f"the archive holds a {type(tree).__name__}, not a scripted module")
    out: dict[str, Tensor] = {}
    _collect(tree, "", classes, out, set())
    return out


def _collect(
    obj: _ScriptObject,
    prefix: str,
    classes: dict[str, tuple[bool, list[str], list[str]]],
    out: dict[str, Tensor],
    active: set[int],
) -> None:
    if id(obj) in active:
        raise TorchScriptArchiveError(f"module {prefix.rstrip('.') or '<root>'} contains itself")
    definition = classes.get(obj.qualified)
    if definition is None:
        raise TorchScriptArchiveError(f"no definition of class {obj.qualified} in the archive's code/")
    state = getattr(obj, "state", None)
    if not isinstance(state, dict):
        raise TorchScriptArchiveError(
            f"module {prefix.rstrip('.') or '<root>'} ({obj.qualified}) was saved with a custom state, not "
            "its attributes; its weights cannot be read as data"
        )
    active.add(id(obj))
    _, parameters, buffers = definition
    for name in parameters + buffers:
        value = state.get(name)
        if value is None:  # an optional parameter left unset (e.g. a Linear without bias)
            continue
        if not isinstance(value, Tensor):
            raise TorchScriptArchiveError(f"{prefix}{name} is a {type(value).__name__}, not a tensor")
        out[prefix + name] = value
    for name, value in state.items():
        if isinstance(value, _ScriptObject) and classes.get(value.qualified, (False,))[0]:
            _collect(value, f"{prefix}{name}.", classes, out, active)
    active.discard(id(obj))
