"""The index folder as a store: FAISS over the shards' shortlist embeddings, with row tables and ``manifest.json``
(the layout in docs/search.md). The default store, unchanged by the seam: the same files, byte for byte.

Writing: the FAISS file is rebuilt from the shards in canonical order (videos sorted by path, windows in time order)
at every commit, so the store keeps nothing between jobs (:meth:`FolderWriter.stored` is empty and every current
video is added again) and a resumed, updated or sharded build equals a fresh one. Reading: a filter is applied
exactly after the shortlist (:meth:`FolderStore.shortlist`), which widens until it holds enough windows that pass or
has seen every window.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

import tvr.search.ann as ann
from tvr.search.checks import check_manifest, check_tables, load_ann, load_tables, read_index_json
from tvr.search.filters import WindowFilter
from tvr.search.layout import ANN_FILE, MANIFEST, TABLES
from tvr.search.store import SHARDS, IndexFormatError, ShardReader
from tvr.search.stores.base import Candidates, ShortlistStore, StoreWriter
from tvr.utils.io import atomic_write, atomic_write_json

#: filters whose per-video masks a store keeps (a server sees the same few folders again and again)
_MASKS = 64


class FolderStore(ShortlistStore):
    """A finished index folder, opened: its manifest checked, row tables memory-mapped, shards and FAISS loaded
    (every check of :mod:`tvr.search.checks`)."""

    def __init__(self, path: Path, nprobe: int | None = None, ef_search: int | None = None) -> None:
        self.path = path
        self.location = str(path)
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise IndexFormatError(
                f"{path}: the index is not finished (no {MANIFEST}): run tvr index again with the same arguments to "
                "finish it"
            )
        self.manifest = read_index_json(manifest_path, "build the index again")
        check_manifest(self.manifest, manifest_path)
        videos = self.manifest["videos"]
        tables = load_tables(path, TABLES, self.rows)
        self.table_shard, self.table_row, self.table_video, self.table_times = tables
        self.readers = [ShardReader(path / SHARDS / name) for name in self.manifest["shards"]]
        check_tables(path, tables, [reader.rows for reader in self.readers], len(videos))
        dims = {int(reader.emb.shape[1]) for reader in self.readers}
        self.dim = min(dims) if dims else 0
        if len(dims) > 1:
            raise IndexFormatError(f"{path}: its shards hold embeddings of different widths {sorted(dims)}")
        self.ann = None
        if self.rows:
            settings = self.manifest["ann"]
            self.ann = load_ann(
                path / ANN_FILE,
                settings,
                self.rows,
                dims.pop(),
                lambda file: ann.load(file, settings, nprobe=nprobe, ef_search=ef_search),
            )
        self._video_masks = functools.lru_cache(maxsize=_MASKS)(self._video_mask)

    def _video_mask(self, under: str | None) -> np.ndarray:
        where = WindowFilter(under=under)
        return np.array([where.keeps_video(entry["video"]) for entry in self.manifest["videos"]], dtype=bool)

    def _keeps(self, rows: np.ndarray, where: WindowFilter) -> np.ndarray:
        keep = self._video_masks(where.under)[np.asarray(self.table_video[rows], dtype=np.int64)]
        if where.between is not None:
            keep &= where.keeps_times(self.table_times[rows])
        return keep

    def _search(self, query: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = ann.search(self.ann, query, n)
        keep = rows[0] >= 0
        return rows[0][keep].astype(np.int64), scores[0][keep].astype(np.float64)

    def shortlist(self, query: np.ndarray, n: int, where: WindowFilter | None = None) -> Candidates:
        if not where:
            rows, scores = self._search(query, n)
            return self._candidates(rows, scores, exhausted=n >= self.rows)
        # post-filter: ask the shortlist for more until enough of what it finds passes, or it has seen every window
        asked = n
        while True:
            rows, scores = self._search(query, min(asked, self.rows))
            keep = self._keeps(rows, where)
            if int(keep.sum()) >= n or asked >= self.rows:
                break
            asked *= 4
        rows, scores = rows[keep], scores[keep]
        best = np.lexsort((rows, -scores))[:n]  # ties at the cut go by row, whatever order FAISS found them in
        return self._candidates(rows[best], scores[best], exhausted=asked >= self.rows and len(rows) <= n)

    def _candidates(self, rows: np.ndarray, scores: np.ndarray, exhausted: bool) -> Candidates:
        return Candidates(
            order=rows,
            video=np.asarray(self.table_video[rows], dtype=np.int64),
            times=np.asarray(self.table_times[rows], dtype=np.float64),
            shard=np.asarray(self.table_shard[rows], dtype=np.int64),
            row=np.asarray(self.table_row[rows], dtype=np.int64),
            score=scores,
            exhausted=exhausted,
        )

    def count(self, where: WindowFilter | None = None) -> int:
        if not where:
            return self.rows
        return int(self._keeps(np.arange(self.rows), where).sum())

    def close(self) -> None:
        """Nothing to let go: the memory maps and files close with the store."""


class FolderWriter(StoreWriter):
    """Writes the FAISS file, the row tables and ``manifest.json`` of the index folder ``index`` (see the module
    docstring): :meth:`add` collects the videos in the order they come (canonical: the caller adds them sorted by
    path), :meth:`commit` builds everything from them."""

    def __init__(self, index: Path, ann_kind: str, ann_threshold: int, nlist: int) -> None:
        self.index = index
        self.ann_kind, self.ann_threshold, self.nlist = ann_kind, ann_threshold, nlist
        self.added: list[tuple[dict[str, Any], ShardReader]] = []

    def begin(self) -> None:
        """Nothing to do: ``tvr index`` removed ``manifest.json`` when the job began."""

    def close(self) -> None:
        """Nothing held open."""

    def stored(self) -> dict[str, dict[str, Any]]:
        return {}  # the FAISS file is rebuilt at every commit: it keeps nothing between jobs

    def add(self, entry: dict[str, Any], reader: ShardReader) -> None:
        self.added.append((entry, reader))

    def delete(self, video: str) -> None:
        """Nothing to do: a video not added again is not in the next FAISS file."""

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        used: dict[str, int] = {}
        readers: list[ShardReader] = []
        videos: list[dict[str, Any]] = []
        shard_of, local_rows, times, video_of = [], [], [], []
        first = 0
        for number, (entry, reader) in enumerate(self.added):
            if entry["shard"] not in used:
                used[entry["shard"]] = len(used)
                readers.append(reader)
            a, b = entry["rows"]
            videos.append(
                {
                    "video": entry["video"],
                    "size": entry["size"],
                    "mtime_ns": entry["mtime_ns"],
                    "duration": entry["duration"],
                    "first_row": first,
                    "windows": b - a,
                }
            )
            shard_of.append(np.full(b - a, used[entry["shard"]], dtype=np.int32))
            local_rows.append(np.arange(a, b, dtype=np.int64))
            times.append(np.asarray(entry["windows"], dtype=np.float64).reshape(b - a, 2))
            video_of.append(np.full(b - a, number, dtype=np.int32))
            first += b - a
        rows = first
        tables = {
            "table_shard.npy": np.concatenate(shard_of) if shard_of else np.zeros(0, np.int32),
            "table_row.npy": np.concatenate(local_rows) if local_rows else np.zeros(0, np.int64),
            "table_video.npy": np.concatenate(video_of) if video_of else np.zeros(0, np.int32),
            "table_times.npy": np.concatenate(times) if times else np.zeros((0, 2), np.float64),
        }
        ann_settings = None
        if rows:
            dim = int(readers[0].emb.shape[1])
            ann_settings = ann.choose(self.ann_kind, rows, dim, self.ann_threshold, self.nlist)

            def block(order: np.ndarray) -> np.ndarray:
                return gather_rows(readers, tables["table_shard.npy"][order], tables["table_row.npy"][order])

            training = block(ann.training_rows(rows, ann_settings)) if ann_settings.kind == "ivf" else None
            blocks = (block(np.arange(a, min(rows, a + ann.ADD_BLOCK))) for a in range(0, rows, ann.ADD_BLOCK))
            ann.save(ann.build(ann_settings, training, blocks), self.index / ANN_FILE)
        elif (self.index / ANN_FILE).exists():
            (self.index / ANN_FILE).unlink()
        for name, array in tables.items():
            atomic_write(self.index / name, lambda handle, a=array: np.save(handle, a, allow_pickle=False))
        manifest = {
            **manifest,
            "rows": rows,
            "ann": ann_settings.to_dict() if ann_settings else None,
            "shards": list(used),
            "videos": videos,
        }
        atomic_write_json(self.index / MANIFEST, manifest)
        return manifest


def gather_rows(readers: list[ShardReader], shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Shortlist embeddings of the given (shard, row) pairs, in the given order: float32 [n, E]."""
    out = np.empty((len(rows), readers[0].emb.shape[1]), dtype=np.float32)
    for k in np.unique(shards):
        sel = np.nonzero(shards == k)[0]
        out[sel] = readers[int(k)].emb[rows[sel]]
    return out
