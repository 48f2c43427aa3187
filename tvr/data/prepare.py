"""``tvr prepare``: turn raw downloads into the training form, resumably, in parallel, losing nothing.

``prepare_videos(SRC, DST)`` re-encodes every video file under SRC (recursively) to the form the CLIP4Clip / GARE
recipes train on (spec §2.1): a constant 3 fps, the shorter side scaled to 224 (the longer side scaled by the same
factor and truncated to an even number, as yuv420p needs), the video stream only, H.264 (PyAV / libx264, yuv420p,
CRF 23, index at the front of the file). The frame-rate conversion is ffmpeg's ``fps`` filter: input frame i
(timestamp t_i) goes to output slot round(t_i · fps), each slot keeps the last frame that landed in it and an empty
slot repeats the previous frame. The reference's ``ffmpeg -r 3`` drops and repeats frames the same way, though
ffmpeg's ``-r`` bookkeeping may pick the neighbouring frame at a slot boundary. Scaling is ffmpeg's bicubic
``scale``. ``DST`` mirrors SRC's folder structure (every output is ``<same relative path>.mp4``), or with ``flat``
holds every output directly (two sources with the same name are then reported as a clash).

Resumable and crash-safe: each output is encoded into a temporary file in its destination folder
(``.<name>.tvr-<random>.tmp``, see :mod:`tvr.utils.io`), fsynced and renamed into place. A file under its final name is
therefore always complete, and *that* is how a resumed run knows which outputs are finished: it skips them, removes
the temporaries a killed run left, and encodes the rest. The settings are recorded in ``DST/prepare_manifest.json``
and a resume with different settings is refused (mixed outputs would be silent damage).

Nothing is lost silently: a file that fails to decode or encode is listed with its error in
``DST/prepare_report.json`` and in the summary — so is a truncated source (fewer frames, or a shorter time, than its
container announces) and a file with a video suffix that is not a regular file (a FIFO would block the decoder
forever); ``copy_on_failure`` copies such a file unchanged instead, as the reference's ``compress_video.py`` does
(off by default: a raw copy keeps the original frame rate and size, so the folder is then no longer uniform — the
report says which files were copied, and ``DST/prepare_copies.jsonl`` keeps saying so on reruns). Symlinked folders
of SRC are walked; a folder reached twice (a loop) is walked once and reported as ``ignored``. One job per
destination at a time (:mod:`tvr.utils.lock`).

Encoding is deterministic (x264 with one thread per file; files are spread over worker processes), so a killed and
resumed run produces byte-identical files to an uninterrupted one.

``extract_frames(SRC, DST)`` is the optional frame cache: for every video, the frames a clip reads (the sampling of
``data.sampling`` / ``max_frames`` / ``frame_rate``, evaluation mode) decoded once, resized like
:func:`tvr.data.transforms.clip_preprocess` does before its centre crop, and stored as one uint8 ``.npy`` per video
(memory-mappable). Runs read it through :mod:`tvr.data.frame_cache` (the cache's format and its reader):
``load_cached_clip`` turns such a file into exactly the tensors :func:`tvr.data.video.load_clip` returns for the
source video, without decoding anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from tvr.data.frame_cache import FRAMES_MANIFEST, FrameSettings
from tvr.utils.data_files import parse_json, read_json
from tvr.utils.errors import UserError, reason
from tvr.utils.io import (
    atomic_copy,
    atomic_output,
    atomic_write,
    atomic_write_json,
    is_disk_full,
    is_temporary_name,
    json_kind,
    naming_errors,
    remove_stale_temporaries,
    why_not_regular_file,
)
from tvr.utils.lock import folder_lock
from tvr.utils.parallel import parallel_map

#: file suffixes treated as videos when walking SRC (case-insensitive)
VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg", ".flv", ".wmv", ".3gp", ".ts")
MANIFEST = "prepare_manifest.json"
REPORT = "prepare_report.json"
#: one line per file copied unchanged (``copy_on_failure``), so a rerun reports it as copied, not as encoded
COPIES = "prepare_copies.jsonl"
FRAMES_REPORT = "frames_report.json"


class PrepareError(UserError, ValueError):
    """Bad arguments, an empty source, a damaged manifest, or a destination prepared with other settings."""


#: libx264's presets (``--preset``), checked before anything is written
X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """How ``prepare_videos`` encodes. ``short_side`` 0 keeps the size; ``fps`` 0 keeps the frame rate."""

    fps: float = 3.0
    short_side: int = 224
    codec: str = "libx264"
    crf: int = 23
    preset: str = "medium"

    def validate(self) -> None:
        if self.fps < 0 or not np.isfinite(self.fps):
            raise PrepareError(f"fps={self.fps}: expected a positive frame rate (or 0 to keep the source's)")
        if self.short_side < 0 or self.short_side % 2:
            raise PrepareError(f"short side {self.short_side}: expected an even number of pixels (or 0 to keep)")
        if not 0 <= self.crf <= 51:
            raise PrepareError(f"crf={self.crf}: expected 0..51")
        import av

        if self.codec not in av.codecs_available:
            raise PrepareError(f"codec {self.codec!r} is not in this PyAV build; e.g. libx264, mpeg4")
        if self.codec == "libx264" and self.preset not in X264_PRESETS:
            raise PrepareError(f"preset {self.preset!r}: expected one of {', '.join(X264_PRESETS)}")


def output_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) with the shorter side = ``short_side`` and the longer side scaled by the same factor,
    truncated to even (a square stays square). ``short_side`` 0 keeps the size, rounded down to even."""
    if width <= 0 or height <= 0:
        raise ValueError(f"invalid frame size {width}x{height}")
    if short_side == 0:
        return max(2, width - width % 2), max(2, height - height % 2)
    if width >= height:
        return max(2, int(short_side * width / height / 2) * 2), short_side
    return short_side, max(2, int(short_side * height / width / 2) * 2)


@functools.lru_cache(maxsize=1)
def _x264_determinism() -> dict[str, str]:
    """Extra libx264 options that make its output a pure function of the input pixels.

    On CPUs with AVX-512, libx264's AVX-512 code paths (PyAV 18's bundled libx264) produced different bitstreams
    from identical frames in about a third of the runs, even single-threaded; without those paths (SIMD capped at
    AVX2, or no assembly at all) every run is identical. So on such CPUs the SIMD level is capped at AVX2, which
    costs nothing measurable at 224-pixel frames.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"x264-params": "asm=AVX2"}
    return {"x264-params": "asm=AVX2"} if "avx512" in flags else {}


def encode_video(src: str | os.PathLike, dst: str | os.PathLike, settings: EncodeSettings) -> dict[str, Any]:
    """Re-encode ``src`` into ``dst`` (mp4) with ``settings``; atomic (temporary file, fsync, rename).

    Returns {"frames_in", "frames_out", "size": [w, h], "fps"}. Raises on a file that cannot be decoded to the end
    or encoded; the temporary is removed then.
    """
    import av

    src, dst = Path(src), Path(dst)
    frames_in = frames_out = 0
    with atomic_output(dst) as tmp:
        with av.open(str(src), mode="r") as source:
            if not source.streams.video:
                raise ValueError("no video stream")
            stream = source.streams.video[0]
            stream.thread_type = "AUTO"
            in_w, in_h = stream.codec_context.width, stream.codec_context.height
            out_w, out_h = output_size(in_w, in_h, settings.short_side)
            rate = Fraction(settings.fps).limit_denominator(1001) if settings.fps else None
            if rate is None:
                guess = stream.average_rate or stream.guessed_rate
                if not guess:
                    raise ValueError("the source gives no frame rate and fps=0 asks to keep it")
                rate = Fraction(guess).limit_denominator(1001)
            with av.open(str(tmp), mode="w", format="mp4", options={"movflags": "+faststart"}) as sink:
                out = sink.add_stream(settings.codec, rate=rate)
                out.width, out.height, out.pix_fmt = out_w, out_h, "yuv420p"
                # one thread and no slice threading: libx264's output then depends on the pixels only (with the
                # default slice mode it varied from run to run on identical input); files run in parallel instead
                out.codec_context.thread_count = 1
                out.codec_context.thread_type = "NONE"
                if settings.codec == "libx264":
                    out.options = {"crf": str(settings.crf), "preset": settings.preset, **_x264_determinism()}
                graph = av.filter.Graph()
                nodes = [graph.add_buffer(template=stream)]
                if settings.fps:
                    nodes.append(graph.add("fps", f"fps={rate.numerator}/{rate.denominator}"))
                nodes.append(graph.add("scale", f"{out_w}:{out_h}:flags=bicubic"))
                nodes.append(graph.add("format", "yuv420p"))
                nodes.append(graph.add("buffersink"))
                for a, b in zip(nodes, nodes[1:], strict=False):
                    a.link_to(b)
                graph.configure()
                time_base = Fraction(1) / rate

                def drain() -> None:
                    nonlocal frames_out
                    while True:
                        try:
                            frame = graph.pull()
                        except (av.BlockingIOError, av.EOFError):
                            return
                        frame.pts, frame.time_base = frames_out, time_base
                        # the source's picture type survives the filters, and libx264 takes it as a forced frame type
                        frame.pict_type = av.video.frame.PictureType.NONE
                        sink.mux(out.encode(frame))
                        frames_out += 1

                last_end = 0.0
                for frame in source.decode(stream):
                    frames_in += 1
                    if frame.time is not None:
                        last_end = max(last_end, float(frame.time))
                    graph.push(frame)
                    drain()
                if frames_in == 0:
                    raise ValueError("the video stream decodes to no frame")
                _check_complete(stream, frames_in, last_end)
                graph.push(None)
                drain()
                sink.mux(out.encode(None))
    return {"frames_in": frames_in, "frames_out": frames_out, "size": [out_w, out_h], "fps": float(rate)}


def _check_complete(stream: Any, decoded: int, last_time: float) -> None:
    """Raise when the source decoded to fewer frames (or a shorter time) than its container announces: a truncated
    download must not become a clean, shorter output. The rule for counts is ``check-data --full``'s."""
    announced = int(stream.frames or 0)
    if announced and decoded < announced:
        raise ValueError(f"truncated: {decoded} of the {announced} frames the container announces decode")
    # no frame count (mkv, webm): the video stream's own duration, never the container's (an audio track may run
    # longer than the video without anything being cut)
    if announced or stream.duration is None or stream.time_base is None:
        return
    duration = float(stream.duration * stream.time_base)
    rate = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
    # the last frame starts one frame before the end; allow a second (or 5%) of slack for rounding and edits
    if duration - (last_time + 1.0 / rate) > max(1.0, 0.05 * duration):
        raise ValueError(
            f"truncated: the frames decode to {last_time + 1.0 / rate:.2f} s of the {duration:.2f} s "
            "the container announces"
        )


# --------------------------------------------------------------------------------------------- walking SRC


def find_videos(
    src: Path,
    exclude: Path | None = None,
    extensions: Sequence[str] = VIDEO_EXTENSIONS,
    problems: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Video files under ``src`` (recursively, symlinked folders followed, sorted, hidden files and our temporaries
    skipped), as paths relative to ``src``; ``exclude`` (a folder inside ``src``, e.g. the destination) is not
    entered. Every file with a video suffix is listed, so a FIFO or a broken link is reported, not skipped in
    silence. A folder reached a second time (a symlink loop, or two links to one folder) is not walked again; it
    is added to ``problems`` (when given) as an ``ignored`` entry naming the first path."""
    found = []
    wanted = {e.lower() for e in extensions}
    exclude = exclude.resolve() if exclude is not None else None
    walked: dict[Path, Path] = {src.resolve(): Path(".")}
    for root, dirs, files in os.walk(src, followlinks=True):
        here = Path(root)
        kept = []
        for d in sorted(dirs):
            path = here / d
            if d.startswith(".") or path.resolve() == exclude:
                continue
            real = path.resolve()
            if real in walked:
                if problems is not None:
                    here_real = here.resolve()
                    loop = real == here_real or real in here_real.parents
                    what = "a symlink loop" if loop else "a second link to one folder"
                    problems.append(
                        {
                            "source": str(path.relative_to(src)),
                            "status": "ignored",
                            "error": f"{what}: the same folder as {walked[real]} (walked once)",
                        }
                    )
                continue
            walked[real] = path.relative_to(src)
            kept.append(d)
        dirs[:] = kept
        for name in sorted(files):
            if name.startswith(".") or is_temporary_name(name):
                continue
            if Path(name).suffix.lower() in wanted:
                found.append((here / name).relative_to(src))
    return found


def _plan(
    src: Path, dst: Path, suffix: str, flat: bool = False
) -> tuple[list[tuple[Path, Path]], list[dict[str, Any]]]:
    """(source, output) pairs, and clashes: two sources whose outputs would share a name (the first one wins).
    ``flat``: every output directly in ``dst`` (sub-folders of ``src`` dropped), as ``data.video_dir`` needs."""
    if not src.is_dir():
        raise PrepareError(f"source folder not found: {src}")
    if src.resolve() == dst.resolve():
        raise PrepareError(f"destination {dst} is the source folder; choose another folder")
    inside = dst.resolve().is_relative_to(src.resolve())
    plan: list[tuple[Path, Path]] = []
    clashes: list[dict[str, Any]] = []
    owner: dict[Path, Path] = {}
    for rel in find_videos(src, exclude=dst if inside else None, problems=clashes):
        unreadable = why_not_regular_file(src / rel)
        if unreadable is not None:
            clashes.append({"source": str(rel), "status": "failed", "error": unreadable})
            continue
        target = Path(rel.name).with_suffix(suffix) if flat else rel.with_suffix(suffix)
        if target in owner:
            clashes.append(
                {
                    "source": str(rel),
                    "status": "failed",
                    "error": f"output name {target} is already taken by {owner[target]}",
                }
            )
            continue
        owner[target] = rel
        plan.append((src / rel, dst / target))
    if not plan and not any(e["status"] == "failed" for e in clashes):
        raise PrepareError(
            f"no video files under {src} (looked for {', '.join(VIDEO_EXTENSIONS)}, in sub-folders "
            "too); check the folder"
        )
    return plan, clashes


def _check_manifest(dst: Path, name: str, settings: dict[str, Any], outputs: Sequence[Path]) -> None:
    """Record ``settings`` in ``dst/name``; refuse when the destination already holds outputs made with other
    settings (mixed outputs would be silent damage). A manifest whose settings made no output yet is replaced."""
    path = dst / name
    if path.is_file():
        try:
            record = read_json(path)
            saved = record.get("settings") if isinstance(record, dict) else record
            if not isinstance(saved, dict):
                what = "the file" if saved is record else '"settings"'
                raise TypeError(f"{what} is {json_kind(saved)}, not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise PrepareError(
                f"{path}: damaged ({reason(exc)}), so the settings of the outputs in {dst} are unknown; "
                "delete it and those outputs to start over, or use another destination"
            ) from None
        differ = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
        if differ and any(output.is_file() for output in outputs):
            shown = ", ".join(f"{k}: {a!r} before, {b!r} now" for k, (a, b) in differ.items())
            raise PrepareError(
                f"{dst} was prepared with other settings ({shown}); use the same settings to resume, or another "
                "destination"
            )
    atomic_write_json(path, {"settings": settings})


def _run_pool(
    task: Callable[[Any], dict[str, Any]], items: list[Any], workers: int, progress: bool, what: str
) -> list[dict[str, Any]]:
    return list(parallel_map(task, items, workers, what, progress))


@contextlib.contextmanager
def _resumed(
    dst: Path, what: str, manifest: str, settings: dict[str, Any], plan: list[tuple[Path, Path]]
) -> Iterator[list[Path]]:
    """Hold ``dst`` for one job (a lock), with ``settings`` on record in its ``manifest`` (refused when its outputs
    were made with others) and a killed run's temporaries removed (listed)."""
    with folder_lock(dst, what):
        _check_manifest(dst, manifest, settings, [output for _, output in plan])
        try:
            yield remove_stale_temporaries(dst, recursive=True)
        except BaseException:
            remove_stale_temporaries(dst, recursive=True)  # what the stopped workers were writing (a full disk)
            raise


def _write_report(
    dst: Path, name: str, src: Path, settings: Any, entries: list[dict[str, Any]], start: float, **extra: Any
) -> dict[str, Any]:
    """A job's report, also written to ``dst/name``: the folders, the settings, ``extra``, the counts by status with
    the time since ``start``, and every file's entry in the order of their sources."""
    entries.sort(key=lambda e: e["source"])
    report = {
        "source": str(src),
        "destination": str(dst),
        "settings": dataclasses.asdict(settings),
        **extra,
        "summary": _summarise(entries, time.perf_counter() - start),
        "files": entries,
    }
    atomic_write_json(dst / name, report)
    return report


def _summarise(entries: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for e in entries:
        counts[e["status"]] = counts.get(e["status"], 0) + 1
    return {"total": len(entries), **counts, "seconds": round(seconds, 2)}


# --------------------------------------------------------------------------------------------- videos


def _encode_task(item: tuple[str, str, str, EncodeSettings, bool, str]) -> dict[str, Any]:
    src, dst, rel, settings, copy_on_failure, journal = item
    start = time.perf_counter()
    try:
        info = encode_video(src, dst, settings)
        return {
            "source": rel,
            "output": str(dst),
            "status": "encoded",
            **info,
            "seconds": round(time.perf_counter() - start, 3),
        }
    except Exception as exc:  # noqa: BLE001 - every failure is reported, never raised out of the pool
        if is_disk_full(exc):  # not this video's failure: the job stops, and a rerun continues
            raise
        entry = {"source": rel, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        if copy_on_failure:
            copy = Path(dst).with_suffix(Path(src).suffix)
            try:
                # on record before the copy lands, so a rerun can tell a copy from an encoded output of that name
                _journal_copy(Path(journal), rel, copy, entry["error"])
                atomic_copy(src, copy)
                entry.update(status="copied", output=str(copy))
            except OSError as copy_exc:
                if is_disk_full(copy_exc):
                    raise
                entry["error"] += f"; copying the raw file failed too: {copy_exc}"
        return entry


def _journal_copy(journal: Path, rel: str, copy: Path, error: str) -> None:
    line = json.dumps({"source": rel, "output": str(copy), "error": error}) + "\n"
    # one append per line: whole lines from every worker
    with naming_errors(journal), open(journal, "a", encoding="utf-8") as handle:
        handle.write(line)


def _read_copies(journal: Path) -> dict[str, dict[str, Any]]:
    """Source → journal entry of every file an earlier run copied unchanged (a torn last line is ignored)."""
    copies: dict[str, dict[str, Any]] = {}
    if journal.is_file():
        for line in journal.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = parse_json(line, journal)
                copies[str(entry["source"])] = entry
            except (ValueError, KeyError, TypeError):
                continue
    return copies


def prepare_videos(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    settings: EncodeSettings | None = None,
    workers: int = 0,
    copy_on_failure: bool = False,
    progress: bool = True,
    flat: bool = False,
) -> dict[str, Any]:
    """Re-encode every video under ``src`` into ``dst`` (see the module docstring); returns the report, which is
    also written to ``dst/prepare_report.json``. Files already finished in ``dst`` are skipped. ``flat`` writes
    every output directly into ``dst`` (e.g. ActivityNet's train/val folders → one video folder)."""
    settings = settings or EncodeSettings()
    settings.validate()
    src, dst = Path(src), Path(dst)
    start = time.perf_counter()
    plan, entries = _plan(src, dst, ".mp4", flat)
    recorded = {**dataclasses.asdict(settings), "container": "mp4", "pix_fmt": "yuv420p", "flat": flat}
    with _resumed(dst, "prepare destination", MANIFEST, recorded, plan) as stale:
        journal = dst / COPIES
        copies = _read_copies(journal)
        todo = []
        for source, output in plan:
            rel = str(source.relative_to(src))
            copy = output.with_suffix(source.suffix)
            if rel in copies and copy.is_file():
                entries.append(
                    {
                        "source": rel,
                        "output": str(copy),
                        "status": "copied",
                        "error": f"copied unchanged by an earlier run: {copies[rel].get('error', '')}",
                    }
                )
            elif output.is_file():
                entries.append({"source": rel, "output": str(output), "status": "skipped"})
            else:
                todo.append((str(source), str(output), rel, settings, copy_on_failure, str(journal)))
        entries += _run_pool(_encode_task, todo, workers, progress, "encoding videos")
    stale_removed = [str(p) for p in stale]
    return _write_report(
        dst,
        REPORT,
        src,
        settings,
        entries,
        start,
        copy_on_failure=copy_on_failure,
        stale_temporaries_removed=stale_removed,
    )


# --------------------------------------------------------------------------------------------- frame cache


def cache_frames(src: str | os.PathLike, settings: FrameSettings) -> np.ndarray:
    """The uint8 [n, H, W, 3] frames a clip of ``src`` reads, resized as ``clip_preprocess`` resizes them."""
    import torch

    from tvr.data.transforms import resize_short_side, square_resize, to_tensor_frames
    from tvr.data.video import VideoDecodeError, decode_frames, probe_video, sample_indices

    info = probe_video(src)
    try:
        indices = sample_indices(
            info, settings.max_frames, settings.frame_rate, settings.sampling, None, None, train=False, rng=None
        )
    except ValueError as exc:
        raise VideoDecodeError(src, "no frame rate", str(exc)) from exc
    frames = to_tensor_frames(decode_frames(src, indices))
    with torch.no_grad():
        if settings.resize == "square":
            frames = square_resize(frames, settings.image_size)
        else:
            frames = resize_short_side(frames, settings.image_size)
    return np.ascontiguousarray(frames.permute(0, 2, 3, 1).numpy())


def _frames_task(item: tuple[str, str, str, FrameSettings]) -> dict[str, Any]:
    src, dst, rel, settings = item
    start = time.perf_counter()
    try:
        frames = cache_frames(src, settings)
        atomic_write(dst, lambda handle: np.save(handle, frames, allow_pickle=False))
        return {
            "source": rel,
            "output": str(dst),
            "status": "extracted",
            "frames": int(frames.shape[0]),
            "shape": list(frames.shape[1:]),
            "seconds": round(time.perf_counter() - start, 3),
        }
    except Exception as exc:  # noqa: BLE001
        if is_disk_full(exc):  # not this video's failure: the job stops, and a rerun continues
            raise
        return {"source": rel, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}


def extract_frames(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    settings: FrameSettings | None = None,
    workers: int = 0,
    progress: bool = True,
    flat: bool = False,
) -> dict[str, Any]:
    """Build the frame cache of every video under ``src`` in ``dst`` (``<relative path>.npy``, or ``<name>.npy``
    with ``flat``), resumably, like :func:`prepare_videos`; returns the report (also ``dst/frames_report.json``)."""
    settings = settings or FrameSettings()
    if settings.sampling not in ("clip4clip", "clipvip"):
        raise PrepareError(f"sampling {settings.sampling!r}: expected clip4clip or clipvip")
    if settings.max_frames <= 0 or settings.frame_rate <= 0 or settings.image_size <= 0:
        raise PrepareError("max_frames, frame_rate and image_size must be positive")
    src, dst = Path(src), Path(dst)
    start = time.perf_counter()
    plan, entries = _plan(src, dst, ".npy", flat)
    recorded = {**dataclasses.asdict(settings), "resize": settings.resize, "flat": flat}
    with _resumed(dst, "frame cache", FRAMES_MANIFEST, recorded, plan):
        todo = []
        for source, output in plan:
            rel = str(source.relative_to(src))
            if output.is_file():
                entries.append({"source": rel, "output": str(output), "status": "skipped"})
            else:
                todo.append((str(source), str(output), rel, settings))
        entries += _run_pool(_frames_task, todo, workers, progress, "extracting frames")
    return _write_report(dst, FRAMES_REPORT, src, settings, entries, start)
