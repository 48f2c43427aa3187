"""``tvr check-data``: everything a run would trip over, found in seconds before the run instead of hours into it.

For the config's dataset this reads every split (train, val, test) with the run's own readers, resolves every
referenced video with the run's own resolver (so ``data.video_pattern``, the container fallbacks and the
``data.video_dir`` containment rule are the ones training uses), and probes each file in parallel worker processes:
open the container, read the stream's frame rate / frame count / duration / size, and decode the first frame
(``full=True`` decodes every frame and compares the count with the container's). It also measures caption lengths
in CLIP BPE tokens against ``data.max_words`` and looks for duplicates and split overlaps.

The result is a plain dict (the JSON report); :func:`render_report` turns it into rich tables. ``report["ok"]`` is
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
from pathlib import Path
from typing import Any

from tvr.config import Config
from tvr.utils.parallel import parallel_map

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
#: up to this many unusable videos the printed table names every one
LIST_ALL = 20
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
    cfg: Config, tokenizer: str | os.PathLike | None = None
) -> tuple[Callable[[list[str]], tuple[list[int], list[int]]] | None, str]:
    """A function counting CLIP BPE tokens per caption (:meth:`ClipTokenizer.count_tokens_checked`: counts, and the
    positions of captions whose count is a lower bound), and where its vocabulary came from.

    ``tokenizer`` (or ``model.tokenizer``, or a HF CLIP folder in ``model.clip``): a folder with vocab.json +
    merges.txt, or CLIP's ``bpe_simple_vocab_16e6.txt.gz``. ``model.clip: tiny`` uses the tiny model's own
    tokenizer, as a run would. Returns (None, why) when no tokenizer is configured.
    """
    from tvr.data.tokenizer import (
        CLIP_BPE,
        TINY_CLIP_BPE,
        ClipTokenizer,
        build_tiny_tokenizer_files,
        read_clip_merges,
        tokenizer_spec,
        vocabulary_from_merges,
    )

    spec = tokenizer_spec(cfg)
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


def _excerpt(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------------------------- the check


def check_data(
    cfg: Config,
    full: bool = False,
    workers: int = 0,
    tokenizer: str | os.PathLike | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Check the dataset of ``cfg`` (see the module docstring); returns the JSON-ready report."""
    from tvr.data.annotations import SPLITS, AnnotationError, load_split
    from tvr.data.datasets import VideoNotFoundError, VideoOutsideDirError, VideoResolver, check_pixel_settings
    from tvr.data.video import VideoDecodeError, clip4clip_indices

    data = cfg.data
    check_pixel_settings(data, image_size=False)
    errors: list[str] = []
    warnings: list[str] = []
    report: dict[str, Any] = {
        "dataset": data.dataset,
        "annotations": data.annotations,
        "video_dir": data.video_dir,
        "video_pattern": data.video_pattern,
        "max_words": data.max_words,
        "full_decode": full,
    }

    # 1. splits -------------------------------------------------------------------------------------------
    splits: dict[str, Any] = {}
    loaded = {}
    for name in SPLITS:
        try:
            split = load_split(data, name)
        except (AnnotationError, ValueError) as exc:
            splits[name] = {"status": "error", "error": str(exc)}
            errors.append(f"{name} split: {exc}")
            continue
        loaded[name] = split
        splits[name] = {
            "status": "ok",
            "files": split.files,
            "protocol": split.protocol,
            "num_texts": split.num_texts,
            "num_videos": split.num_videos,
        }
    report["splits"] = splits

    # 2. resolve every referenced video ---------------------------------------------------------------------
    video_splits: dict[str, list[str]] = defaultdict(list)
    for name, split in loaded.items():
        for vid in split.videos:
            video_splits[vid].append(name)
    ids = list(video_splits)
    problems: list[dict[str, Any]] = []
    paths: dict[str, Path] = {}
    folder = Path(data.video_dir).expanduser() if data.video_dir else None
    if folder is None or not folder.is_dir():
        what = "data.video_dir is empty" if folder is None else f"video folder not found: {folder}"
        errors.append(f"{what} (data.video_dir); none of the {len(ids)} referenced videos can be read")
        problems = [
            {"id": v, "splits": video_splits[v], "reason": "missing", "detail": what, "path": None} for v in ids
        ]
    else:
        resolver = VideoResolver.from_config(data)
        for vid in ids:
            try:
                paths[vid] = resolver(vid)
            except VideoOutsideDirError as exc:
                problems.append(
                    {
                        "id": vid,
                        "splits": video_splits[vid],
                        "reason": exc.reason,
                        "detail": exc.detail,
                        "path": exc.path,
                    }
                )
            except VideoNotFoundError as exc:
                problems.append(
                    {
                        "id": vid,
                        "splits": video_splits[vid],
                        "reason": "missing",
                        "detail": _tried(exc.tried),
                        "path": None,
                    }
                )
            except VideoDecodeError as exc:  # an id that cannot name a file (NUL byte, too long, symlink loop)
                problems.append(
                    {"id": vid, "splits": video_splits[vid], "reason": exc.reason, "detail": exc.detail, "path": None}
                )

    # 3. probe the files that exist ------------------------------------------------------------------------
    probed_ids = list(paths)
    results = probe_files([str(paths[v]) for v in probed_ids], full=full, workers=workers, progress=progress)
    info: dict[str, dict[str, Any]] = {}
    for vid, res in zip(probed_ids, results, strict=True):
        if res["ok"]:
            info[vid] = res
        else:
            problems.append(
                {
                    "id": vid,
                    "splits": video_splits[vid],
                    "reason": res["reason"],
                    "detail": res["detail"],
                    "path": str(paths[vid]),
                }
            )
    order = {r: k for k, r in enumerate(REASONS)}
    position = {v: k for k, v in enumerate(ids)}
    problems.sort(key=lambda p: (order.get(p["reason"], len(REASONS)), position[p["id"]]))
    by_reason = Counter(p["reason"] for p in problems)
    report["videos"] = {
        "referenced": len(ids),
        "files_found": len(paths),
        "usable": len(info),
        "by_reason": {r: by_reason[r] for r in REASONS if by_reason[r]},
        "problems": problems,
    }
    if problems:
        counts = ", ".join(f"{n} {r}" for r, n in report["videos"]["by_reason"].items())
        errors.append(f"{len(problems)} of {len(ids)} videos are unusable ({counts}); a run skips them")

    # duplicates among files: two ids that resolve to the same file
    by_file: dict[str, list[str]] = defaultdict(list)
    for vid, path in paths.items():
        by_file[str(path.resolve())].append(vid)
    same_file = {f: v for f, v in by_file.items() if len(v) > 1}
    if same_file:
        warnings.append(
            f"{len(same_file)} file(s) are referenced by more than one video id, e.g. {next(iter(same_file.values()))}"
        )

    # 4. statistics of the usable videos -------------------------------------------------------------------
    stats = {key: _stats([r[key] for r in info.values()]) for key in ("duration", "fps", "num_frames")}
    if data.sampling == "clip4clip" and info:
        sampled = [
            len(clip4clip_indices(r["num_frames"], r["fps"], data.max_frames, data.frame_rate))
            for r in info.values()
            if r["num_frames"] and r["fps"]
        ]
        stats["sampled_frames"] = _stats(sampled)
        padded = sum(1 for n in sampled if n < data.max_frames)
        stats["padded_videos"] = padded
    report["video_stats"] = stats

    # 5. per-split usability, captions, duplicates ----------------------------------------------------------
    counter, token_source = caption_token_counter(cfg, tokenizer)
    report["tokenizer"] = token_source
    if counter is None:
        warnings.append(token_source)
    for name, split in loaded.items():
        entry = splits[name]
        usable = [v for v in split.videos if v in info]
        entry["usable_videos"] = len(usable)
        usable_set = set(usable)
        entry["usable_texts"] = sum(1 for v in split.text_video if split.videos[v] in usable_set)
        if not usable:
            errors.append(f"{name} split: none of its {split.num_videos} videos is usable")
        elif name == "val" and len(usable) < SMALL_VAL:
            warnings.append(
                f"val split: only {len(usable)} usable video(s); R@1 moves in steps of "
                f"{100 / len(usable):.1f} points and model selection is noisy"
            )
        if name == "train" and entry["usable_texts"] < cfg.train.batch_size:
            errors.append(
                f"train split: {entry['usable_texts']} usable pairs, fewer than train.batch_size={cfg.train.batch_size}"
            )
        pairs = Counter(zip(split.text_video, split.texts, strict=True))
        dup_pairs = [(split.videos[v], t) for (v, t), n in pairs.items() if n > 1]
        entry["duplicate_pairs"] = len(dup_pairs)
        if dup_pairs:
            warnings.append(
                f"{name} split: {len(dup_pairs)} (video, caption) pairs appear more than once, e.g. "
                f"{dup_pairs[0][0]!r}: {_excerpt(dup_pairs[0][1], 60)!r}"
            )
        if name != "train":
            owners: dict[str, set[int]] = defaultdict(set)
            for v, t in zip(split.text_video, split.texts, strict=True):
                owners[" ".join(t.lower().split())].add(v)
            shared = {t: vs for t, vs in owners.items() if len(vs) > 1}
            entry["captions_on_several_videos"] = len(shared)
            if shared:
                text, vs = next(iter(shared.items()))
                warnings.append(
                    f"{name} split: {len(shared)} caption(s) belong to several videos, so their ground "
                    f"truth is ambiguous, e.g. {_excerpt(text, 60)!r} on "
                    f"{sorted(split.videos[v] for v in vs)[:3]}"
                )
        if counter is not None:
            lengths, bounded = counter(split.texts)
            if bounded:
                from tvr.data.tokenizer import MAX_COUNTED_WORD_BYTES

                first = bounded[0]
                example = split.videos[split.text_video[first]]
                warnings.append(
                    f"{name} split: {len(bounded)} caption(s) hold a word longer than "
                    f"{MAX_COUNTED_WORD_BYTES:,} bytes (e.g. on video {example!r}, "
                    f"{len(split.texts[first]):,} characters): not tokenized, their token counts are "
                    "lower bounds; a run truncates them to data.max_words"
                )
            entry["long_word_captions"] = len(bounded)
            limit = data.max_words - 2  # SOT and EOT take two places
            cut = [
                (split.videos[v], t, n)
                for v, t, n in zip(split.text_video, split.texts, lengths, strict=True)
                if n > limit
            ]
            entry["caption_tokens"] = _stats(lengths)
            entry["truncated_captions"] = len(cut)
            entry["truncated_examples"] = [{"id": v, "tokens": n, "caption": _excerpt(t)} for v, t, n in cut[:EXAMPLES]]
            if cut:
                warnings.append(
                    f"{name} split: {len(cut)} of {len(lengths)} captions exceed data.max_words="
                    f"{data.max_words} ({limit} BPE tokens + SOT/EOT) and are truncated"
                )

    # 6. a video in two splits -----------------------------------------------------------------------------
    overlap = {v: s for v, s in video_splits.items() if len(set(s)) > 1}
    report["videos_in_several_splits"] = [{"id": v, "splits": s} for v, s in overlap.items()]
    if overlap:
        v, s = next(iter(overlap.items()))
        errors.append(
            f"{len(overlap)} video(s) are in more than one split (e.g. {v!r} in {s}): evaluation would "
            "score videos the model trained on"
        )

    report["errors"] = errors
    report["warnings"] = warnings
    report["ok"] = not errors
    return report


# --------------------------------------------------------------------------------------------- rendering


def render_report(report: dict[str, Any], console: Any, json_path: str | os.PathLike | None = None) -> None:
    """Print the report as rich tables: splits, unusable videos by reason (with examples), video statistics, and
    the error / warning lines. ``json_path``: where the full JSON report was written (None: it was not, and the
    text says how to get it). Every text from the data is escaped: ``[...]`` prints as written, never as markup."""
    from rich.markup import escape
    from rich.table import Table

    full = (
        f"every one is in the JSON report {json_path}"
        if json_path is not None
        else "pass --json FILE for the full report, every one listed"
    )

    table = Table(title=f"{escape(report['dataset'])}: splits", title_justify="left")
    for col in (
        "split",
        "status",
        "protocol",
        "texts",
        "videos",
        "usable videos",
        "truncated captions",
        "tokens (median / max)",
    ):
        table.add_column(col, justify="left" if col in ("split", "status", "protocol") else "right")
    for name, entry in report["splits"].items():
        if entry["status"] != "ok":
            table.add_row(name, "[red]error[/red]", "", "", "", "", "", "")
            continue
        tokens = entry.get("caption_tokens")
        table.add_row(
            name,
            "ok",
            escape(entry["protocol"]),
            str(entry["num_texts"]),
            str(entry["num_videos"]),
            str(entry.get("usable_videos", "")),
            str(entry.get("truncated_captions", "–")),
            f"{tokens['median']:g} / {tokens['max']:g}" if tokens else "–",
        )
    console.print(table)

    videos = report["videos"]
    if videos["problems"]:
        bad = Table(title=f"unusable videos: {len(videos['problems'])} of {videos['referenced']}", title_justify="left")
        bad.add_column("reason")
        bad.add_column("count", justify="right")
        bad.add_column("examples (id: detail)")
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for p in videos["problems"]:
            grouped[p["reason"]].append(p)
        shown = len(videos["problems"]) if len(videos["problems"]) <= LIST_ALL else EXAMPLES
        for reason, items in grouped.items():
            examples = "\n".join(escape(f"{p['id']}: {_excerpt(p['detail'], 160)}") for p in items[:shown])
            if len(items) > shown:
                examples += f"\n… and {len(items) - shown} more ({escape(full)})"
            bad.add_row(reason, str(len(items)), examples)
        console.print(bad)
    else:
        console.print(f"all {videos['referenced']} referenced videos are usable")

    stats = report.get("video_stats") or {}
    rows = [(k, v) for k, v in stats.items() if isinstance(v, dict)]
    if rows:
        st = Table(title="usable videos", title_justify="left")
        for col in ("", "min", "p5", "median", "mean", "p95", "max"):
            st.add_column(col, justify="left" if not col else "right")
        for key, s in rows:
            st.add_row(key, *(f"{s[c]:.4g}" for c in ("min", "p5", "median", "mean", "p95", "max")))
        console.print(st)
        if "padded_videos" in stats:
            console.print(
                f"{stats['padded_videos']} usable video(s) give fewer sampled frames than data.max_frames "
                "(zero-padded, masked)"
            )
    for line in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True)
    for line in report["errors"]:
        console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True)
    details = (
        f"details in the JSON report {json_path}"
        if json_path is not None
        else "for every detail, rerun with --json FILE"
    )
    console.print(
        "[green]OK: a run would not trip over this data[/green]"
        if report["ok"]
        else f"[red]NOT OK: fix the errors above ({escape(details)})[/red]",
        soft_wrap=True,
    )
