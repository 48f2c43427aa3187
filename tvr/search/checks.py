"""What opening an index checks, so a damaged or tampered index folder is refused in one line when it is opened,
never by a traceback (or a wrong answer) at query time.

An index folder may come from elsewhere, and every file in it is data: ``manifest.json`` must have the shape
``tvr index`` writes (types, a consistent row count per video, shard names that are plain folder names, video paths
that stay inside the indexed folder); the row tables must be integer / float arrays of the manifest's length whose
every value points at a shard, a row inside that shard and a video of the manifest (``table_video = -1`` would
otherwise name the last video); every file is opened only if it is a regular file (a FIFO in a file's place would
block the reader forever); ``ann.faiss`` is read by FAISS with its errors reported in a line, and must hold the
manifest's rows at the embeddings' width.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from pathlib import Path
from typing import Any

import numpy as np

from tvr.search.defaults import ANN_KINDS, HNSW_STORAGES
from tvr.search.store import IndexFormatError
from tvr.utils.data_files import read_json
from tvr.utils.errors import UserError, first_line, reason
from tvr.utils.io import check_regular_file, json_kind, why_not_regular_file

#: rows checked per pass over the tables (bounds the temporary arrays of the range checks)
CHUNK = 1 << 20
#: the ANN kinds an index may record: those ``--ann`` takes but "auto", which is resolved at build time
BUILT_ANN_KINDS = tuple(kind for kind in ANN_KINDS if kind != "auto")


def read_index_json(path: Path, hint: str) -> Any:
    """A JSON file of the index (a regular file only); ``hint`` says what to do when it is damaged."""
    try:
        return read_json(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise IndexFormatError(f"{path}: unreadable ({reason(exc)}); {hint}") from None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def is_relative_path(value: Any) -> bool:
    """A POSIX path that stays where it is put: relative, no ``..``, no empty or NUL parts."""
    if not isinstance(value, str) or not value or "\0" in value or value.startswith("/"):
        return False
    parts = value.split("/")
    return all(part not in ("", ".", "..") for part in parts) and posixpath.normpath(value) == value


def check_manifest(manifest: Any, path: Path) -> None:
    """Refuse a manifest that is not what ``tvr index`` writes (see the module docstring)."""

    def refuse(problem: str) -> IndexFormatError:
        return IndexFormatError(f"{path}: {problem}; not a manifest tvr index wrote (build the index again)")

    if not isinstance(manifest, dict):
        raise refuse(f"the file is {json_kind(manifest)}, not an object")
    for key, ok, expected in (
        ("rows", _count, "a count"),
        ("window", _positive_number, "a positive number of seconds"),
        ("stride", _positive_number, "a positive number of seconds"),
        ("shards", lambda v: isinstance(v, list), "a list of shard names"),
        ("videos", lambda v: isinstance(v, list), "a list of videos"),
        ("model", lambda v: isinstance(v, dict), "an object (the model stamp)"),
        ("source", lambda v: isinstance(v, dict) and isinstance(v.get("root"), str), "an object with a root"),
        ("ann", lambda v: v is None or (isinstance(v, dict) and v.get("kind") in BUILT_ANN_KINDS), "null or an object"),
    ):
        if not ok(manifest.get(key)):
            got = json_kind(manifest[key]) if key in manifest else "missing"
            raise refuse(f"{key!r} is {got}; expected {expected}")
    shards = manifest["shards"]
    if not all(isinstance(s, str) and is_relative_path(s) and "/" not in s for s in shards) or len(set(shards)) != len(
        shards
    ):
        raise refuse("'shards' must name distinct shard folders (plain names)")
    if (manifest["ann"] is None) != (manifest["rows"] == 0):
        raise refuse("'ann' must describe the shortlist index exactly when there are rows")
    storage = (manifest["ann"] or {}).get("storage") or "float32"  # absent before issue 35 item 7: float32
    if storage not in HNSW_STORAGES:
        raise IndexFormatError(
            f"{path}: 'ann.storage' is {str(storage)[:40]!r}, which this tvr cannot read (it reads "
            f"{' | '.join(HNSW_STORAGES)}): update tvr, or build the index again"
        )
    first = 0
    names = set()
    for number, entry in enumerate(manifest["videos"]):
        if not isinstance(entry, dict):
            raise refuse(f"videos[{number}] is {json_kind(entry)}, not an object")
        video = entry.get("video")
        if not is_relative_path(video):
            raise refuse(f"videos[{number}].video = {str(video)[:80]!r} is not a path inside the indexed folder")
        if video in names:
            raise refuse(f"videos[{number}].video = {video!r} is listed twice")
        names.add(video)
        for key in ("size", "mtime_ns", "first_row", "windows"):
            if not isinstance(entry.get(key), int) or isinstance(entry.get(key), bool):
                raise refuse(f"videos[{number}].{key} is {json_kind(entry.get(key))}; expected an integer")
        if entry["first_row"] != first or entry["windows"] < 0 or entry["size"] < 0:
            raise refuse(f"videos[{number}] ({video}): its rows do not follow the previous video's")
        first += entry["windows"]
    if first != manifest["rows"]:
        raise refuse(f"the videos hold {first} rows, the manifest says {manifest['rows']}")


def load_tables(index: Path, names: tuple[str, ...], rows: int) -> list[np.ndarray]:
    """The row tables, memory-mapped: shard, row and video numbers as integers, (start, end) times as floats."""
    tables = []
    for number, name in enumerate(names):
        path = index / name
        try:
            table = np.load(check_regular_file(path), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{path}: unreadable ({reason(exc)}); build the index again") from None
        times = number == len(names) - 1
        shape = (rows, 2) if times else (rows,)
        kind = "f" if times else "iu"
        if table.dtype.kind not in kind or table.shape != shape:
            raise IndexFormatError(
                f"{path}: {table.dtype} {table.shape}; expected {'float' if times else 'integer'} {shape} (the "
                "manifest's rows); build the index again"
            )
        tables.append(table)
    return tables


def check_tables(index: Path, tables: list[np.ndarray], shard_rows: list[int], videos: int) -> None:
    """Every row of the tables names a shard, a row inside it and a video (checked in chunks of :data:`CHUNK`)."""
    shard, row, video, times = tables
    limits = np.asarray(shard_rows, dtype=np.int64)
    for start in range(0, len(shard), CHUNK):
        part = slice(start, start + CHUNK)
        s, r, v = (np.asarray(t[part], dtype=np.int64) for t in (shard, row, video))
        problem = None
        if len(s) and (s.min() < 0 or s.max() >= len(limits)):
            problem = f"a shard number outside 0..{len(limits) - 1}"
        elif len(r) and (r.min() < 0 or bool((r >= limits[s]).any())):
            problem = "a row outside its shard"
        elif len(v) and (v.min() < 0 or v.max() >= videos):
            problem = f"a video number outside 0..{videos - 1}"
        elif not np.isfinite(np.asarray(times[part])).all():
            problem = "a window time that is not a finite number"
        if problem is not None:
            raise IndexFormatError(f"{index}: the row tables hold {problem}; build the index again")


def load_ann(path: Path, settings: dict[str, Any], rows: int, dim: int, load) -> Any:
    """``load(path)`` (the FAISS reader) with its failures in one line, and the result checked against the
    manifest: ``rows`` vectors of ``dim`` floats."""
    if not os.path.lexists(path):
        raise IndexFormatError(f"{path}: missing; build the index again")
    why = why_not_regular_file(path)
    if why is not None:
        raise IndexFormatError(f"{path}: {why}; build the index again")
    try:
        index = load(path)
    except UserError:  # a bad --nprobe / --ef-search: said as it is
        raise
    except Exception as exc:  # noqa: BLE001 - FAISS raises RuntimeError with its C++ context for a damaged file
        raise IndexFormatError(f"{path}: unreadable ({_faiss_reason(exc)}); build the index again") from None
    if int(index.ntotal) != rows or int(index.d) != dim:
        raise IndexFormatError(
            f"{path}: holds {int(index.ntotal)} vectors of {int(index.d)} floats; the index has {rows} rows of {dim} "
            "(build the index again)"
        )
    return index


def _faiss_reason(exc: BaseException) -> str:
    """FAISS's message without the C++ function and source position it starts with."""
    return re.sub(r"^Error in .*? at \S+:\d+: (Error: )?", "", first_line(exc))
