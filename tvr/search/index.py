"""Querying an index: ``open_index(path).search(text, k)``, and ranking captions for a clip.

A text query is encoded by the index's own model (refused if the model offered differs from the one the index was
built with), shortlisted on the head's shortlist embedding by the index's store (FAISS in an index folder, or a
Qdrant collection: :mod:`tvr.search.stores`), optionally among the videos under a folder and the windows of a time
span (:mod:`tvr.search.filters`), and — for a head whose score is not a dot product — the top ``rerank`` windows are
scored exactly with the rerank state stored at index time (``head.score_rerank``), read from the shards. Results are
one per video (its best window) unless ``all_windows``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tvr.search.defaults import DEFAULT_K, DEFAULT_RERANK
from tvr.search.filters import WindowFilter, window_filter
from tvr.search.layout import SETTINGS, read_settings
from tvr.search.stamps import describe_stamp
from tvr.search.store import IndexFormatError, ShardReader, gather_state, state_class
from tvr.search.stores import parse_target
from tvr.search.stores.base import ShortlistStore
from tvr.utils.errors import UserError

if TYPE_CHECKING:
    import torch

    from tvr.search.encoders import SearchEncoder

#: bounds a query must respect (the web API enforces them too)
MAX_K = 1000
MAX_QUERY_CHARS = 1000


class QueryError(UserError, ValueError):
    """A query the index cannot answer as given (empty or too long text, k or rerank out of range, no captions)."""


def check_limits(k: Any, rerank: Any = None) -> None:
    """Raise :class:`QueryError` unless ``k`` (results) and ``rerank`` (windows scored exactly) are in range."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise QueryError(f"-k {k!r}: expected an integer from 1 to {MAX_K}")
    if rerank is not None and (isinstance(rerank, bool) or not isinstance(rerank, int) or rerank < 0):
        raise QueryError(f"--rerank {rerank!r}: expected an integer >= 0 (0 = rank by the shortlist alone)")


def check_query(text: Any) -> str:
    """Raise :class:`QueryError` unless ``text`` is a query the index answers (not blank, not too long). The command
    line checks its arguments with this before loading any model, the library on every call."""
    if not isinstance(text, str) or not text.strip():
        raise QueryError("the query is empty: give the text to search for")
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(f"the query has {len(text)} characters, at most {MAX_QUERY_CHARS} are accepted")
    return text


@dataclasses.dataclass(frozen=True)
class Query:
    """One text query with its settings (:meth:`SearchIndex.search`'s arguments)."""

    text: str
    k: int = DEFAULT_K
    rerank: int | None = None
    all_windows: bool = False
    #: the videos and times the results may come from (None: all)
    where: WindowFilter | None = None


class _Ranked:
    """A ranked result as the JSON object ``tvr search`` and the web API give (its fields, in order)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Hit(_Ranked):
    """One result: ``video`` (path relative to the indexed folder), the window ``start``/``end`` in seconds, its
    ``score`` and 1-based ``rank``."""

    video: str
    start: float
    end: float
    score: float
    rank: int


@dataclasses.dataclass(frozen=True)
class CaptionHit(_Ranked):
    """A caption ranked for a clip: its text, score, rank and the clip's best window."""

    caption: str
    start: float
    end: float
    score: float
    rank: int


def exact_scores(
    head: Any, text_state: Any, readers: list[ShardReader], shards: np.ndarray, rows: np.ndarray, state_cls: type
) -> np.ndarray:
    """The head's exact scores (float64 [n]) of one encoded text against the stored windows (``shards[i]``,
    ``rows[i]``), in that order: the state is read in storage order, scored in float32, and only the scores are put
    back in the caller's order."""
    import torch

    order = np.lexsort((rows, shards))
    state = gather_state(readers, shards[order], rows[order], state_cls, torch.float32)
    scores = np.empty(len(rows), dtype=np.float64)
    with torch.inference_mode():
        scores[order] = head.score_rerank(text_state, state)[0].float().cpu().numpy()
    return scores


def encoder_for(
    stamp: dict[str, Any], checkpoint: str | os.PathLike | None = None, device: str = "cpu", model: str | None = None
) -> SearchEncoder:
    """The encoder an index's model stamp names (``checkpoint`` points to a moved checkpoint file, ``model`` to a
    pretrained model's folder elsewhere)."""
    from tvr.search.encoders import CheckpointEncoder, ConfigEncoder, PretrainedEncoder

    kind = stamp.get("encoder")
    if model is not None and kind != "pretrained":
        raise IndexFormatError(f"the index was built with {describe_stamp(stamp)}, not with a --model: drop --model")
    if kind == "pretrained":
        if checkpoint is not None:
            raise IndexFormatError("the index was built with a pretrained model, not a checkpoint: drop --checkpoint")
        where = model if model is not None else str(stamp.get("source", ""))
        try:
            return PretrainedEncoder(where, device=device)
        except UserError as exc:
            raise UserError(
                f"the index was built with {describe_stamp(stamp)}, which does not load from {where} ({exc}); if "
                "it moved, pass its new location with --model"
            ) from None
    if kind == "checkpoint":
        path = checkpoint if checkpoint is not None else stamp.get("path")
        if not path or not Path(path).is_file():
            raise IndexFormatError(
                f"the index was built with the checkpoint {stamp.get('path')}, which is not there any more: pass its "
                "new location with --checkpoint"
            )
        return CheckpointEncoder(path, device=device)
    if kind == "config":
        if checkpoint is not None:
            raise IndexFormatError("the index was built from a config, not a checkpoint: drop --checkpoint")
        from tvr.config import ConfigError, config_from_dict

        try:
            cfg = config_from_dict(stamp.get("config") or {}, where="the index's model config")
        except ConfigError as exc:
            raise IndexFormatError(f"the index's model config does not load: {exc}") from None
        return ConfigEncoder(cfg, name=str(stamp.get("name", "")), device=device)
    raise IndexFormatError(f"the index was built with encoder {kind!r}, which this tvr does not know")


class SearchIndex:
    """A finished index with the model that built it: an index folder (FAISS over memory-mapped shards) or a Qdrant
    collection (:mod:`tvr.search.stores`). Thread-safe: queries share one model, and queries from several threads
    run at the same time (each on one torch thread: a machine's cores serve as many).

    ``without_torch``: answer text queries with the model's numpy query side when ``tvr index`` wrote one
    (:mod:`tvr.search.numpy_query`: no torch import; query vectors within 1e-5 of the model's, each query encoded
    alone), else as usual. For one-off queries from the shell; a server keeps the torch path, whose micro-batched
    answers equal serial ones bit for bit. ``state``: where a Qdrant index's rerank state (its shards) is on this
    machine, when not where ``tvr index`` wrote it."""

    def __init__(
        self,
        path: str | os.PathLike,
        encoder: SearchEncoder | None = None,
        *,
        checkpoint: str | os.PathLike | None = None,
        device: str = "cpu",
        nprobe: int | None = None,
        ef_search: int | None = None,
        without_torch: bool = False,
        model: str | None = None,
        state: str | os.PathLike | None = None,
    ) -> None:
        target = parse_target(path)
        self.store = _open_store(target, nprobe, ef_search, state)
        try:
            self._load(encoder, checkpoint, device, without_torch, model)
        except BaseException:
            self.store.close()
            raise

    def _load(
        self,
        encoder: SearchEncoder | None,
        checkpoint: str | os.PathLike | None,
        device: str,
        without_torch: bool,
        model: str | None,
    ) -> None:
        store = self.store
        #: where the index is, as given (a folder, or a Qdrant address); ``path``: the folder it keeps its files in
        #: (the index folder; a Qdrant index's state folder)
        self.location = store.location
        self.path = getattr(store, "path", None) or getattr(store, "state_root", None)
        self.manifest = store.manifest
        settings = self.settings = store.settings
        self._checkpoint, self._device, self._model = checkpoint, device, model
        if encoder is None and checkpoint is None and device == "cpu" and without_torch:
            from tvr.search.numpy_query import load_numpy_query_encoder

            encoder = load_numpy_query_encoder(settings["model"])
        if encoder is None and checkpoint is None and device == "cpu":
            from tvr.search.query_encoder import load_query_encoder

            encoder = load_query_encoder(settings["model"])  # the text side alone, when it was exported
        if encoder is None:
            encoder = encoder_for(settings["model"], checkpoint, device, model)
            if checkpoint is None:  # the next cold start loads the text side alone
                from tvr.search.query_encoder import export_query_encoder

                export_query_encoder(encoder)
        self.encoder = encoder
        self.encoder.check_stamp(self.manifest["model"], f"the index {self.location}")
        #: the method head (None for a numpy query side, whose head is indexable and needs no torch)
        self.head = None if self.encoder.head is None else self.encoder.head.eval()
        self.indexable = bool(self.head.indexable if self.head is not None else self.encoder.indexable)
        self.root = Path(self.manifest["source"]["root"])
        self.videos: list[dict[str, Any]] = self.manifest["videos"]
        self.rows = int(self.manifest["rows"])
        self.window = float(self.manifest["window"])
        self.stride = float(self.manifest["stride"])
        self.state_cls = None
        self.readers: list[ShardReader] = []
        if self.rows and not self.indexable:
            self.readers = store.readers
            named = {str(reader.meta.get("state_class")) for reader in self.readers}
            if len(named) != 1:
                raise IndexFormatError(
                    f"{self.location}: its shards store rerank states of several types {sorted(named)}"
                )
            self.state_cls = state_class(named.pop(), self.readers[0].fields)
        elif hasattr(store, "table_shard"):  # an index folder's shards are open anyway
            self.readers = store.readers
        #: the width of the shortlist embeddings (0 for an index of no videos)
        self.dim = store.dim
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # an index folder's row tables and FAISS index (``table_shard``, ``table_row``, ``table_video``,
        # ``table_times``, ``ann``), as before the store seam
        if name.startswith("table_") or name == "ann":
            return getattr(self.__dict__["store"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def close(self) -> None:
        """Let go of the store (a Qdrant connection, or the local or Edge folder it holds)."""
        self.store.close()

    # ------------------------------------------------------------------ helpers
    def __len__(self) -> int:
        return len(self.videos)

    def video_file(self, number: int) -> Path:
        """The file of video ``number`` (as recorded in the manifest: nothing else is ever served)."""
        return self.root / self.videos[number]["video"]

    def window_of(self, row: int) -> tuple[int, float, float]:
        start, end = self.table_times[row]
        return int(self.table_video[row]), float(start), float(end)

    def rerank_state(self, rows: np.ndarray, dtype: torch.dtype | None = None) -> Any:
        """The stored rerank state of global ``rows`` (in that order; floating fields in ``dtype``, default as
        stored) of an index folder."""
        return gather_state(self.readers, self.table_shard[rows], self.table_row[rows], self.state_cls, dtype)

    def count(self, *, under: str | None = None, between: Any = None) -> int:
        """How many windows a search with ``under`` / ``between`` chooses from (every window without them)."""
        return self.store.count(window_filter(under, between))

    # ------------------------------------------------------------------ text → video
    def search(
        self,
        text: str,
        k: int = DEFAULT_K,
        *,
        rerank: int | None = None,
        all_windows: bool = False,
        under: str | None = None,
        between: Any = None,
    ) -> list[Hit]:
        """The ``k`` best videos for ``text`` (each at its best window), or the ``k`` best windows with
        ``all_windows``. ``rerank``: windows scored exactly (default :data:`DEFAULT_RERANK` for a head whose score
        is not a dot product; 0 = rank by the shortlist embedding alone). ``under``: only the videos under this
        folder (a path as the index lists them); ``between``: only the windows sharing time with (start, end)
        seconds (or ``"START,END"``) — :mod:`tvr.search.filters`."""
        check_query(text)
        check_limits(k, rerank)
        return self._answer([Query(text, k, rerank, all_windows, window_filter(under, between))])[0]

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        """The vectors the shortlist searches ``texts`` with: float32 [n, d], one row per text, each encoded as
        :meth:`search` encodes it (padded to its length group; the numpy query side one text at a time)."""
        texts = list(texts)
        for text in texts:
            check_query(text)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.head is None:
            with self._lock:
                rows = [self.encoder.query_vector(text).reshape(-1) for text in texts]
            return np.stack(rows).astype(np.float32, copy=False)
        vectors: list[np.ndarray] = [np.empty(0, np.float32)] * len(texts)
        for members, _, rows in self._encoded_groups(texts):
            for row, i in enumerate(members):
                vectors[i] = rows[row]
        return np.stack(vectors).astype(np.float32, copy=False)

    def search_many(
        self,
        texts: list[str],
        k: int = DEFAULT_K,
        *,
        rerank: int | None = None,
        all_windows: bool = False,
        under: str | None = None,
        between: Any = None,
    ) -> list[list[Hit] | QueryError]:
        """:meth:`search` for many queries at once: the text encoder runs once on all of them (in batches of the
        encoder's ``batch_size``), then each query is shortlisted and reranked on its own, so every answer is the one
        :meth:`search` gives. A bad query's answer is its :class:`QueryError`; ``k``, ``rerank`` and the filter are
        checked for all."""
        check_limits(k, rerank)
        where = window_filter(under, between)
        return self.answer([Query(text, k, rerank, all_windows, where) for text in texts])

    def answer(self, queries: list[Query]) -> list[list[Hit] | QueryError]:
        """Answer ``queries`` (each with its own k, rerank, all_windows and filter) with one text-encoder pass over
        all of them: what :meth:`search_many` and the server's micro-batches run. A bad query's answer is its
        :class:`QueryError`."""
        answers: list[list[Hit] | QueryError] = []
        good: list[Query] = []
        for query in queries:
            try:
                check_query(query.text)
                check_limits(query.k, query.rerank)
                good.append(query)
                answers.append([])
            except QueryError as exc:
                answers.append(exc)
        found = iter(self._answer(good) if good else [])
        return [answer if isinstance(answer, QueryError) else next(found) for answer in answers]

    def _answer(self, queries: list[Query]) -> list[list[Hit]]:
        if not self.rows:
            return [[] for _ in queries]
        found: list[list[tuple[int, float, float, float]]] = [[] for _ in queries]
        if self.head is None:  # the numpy query side: each query alone, no torch
            with self._lock:
                for i, query in enumerate(queries):
                    vector = self.encoder.query_vector(query.text)
                    found[i] = self._rank(None, vector, query)
        else:
            self._answer_with_torch(queries, found)
        return [
            [
                Hit(self.videos[video]["video"], start, end, float(score), rank)
                for rank, (video, start, end, score) in enumerate(rows, 1)
            ]
            for rows in found
        ]

    def _encoded_groups(self, texts: list[str]):
        """Yield (positions, text state, shortlist vectors [m, d] float32) for each group of ``texts`` padded to one
        length (one text-encoder pass each, :data:`tvr.search.encoders.QUERY_LENGTHS`)."""
        import torch

        # inference mode: a query is dozens of small tensor operations, each cheaper without autograd's bookkeeping
        from tvr.search.encoders import one_torch_thread

        # no lock: queries of several threads run at once, each on one torch thread (the tokenizers take turns
        # inside; the model, the ANN index and the state files are only read). rank_captions may swap in the full
        # model meanwhile: its text side and head have the export's weights, so either pair gives the same answer
        encoder, head = self.encoder, self.head
        with torch.inference_mode(), one_torch_thread():
            lengths = encoder.query_lengths(texts)
            for length in sorted(set(lengths)):  # one text-encoder pass per padded length (encoders.QUERY_LENGTHS)
                members = [i for i, n in enumerate(lengths) if n == length]
                text_state = encoder.encode_texts([texts[i] for i in members], length)
                yield members, text_state, head.shortlist_texts(text_state).float().cpu().numpy()

    def _answer_with_torch(self, queries: list[Query], found: list[list[tuple[int, float, float, float]]]) -> None:
        import torch

        texts = [q.text for q in queries]
        for members, text_state, vectors in self._encoded_groups(texts):
            with torch.inference_mode():
                for row, i in enumerate(members):
                    found[i] = self._rank(text_state[row : row + 1], vectors[row : row + 1], queries[i])

    def _rank(self, text_state: Any, query: np.ndarray, q: Query) -> list[tuple[int, float, float, float]]:
        """One encoded query's best ``k`` (video, start, end, score): shortlist (among the windows its filter keeps),
        exact rerank, one per video."""
        k, all_windows = q.k, q.all_windows
        exact = not self.indexable
        rerank = DEFAULT_RERANK if q.rerank is None else q.rerank
        want = max(k, rerank if exact else 0)
        while True:
            found = self.store.shortlist(query, min(want, self.rows), q.where)
            if exact and rerank > 0:
                found = found.first(max(rerank, k))
                scores = exact_scores(self.head, text_state, self.readers, found.shard, found.row, self.state_cls)
            else:
                scores = found.score
            order = np.lexsort((found.order, -scores))
            found, scores = found.take(order), scores[order]
            if not all_windows:
                _, first = np.unique(found.video, return_index=True)
                keep = np.sort(first)
                found, scores = found.take(keep), scores[keep]
            if len(found) >= k or found.exhausted or want >= self.rows:
                break
            want = min(self.rows, want * 4)  # fewer than k videos among the shortlist: widen it
            if exact and rerank > 0:
                rerank = want
        return [
            (int(video), float(times[0]), float(times[1]), float(score))
            for video, times, score in zip(found.video[:k], found.times[:k], scores[:k], strict=True)
        ]

    # ------------------------------------------------------------------ video → text
    def _full_encoder(self) -> SearchEncoder:
        """The whole model (a query encoder has only the text side): loaded on first use, checked against the
        index's stamp."""
        if not self.encoder.has_image_side:
            full = encoder_for(self.settings["model"], self._checkpoint, self._device, self._model)
            full.check_stamp(self.manifest["model"], f"the index {self.location}")
            self.encoder = full
            self.head = full.head.eval()
        return self.encoder

    def rank_captions(self, video: str | os.PathLike, captions: list[str]) -> list[CaptionHit]:
        """Rank ``captions`` for the clip ``video`` (any file, decoded with the index's window settings): a
        caption's score is its exact score with the clip's best window."""
        captions = [c.strip() for c in captions if c.strip()]
        if not captions:
            raise QueryError("no captions to rank (one caption per line)")
        import torch

        from tvr.search.windows import decode_windows

        with self._lock:
            encoder = self._full_encoder()
        decoded = decode_windows(video, encoder.spec, self.window, self.stride)
        with self._lock, torch.no_grad():
            slots = decoded.slots
            crops = torch.from_numpy(decoded.frames[np.clip(slots, 0, None)])
            features = encoder.encode_windows(crops, torch.from_numpy((slots >= 0).astype(np.int64)))
            video_state = encoder.head.encode_videos(features)
            text_state = encoder.encode_texts(captions)
            scores = encoder.head.score(text_state, video_state).float().cpu()
        best, window = scores.max(dim=1)
        order = sorted(range(len(captions)), key=lambda i: (-float(best[i]), i))
        return [
            CaptionHit(captions[i], *decoded.windows[int(window[i])], float(best[i]), rank)
            for rank, i in enumerate(order, 1)
        ]


def open_index(
    path: str | os.PathLike,
    *,
    checkpoint: str | os.PathLike | None = None,
    device: str = "cpu",
    encoder: SearchEncoder | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    without_torch: bool = False,
    model: str | None = None,
    state: str | os.PathLike | None = None,
) -> SearchIndex:
    """Open the index at ``path`` — a folder, or a Qdrant collection's address (``qdrant://HOST:PORT/COLLECTION``,
    ``qdrant+local:PATH``, ``qdrant+edge:PATH``) — with the model it was built with (``checkpoint``: where that
    checkpoint is now; ``encoder``: an encoder already loaded). ``nprobe`` (IVF) / ``ef_search`` (HNSW): the
    shortlist's search effort instead of the index's. ``without_torch``, ``state``: see :class:`SearchIndex`.
    ``model``: where the pretrained model an index was built with (``tvr index --model``) is now, if it moved
    (checked against the index's stamp). Raises ``EncoderMismatchError`` for another model."""
    return SearchIndex(
        path,
        encoder,
        checkpoint=checkpoint,
        device=device,
        nprobe=nprobe,
        ef_search=ef_search,
        without_torch=without_torch,
        model=model,
        state=state,
    )


def _open_store(
    target: Any, nprobe: int | None, ef_search: int | None, state: str | os.PathLike | None
) -> ShortlistStore:
    """The store ``target`` (a folder or a Qdrant address, :func:`~tvr.search.stores.parse_target`) names, opened
    and checked, with its settings (``store.settings``)."""
    if isinstance(target, Path):
        if state is not None:
            raise UserError(f"--state {state}: only a Qdrant index keeps its rerank state apart; {target} is a folder")
        settings = read_settings(target)
        from tvr.search.stores.faiss import FolderStore

        store: ShortlistStore = FolderStore(target, nprobe=nprobe, ef_search=ef_search)
        store.settings = settings
        return store
    from tvr.search.stores.qdrant import QdrantStore

    if nprobe is not None:
        raise UserError(f"nprobe={nprobe}: a Qdrant collection has no IVF cells to probe (use ef_search)")
    store = QdrantStore(target, ef_search=ef_search, state=state)
    store.settings = store.manifest
    return store


__all__ = ["CaptionHit", "Hit", "Query", "SearchIndex", "exact_scores", "open_index", "SETTINGS"]
