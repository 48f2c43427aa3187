"""Checks that run before the first training step, so a run that would trip stops in seconds instead of after hours.

Every split the run will read (train, validation, and test unless ``--no-test``) is parsed and resolved; the video
folder must exist; the validation videos are opened (first frame) so an empty validation split is an error now, not
after the last epoch; a frame cache (``data.frame_cache``) must match the run's frame settings; the run folder must
be a folder. A small validation split is a warning: model selection on
it is coarse. ``tvr check-data`` does the same checks on every video of every split, with statistics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from tvr.config import Config, ConfigError
from tvr.data.annotations import AnnotationError, RetrievalSplit, load_split
from tvr.data.check import SMALL_VAL, probe_files
from tvr.data.datasets import VideoResolver, frame_cache_reader
from tvr.data.video import VideoDecodeError
from tvr.models.build import check_data_fits_backbone, check_image_size
from tvr.models.run_spec import RunSpec
from tvr.utils.distributed import is_main_process

log = logging.getLogger(__name__)

#: validation videos probed in this process; more are probed by worker processes
IN_PROCESS_PROBES = 64


class PreflightError(ConfigError):
    """The run would fail later (a split, the video folder, the validation videos, the run folder)."""


@dataclass
class Preflight:
    splits: dict[str, RetrievalSplit]
    warnings: list[str] = field(default_factory=list)


def check_run_folder_path(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise PreflightError(f"--out {out_dir}: is a file; expected a folder (existing or new)")


def preflight(
    run: RunSpec,
    out_dir: str | Path,
    final_test: bool = True,
    progress: bool = True,
    small_val_reason: str | None = None,
) -> Preflight:
    """Parse and resolve everything the run will need; raise :class:`PreflightError` / ``AnnotationError`` naming
    the file, field or video when something would stop the run later. ``small_val_reason``: why the caller chose a
    small validation split (the demo's); it is said, as a note, in place of the small-split warning. ``run``: the
    job's resolved run (:func:`tvr.models.run_spec.resolve_run`)."""
    cfg = run.config
    check_run_folder_path(Path(out_dir))
    if not cfg.data.features_dir:  # cached features were encoded already; the crop no longer reaches the backbone
        check_image_size(run)
        check_data_fits_backbone(run)
    names = ["train", "val"] + (["test"] if final_test else [])
    splits: dict[str, RetrievalSplit] = {}
    for name in names:
        try:
            splits[name] = load_split(cfg.data, name)
        except AnnotationError as exc:
            hint = " (or pass --no-test to train without a test split)" if name == "test" else ""
            raise AnnotationError(f"{name} split: {exc}{hint}") from None
    frame_cache_reader(cfg.data)  # a frame cache built with other frame settings stops the run here
    if cfg.data.features_dir:
        from tvr.data.feature_cache import load_cached_split

        usable = len(load_cached_split(cfg.data.features_dir, "val").video_ids)
        problems: list[str] = []
    else:
        usable, problems = _probe_val_videos(cfg, splits["val"], progress)
    val = splits["val"]
    if usable == 0:
        shown = "; ".join(problems[:5]) + (f"; … ({len(problems)} in all)" if len(problems) > 5 else "")
        raise PreflightError(
            f"validation split: none of its {len(val.videos)} videos can be read ({shown or 'no videos'}); "
            "model selection needs some (run tvr check-data for every problem)"
        )
    warnings = []
    if usable < SMALL_VAL and small_val_reason:
        log.info(
            "the validation split has %d usable video(s), R@1 in steps of %.3g points: %s",
            usable,
            100.0 / usable,
            small_val_reason,
        )
    elif usable < SMALL_VAL:
        step = 100.0 / usable
        warnings.append(
            f"the validation split has only {usable} usable video(s): R@1 moves in steps of {step:.3g} points, so "
            f"best.pt is chosen on a coarse signal"
            + (" (every metric is trivially perfect)" if usable == 1 else "")
            + "; raise data.val_fraction or use the official validation split"
        )
    if problems:
        warnings.append(
            f"{len(problems)} validation video(s) cannot be read and will be left out: " + "; ".join(problems[:3])
        )
    if is_main_process():  # every rank of a torchrun job checks; one says it (each used to, N times over)
        for message in warnings:
            log.warning(message)
    return Preflight(splits, warnings)


def _probe_val_videos(cfg: Config, val: RetrievalSplit, progress: bool) -> tuple[int, list[str]]:
    """(usable videos, one line per unusable one) for the validation split's raw videos."""
    if not Path(cfg.data.video_dir).is_dir():
        raise PreflightError(f"data.video_dir = {cfg.data.video_dir!r}: video folder not found")
    resolver = VideoResolver.from_config(cfg.data)
    problems: list[str] = []
    paths: list[str] = []
    ids: list[str] = []
    for video_id in val.videos:
        try:
            paths.append(str(resolver(video_id)))
            ids.append(video_id)
        except VideoDecodeError as exc:
            problems.append(f"{video_id}: {exc}")
    workers = 1 if len(paths) <= IN_PROCESS_PROBES else 0
    results = probe_files(paths, full=False, workers=workers, progress=progress and len(paths) > IN_PROCESS_PROBES)
    usable = 0
    for video_id, result in zip(ids, results, strict=True):
        if result["ok"]:
            usable += 1
        else:
            problems.append(f"{video_id}: {result['reason']} ({result['detail']})")
    return usable, problems
