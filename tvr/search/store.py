"""Shards: the durable unit of an index's work, written atomically, read by positional reads.

A shard is a folder ``shards/<name>/`` holding, for the windows of the videos it covers:

* ``emb.npy`` — the head's shortlist embedding, float32 [n, E] (what FAISS indexes);
* ``state.npy`` — the head's rerank state (``head.rerank_state``) as one byte record per window, uint8
  [n, record_bytes]: every tensor field flattened at its own byte offset (float16 or float32 — a state's
  ``full_precision`` fields float32 either way —, masks in their integer dtype; widest items first, so every field
  is aligned), so one window's state is one contiguous run of bytes, read with one system call;
* ``meta.json`` — the state's dataclass (``module:qualname``), the record's size, every field's dtype, shape and
  byte offset, and per video its relative path, size, mtime (ns), duration, windows (start, end seconds) and its rows
  [first, last) in this shard.

The folder is filled under a temporary name and renamed into place, so a shard either exists complete or not at
all: a killed ``tvr index`` loses only the shard it was filling. Reading never imports anything a file names: the
state's class is looked up among modules already imported (the head's own module is, once the model is loaded), and
it must be a :class:`tvr.types.Sliceable` dataclass. A query's rows are read with ``preadv`` into one buffer, not
through a memory map: the shortlist's rows are scattered, and first touches of mapped pages made the latency's
tail several times its median (measured in docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tvr.utils.data_files import read_json
from tvr.utils.errors import UserError, reason
from tvr.utils.io import (
    atomic_write_json,
    check_regular_file,
    create_temporary_dir,
    fsync_path,
    naming_path,
    open_regular,
)

SHARDS = "shards"
META = "meta.json"
#: what a rerank-state field may be stored as (numbers only: a field described as "object" would turn bytes into
#: pointers)
FIELD_DTYPES = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8"})
EMB = "emb.npy"
STATE = "state.npy"
#: a record's size is a multiple of this, so every row starts aligned for every field
_ALIGN = 8

if TYPE_CHECKING:
    import torch
    from torch import Tensor


class IndexFormatError(UserError, ValueError):
    """An index folder's files are missing, damaged or of another format."""


def _to_numpy(x: Tensor, half: bool) -> np.ndarray:
    import torch

    x = x.detach().cpu()
    if x.is_floating_point():
        x = x.to(torch.float16 if half else torch.float32)
    elif x.dtype == torch.bool:
        x = x.to(torch.uint8)
    return np.ascontiguousarray(x.numpy())


def write_shard(folder: Path, name: str, emb: Tensor, state: Any, videos: list[dict[str, Any]], half: bool) -> Path:
    """Write one shard atomically as ``folder/name``; ``videos`` entries carry ``rows`` [first, last)."""
    import torch
    from torch import Tensor

    from tvr.types import Sliceable

    if not dataclasses.is_dataclass(state) or not isinstance(state, Sliceable):
        raise TypeError(f"rerank state: expected a Sliceable dataclass, got {type(state).__name__}")
    n = int(emb.shape[0])
    target = folder / name
    tmp = create_temporary_dir(target)
    try:
        np.save(tmp / EMB, np.ascontiguousarray(emb.detach().cpu().float().numpy()), allow_pickle=False)
        arrays: dict[str, np.ndarray] = {}
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(state):
            value = getattr(state, f.name)
            if not isinstance(value, Tensor):
                fields[f.name] = None
                continue
            array = _to_numpy(value, half and f.name not in state.full_precision)
            if array.shape[:1] != (n,):
                raise ValueError(f"rerank state field {f.name}: {tuple(array.shape)}, expected {n} rows")
            arrays[f.name] = array
            fields[f.name] = {"dtype": str(array.dtype), "shape": list(array.shape), "bool": value.dtype == torch.bool}
        offset = 0
        for name in sorted(arrays, key=lambda k: -arrays[k].dtype.itemsize):  # widest first: all aligned
            fields[name]["offset"] = offset
            offset += _row_bytes(fields[name])
        record = -(-offset // _ALIGN) * _ALIGN
        packed = np.zeros((n, record), dtype=np.uint8)
        for name, array in arrays.items():
            start = fields[name]["offset"]
            width = _row_bytes(fields[name])
            packed[:, start : start + width] = array.reshape(n, width // array.dtype.itemsize).view(np.uint8)
        if arrays:  # an indexable head stores no state
            np.save(tmp / STATE, packed, allow_pickle=False)
        cls = type(state)
        meta = {
            "rows": n,
            "record_bytes": record,
            "state_class": f"{cls.__module__}:{cls.__qualname__}",
            "fields": fields,
            "videos": videos,
        }
        atomic_write_json(tmp / META, meta)
        for entry in os.scandir(tmp):
            fsync_path(entry.path)
        os.replace(tmp, target)
    except BaseException as exc:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        named = naming_path(exc, target, tmp)  # a full disk names the shard, not a file of its temporary folder
        if named is exc:
            raise
        raise named from exc
    return target


def _row_bytes(info: dict[str, Any]) -> int:
    return math.prod(info["shape"][1:]) * np.dtype(info["dtype"]).itemsize


def read_meta(shard: Path) -> dict[str, Any]:
    try:
        meta = read_json(shard / META)
    except (OSError, ValueError) as exc:
        raise IndexFormatError(
            f"{shard / META}: unreadable shard description ({reason(exc)}); delete the shard folder to re-embed "
            "its videos"
        ) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("videos"), list) or "fields" not in meta:
        raise IndexFormatError(f"{shard / META}: not a tvr index shard")
    return meta


#: where the rerank-state classes of the built-in methods lived when an index named them (``meta.json`` records a
#: state's ``module:qualname``): the methods' folders moved from ``tvr.models.heads`` to ``tvr.methods`` (issue 50),
#: and an index written before still opens
MOVED_MODULES = {
    f"tvr.models.heads.{method}": f"tvr.methods.{method}" for method in ("clip4clip", "gare", "gravialign", "proxy")
}


def current_module_name(module_name: str) -> str:
    """``module_name`` as it is named today (a module of :data:`MOVED_MODULES` at its new path)."""
    for old, new in MOVED_MODULES.items():
        if module_name == old or module_name.startswith(f"{old}."):
            return new + module_name[len(old) :]
    return module_name


def state_class(name: str, fields: Any = None) -> type:
    """The rerank-state dataclass ``module:qualname``, among modules already imported only; with ``fields`` (a
    shard's field descriptions), its fields must be exactly those (another head's state is refused here, not when a
    query tries to score it)."""
    from tvr.types import Sliceable

    module_name, _, qualname = str(name).partition(":")
    module = sys.modules.get(current_module_name(module_name))
    cls: Any = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None) if cls is not None else None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and issubclass(cls, Sliceable)):
        raise IndexFormatError(
            f"the index stores rerank state of type {name!r}, which this model's head does not produce (was the "
            "index built with another head?)"
        )
    names = {f.name for f in dataclasses.fields(cls)}
    if fields is not None and (not isinstance(fields, dict) or set(fields) != names):
        stored = sorted(fields) if isinstance(fields, dict) else fields
        raise IndexFormatError(
            f"the index stores rerank state of type {name!r} with the fields {stored!r}, which that class does not "
            "have (was the index built with another head?)"
        )
    return cls


class _OpenFiles:
    """Read-only file handles shared by every :class:`RowFile`, at most ``limit`` open (least recently used closed
    first), so an index of thousands of shards stays within the process's file limit. Reads hold the lock: a
    handle is never closed under a read."""

    def __init__(self) -> None:
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            self.limit = max(32, soft // 4) if soft != resource.RLIM_INFINITY else 4096
        except (ImportError, OSError, ValueError):
            self.limit = 128
        self.lock = threading.RLock()
        self._files: OrderedDict[int, Any] = OrderedDict()  # id(RowFile) → handle

    def get(self, owner: RowFile) -> Any:
        key = id(owner)
        handle = self._files.get(key)
        if handle is not None:
            self._files.move_to_end(key)
            return handle
        handle = owner.open()
        self._files[key] = handle
        while len(self._files) > max(1, self.limit):
            self._files.popitem(last=False)[1].close()
        return handle

    def holds(self, owner: RowFile) -> bool:
        return id(owner) in self._files

    def forget(self, key: int) -> None:
        """Close the handle of a :class:`RowFile` that is gone (its finaliser: an index closed frees its files)."""
        with self.lock:
            handle = self._files.pop(key, None)
            if handle is not None:
                handle.close()


_FILES = _OpenFiles()
_PREADV = hasattr(os, "preadv")


class RowFile:
    """A 2-D C-ordered ``.npy`` file whose rows are read by position (``preadv``; seek + read where the platform
    has no positional read), never mapped and never unpickled."""

    def __init__(self, path: Path, rows: int, dtype: str, width: int) -> None:
        self.path = path
        self.identity: tuple[int, int, int] | None = None
        weakref.finalize(self, _FILES.forget, id(self))
        with _FILES.lock:
            fh = _FILES.get(self)
            try:
                fh.seek(0)
                version = np.lib.format.read_magic(fh)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                shape, fortran, stored = read_header(fh)
                self.offset = fh.tell()
            except (OSError, ValueError) as exc:
                raise IndexFormatError(f"{path}: unreadable ({reason(exc)}); {_REDO}") from None
        if stored.hasobject or str(stored) != dtype or fortran or tuple(shape) != (rows, width):
            raise IndexFormatError(
                f"{path}: {stored} {'Fortran' if fortran else 'C'}-ordered {tuple(shape)}, the shard says {dtype} "
                f"({rows}, {width}); {_REDO}"
            )
        self.dtype = np.dtype(dtype)
        self.width = width
        self.row_bytes = width * self.dtype.itemsize
        if self.offset + rows * self.row_bytes > self.identity[2]:
            raise IndexFormatError(f"{path}: truncated; {_REDO}")

    def open(self) -> Any:
        """A handle on the file, refused if it is not the file this reader was made from."""
        try:
            handle = open_regular(self.path)  # kept open by _FILES, closed on eviction
        except OSError as exc:
            raise IndexFormatError(f"{self.path}: unreadable ({reason(exc)}); {_REDO}") from None
        st = os.fstat(handle.fileno())
        identity = (st.st_dev, st.st_ino, st.st_size)
        if self.identity is None:
            self.identity = identity
        elif identity != self.identity:
            handle.close()
            raise IndexFormatError(f"{self.path} changed since the index was opened: open the index again")
        return handle

    def read_into(self, view: memoryview, row: int) -> None:
        """Rows from ``row`` on into ``view`` (a whole number of rows); the caller holds ``_FILES.lock``."""
        handle = _FILES.get(self)
        position = self.offset + row * self.row_bytes
        while len(view):  # a short read goes on from where it stopped
            if _PREADV:
                got = os.preadv(handle.fileno(), [view], position)
            else:
                handle.seek(position)
                got = handle.readinto(view)
            if not got:
                raise IndexFormatError(f"{self.path}: truncated; {_REDO}")
            view, position = view[got:], position + got


_REDO = "delete its shard folder to re-embed its videos"


class ShardReader:
    """One shard: its shortlist embedding memory-mapped (read-only), its rerank state read row by row."""

    def __init__(self, shard: Path, meta: dict[str, Any] | None = None) -> None:
        self.path = shard
        self.meta = meta if meta is not None else read_meta(shard)
        rows = self.meta.get("rows")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise IndexFormatError(f"{shard / META}: rows is {rows!r}; expected a count (delete the shard to re-embed)")
        self.rows = rows
        self.emb = self._load(shard / EMB)
        self.fields: dict[str, dict[str, Any] | None] = self.meta["fields"]
        self.state_file: RowFile | None = None
        try:
            record = int(self.meta.get("record_bytes", -1))
            described = [info for info in self.fields.values() if info is not None]
            for info in described:
                start = int(info["offset"])
                shape = info["shape"]
                if not (
                    info["dtype"] in FIELD_DTYPES
                    and isinstance(shape, list)
                    and shape[:1] == [self.rows]
                    and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
                    and 0 <= start
                    and start + _row_bytes(info) <= record
                    and start % np.dtype(info["dtype"]).itemsize == 0
                ):
                    raise ValueError(info)
        except (AttributeError, KeyError, TypeError, ValueError):
            raise IndexFormatError(
                f"{shard / META}: the rerank state is not described as this tvr stores it (an index of an older "
                "format?); build the index again"
            ) from None
        if described:
            if record % _ALIGN:
                raise IndexFormatError(f"{shard / META}: record_bytes {record} is not a multiple of {_ALIGN}")
            self.state_file = RowFile(shard / STATE, self.rows, "uint8", record)
        self.record = record
        self.unpackers: dict[Any, dict[str, Any]] = {}  # gather_state's, per dtype
        # what gather_state compares across shards: the same head stores the same fields the same way
        self.layout = json.dumps(
            [record, {k: v and {**v, "shape": v["shape"][1:]} for k, v in self.fields.items()}], sort_keys=True
        )

    def _load(self, path: Path) -> np.ndarray:
        try:
            array = np.load(check_regular_file(path), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise IndexFormatError(
                f"{path}: unreadable ({reason(exc)}); delete the shard folder {self.path} to re-embed its videos"
            ) from None
        if array.dtype != np.float32 or array.ndim != 2:
            raise IndexFormatError(
                f"{path}: {array.dtype} {array.shape}; a shortlist embedding is float32 [rows, dim]: delete the shard "
                f"folder {self.path} to re-embed its videos"
            )
        if array.shape[:1] != (self.rows,):
            raise IndexFormatError(f"{path}: {array.shape[0] if array.ndim else 0} rows, the shard says {self.rows}")
        return array

    def state(self, rows: np.ndarray, cls: type, dtype: torch.dtype | None = None) -> Any:
        """The rerank state of local ``rows`` as ``cls`` (see :func:`gather_state`)."""
        rows = np.asarray(rows, dtype=np.int64)
        return gather_state([self], np.zeros(len(rows), dtype=np.int64), rows, cls, dtype)


#: below this many items a widening cast is numpy's (about a microsecond a call); above it torch's, which converts
#: float16 with the CPU's vector instructions (numpy's loop takes ~10× longer on the frames of 100 windows)
_NUMPY_CAST_ITEMS = 1 << 15


def _unpackers(reader: ShardReader, dtype: Any) -> dict[str, Any]:
    """Per field of ``reader``'s layout, a function from gathered records [n, record] to that field's tensor (floating
    fields in ``dtype``; ``None``: as stored), contiguous and its own, for one copy each: the field descriptions are
    read once per reader and dtype, not once a query. A widening cast is exact, so where numpy does one its bits are
    torch's."""
    found = reader.unpackers.get(dtype)
    if found is None:
        found = reader.unpackers[dtype] = {name: _unpacker(info, dtype) for name, info in reader.fields.items()}
    return found


def _unpacker(info: dict[str, Any] | None, dtype: Any) -> Any:
    import torch

    if info is None:
        return lambda buf: None
    start = int(info["offset"])
    stop = start + _row_bytes(info)
    stored, shape = np.dtype(info["dtype"]), tuple(info["shape"][1:])
    items = math.prod(shape)

    def raw(buf: np.ndarray) -> np.ndarray:
        return buf[:, start:stop].view(stored).reshape(len(buf), *shape)

    if info.get("bool"):
        return lambda buf: torch.from_numpy(raw(buf).astype(bool))
    try:
        target = stored if dtype is None else np.dtype(str(dtype).removeprefix("torch."))
    except TypeError:  # a dtype numpy lacks (bfloat16): torch casts
        target = None
    if stored.kind != "f" or target == stored:
        return lambda buf: torch.from_numpy(np.ascontiguousarray(raw(buf)))
    widening = target is not None and target.kind == "f" and target.itemsize > stored.itemsize

    def cast(buf: np.ndarray) -> Any:
        if widening and len(buf) * items <= _NUMPY_CAST_ITEMS:
            return torch.from_numpy(raw(buf).astype(target))
        return torch.from_numpy(raw(buf)).to(dtype, memory_format=torch.contiguous_format)

    return cast


def gather_state(
    readers: list[ShardReader], shards: np.ndarray, rows: np.ndarray, cls: type, dtype: torch.dtype | None = None
) -> Any:
    """The rerank state of the rows (``shards[i]``, ``rows[i]``), in that order, as ``cls``: floating fields in
    ``dtype`` (default: as stored), every tensor contiguous and the caller's own. Records are read in (shard, row)
    order, one read per run of consecutive rows; passing them already in that order saves a reordering copy."""
    shards, rows = np.asarray(shards, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    n = len(rows)
    order = np.lexsort((rows, shards))
    in_order = bool(np.array_equal(order, np.arange(n)))
    s_shards, s_rows = (shards, rows) if in_order else (shards[order], rows[order])
    template = readers[int(s_shards[0])] if n else readers[0]
    buf = np.empty((n, template.record if template.state_file is not None else 0), dtype=np.uint8)
    if n and template.state_file is not None:
        first = np.ones(n, dtype=bool)
        first[1:] = (s_shards[1:] != s_shards[:-1]) | (s_rows[1:] != s_rows[:-1] + 1)
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], n)
        for k in np.unique(s_shards).tolist():
            reader = readers[k]
            if reader.layout != template.layout:
                raise IndexFormatError(f"{reader.path}: its rerank state is stored unlike {template.path}'s")
        lasts = s_rows[ends - 1]
        limits = np.array([readers[k].rows for k in s_shards[starts].tolist()])
        if int(s_rows.min()) < 0 or bool((lasts >= limits).any()):
            bad = int(np.flatnonzero((lasts >= limits) | (s_rows[starts] < 0))[0])
            raise IndexError(
                f"rows up to {lasts[bad]} of {readers[int(s_shards[starts[bad]])].path}, which has {limits[bad]}"
            )
        view = memoryview(buf).cast("B")
        rb = template.record
        run_shards = s_shards[starts].tolist()
        with _FILES.lock:
            files = {k: readers[k].state_file for k in set(run_shards)}
            # the common case inline, on descriptors that stay open through the loop (no more files than the
            # handle cache keeps); short reads, platforms without preadv and wider gathers go the long way
            inline = _PREADV and len(files) <= _FILES.limit
            fds = {k: _FILES.get(f).fileno() for k, f in files.items()} if inline else {}
            for a, b, k, row in zip(starts.tolist(), ends.tolist(), run_shards, s_rows[starts].tolist(), strict=True):
                segment = view[a * rb : b * rb]
                if not inline or os.preadv(fds[k], [segment], files[k].offset + row * rb) != len(segment):
                    files[k].read_into(segment, row)
    if not in_order:
        buf = buf[np.argsort(order)]
    values = {name: unpack(buf) for name, unpack in _unpackers(template, dtype).items()}
    return cls(**values)
