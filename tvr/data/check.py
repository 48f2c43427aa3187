"""``tvr check-data``: everything a run would trip over, found in seconds before the run instead of hours into it.

For the config's dataset this reads every split (train, val, test) with the run's own readers, resolves every
referenced video with the run's own resolver (so ``data.video_pattern``, the container fallbacks and the
``data.video_dir`` containment rule are the ones training uses), and probes each file in parallel worker processes:
open the container, read the stream's frame rate / frame count / duration / size, and decode the first frame
(``full=True`` decodes every frame and compares the count with the container's). It also measures caption lengths
in CLIP BPE tokens against ``data.max_words`` and looks for duplicates and split overlaps.

The result is a plain dict (the JSON report); the command line prints it as tables (``tvr.cli``). ``report["ok"]`` is
false when a run would trip or silently lose data: an unreadable split, a missing / outside / unreadable / empty /
truncated video, a split left without usable videos, fewer training pairs than ``train.batch_size``, or a video in
two splits. Caption truncation, duplicate captions and tiny validation splits are warnings.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tvr.config import Config, DataConfig
from tvr.data.annotations import SPLITS, AnnotationError, RetrievalSplit, load_split
from tvr.utils.parallel import parallel_map

if TYPE_CHECKING:  # the tokenizer module imports torch; checking data does not need it
    from tvr.data.tokenizer import TokenizerSpec

#: why a video is unusable, in the order reports list them
REASONS = (
    "missing",
    "outside video_dir",
    "invalid name",
    "empty",
    "unreadable",
    "no video stream",
    "zero frames",
    "truncated",
    "no frame rate",
)
#: problem examples kept per reason in the printed table (the JSON report lists every one)
EXAMPLES = 5
#: a validation split with fewer usable videos than this gets a warning (R@1 moves in steps of 100/N points)
SMALL_VAL = 100


# --------------------------------------------------------------------------------------------- probing


def probe_file(path: str, full: bool = False) -> dict[str, Any]:
    """Probe one video file; never raises. Returns ``{"ok", "reason", "detail", "fps", "num_frames", "duration",
    "width", "height", "decoded"}`` (``decoded``: frames decoded, only with ``full``)."""
    import av

    out: dict[str, Any] = {
        "ok": False,
        "reason": None,
        "detail": "",
        "fps": None,
        "num_frames": None,
        "duration": None,
        "width": None,
        "height": None,
        "decoded": None,
    }

    def fail(reason: str, detail: str) -> dict[str, Any]:
        out.update(reason=reason, detail=detail)
        return out

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        return fail("missing", str(exc))
    if size == 0:
        return fail("empty", "zero-length file")
    try:
        container = av.open(str(p), mode="r")
    except Exception as exc:  # noqa: BLE001 - PyAV raises many types for broken files
        return fail("unreadable", f"cannot open: {exc}")
    try:
        if not container.streams.video:
            return fail("no video stream", "the container has no video stream")
        stream = container.streams.video[0]
        for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
            if rate is not None and float(rate) > 0:
                out["fps"] = float(rate)
                break
        out["num_frames"] = int(stream.frames) if stream.frames else None
        if stream.duration is not None and stream.time_base is not None:
            out["duration"] = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            out["duration"] = container.duration / av.time_base
        out["width"] = int(stream.codec_context.width or 0) or None
        out["height"] = int(stream.codec_context.height or 0) or None
        decoded = 0
        try:
            for _ in container.decode(stream):
                decoded += 1
                if not full:
                    break
        except Exception as exc:  # noqa: BLE001
            if decoded == 0:
                return fail("unreadable", f"decoding failed before the first frame: {exc}")
            announced = f" of the {out['num_frames']} frames the container announces" if out["num_frames"] else ""
            return fail("truncated", f"decoder error after {decoded}{announced}: {exc}")
        if decoded == 0:
            return fail("zero frames", "the video stream decodes to no frame")
        if full:
            out["decoded"] = decoded
            expected = out["num_frames"]
            if expected and decoded < expected:
                return fail("truncated", f"{decoded} of the {expected} frames the container announces decode")
            out["num_frames"] = decoded
        if not out["fps"]:
            if out["duration"] and out["num_frames"]:
                out["fps"] = out["num_frames"] / out["duration"]
            else:
                return fail("no frame rate", "the container gives no frame rate (needed by frame sampling)")
        if out["duration"] is None and out["num_frames"] and out["fps"]:
            out["duration"] = out["num_frames"] / out["fps"]
        out["ok"] = True
        return out
    finally:
        container.close()


def _probe_task(task: tuple[int, str, bool]) -> tuple[int, dict[str, Any]]:
    index, path, full = task
    return index, probe_file(path, full)


def probe_files(
    paths: Sequence[str], full: bool = False, workers: int = 0, progress: bool = True
) -> list[dict[str, Any]]:
    """Probe ``paths`` with ``workers`` processes (0 = one per CPU, at most 8); results in input order."""
    tasks = [(k, p, full) for k, p in enumerate(paths)]
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    for k, res in parallel_map(_probe_task, tasks, workers, "probing videos", progress):
        results[k] = res
    return [r for r in results if r is not None]


# --------------------------------------------------------------------------------------------- tokens


def caption_token_counter(
    spec: TokenizerSpec, tokenizer: str | os.PathLike | None = None
) -> tuple[Callable[[list[str]], tuple[list[int], list[int]]] | None, str]:
    """A function counting CLIP BPE tokens per caption (:meth:`ClipTokenizer.count_tokens_checked`: counts, and the
    positions of captions whose count is a lower bound), and where its vocabulary came from.

    ``tokenizer`` (or the run's tokenizer ``spec``, which names ``model.tokenizer`` or a HF CLIP folder in
    ``model.clip``): a folder with vocab.json + merges.txt, or CLIP's ``bpe_simple_vocab_16e6.txt.gz``.
    ``model.clip: tiny`` uses the tiny model's own tokenizer, as a run would. Returns (None, why) when no tokenizer
    is configured.
    """
    from tvr.data.tokenizer import (
        CLIP_BPE,
        TINY_CLIP_BPE,
        ClipTokenizer,
        build_tiny_tokenizer_files,
        read_clip_merges,
        vocabulary_from_merges,
    )

    if spec.kind not in (CLIP_BPE, TINY_CLIP_BPE) and not tokenizer:
        # the backbone's own (e.g. a sentence model's WordPiece/SentencePiece) tokenizer: counting CLIP tokens would
        # mislead
        return None, (
            f"model.backbone={spec.backbone} tokenizes with its text model's own tokenizer; caption lengths in "
            "CLIP tokens are not checked"
        )
    source = str(tokenizer or (spec.source if spec.kind == CLIP_BPE else ""))
    if source:
        path = Path(source).expanduser()
        if path.is_dir():
            tok = ClipTokenizer.from_dir(path, backend="python")
        else:
            merges = read_clip_merges(path)
            tok = ClipTokenizer({t: i for i, t in enumerate(vocabulary_from_merges(merges))}, merges, backend="python")
        return tok.count_tokens_checked, str(path)
    if spec.kind == TINY_CLIP_BPE:
        with tempfile.TemporaryDirectory() as folder:
            tok = ClipTokenizer.from_dir(build_tiny_tokenizer_files(folder), backend="python")
        return tok.count_tokens_checked, "the tiny model's tokenizer (model.clip: tiny)"
    return None, f"caption lengths are not checked: {spec.missing} (or pass --tokenizer to tvr check-data)"


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None

    def q(p: float) -> float:
        return vals[min(len(vals) - 1, max(0, round(p * (len(vals) - 1))))]

    return {
        "count": len(vals),
        "min": vals[0],
        "p5": q(0.05),
        "median": statistics.median(vals),
        "mean": statistics.fmean(vals),
        "p95": q(0.95),
        "max": vals[-1],
    }


def _tried(paths: Sequence[str]) -> str:
    """``no file video0.mp4 (nor .webm, .mkv, .avi, .mov) in /data/videos``: short enough for a table cell."""
    first = Path(paths[0])
    others = [Path(p).suffix for p in paths[1:] if Path(p).with_suffix("") == first.with_suffix("")]
    nor = f" (nor {', '.join(others)})" if others else ""
    return f"no file {first.name}{nor} in {first.parent}"


def excerpt(text: str, n: int = 80) -> str:
    """``text`` on one line, cut to ``n`` characters (an ellipsis marks a cut)."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------------------------- the check


@dataclass
class _Findings:
    """What the check found so far: errors (a run would trip or lose data) and warnings, in the order found."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_data(
    cfg: Config,
    tokenizer_spec: TokenizerSpec,
    full: bool = False,
    workers: int = 0,
    tokenizer: str | os.PathLike | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Check the dataset of ``cfg`` (see the module docstring), counting caption tokens with the tokenizer
    ``tokenizer_spec`` names (the run's: ``tvr.models.run_spec.resolve_run(cfg).tokenizer``) unless ``tokenizer``
    is given; returns the JSON-ready report."""
    from tvr.data.datasets import check_pixel_settings

    data = cfg.data
    check_pixel_settings(data, image_size=False)
    found = _Findings()
    report: dict[str, Any] = {
        "dataset": data.dataset,
        "annotations": data.annotations,
        "video_dir": data.video_dir,
        "video_pattern": data.video_pattern,
        "max_words": data.max_words,
        "full_decode": full,
    }
    report["splits"], loaded = _read_splits(data, found)  # 1.
    video_splits: dict[str, list[str]] = defaultdict(list)
    for name, split in loaded.items():
        for vid in split.videos:
            video_splits[vid].append(name)
    paths, problems = _resolve_videos(data, video_splits, found)  # 2.
    info = _probe_videos(paths, video_splits, problems, full, workers, progress)  # 3.
    report["videos"] = _video_summary(list(video_splits), paths, info, problems, found)
    report["video_stats"] = _video_statistics(data, info)  # 4.
    counter, token_source = caption_token_counter(tokenizer_spec, tokenizer)  # 5.
    report["tokenizer"] = token_source
    if counter is None:
        found.warnings.append(token_source)
    for name, split in loaded.items():
        entry = report["splits"][name]
        _check_usable(cfg, name, split, entry, info, found)
        _check_duplicate_captions(name, split, entry, found)
        if counter is not None:
            _check_caption_lengths(data.max_words, name, split, entry, counter, found)
    report["videos_in_several_splits"] = _split_overlap(video_splits, found)  # 6.
    report["errors"] = found.errors
    report["warnings"] = found.warnings
    report["ok"] = not found.errors
    return report


def _read_splits(data: DataConfig, found: _Findings) -> tuple[dict[str, Any], dict[str, RetrievalSplit]]:
    """1. Every split with the run's own readers: its entry in the report, and the splits that could be read."""
    splits: dict[str, Any] = {}
    loaded: dict[str, RetrievalSplit] = {}
    for name in SPLITS:
        try:
            split = load_split(data, name)
        except (AnnotationError, ValueError) as exc:
            splits[name] = {"status": "error", "error": str(exc)}
            found.errors.append(f"{name} split: {exc}")
            continue
        loaded[name] = split
        splits[name] = {
            "status": "ok",
            "files": split.files,
            "protocol": split.protocol,
            "num_texts": split.num_texts,
            "num_videos": split.num_videos,
        }
    return splits, loaded


def _problem(vid: str, splits: list[str], reason: str, detail: str, path: str | None) -> dict[str, Any]:
    return {"id": vid, "splits": splits, "reason": reason, "detail": detail, "path": path}


def _resolve_videos(
    data: DataConfig, video_splits: dict[str, list[str]], found: _Findings
) -> tuple[dict[str, Path], list[dict[str, Any]]]:
    """2. Every referenced video through the run's own resolver: the files found, and the ids that name none."""
    from tvr.data.datasets import VideoNotFoundError, VideoOutsideDirError, VideoResolver
    from tvr.data.video import VideoDecodeError

    ids = list(video_splits)
    paths: dict[str, Path] = {}
    folder = Path(data.video_dir).expanduser() if data.video_dir else None
    if folder is None or not folder.is_dir():
        what = "data.video_dir is empty" if folder is None else f"video folder not found: {folder}"
        found.errors.append(f"{what} (data.video_dir); none of the {len(ids)} referenced videos can be read")
        return paths, [_problem(v, video_splits[v], "missing", what, None) for v in ids]
    problems: list[dict[str, Any]] = []
    resolver = VideoResolver.from_config(data)
    for vid in ids:
        try:
            paths[vid] = resolver(vid)
        except VideoOutsideDirError as exc:
            problems.append(_problem(vid, video_splits[vid], exc.reason, exc.detail, exc.path))
        except VideoNotFoundError as exc:
            problems.append(_problem(vid, video_splits[vid], "missing", _tried(exc.tried), None))
        except VideoDecodeError as exc:  # an id that cannot name a file (NUL byte, too long, symlink loop)
            problems.append(_problem(vid, video_splits[vid], exc.reason, exc.detail, None))
    return paths, problems


def _probe_videos(
    paths: dict[str, Path],
    video_splits: dict[str, list[str]],
    problems: list[dict[str, Any]],
    full: bool,
    workers: int,
    progress: bool,
) -> dict[str, dict[str, Any]]:
    """3. Probe the files that exist: what each usable one holds (an unusable one joins ``problems``)."""
    probed_ids = list(paths)
    results = probe_files([str(paths[v]) for v in probed_ids], full=full, workers=workers, progress=progress)
    info: dict[str, dict[str, Any]] = {}
    for vid, res in zip(probed_ids, results, strict=True):
        if res["ok"]:
            info[vid] = res
        else:
            problems.append(_problem(vid, video_splits[vid], res["reason"], res["detail"], str(paths[vid])))
    return info


def _video_summary(
    ids: list[str],
    paths: dict[str, Path],
    info: dict[str, dict[str, Any]],
    problems: list[dict[str, Any]],
    found: _Findings,
) -> dict[str, Any]:
    """The report's ``videos``: counts and the unusable videos by reason; two ids naming one file is a warning."""
    order = {r: k for k, r in enumerate(REASONS)}
    position = {v: k for k, v in enumerate(ids)}
    problems.sort(key=lambda p: (order.get(p["reason"], len(REASONS)), position[p["id"]]))
    by_reason = Counter(p["reason"] for p in problems)
    videos = {
        "referenced": len(ids),
        "files_found": len(paths),
        "usable": len(info),
        "by_reason": {r: by_reason[r] for r in REASONS if by_reason[r]},
        "problems": problems,
    }
    if problems:
        counts = ", ".join(f"{n} {r}" for r, n in videos["by_reason"].items())
        found.errors.append(f"{len(problems)} of {len(ids)} videos are unusable ({counts}); a run skips them")
    by_file: dict[str, list[str]] = defaultdict(list)
    for vid, path in paths.items():
        by_file[str(path.resolve())].append(vid)
    same_file = {f: v for f, v in by_file.items() if len(v) > 1}
    if same_file:
        found.warnings.append(
            f"{len(same_file)} file(s) are referenced by more than one video id, e.g. {next(iter(same_file.values()))}"
        )
    return videos


def _video_statistics(data: DataConfig, info: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """4. Duration, frame rate and frame count of the usable videos (and, under clip4clip, the frames sampled)."""
    from tvr.data.video import clip4clip_indices

    stats: dict[str, Any] = {key: _stats([r[key] for r in info.values()]) for key in ("duration", "fps", "num_frames")}
    if data.sampling == "clip4clip" and info:
        sampled = [
            len(clip4clip_indices(r["num_frames"], r["fps"], data.max_frames, data.frame_rate))
            for r in info.values()
            if r["num_frames"] and r["fps"]
        ]
        stats["sampled_frames"] = _stats(sampled)
        stats["padded_videos"] = sum(1 for n in sampled if n < data.max_frames)
    return stats


def _check_usable(
    cfg: Config,
    name: str,
    split: RetrievalSplit,
    entry: dict[str, Any],
    info: dict[str, dict[str, Any]],
    found: _Findings,
) -> None:
    """5a. A split's usable videos and texts: none usable, a tiny validation split, fewer pairs than a batch."""
    usable = [v for v in split.videos if v in info]
    entry["usable_videos"] = len(usable)
    usable_set = set(usable)
    entry["usable_texts"] = sum(1 for v in split.text_video if split.videos[v] in usable_set)
    if not usable:
        found.errors.append(f"{name} split: none of its {split.num_videos} videos is usable")
    elif name == "val" and len(usable) < SMALL_VAL:
        found.warnings.append(
            f"val split: only {len(usable)} usable video(s); R@1 moves in steps of "
            f"{100 / len(usable):.1f} points and model selection is noisy"
        )
    if name == "train" and entry["usable_texts"] < cfg.train.batch_size:
        found.errors.append(
            f"train split: {entry['usable_texts']} usable pairs, fewer than train.batch_size={cfg.train.batch_size}"
        )


def _check_duplicate_captions(name: str, split: RetrievalSplit, entry: dict[str, Any], found: _Findings) -> None:
    """5b. A (video, caption) pair listed twice; outside training, a caption whose ground truth is several videos."""
    pairs = Counter(zip(split.text_video, split.texts, strict=True))
    dup_pairs = [(split.videos[v], t) for (v, t), n in pairs.items() if n > 1]
    entry["duplicate_pairs"] = len(dup_pairs)
    if dup_pairs:
        found.warnings.append(
            f"{name} split: {len(dup_pairs)} (video, caption) pairs appear more than once, e.g. "
            f"{dup_pairs[0][0]!r}: {excerpt(dup_pairs[0][1], 60)!r}"
        )
    if name == "train":
        return
    owners: dict[str, set[int]] = defaultdict(set)
    for v, t in zip(split.text_video, split.texts, strict=True):
        owners[" ".join(t.lower().split())].add(v)
    shared = {t: vs for t, vs in owners.items() if len(vs) > 1}
    entry["captions_on_several_videos"] = len(shared)
    if shared:
        text, vs = next(iter(shared.items()))
        found.warnings.append(
            f"{name} split: {len(shared)} caption(s) belong to several videos, so their ground "
            f"truth is ambiguous, e.g. {excerpt(text, 60)!r} on "
            f"{sorted(split.videos[v] for v in vs)[:3]}"
        )


def _check_caption_lengths(
    max_words: int,
    name: str,
    split: RetrievalSplit,
    entry: dict[str, Any],
    counter: Callable[[list[str]], tuple[list[int], list[int]]],
    found: _Findings,
) -> None:
    """5c. Caption lengths in tokens against ``data.max_words``: the truncated ones, and words too long to count."""
    from tvr.data.tokenizer import MAX_COUNTED_WORD_BYTES

    lengths, bounded = counter(split.texts)
    if bounded:
        first = bounded[0]
        example = split.videos[split.text_video[first]]
        found.warnings.append(
            f"{name} split: {len(bounded)} caption(s) hold a word longer than "
            f"{MAX_COUNTED_WORD_BYTES:,} bytes (e.g. on video {example!r}, "
            f"{len(split.texts[first]):,} characters): not tokenized, their token counts are "
            "lower bounds; a run truncates them to data.max_words"
        )
    entry["long_word_captions"] = len(bounded)
    limit = max_words - 2  # SOT and EOT take two places
    cut = [(split.videos[v], t, n) for v, t, n in zip(split.text_video, split.texts, lengths, strict=True) if n > limit]
    entry["caption_tokens"] = _stats(lengths)
    entry["truncated_captions"] = len(cut)
    entry["truncated_examples"] = [{"id": v, "tokens": n, "caption": excerpt(t)} for v, t, n in cut[:EXAMPLES]]
    if cut:
        found.warnings.append(
            f"{name} split: {len(cut)} of {len(lengths)} captions exceed data.max_words="
            f"{max_words} ({limit} BPE tokens + SOT/EOT) and are truncated"
        )


def _split_overlap(video_splits: dict[str, list[str]], found: _Findings) -> list[dict[str, Any]]:
    """6. Videos in more than one split (evaluation would score videos the model trained on)."""
    overlap = {v: s for v, s in video_splits.items() if len(set(s)) > 1}
    if overlap:
        v, s = next(iter(overlap.items()))
        found.errors.append(
            f"{len(overlap)} video(s) are in more than one split (e.g. {v!r} in {s}): evaluation would "
            "score videos the model trained on"
        )
    return [{"id": v, "splits": s} for v, s in overlap.items()]
