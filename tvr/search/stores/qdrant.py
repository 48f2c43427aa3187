"""An index whose shortlist lives in a Qdrant collection: ``qdrant://HOST:PORT/COLLECTION`` (a server or cluster;
``qdrant+https://`` over TLS), ``qdrant+local:PATH`` (``qdrant-client``'s local mode in the folder PATH) or
``qdrant+edge:PATH`` (Qdrant Edge, the engine in-process, in the folder PATH).

The collection holds three kinds of points (payload ``kind``), with ids derived from what they describe, so writing
one again replaces it:

* ``window`` — one per window, its shortlist embedding as the named vector ``window`` (inner product), and the
  payload ``video`` (the path relative to the indexed folder, as hits name it), ``path`` (the video's path prefixes,
  what ``--under`` matches), ``window`` (its number in the video), ``start``, ``end`` (seconds) and ``model`` (the
  model stamp's id); id ``uuid5(video, window number)``;
* ``video`` — one per video, no vector: size, mtime_ns, duration, window count, and where its rerank state is in
  tvr's shards (``shard``, ``rows``); written after its windows, so a video that has a record has all its windows;
* ``manifest`` — one, no vector: the index's settings (model stamp, frames, windows, state precision, head, indexed
  folder), ``rows``, the shortlist's settings (``ann``), where the shards are (``state.root``), and ``complete``.

``tvr index`` sets ``complete`` to false before it changes any point and back to true after the last one, and a
query refuses a collection that is not complete: nothing half-written is ever searched. Before it writes a batch of
videos' windows it notes their names in the manifest point (``adding``); a job that stops in the middle leaves that
note, and the next job deletes those videos' windows and records and adds them again (deterministic ids alone would
not remove the extra windows of an older, longer version of a video). A point without the
``window`` vector is never a search result, so records and the manifest need no filter.

The rerank state stays in tvr's shards (the folder ``--state`` names; PATH for the local and Edge stores), read by
position with the window's (video, window number), i.e. its point id: docs/search.md ("Beyond one machine") and
docs/benchmarks.md give the measurement that chose this over keeping it in Qdrant.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np

import tvr.search.ann as ann
from tvr.search.checks import is_relative_path
from tvr.search.filters import WindowFilter, path_prefixes
from tvr.search.layout import FORMAT, SETTINGS, VERSION
from tvr.search.store import IndexFormatError, ShardReader
from tvr.search.stores.base import Candidates, ShortlistStore, StoreWriter
from tvr.search.stores.qdrant_engines import (
    BATCH,
    EDGE_FOLDER,
    LOCAL_FOLDER,
    VECTOR,
    ClientEngine,
    Condition,
    EdgeEngine,
    Engine,
)
from tvr.utils.data_files import MAX_DEPTH, json_depth_exceeds
from tvr.utils.errors import UserError
from tvr.utils.io import json_kind

#: the URL schemes of a Qdrant store
SCHEMES = ("qdrant", "qdrant+https", "qdrant+local", "qdrant+edge")
#: the collection of a local or Edge store (one per folder)
LOCAL_COLLECTION = "tvr"
DEFAULT_PORT = 6333
#: how points are named: uuid5 in this namespace of a key that says what the point describes
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "tvr-search/qdrant-store")
#: the manifest point's store format
STORE_FORMAT = "tvr-qdrant-store"
STORE_VERSION = 1
#: payload fields a search reads
HIT_FIELDS = ["video", "window", "start", "end"]
_COLLECTION_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,254}$")


class AddressError(UserError, ValueError):
    """A ``--out`` / index address that is not a folder or a Qdrant address tvr knows."""


@dataclasses.dataclass(frozen=True)
class QdrantAddress:
    """Where a Qdrant store is: ``kind`` (remote | local | edge), the server's ``url`` and ``collection`` (remote), or
    the ``folder`` (local, Edge). ``text``: the address as given, for messages."""

    kind: str
    text: str
    url: str = ""
    collection: str = LOCAL_COLLECTION
    folder: Path | None = None

    def engine(self) -> Engine:
        """A connection to the store's engine (nothing is created)."""
        if self.kind == "edge":
            return EdgeEngine(self.folder / EDGE_FOLDER, self.text)
        if self.kind == "local":
            return ClientEngine(self.collection, self.text, path=self.folder / LOCAL_FOLDER, api_key=None)
        return ClientEngine(self.collection, self.text, url=self.url, api_key=os.environ.get("QDRANT_API_KEY") or None)


def looks_like_address(text: str) -> bool:
    """Whether ``text`` names a store by URL (``scheme://...`` or ``qdrant...:``) rather than a folder."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", text)
    return bool(match) and (match.group(1).lower().startswith("qdrant") or match.group(2).startswith("//"))


def parse_address(text: str) -> QdrantAddress:
    """``qdrant://HOST:PORT/COLLECTION`` (``qdrant+https://`` for TLS; PORT defaults to 6333), ``qdrant+local:PATH``
    or ``qdrant+edge:PATH``; anything else is refused in a line. An API key in the address is refused: it goes in
    ``QDRANT_API_KEY``, out of shell histories, process lists and logs."""
    scheme, _, rest = text.partition(":")
    expected = (
        "expected qdrant://HOST:PORT/COLLECTION, qdrant+https://HOST:PORT/COLLECTION, qdrant+local:PATH, "
        "qdrant+edge:PATH or a folder"
    )
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise AddressError(f"{text}: unknown scheme {scheme!r}; {expected}")
    if scheme in ("qdrant+local", "qdrant+edge"):
        if not rest.strip():
            raise AddressError(f"{text}: no folder after {scheme}:; {expected}")
        return QdrantAddress(scheme.removeprefix("qdrant+"), text, folder=Path(rest).expanduser())
    if not rest.startswith("//"):
        raise AddressError(f"{text}: {expected}")
    parts = urlsplit(f"http:{rest}")
    if parts.username is not None or parts.password is not None:
        shown = f"{scheme}://…@{rest[2:].rpartition('@')[2]}"  # never the credentials themselves
        raise AddressError(f"{shown}: an address carries no credentials; put the API key in QDRANT_API_KEY")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise AddressError(f"{text}: the port is not a number from 1 to 65535; {expected}") from None
    collection = unquote(parts.path.strip("/"))
    if not parts.hostname or not _COLLECTION_NAME.match(collection) or parts.query or parts.fragment:
        raise AddressError(f"{text}: {expected} (COLLECTION: letters, digits, '_', '-', '.')")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    protocol = "https" if scheme == "qdrant+https" else "http"
    return QdrantAddress("remote", text, url=f"{protocol}://{host}:{port}", collection=collection)


def window_id(video: str, window: int) -> str:
    return str(uuid.uuid5(NAMESPACE, f"window\0{video}\0{window}"))


def record_id(video: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"video\0{video}"))


MANIFEST_ID = str(uuid.uuid5(NAMESPACE, "manifest"))


def filter_conditions(where: WindowFilter | None) -> list[Condition]:
    """The payload conditions of ``where`` (pushed down: the engine searches only among the windows that pass)."""
    conditions: list[Condition] = []
    if where is not None and where.under is not None:
        conditions.append(("match", "path", where.under))
    if where is not None and where.between is not None:
        start, end = where.between
        conditions += [("range", "start", {"lt": end}), ("range", "end", {"gt": start})]
    return conditions


def _refuse(address: QdrantAddress, problem: str) -> IndexFormatError:
    return IndexFormatError(f"{address.text}: {problem}")


def read_manifest(engine: Engine, address: QdrantAddress) -> dict[str, Any] | None:
    """The manifest point's payload, checked to be one tvr wrote (None when the collection has none)."""
    manifest = engine.retrieve(MANIFEST_ID)
    if manifest is None:
        return None
    if json_depth_exceeds(manifest, MAX_DEPTH):  # compared and copied as tvr's own settings later
        raise _refuse(address, f"its manifest point's payload is nested more than {MAX_DEPTH} levels deep")
    store = manifest.get("store")
    if manifest.get("kind") != "manifest" or not isinstance(store, dict) or store.get("format") != STORE_FORMAT:
        raise _refuse(address, "its manifest point is not one tvr index writes; use another collection")
    if store.get("version") != STORE_VERSION or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise _refuse(
            address,
            f"written by another tvr (store version {store.get('version')}, index version {manifest.get('version')}; "
            f"this tvr reads {STORE_VERSION} and {VERSION}): build it again into a new collection",
        )
    if not isinstance(manifest.get("model"), dict):
        raise _refuse(address, f"the model stamp is {json_kind(manifest.get('model'))}, not an object")
    for key in ("window", "stride"):
        value = manifest.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise _refuse(address, f"its manifest's {key!r} is {json_kind(value)}; expected a positive number")
    source = manifest.get("source")
    if not (isinstance(source, dict) and isinstance(source.get("root"), str)):
        raise _refuse(address, f"its manifest's 'source' is {json_kind(source)}; expected the indexed folder")
    return manifest


# --------------------------------------------------------------------------------------------- reading


class QdrantStore(ShortlistStore):
    """A finished Qdrant store, opened (see the module docstring): its manifest point checked, its video records
    read (sorted by path, numbered as a folder's manifest numbers them), the shards of the rerank state opened when
    first needed (``state``: where they are on this machine, when not where ``tvr index`` wrote them)."""

    def __init__(
        self, address: QdrantAddress, ef_search: int | None = None, state: str | os.PathLike | None = None
    ) -> None:
        if ef_search is not None and (isinstance(ef_search, bool) or not isinstance(ef_search, int) or ef_search < 1):
            raise UserError(f"ef_search={ef_search!r}: expected a positive integer")
        self.address, self.location = address, address.text
        self.engine = address.engine()
        try:
            self._open(ef_search, state)
        except BaseException:
            self.engine.close()
            raise

    def _open(self, ef_search: int | None, state: str | os.PathLike | None) -> None:
        address = self.address
        size = self.engine.vector_size()
        if size is None:
            if address.folder is not None and (address.folder / SETTINGS).is_file():  # a first build stopped early
                raise _refuse(address, "the index is not finished: run tvr index again with the same arguments")
            raise _refuse(address, "no such collection; build it with tvr index VIDEOS --out " + address.text)
        manifest = read_manifest(self.engine, address)
        if manifest is None:
            raise _refuse(address, "not a tvr search index (no manifest point); build one with tvr index")
        if manifest["store"].get("complete") is not True:
            raise _refuse(
                address,
                "the index is not finished (a tvr index job on it stopped or is running): run tvr index again with "
                "the same arguments to finish it",
            )
        rows, spec = manifest.get("rows"), manifest.get("ann")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise _refuse(address, f"'rows' is {json_kind(rows)}; expected a count")
        if rows and not (isinstance(spec, dict) and spec.get("kind") in ("flat", "hnsw")):
            raise _refuse(address, f"'ann' is {json_kind(spec)}; expected the shortlist's settings")
        if rows and size != (int(spec.get("dim", -1)), "Dot"):
            raise _refuse(
                address,
                f"holds {VECTOR!r} vectors of size {size[0]} ({size[1] or 'no such vector'}); the index's model "
                f"embeds {spec.get('dim')} (inner product): the collection was changed after tvr index wrote it",
            )
        self.dim = int(spec["dim"]) if rows else 0
        self.ef_search = ef_search or int((spec or {}).get("ef_search") or ann.HNSW_EF_SEARCH)
        self.exact = (spec or {}).get("kind") == "flat"
        records = sorted(self.engine.scroll([("match", "kind", "video")]), key=lambda r: str(r.get("video")))
        videos, first, shard_names = self._videos(records)
        if first != rows:
            raise _refuse(address, f"its video records hold {first} windows, its manifest says {rows}")
        self.manifest = {**manifest, "videos": videos, "shards": sorted(set(shard_names))}
        self._numbers = {entry["video"]: number for number, entry in enumerate(videos)}
        shard_number = {name: k for k, name in enumerate(self.manifest["shards"])}
        self._first_row = np.array([entry["first_row"] for entry in videos], dtype=np.int64)
        self._windows = np.array([entry["windows"] for entry in videos], dtype=np.int64)
        self._shard = np.array([shard_number[name] for name in shard_names], dtype=np.int64)
        self._shard_row = np.array([record["rows"][0] for record in records], dtype=np.int64)
        root = state if state is not None else (address.folder or (manifest.get("state") or {}).get("root"))
        self.state_root = Path(root) if root else None
        self._readers: list[ShardReader] | None = None

    def _videos(self, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, list[str]]:
        videos, shard_names = [], []
        first = 0
        for record in records:
            video, rows = record.get("video"), record.get("rows")
            ok = (
                is_relative_path(video)
                and all(_count(record.get(key)) for key in ("size", "mtime_ns", "windows"))
                and isinstance(record.get("shard"), str)
                and is_relative_path(record["shard"])
                and "/" not in record["shard"]
                and isinstance(rows, list)
                and len(rows) == 2
                and all(_count(r) for r in rows)
                and rows[1] - rows[0] == record.get("windows")
            )
            if not ok or (videos and videos[-1]["video"] == video):
                raise _refuse(self.address, f"the video record of {str(video)[:80]!r} is not one tvr index writes")
            videos.append(
                {
                    "video": video,
                    "size": record["size"],
                    "mtime_ns": record["mtime_ns"],
                    "duration": record.get("duration"),
                    "first_row": first,
                    "windows": record["windows"],
                }
            )
            shard_names.append(record["shard"])
            first += record["windows"]
        return videos, first, shard_names

    @property
    def readers(self) -> list[ShardReader]:
        """The shards of the rerank state, opened on first use (a head that needs none never opens them)."""
        if self._readers is None:
            if self.state_root is None:
                raise _refuse(self.address, "its manifest does not say where the rerank state is: pass state=DIR")
            shards = self.state_root / "shards"
            if not shards.is_dir():
                raise IndexFormatError(
                    f"{self.location}: its rerank state is not at {self.state_root} (no shards folder there): mount it "
                    "there, or name where it is with --state DIR"
                )
            self._readers = [ShardReader(shards / name) for name in self.manifest["shards"]]
        return self._readers

    def shortlist(self, query: np.ndarray, n: int, where: WindowFilter | None = None) -> Candidates:
        conditions = filter_conditions(where)
        found = self.engine.search(query[0], n, conditions, max(self.ef_search, n), self.exact, HIT_FIELDS)
        video = np.empty(len(found), dtype=np.int64)
        window = np.empty(len(found), dtype=np.int64)
        times = np.empty((len(found), 2), dtype=np.float64)
        for i, (payload, _) in enumerate(found):
            number = self._numbers.get(payload.get("video"))
            step = payload.get("window")
            if number is None or not _count(step) or step >= self._windows[number]:
                raise _refuse(
                    self.address,
                    f"a window point names {str(payload.get('video'))[:80]!r} window {step!r}, which its video "
                    "records do not hold: build the index again",
                )
            video[i], window[i] = number, step
            times[i] = payload.get("start"), payload.get("end")
        return Candidates(
            order=self._first_row[video] + window,
            video=video,
            times=times,
            shard=self._shard[video],
            row=self._shard_row[video] + window,
            score=np.array([score for _, score in found], dtype=np.float64),
            exhausted=len(found) < n or n >= self.rows,
        )

    def count(self, where: WindowFilter | None = None) -> int:
        if not where:
            return self.rows
        return self.engine.count([("match", "kind", "window"), *filter_conditions(where)])

    def close(self) -> None:
        self.engine.close()


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --------------------------------------------------------------------------------------------- writing


class QdrantWriter(StoreWriter):
    """Keeps a Qdrant store in step with the shards of ``state_root`` (see the module docstring): videos added
    point by point (their records last), deleted windows first, the manifest point completed last. ``settings``: the
    index's settings, as the manifest point carries them."""

    def __init__(
        self, address: QdrantAddress, state_root: Path, settings: dict[str, Any], ann_kind: str, ann_threshold: int
    ) -> None:
        self.address, self.state_root, self.settings = address, state_root.resolve(), settings
        self.ann_kind, self.ann_threshold = ann_kind, ann_threshold
        self.engine = address.engine()
        self.dim: int | None = None
        self.manifest: dict[str, Any] | None = None
        self.pending: list[tuple[dict[str, Any], np.ndarray]] = []
        self.pending_rows = 0

    def check(self, compare: Callable[[dict[str, Any]], None]) -> None:
        """Before any work: the collection is absent, empty (made by its operator: then it must have an inner-product
        ``window`` vector), or a tvr index of the same settings (``compare(saved)`` raises otherwise) whose rerank
        state is in ``state_root``."""
        if self.ann_kind == "ivf":
            raise UserError("--ann ivf: a Qdrant collection is searched by its HNSW graph (--ann auto | hnsw | flat)")
        size = self.engine.vector_size()
        if size is None:
            return
        manifest = read_manifest(self.engine, self.address)
        if manifest is None:
            if self.engine.count([]):
                raise _refuse(self.address, "the collection holds points tvr index did not write; use another one")
            if size[1] != "Dot":
                raise _refuse(
                    self.address,
                    f"the collection has no inner-product vector named {VECTOR!r} (create it with the vector "
                    f"{VECTOR!r}: size = the model's embedding size, distance Dot; or let tvr index create it)",
                )
            return
        compare(manifest)
        self.dim = (manifest.get("ann") or {}).get("dim")
        recorded = (manifest.get("state") or {}).get("root")
        if self.address.kind == "remote" and recorded != str(self.state_root):
            raise IndexFormatError(
                f"{self.address.text}: its rerank state is kept in {recorded}; this job's --state is {self.state_root} "
                "(one state folder per collection)"
            )
        self.manifest = manifest

    def begin(self) -> None:
        if self.manifest is None:
            return
        # the collection exists and is ours: unfinished from now on
        self._write_manifest({**self.manifest, "store": {**self.manifest["store"], "complete": False}})
        adding = self.manifest.get("adding") or []
        if adding:  # the videos a stopped job was adding: some of their windows may be written, so all go again
            self.engine.delete([("match", "kind", "window"), ("any", "video", adding)])
            self.engine.delete_ids([record_id(video) for video in adding])
            self._write_manifest({**self.manifest, "adding": []})

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        self.engine.upsert([MANIFEST_ID], None, [{**manifest, "kind": "manifest"}])
        self.manifest = manifest

    def _manifest(self, rows: int, complete: bool) -> dict[str, Any]:
        spec = None
        if rows:
            chosen = ann.choose(self.ann_kind, rows, self.dim or 0, self.ann_threshold)
            spec = {
                "kind": chosen.kind,
                "engine": "qdrant",
                "rows": rows,
                "dim": self.dim,
                "hnsw_m": ann.HNSW_M,
                "ef_construction": ann.HNSW_EF_CONSTRUCTION,
                "ef_search": ann.hnsw_ef_search(rows),
            }
        return {
            **self.settings,
            "rows": rows,
            "ann": spec,
            "state": {"root": str(self.state_root)},
            "store": {"format": STORE_FORMAT, "version": STORE_VERSION, "complete": complete},
            "adding": [],
        }

    def stored(self) -> dict[str, dict[str, Any]]:
        if self.manifest is None:
            return {}
        return {str(record.get("video")): record for record in self.engine.scroll([("match", "kind", "video")])}

    def _ensure_collection(self, dim: int) -> None:
        """Create the collection (or take its operator's empty one) for vectors of ``dim`` floats, its first point an
        unfinished manifest."""
        if self.dim == dim:
            return
        size = self.engine.vector_size()
        if size is None:
            self.engine.create(dim, ann.HNSW_M, ann.HNSW_EF_CONSTRUCTION)
        elif size != (dim, "Dot"):
            raise _refuse(
                self.address,
                f"its {VECTOR!r} vectors have {size[0]} floats ({size[1] or 'no such vector'}); this model embeds "
                f"{dim} (inner product): use another collection",
            )
        elif self.manifest is None:  # its operator's empty collection: the payload indexes tvr's lookups use
            self.engine.index_payload()
        self.dim = dim
        if self.manifest is None:
            self._write_manifest(self._manifest(rows=0, complete=False))

    def add(self, entry: dict[str, Any], reader: ShardReader) -> None:
        a, b = entry["rows"]
        self._ensure_collection(int(reader.emb.shape[1]))
        self.pending.append((entry, np.asarray(reader.emb[a:b], dtype=np.float32)))
        self.pending_rows += b - a
        if self.pending_rows >= BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        model = self.settings["model"].get("id")
        # noted before any of their windows is written: the next job deletes what a stop in between leaves
        self._write_manifest({**self.manifest, "adding": [entry["video"] for entry, _ in self.pending]})
        ids, payloads = [], []
        for entry, _ in self.pending:
            video = entry["video"]
            prefixes = path_prefixes(video)
            for step, (start, end) in enumerate(entry["windows"]):
                ids.append(window_id(video, step))
                payloads.append(
                    {
                        "kind": "window",
                        "video": video,
                        "path": prefixes,
                        "window": step,
                        "start": float(start),
                        "end": float(end),
                        "model": model,
                    }
                )
        vectors = np.concatenate([emb for _, emb in self.pending])
        for a in range(0, len(ids), BATCH):
            self.engine.upsert(ids[a : a + BATCH], vectors[a : a + BATCH], payloads[a : a + BATCH])
        records = [
            {
                "kind": "video",
                "video": entry["video"],
                "size": entry["size"],
                "mtime_ns": entry["mtime_ns"],
                "duration": entry["duration"],
                "windows": entry["rows"][1] - entry["rows"][0],
                "shard": entry["shard"],
                "rows": list(entry["rows"]),
                "model": model,
            }
            for entry, _ in self.pending
        ]
        for a in range(0, len(records), BATCH):  # after their windows: a video with a record has all of them
            part = records[a : a + BATCH]
            self.engine.upsert([record_id(r["video"]) for r in part], None, part)
        self.pending, self.pending_rows = [], 0

    def delete(self, video: str) -> None:
        # the windows first: a record left without its windows is deleted again by the next job, windows left without
        # their record would be searched
        self.engine.delete([("match", "kind", "window"), ("match", "video", video)])
        self.engine.delete_ids([record_id(video)])

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._flush()
        if self.manifest is None:
            raise UserError(f"{self.address.text}: no video was indexed, so nothing was written to the collection")
        self.engine.finish_writes()
        records = sorted(self.engine.scroll([("match", "kind", "video")]), key=lambda r: str(r.get("video")))
        rows = sum(int(r.get("windows", 0)) for r in records)
        points = self.engine.count([("match", "kind", "window")])
        if points != rows:  # never expected: every window is written with its record and deleted with it
            raise RuntimeError(f"{self.address.text}: {points} window points, but its video records hold {rows}")
        final = {**self._manifest(rows=rows, complete=True), "adding": []}
        self._write_manifest(final)
        self.engine.finish_writes()
        videos, first = [], 0
        for record in records:
            videos.append({key: record.get(key) for key in ("video", "size", "mtime_ns", "duration", "windows")})
            videos[-1]["first_row"] = first
            first += int(record.get("windows", 0))
        return {**final, "shards": sorted({str(r.get("shard")) for r in records}), "videos": videos}

    def close(self) -> None:
        self.engine.close()
