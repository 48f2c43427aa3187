"""Shards: the durable unit of an index's work, written atomically, read memory-mapped.

A shard is a folder ``shards/<name>/`` holding, for the windows of the videos it covers:

* ``emb.npy`` — the head's shortlist embedding, float32 [n, E] (what FAISS indexes);
* ``state.<field>.npy`` — every tensor field of the head's rerank state (``head.rerank_state``), float16 or
  float32 [n, ...] (masks keep their integer dtype);
* ``meta.json`` — the state's dataclass (``module:qualname``) and fields, and per video its relative path, size,
  mtime (ns), duration, windows (start, end seconds) and its rows [first, last) in this shard.

The folder is filled under a temporary name and renamed into place, so a shard either exists complete or not at
all: a killed ``tvr index`` loses only the shard it was filling. Reading never imports anything a file names: the
state's class is looked up among modules already imported (the head's own module is, once the model is loaded), and
it must be a :class:`tvr.types.Sliceable` dataclass.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
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
    target = folder / name
    tmp = create_temporary_dir(target)
    try:
        np.save(tmp / EMB, np.ascontiguousarray(emb.detach().cpu().float().numpy()), allow_pickle=False)
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(state):
            value = getattr(state, f.name)
            if isinstance(value, Tensor):
                array = _to_numpy(value, half)
                np.save(tmp / f"{STATE_PREFIX}{f.name}.npy", array, allow_pickle=False)
                fields[f.name] = {
                    "dtype": str(array.dtype),
                    "shape": list(array.shape),
                    "bool": value.dtype == torch.bool,
                }
            else:
                fields[f.name] = None
        cls = type(state)
        meta = {
            "rows": int(emb.shape[0]),
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


class ShardReader:
    """The arrays of one shard, memory-mapped (read-only)."""

    def __init__(self, shard: Path, meta: dict[str, Any] | None = None) -> None:
        self.path = shard
        self.meta = meta if meta is not None else read_meta(shard)
        self.rows = int(self.meta["rows"])
        self.emb = self._load(shard / EMB)
        self.fields: dict[str, np.ndarray | None] = {}
        for name, info in self.meta["fields"].items():
            self.fields[name] = None if info is None else self._load(shard / f"{STATE_PREFIX}{name}.npy")

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

    def state(self, rows: np.ndarray, cls: type) -> Any:
        """The rerank state of local ``rows`` as ``cls`` (tensors copied out of the mapping, stored dtype)."""
        values = {}
        for name, array in self.fields.items():
            if array is None:
                values[name] = None
                continue
            part = torch.from_numpy(np.ascontiguousarray(array[rows]))
            if self.meta["fields"][name].get("bool"):
                part = part.bool()
            values[name] = part
        return cls(**values)


def gather_state(readers: list[ShardReader], shards: np.ndarray, rows: np.ndarray, cls: type) -> Any:
    """The rerank state of the rows (``shards[i]``, ``rows[i]``), in that order, as ``cls``. Each field is filled
    shard by shard into one array, each shard's rows read from its mapping in ascending order (one fancy-indexed
    read): no per-shard objects, no concatenation and no reordering copy, which at K = 100 candidates spread over
    tens of shards cost more than the reads themselves."""
    shards, rows = np.asarray(shards), np.asarray(rows)
    groups = []
    for k in np.unique(shards):
        sel = np.nonzero(shards == k)[0]
        sel = sel[np.argsort(rows[sel], kind="stable")]
        groups.append((readers[int(k)], sel, rows[sel]))
    template = groups[0][0] if groups else readers[0]
    values: dict[str, Any] = {}
    for name, info in template.meta["fields"].items():
        if info is None:
            values[name] = None
            continue
        like = template.fields[name]
        out = np.empty((len(rows), *like.shape[1:]), dtype=like.dtype)
        for reader, sel, local in groups:
            out[sel] = reader.fields[name][local]
        part = torch.from_numpy(out)
        values[name] = part.bool() if info.get("bool") else part
    return cls(**values)
