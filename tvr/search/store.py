"""Shards: the durable unit of an index's work, written atomically, read by positional reads.

A shard is a folder ``shards/<name>/`` holding, for the windows of the videos it covers:

* ``emb.npy`` — the head's shortlist embedding, float32 [n, E] (what FAISS indexes);
* ``state.<dtype>.npy`` — the head's rerank state (``head.rerank_state``) packed as one record per window: every
  tensor field of one stored dtype (float16 or float32, with the state's ``full_precision`` fields float32 either
  way; masks keep their integer dtype) flattened side by side,
  [n, width] — so one window's state is one contiguous run of bytes, read with one system call;
* ``meta.json`` — the state's dataclass (``module:qualname``), every field's dtype, shape, array and column
  offset, and per video its relative path, size, mtime (ns), duration, windows (start, end seconds) and its rows
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
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tvr.types import Sliceable
from tvr.utils.errors import UserError
from tvr.utils.io import atomic_write_json, create_temporary_dir, fsync_path

SHARDS = "shards"
META = "meta.json"
EMB = "emb.npy"
STATE_PREFIX = "state."


class IndexFormatError(UserError, ValueError):
    """An index folder's files are missing, damaged or of another format."""


def _to_numpy(x: Tensor, half: bool) -> np.ndarray:
    x = x.detach().cpu()
    if x.is_floating_point():
        x = x.to(torch.float16 if half else torch.float32)
    elif x.dtype == torch.bool:
        x = x.to(torch.uint8)
    return np.ascontiguousarray(x.numpy())


def write_shard(folder: Path, name: str, emb: Tensor, state: Any, videos: list[dict[str, Any]], half: bool) -> Path:
    """Write one shard atomically as ``folder/name``; ``videos`` entries carry ``rows`` [first, last)."""
    if not dataclasses.is_dataclass(state) or not isinstance(state, Sliceable):
        raise TypeError(f"rerank state: expected a Sliceable dataclass, got {type(state).__name__}")
    n = int(emb.shape[0])
    target = folder / name
    tmp = create_temporary_dir(target)
    try:
        np.save(tmp / EMB, np.ascontiguousarray(emb.detach().cpu().float().numpy()), allow_pickle=False)
        fields: dict[str, Any] = {}
        columns: dict[str, list[np.ndarray]] = {}
        for f in dataclasses.fields(state):
            value = getattr(state, f.name)
            if not isinstance(value, Tensor):
                fields[f.name] = None
                continue
            array = _to_numpy(value, half and f.name not in state.full_precision)
            if array.shape[:1] != (n,):
                raise ValueError(f"rerank state field {f.name}: {tuple(array.shape)}, expected {n} rows")
            file = f"{STATE_PREFIX}{array.dtype}.npy"
            parts = columns.setdefault(file, [])
            fields[f.name] = {
                "dtype": str(array.dtype),
                "shape": list(array.shape),
                "bool": value.dtype == torch.bool,
                "array": file,
                "offset": sum(p.shape[1] for p in parts),
            }
            parts.append(array.reshape(n, math.prod(array.shape[1:])))
        for file, parts in columns.items():
            np.save(tmp / file, np.concatenate(parts, axis=1), allow_pickle=False)
        cls = type(state)
        meta = {
            "rows": n,
            "state_class": f"{cls.__module__}:{cls.__qualname__}",
            "fields": fields,
            "videos": videos,
        }
        atomic_write_json(tmp / META, meta)
        for entry in os.scandir(tmp):
            fsync_path(entry.path)
        os.replace(tmp, target)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def read_meta(shard: Path) -> dict[str, Any]:
    try:
        meta = json.loads((shard / META).read_text())
    except (OSError, ValueError) as exc:
        raise IndexFormatError(
            f"{shard / META}: unreadable shard description ({exc}); delete the shard folder to re-embed its videos"
        ) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("videos"), list) or "fields" not in meta:
        raise IndexFormatError(f"{shard / META}: not a tvr index shard")
    return meta


def state_class(name: str) -> type:
    """The rerank-state dataclass ``module:qualname``, among modules already imported only."""
    module_name, _, qualname = str(name).partition(":")
    module = sys.modules.get(module_name)
    cls: Any = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None) if cls is not None else None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and issubclass(cls, Sliceable)):
        raise IndexFormatError(
            f"the index stores rerank state of type {name!r}, which this model's head does not produce (was the "
            "index built with another head?)"
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
        self._files: OrderedDict[RowFile, Any] = OrderedDict()

    def get(self, owner: RowFile) -> Any:
        handle = self._files.get(owner)
        if handle is not None:
            self._files.move_to_end(owner)
            return handle
        handle = owner.open()
        self._files[owner] = handle
        while len(self._files) > max(1, self.limit):
            self._files.popitem(last=False)[1].close()
        return handle


_FILES = _OpenFiles()
_PREADV = hasattr(os, "preadv")


class RowFile:
    """A 2-D C-ordered ``.npy`` file whose rows are read by position (``preadv``; seek + read where the platform
    has no positional read), never mapped and never unpickled."""

    def __init__(self, path: Path, rows: int, dtype: str, width: int) -> None:
        self.path = path
        self.identity: tuple[int, int, int] | None = None
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
                raise IndexFormatError(f"{path}: unreadable ({exc}); {_REDO}") from None
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
            handle = open(self.path, "rb", buffering=0)  # noqa: SIM115 (kept open by _FILES, closed on eviction)
        except OSError as exc:
            raise IndexFormatError(f"{self.path}: unreadable ({exc}); {_REDO}") from None
        st = os.fstat(handle.fileno())
        identity = (st.st_dev, st.st_ino, st.st_size)
        if self.identity is None:
            self.identity = identity
        elif identity != self.identity:
            handle.close()
            raise IndexFormatError(f"{self.path} changed since the index was opened: open the index again")
        return handle

    def read(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Rows ``rows`` (ascending) into ``out`` [len(rows), width] (C-contiguous): one read per run of
        consecutive rows."""
        if not len(rows):
            return
        view = memoryview(out).cast("B")
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = [0, *breaks.tolist()]
        ends = [*breaks.tolist(), len(rows)]
        first = rows[starts].tolist()
        rb = self.row_bytes
        with _FILES.lock:
            handle = _FILES.get(self)
            for a, b, row in zip(starts, ends, first, strict=True):
                self._read_exactly(handle, view[a * rb : b * rb], self.offset + row * rb)

    def _read_exactly(self, handle: Any, view: memoryview, position: int) -> None:
        while len(view):
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
        self.rows = int(self.meta["rows"])
        self.emb = self._load(shard / EMB)
        self.arrays: dict[str, RowFile] = {}
        widths: dict[str, tuple[str, int]] = {}
        try:
            for name, info in self.meta["fields"].items():
                if info is None:
                    continue
                dtype, width = widths.get(info["array"], (info["dtype"], 0))
                end = int(info["offset"]) + math.prod(info["shape"][1:])
                if info["dtype"] != dtype or "/" in info["array"] or not info["array"].startswith(STATE_PREFIX):
                    raise ValueError(name)
                widths[info["array"]] = (dtype, max(width, end))
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(
                f"{shard / META}: field {exc} is not described as this tvr stores it (an index of an older format?); "
                "build the index again"
            ) from None
        for file, (dtype, width) in widths.items():
            self.arrays[file] = RowFile(shard / file, self.rows, dtype, width)
        # what gather_state compares across shards: the same head stores the same fields the same way
        self.layout = json.dumps(
            {k: v and {**v, "shape": v["shape"][1:]} for k, v in self.meta["fields"].items()}, sort_keys=True
        )

    def _load(self, path: Path) -> np.ndarray:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise IndexFormatError(
                f"{path}: unreadable ({exc}); delete the shard folder {self.path} to re-embed its videos"
            ) from None
        if array.shape[:1] != (self.rows,):
            raise IndexFormatError(f"{path}: {array.shape[0] if array.ndim else 0} rows, the shard says {self.rows}")
        return array

    def state(self, rows: np.ndarray, cls: type, dtype: torch.dtype | None = None) -> Any:
        """The rerank state of local ``rows`` as ``cls`` (see :func:`gather_state`)."""
        rows = np.asarray(rows, dtype=np.int64)
        return gather_state([self], np.zeros(len(rows), dtype=np.int64), rows, cls, dtype)


def gather_state(
    readers: list[ShardReader], shards: np.ndarray, rows: np.ndarray, cls: type, dtype: torch.dtype | None = None
) -> Any:
    """The rerank state of the rows (``shards[i]``, ``rows[i]``), in that order, as ``cls``: floating fields in
    ``dtype`` (default: as stored), every tensor contiguous and the caller's own. Rows are read in (shard, row)
    order, one read per run of consecutive rows; passing them already in that order saves a reordering copy."""
    shards, rows = np.asarray(shards, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    n = len(rows)
    order = np.lexsort((rows, shards))
    in_order = bool(np.array_equal(order, np.arange(n)))
    s_shards, s_rows = (shards, rows) if in_order else (shards[order], rows[order])
    cut = [0, *(np.flatnonzero(np.diff(s_shards)) + 1).tolist(), n]
    groups = [(readers[int(s_shards[a])], a, b) for a, b in zip(cut[:-1], cut[1:], strict=True) if a < b]
    template = groups[0][0] if groups else readers[0]
    for reader, a, b in groups:
        if reader.layout != template.layout:
            raise IndexFormatError(f"{reader.path}: its rerank state is stored unlike {template.path}'s")
        if s_rows[a] < 0 or s_rows[b - 1] >= reader.rows:
            raise IndexError(f"rows {s_rows[a]}..{s_rows[b - 1]} of {reader.path}, which has {reader.rows}")
    buffers = {}
    for file, spec in template.arrays.items():
        buf = np.empty((n, spec.width), dtype=spec.dtype)
        for reader, a, b in groups:
            reader.arrays[file].read(s_rows[a:b], buf[a:b])
        buffers[file] = torch.from_numpy(buf if in_order else buf[np.argsort(order)])
    values: dict[str, Any] = {}
    for name, info in template.meta["fields"].items():
        if info is None:
            values[name] = None
            continue
        shape = info["shape"][1:]
        offset = int(info["offset"])
        part = buffers[info["array"]][:, offset : offset + math.prod(shape)].reshape(n, *shape)
        if info.get("bool"):
            part = part.bool()
        elif dtype is not None and part.is_floating_point():
            part = part.to(dtype, memory_format=torch.contiguous_format)
        values[name] = part.contiguous()
    return cls(**values)
