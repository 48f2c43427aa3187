"""``tvr index``: embed a folder of videos (or a list file) into a search index, resumably and incrementally.

Work flow (docs/search.md has the full layout):

1. ``settings.json`` fixes the model stamp, frame settings, windows and state precision when an index is created;
   running again with another model or other settings is refused (never a silent mix of embedding spaces).
2. The folder is walked; a video already embedded in a shard with the same size and mtime is kept, anything new or
   changed is embedded, a video that is gone is dropped.
3. Worker processes probe and decode videos (``tvr.utils.parallel``); this process encodes each video's windows,
   in batches of that video only, and writes finished videos to shards (atomically, every ``shard_windows``
   windows or ``flush_seconds``), so a kill loses at most the shard being filled.
4. Finalising (rank 0 under torchrun, after every rank's shards exist) orders the rows canonically (videos sorted
   by path, windows in time order), builds the FAISS index from the shards in that order, removes shards that hold
   nothing current, and writes the row tables, ``manifest.json`` (last: it marks a finished index) and
   ``report.json`` (unreadable files with their errors).

A killed run, resumed, therefore ends with the index an uninterrupted run makes, and so does a run sharded over
processes: every video's embedding depends on that video alone, and the final order on the paths alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

# video files are found as ``tvr prepare`` finds them (the same suffixes, hidden files skipped)
from tvr.data.prepare import VIDEO_EXTENSIONS, find_videos
from tvr.search.defaults import (
    ANN_KINDS,
    AUTO_THRESHOLD,
    DEFAULT_ANN,
    DEFAULT_STATE_DTYPE,
    SHARD_WINDOWS,
    STATE_DTYPES,
)
from tvr.search.encoders import EncoderMismatchError, SearchEncoder, embed_video
from tvr.search.indexed_folders import record_indexed_folder
from tvr.search.layout import FORMAT, MANIFEST, REPORT, SETTINGS, VERSION, read_settings
from tvr.search.store import SHARDS, IndexFormatError, ShardReader, read_meta, write_shard
from tvr.search.stores import parse_target
from tvr.search.stores.base import StoreWriter, same_entry
from tvr.search.stores.faiss import FolderWriter
from tvr.search.windows import DEFAULT_STRIDE, DEFAULT_WINDOW, FrameSpec, check_window, decode_windows
from tvr.types import Sliceable
from tvr.utils.errors import Interrupted, UserError
from tvr.utils.io import atomic_write_json, is_temporary_name, remove_stale_temporaries
from tvr.utils.lock import folder_lock
from tvr.utils.parallel import parallel_map

if TYPE_CHECKING:
    from tvr.search.stores.qdrant import QdrantAddress


class IndexSettingsError(UserError, ValueError):
    """An existing index was built with other settings, or the arguments are invalid."""


class IndexInterrupted(Interrupted):
    """Ctrl-C during ``tvr index``, saying what is kept: ``before`` videos embedded by earlier runs, ``embedded`` by
    this one (written to shards), of ``todo`` this run had to embed."""

    def __init__(self, index: Path, embedded: int, todo: int, before: int = 0) -> None:
        super().__init__()
        self.index, self.embedded, self.todo, self.before = Path(index), embedded, todo, before

    def __str__(self) -> str:
        kept, total = self.before + self.embedded, self.before + self.todo
        if kept >= total:
            return (
                f"every video ({total}) is embedded and kept in {self.index}, but the index is unfinished (stopped "
                "while finishing it): run the same command again to finish it (nothing is embedded again)"
            )
        earlier = f", {self.before} by earlier runs" if self.before else ""
        return (
            f"{kept} of {total} videos are embedded and kept in {self.index} ({self.embedded} by this run{earlier}); "
            f"the index is unfinished: run the same command again to embed the other {total - kept} and finish it "
            "(what is kept is not embedded again)"
        )


class NoVideosError(UserError):
    """The folder (or list file) holds no video file: nothing to index (the command line warns and exits with 1)."""


@dataclasses.dataclass(frozen=True)
class IndexOptions:
    """How ``tvr index`` builds (everything but the model and the paths)."""

    window: float = DEFAULT_WINDOW
    stride: float = DEFAULT_STRIDE
    workers: int = 0
    ann_kind: str = DEFAULT_ANN
    ann_threshold: int = AUTO_THRESHOLD
    nlist: int = 0
    state_dtype: str = DEFAULT_STATE_DTYPE
    shard_windows: int = SHARD_WINDOWS
    flush_seconds: float = 60.0
    progress: bool = True

    def validate(self) -> None:
        try:
            check_window(self.window, self.stride)
        except ValueError as exc:
            raise IndexSettingsError(str(exc)) from None
        if self.ann_kind not in ANN_KINDS:
            raise IndexSettingsError(f"--ann {self.ann_kind!r}: expected one of {list(ANN_KINDS)}")
        if self.state_dtype not in STATE_DTYPES:
            raise IndexSettingsError(f"--state-dtype {self.state_dtype!r}: expected one of {list(STATE_DTYPES)}")
        if self.shard_windows < 1 or self.workers < 0 or self.ann_threshold < 1 or self.nlist < 0:
            raise IndexSettingsError("shard size, ANN threshold and worker count must be positive (workers: 0 = auto)")


# --------------------------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class Source:
    """The videos to index: ``root`` (an absolute folder) and their paths relative to it (sorted, POSIX);
    ``skipped``: files left out, each ``{"video", "error"}`` (reported with the unreadable ones)."""

    root: Path
    kind: str  # folder | list
    videos: tuple[str, ...]
    skipped: tuple[dict[str, str], ...] = ()


def read_source(path: str | os.PathLike) -> Source:
    """A folder (walked recursively for video files, hidden files skipped; a file or folder linked from outside the
    folder is skipped and reported, as ``tvr serve`` would refuse to serve it) or a list file (one path per line,
    relative to the list's folder or absolute inside it; blank lines and ``#`` comments skipped)."""
    path = Path(path)
    if path.is_dir():
        root = path.resolve()
        videos, skipped = [], []
        for rel in sorted(p.as_posix() for p in find_videos(root)):
            target = (root / rel).resolve()
            if target.is_relative_to(root):
                videos.append(rel)
            else:
                error = f"a symbolic link to {target}, outside the indexed folder {root}: not indexed"
                skipped.append({"video": rel, "error": error})
        return Source(root, "folder", tuple(videos), tuple(skipped))
    if path.is_file():
        root = path.resolve().parent
        rels: set[str] = set()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            target = (root / line).resolve()
            if not target.is_relative_to(root):
                raise IndexSettingsError(
                    f"{path}:{number}: {line!r} lies outside the list's folder {root}; list "
                    "files name videos inside their own folder"
                )
            rels.add(target.relative_to(root).as_posix())
        return Source(root, "list", tuple(sorted(rels)))
    raise IndexSettingsError(f"{path}: no such folder or list file; expected a folder of videos or a list file")


def check_source(source_path: str | os.PathLike, out: str | os.PathLike) -> Source:
    """What ``tvr index`` checks before any model loads: the videos exist (a folder with at least one video file,
    or a list file), ``out`` is a folder or nothing yet and not the indexed folder itself."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise IndexSettingsError(f"--out {out}: is a file; expected a folder (existing or new) for the index")
    source = read_source(source_path)
    if out.resolve() == source.root:
        raise IndexSettingsError(f"--out {out} is the indexed folder itself; choose another folder")
    if not source.videos:
        looked = ", ".join(VIDEO_EXTENSIONS)
        where = f"the list file {source_path}" if source.kind == "list" else f"{source.root} (and its sub-folders)"
        raise NoVideosError(
            f"no video files in {where}: nothing to index (looked for {looked}"
            + (f"; {len(source.skipped)} link(s) outside the folder skipped" if source.skipped else "")
            + ")"
        )
    return source


def file_stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return int(st.st_size), int(st.st_mtime_ns)


# --------------------------------------------------------------------------------------------- worker side


def _decode_task(item: tuple[str, str, FrameSpec, float, float]) -> dict[str, Any]:
    path, rel, spec, window, stride = item
    start = time.perf_counter()
    try:
        size, mtime = file_stamp(Path(path))
        decoded = decode_windows(path, spec, window, stride)
        return {
            "video": rel,
            "ok": True,
            "size": size,
            "mtime_ns": mtime,
            "decoded": decoded,
            "seconds": time.perf_counter() - start,
        }
    except Exception as exc:  # noqa: BLE001 - every failure is reported, never raised out of the pool
        return {
            "video": rel,
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "seconds": time.perf_counter() - start,
        }


# --------------------------------------------------------------------------------------------- settings


def settings_for(encoder: SearchEncoder, source: Source, options: IndexOptions) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": encoder.stamp(),
        "frames": dataclasses.asdict(encoder.spec),
        "window": float(options.window),
        "stride": float(options.stride),
        "state_dtype": options.state_dtype,
        "head": {"name": encoder.head.name, "indexable": bool(encoder.head.indexable)},
        "source": {"root": str(source.root), "kind": source.kind},
    }


def _check_settings(index: Path, wanted: dict[str, Any], encoder: SearchEncoder) -> None:
    """Create ``settings.json``, or check that the existing index was built the same way."""
    if not (index / SETTINGS).exists():
        if (index / SHARDS).exists() or (index / MANIFEST).exists():
            raise IndexFormatError(f"{index} holds index files but no {SETTINGS}; use another --out")
        atomic_write_json(index / SETTINGS, wanted)
        return
    compare_settings(read_settings(index), wanted, encoder, str(index))


def compare_settings(saved: dict[str, Any], wanted: dict[str, Any], encoder: SearchEncoder, where: str) -> None:
    """Refuse to add to an index (``saved``: its settings) with another model, other windows, frame settings, state
    precision or another indexed folder than ``wanted``."""
    encoder.check_stamp(saved.get("model", {}), f"the index {where}")
    differ = [
        f"{key}: {saved.get(key)!r} before, {wanted[key]!r} now"
        for key in ("frames", "window", "stride", "state_dtype", "head")
        if saved.get(key) != wanted[key]
    ]
    if saved.get("source", {}).get("root") != wanted["source"]["root"]:
        differ.append(f"indexed folder: {saved.get('source', {}).get('root')} before, {wanted['source']['root']} now")
    if differ:
        raise IndexSettingsError(
            f"{where} was built with other settings ({'; '.join(differ)}); run again with the "
            "same ones to resume or update it, or build a new index with --out elsewhere"
        )


# --------------------------------------------------------------------------------------------- shards


def _shards(index: Path) -> list[Path]:
    folder = index / SHARDS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and not is_temporary_name(p.name))


def current_entries(index: Path, source: Source) -> dict[str, tuple[Path, dict[str, Any]]]:
    """For every video of ``source`` already embedded with its current size and mtime: (shard, its entry). When
    several shards hold it (a video changed and changed back), the newest shard (by name) wins."""
    stamps: dict[str, tuple[int, int] | None] = {}
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    wanted = set(source.videos)
    for shard in _shards(index):
        for entry in read_meta(shard)["videos"]:
            rel = entry["video"]
            if rel not in wanted:
                continue
            if rel not in stamps:
                try:
                    stamps[rel] = file_stamp(source.root / rel)
                except OSError:
                    stamps[rel] = None
            if stamps[rel] == (entry["size"], entry["mtime_ns"]):
                found[rel] = (shard, entry)
    return found


class _ShardBuffer:
    """Finished videos waiting to be written as one shard."""

    def __init__(self, index: Path, rank: int, options: IndexOptions, store_state: bool) -> None:
        self.folder = index / SHARDS
        self.rank, self.options, self.store_state = rank, options, store_state
        #: (entry, embedding, state) of each finished video, added in one step (a Ctrl-C between two appends
        #: cannot leave the three out of step: the shard written on the way out holds whole videos)
        self.pending: list[tuple[dict[str, Any], torch.Tensor, Any]] = []
        self.rows = 0
        self.last_flush = time.monotonic()
        self.written = 0
        #: videos in the shards this buffer wrote
        self.videos_written = 0

    def add(self, entry: dict[str, Any], emb: torch.Tensor, state: Any) -> None:
        entry = {**entry, "rows": [self.rows, self.rows + int(emb.shape[0])]}
        self.pending.append((entry, emb, state if self.store_state else None))
        self.rows += int(emb.shape[0])
        if self.rows >= self.options.shard_windows or time.monotonic() - self.last_flush >= self.options.flush_seconds:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        name = f"{time.time_ns():020d}-r{self.rank:03d}-{secrets.token_hex(3)}"
        entries, embs, states = (list(column) for column in zip(*self.pending, strict=True))
        rows = 0
        for entry in entries:  # rows from the pending list itself (an interrupted add may have counted one more)
            count = entry["rows"][1] - entry["rows"][0]
            entry["rows"] = [rows, rows + count]
            rows += count
        state = type(states[0]).cat(states) if self.store_state else _NoState()
        write_shard(self.folder, name, torch.cat(embs), state, entries, half=self.options.state_dtype == "float16")
        self.written += 1
        self.videos_written += len(entries)
        self.pending, self.rows = [], 0
        self.last_flush = time.monotonic()


@dataclasses.dataclass
class _NoState(Sliceable):
    """The rerank state of an indexable head: nothing beyond the shortlist embedding (its score is exact)."""


# --------------------------------------------------------------------------------------------- encoding


def _progress_items(items: list, fn, workers: int, progress: bool) -> Iterator[dict[str, Any]]:
    yield from parallel_map(fn, items, workers, "indexing videos", progress)


def embed_videos(
    index: Path, source: Source, todo: list[str], encoder: SearchEncoder, options: IndexOptions, rank: int = 0
) -> dict[str, Any]:
    """Decode (worker processes) and embed (here) the videos ``todo``, writing shards; returns counts, timings and
    the unreadable files."""
    encoder.head.eval()
    buffer = _ShardBuffer(index, rank, options, store_state=not encoder.head.indexable)
    items = [(str(source.root / rel), rel, encoder.spec, options.window, options.stride) for rel in todo]
    bad: list[dict[str, str]] = []
    windows = 0
    decode_seconds = encode_seconds = 0.0
    start = time.perf_counter()
    results = None
    try:
        results = _progress_items(items, _decode_task, options.workers, options.progress)
        for result in results:
            decode_seconds += result["seconds"]
            if not result["ok"]:
                bad.append({"video": result["video"], "error": result["error"]})
                continue
            decoded = result["decoded"]
            t0 = time.perf_counter()
            try:
                emb, state = embed_video(encoder, decoded)
            except Exception as exc:  # noqa: BLE001 - a file the model cannot take is reported, never fatal
                bad.append({"video": result["video"], "error": f"{type(exc).__name__}: {exc}"})
                continue
            encode_seconds += time.perf_counter() - t0
            windows += int(emb.shape[0])
            entry = {
                "video": result["video"],
                "size": result["size"],
                "mtime_ns": result["mtime_ns"],
                "duration": decoded.duration,
                "windows": [list(w) for w in decoded.windows],
            }
            buffer.add(entry, emb, state)
    except KeyboardInterrupt:
        if results is not None:
            results.close()  # the decoding workers stop (they ignore Ctrl-C themselves: no tracebacks)
        buffer.flush()  # the videos embedded since the last shard are kept too
        raise IndexInterrupted(index, buffer.videos_written, len(todo)) from None
    buffer.flush()
    return {
        "embedded": len(todo) - len(bad),
        "bad": bad,
        "windows": windows,
        "shards_written": buffer.written,
        "seconds": time.perf_counter() - start,
        "decode_seconds": decode_seconds,
        "encode_seconds": encode_seconds,
    }


# --------------------------------------------------------------------------------------------- finalising


def finalise(index: Path, source: Source, settings: dict[str, Any], writer: StoreWriter) -> dict[str, Any]:
    """Bring the store ``writer`` writes in step with the shards of ``index``: videos it holds that are gone or
    changed are deleted, current ones it lacks are added (in canonical order: videos sorted by path), the manifest
    is committed last; then shards holding nothing current are deleted. Returns the manifest, with ``dropped``."""
    live = current_entries(index, source)
    writer.begin()
    current = {rel: {**entry, "shard": shard.name} for rel, (shard, entry) in live.items()}
    used = {shard for shard, _ in live.values()}
    dropped: set[str] = set()
    for shard in _shards(index):
        dropped.update(e["video"] for e in read_meta(shard)["videos"] if e["video"] not in live)
    stored = writer.stored()
    for video in sorted(stored):
        if not same_entry(stored[video], current.get(video, {})):
            writer.delete(video)
    readers: dict[Path, ShardReader] = {}
    for rel in sorted(live):
        shard = live[rel][0]
        if not same_entry(stored.get(rel), current[rel]):
            if shard not in readers:
                readers[shard] = ShardReader(shard)
            writer.add(current[rel], readers[shard])
    manifest = writer.commit(settings)
    for shard in _shards(index):
        if shard not in used:
            shutil.rmtree(shard, ignore_errors=True)
    return {**manifest, "dropped": sorted(dropped)}


def store_writer(
    target: Path | QdrantAddress, index: Path, settings: dict[str, Any], options: IndexOptions
) -> StoreWriter:
    """The writer of the store ``target`` names (the index folder ``index`` itself, or a Qdrant collection whose
    rerank state is in ``index``)."""
    if isinstance(target, Path):
        return FolderWriter(index, options.ann_kind, options.ann_threshold, options.nlist)
    from tvr.search.stores.qdrant import QdrantWriter

    if options.nlist:
        raise IndexSettingsError("--nlist: a Qdrant collection has no IVF cells")
    return QdrantWriter(target, index, settings, options.ann_kind, options.ann_threshold)


# --------------------------------------------------------------------------------------------- the job


def build_index(
    source_path: str | os.PathLike,
    out: str | os.PathLike,
    encoder: SearchEncoder,
    options: IndexOptions | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    state: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Build or update the index ``out`` of the videos at ``source_path`` (see the module docstring); returns the
    report (also written to ``report.json`` in the index's folder). ``out``: a folder, or a Qdrant address
    (``qdrant://HOST:PORT/COLLECTION`` with ``state``, the folder of its shards; ``qdrant+local:PATH``,
    ``qdrant+edge:PATH``: shards in PATH). Under torchrun (``world_size`` > 1, a process group joined) every rank
    embeds its share of the videos into its own shards and rank 0 finalises."""
    options = options or IndexOptions()
    options.validate()
    start = time.perf_counter()
    target = parse_target(out)
    index = work_folder(target, state)
    source = read_source(source_path)
    if index.resolve() == source.root:
        raise IndexSettingsError(f"--out {index} is the indexed folder itself; choose another folder")
    settings = settings_for(encoder, source, options)
    # rank 0 holds the index folder's lock for the whole job: a second `tvr index` on it stops at once
    with folder_lock(index, "index") if rank == 0 else contextlib.nullcontext():
        return _build(target, index, source, encoder, options, settings, rank, world_size, start)


def work_folder(target: Path | QdrantAddress, state: str | os.PathLike | None) -> Path:
    """The folder a job keeps its shards (the embedded work and the rerank state), settings and report in: the index
    folder itself, the local or Edge store's folder, or ``--state`` for a Qdrant server's collection."""
    if isinstance(target, Path):
        if state is not None:
            raise IndexSettingsError(f"--state {state}: only an index in Qdrant keeps its rerank state apart")
        return target
    if target.kind != "remote":
        if state is not None and Path(state).resolve() != target.folder.resolve():
            raise IndexSettingsError(f"--state {state}: {target.text} keeps its rerank state in {target.folder}")
        return target.folder
    if state is None:
        raise IndexSettingsError(
            f"--out {target.text}: name the folder of the index's rerank state with --state DIR (its shards: on "
            "storage every query node sees, docs/search.md)"
        )
    return Path(state)


def check_target(out: str | os.PathLike, state: str | os.PathLike | None = None) -> Path:
    """Refuse, in a line, an ``--out`` that is neither a folder nor a Qdrant address, a Qdrant server's collection
    without ``--state``, and a server that does not answer: what a job can tell before it loads a model. Returns the
    job's folder (:func:`work_folder`)."""
    target = parse_target(out)
    folder = work_folder(target, state)
    if not isinstance(target, Path) and target.kind == "remote":
        engine = target.engine()
        try:
            engine.vector_size()
        finally:
            engine.close()
    return folder


def report_file(out: str | os.PathLike, state: str | os.PathLike | None = None) -> Path:
    """Where ``tvr index --out OUT [--state STATE]`` writes its ``report.json``."""
    return work_folder(parse_target(out), state) / REPORT


def _build(
    target: Path | QdrantAddress,
    index: Path,
    source: Source,
    encoder: SearchEncoder,
    options: IndexOptions,
    settings: dict[str, Any],
    rank: int,
    world_size: int,
    start: float,
) -> dict[str, Any]:
    from tvr.utils.distributed import all_gather_object, barrier

    writer = None
    try:
        if rank == 0:
            index.mkdir(parents=True, exist_ok=True)
            _check_settings(index, settings, encoder)
            writer = store_writer(target, index, settings, options)
            if not isinstance(target, Path):  # a collection of another model or settings is refused before any work
                writer.check(lambda saved: compare_settings(saved, settings, encoder, target.text))
            # nothing of this job is being written yet: every temporary is a leftover of a killed run
            remove_stale_temporaries(index, recursive=True)
            (index / MANIFEST).unlink(missing_ok=True)  # the index is unfinished until this run writes it again
        barrier()
        if rank != 0:
            _check_settings(index, settings, encoder)
        done = current_entries(index, source)
        todo = [rel for rel in source.videos if rel not in done]
        mine = todo[rank::world_size]
        try:
            part = embed_videos(index, source, mine, encoder, options, rank)
        except IndexInterrupted as exc:
            exc.before = len(done)
            raise
        parts = all_gather_object(part) if world_size > 1 else [part]
        barrier()
        report: dict[str, Any] = {}
        if rank == 0:
            try:
                manifest = finalise(index, source, settings, writer)
            except KeyboardInterrupt:
                raise IndexInterrupted(index, len(todo), len(todo), len(done)) from None
            record_indexed_folder(index, source.root)  # tvr serve's default media folder (indexed_folders)
            bad = sorted([*source.skipped, *(b for p in parts for b in p["bad"])], key=lambda b: b["video"])
            seconds = time.perf_counter() - start
            windows = sum(p["windows"] for p in parts)
            report = {
                "index": str(index) if isinstance(target, Path) else target.text,
                "source": str(source.root),
                "videos": len(source.videos),
                "indexed": len(manifest["videos"]),
                "embedded": sum(p["embedded"] for p in parts),
                "reused": len(done),
                "dropped": manifest["dropped"],
                "bad": bad,
                "windows_embedded": windows,
                "rows": manifest["rows"],
                "ann": manifest["ann"],
                "processes": world_size,
                "seconds": round(seconds, 3),
                "windows_per_second": round(windows / seconds, 3) if seconds > 0 and windows else None,
                "decode_seconds": round(sum(p["decode_seconds"] for p in parts), 3),
                "encode_seconds": round(sum(p["encode_seconds"] for p in parts), 3),
            }
            atomic_write_json(index / REPORT, report)
        barrier()
        return report
    finally:
        if writer is not None:
            writer.close()


__all__ = [
    "VIDEO_EXTENSIONS",
    "IndexOptions",
    "IndexSettingsError",
    "Source",
    "build_index",
    "read_source",
    "EncoderMismatchError",
]
