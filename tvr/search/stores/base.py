"""The storage seam of a search index: where the windows' shortlist embeddings are kept and searched.

Two sides, one per job:

* :class:`ShortlistStore` — what a query reads: the index's manifest (settings, model stamp, videos), the shards
  holding the rerank state, and :meth:`~ShortlistStore.shortlist`: the top windows of a query vector by inner
  product, with a :class:`~tvr.search.filters.WindowFilter`; :meth:`~ShortlistStore.count`;
  :meth:`~ShortlistStore.close`.
* :class:`StoreWriter` — what ``tvr index`` writes at the end of a job: :meth:`~StoreWriter.stored` (the videos the
  store holds and the shard entries they were added from), :meth:`~StoreWriter.add` / :meth:`~StoreWriter.delete`
  by video, :meth:`~StoreWriter.commit` (the manifest, written last: the store is finished from then on).

Implemented by the index folder (:mod:`tvr.search.stores.faiss`: FAISS over the shards, rebuilt in canonical order
at every commit, so it keeps nothing between jobs) and by a Qdrant collection (:mod:`tvr.search.stores.qdrant`:
points added and deleted video by video). Both read the rerank state from tvr's shards (docs/search.md, "Beyond one
machine", for why).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from tvr.search.filters import WindowFilter
from tvr.search.store import ShardReader


@dataclasses.dataclass
class Candidates:
    """One query's shortlisted windows, best first by shortlist score: per window its index row (videos sorted by
    path, windows in time order: what ties are broken by), video number (in the manifest's order), (start, end)
    seconds, shard (a position in the store's ``readers``) and row inside that shard, and shortlist score.
    ``exhausted``: no other window matches the query's filter (asking for more would find nothing new)."""

    order: np.ndarray
    video: np.ndarray
    times: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    score: np.ndarray
    exhausted: bool

    def __len__(self) -> int:
        return len(self.order)

    def first(self, n: int) -> Candidates:
        """The best ``n`` (all of them when there are fewer)."""
        return self.take(slice(0, n))

    def take(self, which: Any) -> Candidates:
        """The windows ``which`` selects (a slice, an index array or a mask), in that order."""
        return Candidates(
            self.order[which],
            self.video[which],
            self.times[which],
            self.shard[which],
            self.row[which],
            self.score[which],
            self.exhausted,
        )


class ShortlistStore(ABC):
    """A finished index as a query sees it (see the module docstring)."""

    #: where it is, as the user named it (a folder, or a ``qdrant…`` address)
    location: str
    #: settings, model stamp, rows, shortlist settings and videos (``{video, size, mtime_ns, duration, first_row,
    #: windows}`` sorted by path), as ``manifest.json`` holds them
    manifest: dict[str, Any]
    #: the index's settings (model stamp, frames, windows, state precision, head, indexed folder)
    settings: dict[str, Any]
    #: the shards a candidate's ``shard`` numbers point into
    readers: list[ShardReader]
    #: the width of the shortlist embeddings (0 for an index of no videos)
    dim: int

    @property
    def rows(self) -> int:
        return int(self.manifest["rows"])

    @abstractmethod
    def shortlist(self, query: np.ndarray, n: int, where: WindowFilter | None = None) -> Candidates:
        """The ``n`` windows of highest inner product with ``query`` (float32 [1, dim]) among those ``where`` keeps
        (all, without a filter), best first."""

    @abstractmethod
    def count(self, where: WindowFilter | None = None) -> int:
        """How many windows ``where`` keeps (all of them without a filter)."""

    @abstractmethod
    def close(self) -> None:
        """Let go of what the store holds open (a connection, a lock)."""


class StoreWriter(ABC):
    """What ``tvr index`` finishes a job with (see the module docstring). A shard entry is
    ``{video, size, mtime_ns, duration, windows: [[start, end], ...], rows: [first, last)}`` plus ``shard`` (the
    shard folder's name)."""

    @abstractmethod
    def begin(self) -> None:
        """Before anything changes: from here until :meth:`commit`, the store is unfinished and refused by queries."""

    @abstractmethod
    def stored(self) -> dict[str, dict[str, Any]]:
        """The videos the store holds, each with the shard entry it was added from (``shard``, ``rows``, ``size``,
        ``mtime_ns`` at least)."""

    @abstractmethod
    def add(self, entry: dict[str, Any], reader: ShardReader) -> None:
        """Add the windows of one video (its shard ``entry``; ``reader``: that shard)."""

    @abstractmethod
    def delete(self, video: str) -> None:
        """Remove every window of ``video``."""

    @abstractmethod
    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Make what was added searchable and write ``manifest`` (settings, rows, shards, videos) last; returns the
        manifest as written (with the shortlist's settings under ``ann``)."""

    @abstractmethod
    def close(self) -> None:
        """Let go of what the writer holds open."""


def same_entry(stored: dict[str, Any] | None, entry: dict[str, Any]) -> bool:
    """Whether a video stored from ``stored`` is the one ``entry`` (the current shard entry) describes."""
    if stored is None:
        return False
    return all(stored.get(key) == entry.get(key) for key in ("shard", "rows", "size", "mtime_ns"))
