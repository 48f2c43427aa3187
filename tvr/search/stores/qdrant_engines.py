"""The Qdrant engines tvr talks to, behind the few calls its store makes: a Qdrant server or cluster and the local
mode, both through ``qdrant-client`` (:class:`ClientEngine`), and Qdrant Edge, Qdrant's engine in-process
(``qdrant-edge-py``, :class:`EdgeEngine`).

A filter is given as a list of conditions, each ``("match", key, value)`` (a keyword equals ``value``, or for a
list of keywords contains it), ``("any", key, values)`` or ``("range", key, {"gt"|"lt": number})``, all of which
must hold; each engine turns them into its own filter classes. Every failure of the engine — a host that does not
answer, an API key refused, a folder another process holds — is a :class:`QdrantError` of one line naming the
collection; the API key (``QDRANT_API_KEY``) is never part of a message.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tvr.utils.data_files import parse_json, read_json
from tvr.utils.errors import UserError, first_line

#: the named vector holding a window's shortlist embedding
VECTOR = "window"
#: seconds a request to a Qdrant server may take (``TVR_QDRANT_TIMEOUT`` overrides it)
DEFAULT_TIMEOUT = 30
#: points per upsert request, and per scroll page
BATCH = 256
EDGE_FOLDER = "edge"
LOCAL_FOLDER = "qdrant"

Condition = tuple[str, str, Any]
log = logging.getLogger(__name__)


class QdrantError(UserError, RuntimeError):
    """The Qdrant engine could not do what was asked (unreachable, refused, busy, another version)."""


def _install_hint(package: str) -> str:
    return f"tvr's Qdrant store needs {package}: pip install 'tvr[qdrant]' (or pip install {package})"


def timeout_seconds() -> int:
    value = os.environ.get("TVR_QDRANT_TIMEOUT", "")
    try:
        seconds = int(value) if value else DEFAULT_TIMEOUT
    except ValueError:
        raise UserError(f"TVR_QDRANT_TIMEOUT={value!r}: expected a whole number of seconds") from None
    if seconds < 1:
        raise UserError(f"TVR_QDRANT_TIMEOUT={value!r}: expected a whole number of seconds, at least 1")
    return seconds


class Engine:
    """The calls the Qdrant store makes (see the module docstring); ``where`` names the collection in messages."""

    where: str

    def vector_size(self) -> tuple[int, str] | None:
        """(size, distance) of the collection's :data:`VECTOR` vector; None when there is no collection; (0, "")
        when it has no such vector."""
        raise NotImplementedError

    def create(self, dim: int, hnsw_m: int, ef_construct: int) -> None:
        """Create the collection, with the payload indexes of :meth:`index_payload`."""
        raise NotImplementedError

    def index_payload(self) -> None:
        """Index the payload fields deleting a video and the filters look up (:data:`PAYLOAD_INDEXES`; indexing a
        field already indexed changes nothing)."""

    def upsert(self, ids: list[str], vectors: np.ndarray | None, payloads: list[dict[str, Any]]) -> None:
        """Insert or replace points (``vectors``: one :data:`VECTOR` row per point, or None: points without one)."""
        raise NotImplementedError

    def delete(self, conditions: list[Condition]) -> None:
        raise NotImplementedError

    def delete_ids(self, ids: list[str]) -> None:
        raise NotImplementedError

    def retrieve(self, point: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def scroll(self, conditions: list[Condition]) -> Iterator[dict[str, Any]]:
        """The payloads of every point the conditions keep, a page at a time."""
        offset = None
        while True:
            payloads, offset = self._page(conditions, offset)
            yield from payloads
            if offset is None:
                return

    def _page(self, conditions: list[Condition], offset: Any) -> tuple[list[dict[str, Any]], Any]:
        """One page of :meth:`scroll` from ``offset`` (None: the first), and the next page's offset (None: none)."""
        raise NotImplementedError

    def search(
        self, vector: np.ndarray, limit: int, conditions: list[Condition], ef: int, exact: bool, fields: list[str]
    ) -> list[tuple[dict[str, Any], float]]:
        raise NotImplementedError

    def count(self, conditions: list[Condition]) -> int:
        raise NotImplementedError

    def finish_writes(self) -> None:
        """Make everything written durable and indexed (Edge: optimise and flush)."""

    def close(self) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------- qdrant-client


class ClientEngine(Engine):
    """A collection of a Qdrant server (``url``) or of the local mode (``path``), through ``qdrant-client``. The
    local mode (pure Python, brute force) is kept behind a lock: it is not made for several threads."""

    def __init__(
        self, collection: str, where: str, *, url: str | None = None, path: Path | None = None, api_key: str | None
    ) -> None:
        try:
            from qdrant_client import QdrantClient, models
        except ImportError:
            raise QdrantError(f"{where}: {_install_hint('qdrant-client')}") from None
        self.models = models
        self.collection, self.where = collection, where
        self.local = path is not None
        self._lock = threading.RLock() if self.local else None
        with self._guard():
            if self.local:
                path.mkdir(parents=True, exist_ok=True)
                self.client = QdrantClient(path=str(path))
            else:
                if api_key and url and url.startswith("http:"):
                    log.warning("%s: QDRANT_API_KEY goes over plain HTTP; qdrant+https:// keeps it private", where)
                # no version check at connection: it would print a warning of its own for a host that does not answer
                self.client = QdrantClient(
                    url=url, api_key=api_key, timeout=timeout_seconds(), check_compatibility=False
                )
        # closed at exit at the latest: the client's own finaliser runs during interpreter shutdown, when the local
        # mode's clean-up can no longer import what it needs (and says so on stderr)
        weakref.finalize(self, _close_quietly, self.client)

    def _guard(self):
        return _Calls(self)

    def vector_size(self) -> tuple[int, str] | None:
        with self._guard():
            if not self.client.collection_exists(self.collection):
                return None
            vectors = self.client.get_collection(self.collection).config.params.vectors
        params = vectors.get(VECTOR) if isinstance(vectors, dict) else None
        if params is None:
            return 0, ""
        distance = params.distance.value if hasattr(params.distance, "value") else str(params.distance)
        return int(params.size), str(distance)

    def create(self, dim: int, hnsw_m: int, ef_construct: int) -> None:
        m = self.models
        with self._guard():
            self.client.create_collection(
                self.collection,
                vectors_config={
                    VECTOR: m.VectorParams(
                        size=dim,
                        distance=m.Distance.DOT,
                        hnsw_config=m.HnswConfigDiff(m=hnsw_m, ef_construct=ef_construct),
                    )
                },
            )
        self.index_payload()

    def index_payload(self) -> None:
        if self.local:  # the local mode has no payload indexes (and warns that it has none)
            return
        m = self.models
        with self._guard():
            for key, schema in PAYLOAD_INDEXES.items():
                kind = m.PayloadSchemaType.KEYWORD if schema == "keyword" else m.PayloadSchemaType.FLOAT
                self.client.create_payload_index(self.collection, key, kind, wait=True)

    def upsert(self, ids: list[str], vectors: np.ndarray | None, payloads: list[dict[str, Any]]) -> None:
        m = self.models
        if vectors is None:
            points: Any = [m.PointStruct(id=i, vector={}, payload=p) for i, p in zip(ids, payloads, strict=True)]
        else:
            rows = np.asarray(vectors, dtype=np.float32).tolist()
            points = m.Batch(ids=ids, vectors={VECTOR: rows}, payloads=payloads)
        with self._guard():
            self.client.upsert(self.collection, points=points, wait=True)

    def _filter(self, conditions: list[Condition]) -> Any:
        m = self.models
        must = []
        for kind, key, value in conditions:
            if kind == "match":
                must.append(m.FieldCondition(key=key, match=m.MatchValue(value=value)))
            elif kind == "any":
                must.append(m.FieldCondition(key=key, match=m.MatchAny(any=list(value))))
            else:
                must.append(m.FieldCondition(key=key, range=m.Range(**value)))
        return m.Filter(must=must)

    def delete(self, conditions: list[Condition]) -> None:
        with self._guard():
            self.client.delete(
                self.collection, points_selector=self.models.FilterSelector(filter=self._filter(conditions)), wait=True
            )

    def delete_ids(self, ids: list[str]) -> None:
        with self._guard():
            self.client.delete(self.collection, points_selector=self.models.PointIdsList(points=ids), wait=True)

    def retrieve(self, point: str) -> dict[str, Any] | None:
        with self._guard():
            found = self.client.retrieve(self.collection, ids=[point], with_payload=True, with_vectors=False)
        return dict(found[0].payload or {}) if found else None

    def _page(self, conditions: list[Condition], offset: Any) -> tuple[list[dict[str, Any]], Any]:
        with self._guard():
            records, offset = self.client.scroll(
                self.collection,
                scroll_filter=self._filter(conditions),
                limit=BATCH * 4,
                offset=offset,
                with_payload=True,
                with_vectors=False,
            )
        return [dict(record.payload or {}) for record in records], offset

    def search(
        self, vector: np.ndarray, limit: int, conditions: list[Condition], ef: int, exact: bool, fields: list[str]
    ) -> list[tuple[dict[str, Any], float]]:
        m = self.models
        with self._guard():
            found = self.client.query_points(
                self.collection,
                query=np.asarray(vector, dtype=np.float32),
                using=VECTOR,
                limit=limit,
                query_filter=self._filter(conditions) if conditions else None,
                search_params=m.SearchParams(hnsw_ef=ef, exact=exact),
                with_payload=fields,
                with_vectors=False,
            ).points
        return [(dict(point.payload or {}), float(point.score)) for point in found]

    def count(self, conditions: list[Condition]) -> int:
        with self._guard():
            return int(self.client.count(self.collection, count_filter=self._filter(conditions), exact=True).count)

    def close(self) -> None:
        with self._guard():
            self.client.close()


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001, S110 - a client closed twice, or its connection gone: nothing left to release
        pass


class _Calls:
    """One call into ``qdrant-client``: under the local mode's lock, its failures turned into one-line
    :class:`QdrantError` s (its local mode's warnings about itself kept off the user's terminal)."""

    def __init__(self, engine: ClientEngine) -> None:
        self.engine = engine
        self.caught = warnings.catch_warnings()

    def __enter__(self) -> None:
        if self.engine._lock is not None:
            self.engine._lock.acquire()
        self.caught.__enter__()
        warnings.simplefilter("ignore", UserWarning)

    def __exit__(self, kind, exc, tb) -> bool:  # noqa: ANN001
        self.caught.__exit__(kind, exc, tb)
        if self.engine._lock is not None:
            self.engine._lock.release()
        if exc is None or isinstance(exc, UserError) or not isinstance(exc, Exception):
            return False
        raise QdrantError(f"{self.engine.where}: {client_problem(exc)}") from None


def client_problem(exc: BaseException) -> str:
    """What went wrong in a ``qdrant-client`` call, in words: a host that does not answer, an HTTP status with
    Qdrant's reason, a local folder in use."""
    try:
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse
    except ImportError:  # pragma: no cover - only reached through qdrant-client
        return first_line(exc)
    if isinstance(exc, UnexpectedResponse):
        status = int(exc.status_code or 0)
        detail = _response_reason(exc)
        if status in (401, 403):
            return f"Qdrant refused the request ({status} {exc.reason_phrase}): set QDRANT_API_KEY to a key it accepts"
        return f"Qdrant answered {status} {exc.reason_phrase}" + (f": {detail}" if detail else "")
    if isinstance(exc, ResponseHandlingException):
        cause = exc.source if getattr(exc, "source", None) is not None else exc
        return f"cannot reach the Qdrant server ({first_line(cause) or type(cause).__name__})"
    text = first_line(exc)
    if "already accessed by another instance" in text:
        return "the local Qdrant folder is in use by another process (the local mode serves one process at a time)"
    return text


def _response_reason(exc: Any) -> str:
    try:
        body = parse_json(exc.content, "the Qdrant server's answer")
        return str(body.get("status", {}).get("error", ""))[:300]
    except (ValueError, AttributeError, TypeError):
        return ""


#: the payload fields a server indexes, and how: what deleting a video and the filters look up
PAYLOAD_INDEXES = {"kind": "keyword", "video": "keyword", "path": "keyword", "start": "float", "end": "float"}


# --------------------------------------------------------------------------------------------- qdrant-edge


class EdgeEngine(Engine):
    """A Qdrant Edge shard in ``folder`` (``qdrant-edge-py``): Qdrant's engine (HNSW, payload indexes, a write-ahead
    log) inside this process. One process at a time holds a shard."""

    def __init__(self, folder: Path, where: str) -> None:
        try:
            import qdrant_edge
        except ImportError:
            raise QdrantError(f"{where}: {_install_hint('qdrant-edge-py')}") from None
        self.q = qdrant_edge
        self.folder, self.where = folder, where
        self._lock = threading.RLock()
        self.shard = None
        if (folder / "edge_config.json").is_file():
            self._opened(self._call(lambda: qdrant_edge.EdgeShard.load(str(folder))))

    def _opened(self, shard) -> None:  # noqa: ANN001
        self.shard = shard
        weakref.finalize(self, _close_quietly, shard)  # flushed and unlocked at exit at the latest

    def _call(self, fn):  # noqa: ANN001, ANN202
        with self._lock:
            try:
                return fn()
            except UserError:
                raise
            except Exception as exc:  # noqa: BLE001 - the engine's errors are one line for the user
                text = first_line(exc)
                if "WouldBlock" in text or "Resource temporarily unavailable" in text:
                    text = "the Qdrant Edge folder is in use by another process (Edge serves one process at a time)"
                raise QdrantError(f"{self.where}: {text}") from None

    def _shard(self):  # noqa: ANN202
        if self.shard is None:
            raise QdrantError(f"{self.where}: no Qdrant Edge shard in {self.folder}")
        return self.shard

    def vector_size(self) -> tuple[int, str] | None:
        if self.shard is None:
            return None
        try:  # the shard's own description of itself (Edge has no call for it)
            vectors = read_json(self.folder / "edge_config.json", max_bytes=1 << 20)["vectors"]
        except (OSError, ValueError, KeyError, TypeError):
            return 0, ""
        params = vectors.get(VECTOR) if isinstance(vectors, dict) else None
        if not isinstance(params, dict):
            return 0, ""
        return int(params.get("size", 0)), str(params.get("distance", ""))

    def create(self, dim: int, hnsw_m: int, ef_construct: int) -> None:
        q = self.q
        config = q.EdgeConfig(
            vectors={VECTOR: q.EdgeVectorParams(size=dim, distance=q.Distance.Dot)},
            hnsw_config=q.HnswIndexConfig(m=hnsw_m, ef_construct=ef_construct, full_scan_threshold=10_000),
        )
        self._opened(self._call(lambda: q.EdgeShard.create(str(self.folder), config)))
        self.index_payload()

    def index_payload(self) -> None:
        q = self.q
        for key, schema in PAYLOAD_INDEXES.items():
            kind = q.PayloadSchemaType.Keyword if schema == "keyword" else q.PayloadSchemaType.Float
            self._update(q.UpdateOperation.create_field_index(key, kind))

    def _update(self, operation) -> None:  # noqa: ANN001
        shard = self._shard()
        self._call(lambda: shard.update(operation))

    def upsert(self, ids: list[str], vectors: np.ndarray | None, payloads: list[dict[str, Any]]) -> None:
        q = self.q
        rows = np.asarray(vectors, dtype=np.float32).tolist() if vectors is not None else None
        points = [
            q.Point(i, {VECTOR: rows[n]} if rows is not None else {}, p)
            for n, (i, p) in enumerate(zip(ids, payloads, strict=True))
        ]
        self._update(q.UpdateOperation.upsert_points(points))

    def _filter(self, conditions: list[Condition]) -> Any:
        q = self.q
        must = []
        for kind, key, value in conditions:
            if kind == "match":
                must.append(q.FieldCondition(key=key, match=q.MatchValue(value)))
            elif kind == "any":
                must.append(q.FieldCondition(key=key, match=q.MatchAny(list(value))))
            else:
                must.append(q.FieldCondition(key=key, range=q.RangeFloat(**value)))
        return q.Filter(must=must)

    def delete(self, conditions: list[Condition]) -> None:
        self._update(self.q.UpdateOperation.delete_points_by_filter(self._filter(conditions)))

    def delete_ids(self, ids: list[str]) -> None:
        self._update(self.q.UpdateOperation.delete_points(list(ids)))

    def retrieve(self, point: str) -> dict[str, Any] | None:
        shard = self._shard()
        found = self._call(lambda: shard.retrieve([point], with_payload=True, with_vector=False))
        return dict(found[0].payload or {}) if found else None

    def _page(self, conditions: list[Condition], offset: Any) -> tuple[list[dict[str, Any]], Any]:
        shard = self._shard()
        request = self.q.ScrollRequest(
            offset=offset, limit=BATCH * 4, filter=self._filter(conditions), with_payload=True, with_vector=False
        )
        records, offset = self._call(lambda: shard.scroll(request))
        return [dict(record.payload or {}) for record in records], offset

    def search(
        self, vector: np.ndarray, limit: int, conditions: list[Condition], ef: int, exact: bool, fields: list[str]
    ) -> list[tuple[dict[str, Any], float]]:
        q = self.q
        shard = self._shard()
        request = q.QueryRequest(
            limit=limit,
            query=q.Query.Nearest(np.asarray(vector, dtype=np.float32).tolist(), using=VECTOR),
            filter=self._filter(conditions) if conditions else None,
            params=q.SearchParams(hnsw_ef=ef, exact=exact),
            with_payload=fields,
            with_vector=False,
        )
        found = self._call(lambda: shard.query(request))
        return [(dict(point.payload or {}), float(point.score)) for point in found]

    def count(self, conditions: list[Condition]) -> int:
        shard = self._shard()
        request = self.q.CountRequest(exact=True, filter=self._filter(conditions))
        return int(self._call(lambda: shard.count(request)))

    def finish_writes(self) -> None:
        shard = self._shard()
        self._call(shard.optimize)
        self._call(shard.flush)

    def close(self) -> None:
        if self.shard is not None:
            shard, self.shard = self.shard, None
            self._call(shard.close)
