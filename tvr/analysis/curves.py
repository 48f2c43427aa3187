"""Training curves from run folders (``tvr plot``): every logged training quantity, the learning rates, validation
recall and the selected inference setting against the step, several runs overlaid.

A run folder is what ``tvr train`` writes: ``train_log.jsonl`` (records ``{"kind": "train", "step", "epoch",
"batch", "lr": {group: value}, <loss components…>}``) and ``val_log.jsonl`` (one record per validation with the
metrics and, for a head with a free inference setting, ``metrics.info.inference_setting``). Epochs are shown on a
second axis when every run has the same number of steps per epoch (read off the logs: step = epoch · steps + batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tvr.analysis.figures import FigureFiles, new_figure, write_figure
from tvr.utils.data_files import DataFileError, read_jsonl, read_yaml
from tvr.utils.errors import UserError
from tvr.utils.io import atomic_write_json

TRAIN_LOG = "train_log.jsonl"
VAL_LOG = "val_log.jsonl"
#: record fields that are bookkeeping, not a logged quantity
BOOKKEEPING = ("kind", "step", "epoch", "batch", "lr", "seconds", "it_s")
RECALLS = ("R1", "R5", "R10")
LINESTYLES = {"R1": "-", "R5": "--", "R10": ":"}
#: a marker shape per recall: a run validated once has no line, only its points
MARKERS = {"R1": "o", "R5": "s", "R10": "^"}
#: marker size of a series with one point (a visible dot), and of the points on a validation curve
LONE_MARKER = 7.0
CURVE_MARKER = 3.0


class RunFolderError(UserError, ValueError):
    """A path given to ``tvr plot`` is not a readable training run folder."""


@dataclasses.dataclass
class RunLog:
    """One run's logs: ``train`` (training records) and ``val`` (validation records), with a unique ``label``."""

    path: Path
    label: str
    head: str | None
    train: list[dict[str, Any]]
    val: list[dict[str, Any]]
    #: ``train.log_every`` of the run's config.yaml (None when it cannot be read)
    log_every: int | None = None

    @property
    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.train + self.val]
        return max(steps) if steps else None

    def no_training_records(self) -> str | None:
        """Why the run has no training record to plot (None when it has some)."""
        if self.train:
            return None
        if self.log_every == 0:
            return f"{self.label}: no training loss logged (train.log_every is 0)"
        if self.log_every and self.last_step is not None and self.last_step < self.log_every:
            return (
                f"{self.label}: no training loss logged: it trained {self.last_step} step(s) and logs one record every "
                f"train.log_every = {self.log_every} steps (lower it to see curves)"
            )
        return f"{self.label}: no training loss logged ({TRAIN_LOG} holds no training record)"

    @property
    def steps_per_epoch(self) -> float | None:
        """Optimizer steps per epoch when the records pin it down (step = epoch · steps + batch), else None."""
        values = {
            (r["step"] - r.get("batch", 0)) / r["epoch"]
            for r in self.train + self.val
            if isinstance(r.get("epoch"), int) and r["epoch"] > 0 and isinstance(r.get("step"), int)
        }
        return values.pop() if len(values) == 1 else None

    def epoch_of(self, record: dict[str, Any]) -> float | None:
        steps = self.steps_per_epoch
        if steps:
            return record["step"] / steps
        return record.get("epoch")


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        records = read_jsonl(path)
    except DataFileError as exc:
        raise RunFolderError(str(exc)) from None
    bad = [k for k, r in enumerate(records) if not isinstance(r, dict) or not isinstance(r.get("step"), int)]
    if bad:
        raise RunFolderError(f"{path}: record {bad[0] + 1} has no integer 'step'; expected a tvr training log")
    return records


def _recorded(run_dir: Path, section: str, key: str) -> Any:
    """``section.key`` of the run's config.yaml, None when it cannot be read."""
    try:
        return read_yaml(run_dir / "config.yaml")[section][key]
    except (OSError, DataFileError, KeyError, TypeError):
        return None


def _head_name(run_dir: Path) -> str | None:
    name = _recorded(run_dir, "head", "name")
    return None if name is None else str(name)


def unique_labels(paths: Sequence[Path]) -> list[str]:
    """The shortest trailing parts of each path that tell the runs apart (``a/run`` and ``b/run``)."""
    parts = [p.resolve().parts for p in paths]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def load_runs(run_dirs: Sequence[str | Path]) -> list[RunLog]:
    """Read every run folder; a path that is not a training run folder is an error naming it."""
    paths = [Path(p) for p in run_dirs]
    if not paths:
        raise RunFolderError("no run folder given")
    for path in paths:
        if not path.is_dir():
            raise RunFolderError(f"{path}: not a folder; expected a run folder written by tvr train")
        if not (path / TRAIN_LOG).is_file() and not (path / VAL_LOG).is_file():
            raise RunFolderError(f"{path}: no {TRAIN_LOG} or {VAL_LOG}; expected a run folder written by tvr train")
    if len({p.resolve() for p in paths}) != len(paths):
        raise RunFolderError("the same run folder is given twice")
    runs = []
    for path, label in zip(paths, unique_labels(paths), strict=True):
        train = [r for r in _read(path / TRAIN_LOG) if r.get("kind", "train") == "train"]
        log_every = _recorded(path, "train", "log_every")
        runs.append(
            RunLog(
                path,
                label,
                _head_name(path),
                train,
                _read(path / VAL_LOG),
                log_every if isinstance(log_every, int) else None,
            )
        )
    return runs


# --------------------------------------------------------------------------------------------- series


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def training_series(runs: Sequence[RunLog]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{quantity: {run label: [(step, value), …]}} for every numeric training-record field (loss, its components,
    grad_norm, logit_scale, …), in the order first seen."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run in runs:
        for record in run.train:
            for key, value in record.items():
                if key not in BOOKKEEPING and _numeric(value):
                    out.setdefault(key, {}).setdefault(run.label, []).append((record["step"], float(value)))
    # the optimised loss first, then the components and diagnostics in the order the logs give them
    first = [k for k in ("loss", "loss_avg") if k in out]
    return {k: out[k] for k in first + [k for k in out if k not in first]}


def lr_series(runs: Sequence[RunLog]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run label: {optimizer group: [(step, lr), …]}}."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run in runs:
        for record in run.train:
            for group, value in (record.get("lr") or {}).items():
                if _numeric(value):
                    out.setdefault(run.label, {}).setdefault(group, []).append((record["step"], float(value)))
    return out


def validation_series(runs: Sequence[RunLog]) -> dict[str, dict[str, Any]]:
    """{run label: {"t2v": {R1: [(step, v)], …}, "v2t": …, "best_step": step of the last improvement,
    "select_metric": name}}."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        entry: dict[str, Any] = {"t2v": {}, "v2t": {}, "best_step": None, "select_metric": None}
        for record in run.val:
            metrics = record.get("metrics") or {}
            for direction in ("t2v", "v2t"):
                for key in RECALLS:
                    value = (metrics.get(direction) or {}).get(key)
                    if _numeric(value):
                        entry[direction].setdefault(key, []).append((record["step"], float(value)))
            if record.get("best"):
                entry["best_step"] = record["step"]
            entry["select_metric"] = record.get("select_metric", entry["select_metric"])
        if run.val:
            out[run.label] = entry
    return out


def setting_series(runs: Sequence[RunLog]) -> dict[str, dict[str, list[tuple[int, Any]]]]:
    """{setting key (gamma, mode, w): {run label: [(step, value), …]}} from each validation's chosen setting."""
    out: dict[str, dict[str, list[tuple[int, Any]]]] = {}
    for run in runs:
        for record in run.val:
            setting = ((record.get("metrics") or {}).get("info") or {}).get("inference_setting") or {}
            for key, value in setting.items():
                out.setdefault(key, {}).setdefault(run.label, []).append((record["step"], value))
    return out


# --------------------------------------------------------------------------------------------- figures


def _epoch_axis(ax: Any, runs: Sequence[RunLog]) -> None:
    steps = {run.steps_per_epoch for run in runs}
    if len(steps) == 1 and (per := steps.pop()):
        top = ax.secondary_xaxis("top", functions=(lambda s: s / per, lambda e: e * per))
        top.set_xlabel("epoch", fontsize=8)
        top.tick_params(labelsize=7)


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, max(n, 1))
    return (n + cols - 1) // cols, cols


def _rows(runs: Sequence[RunLog], series: str, label: str, points: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    run = next(r for r in runs if r.label == label)
    per = run.steps_per_epoch
    return [
        {"run": label, "series": series, "step": step, "epoch": (step / per) if per else None, "value": value}
        for step, value in points
    ]


def _colors(runs: Sequence[RunLog]) -> dict[str, str]:
    palette = [f"C{k}" for k in range(10)]
    return {run.label: palette[k % len(palette)] for k, run in enumerate(runs)}


def plot_training(runs: Sequence[RunLog], out_dir: Path) -> FigureFiles | None:
    series = training_series(runs)
    if not series:
        return None
    colors = _colors(runs)
    nrows, ncols = _grid(len(series))
    fig, axes = new_figure(4.2 * ncols, 2.8 * nrows + 0.4, nrows, ncols)
    rows: list[dict[str, Any]] = []
    for k, (name, per_run) in enumerate(series.items()):
        ax = axes.flat[k]
        for label, points in per_run.items():
            ax.plot(
                *zip(*points, strict=True),
                color=colors[label],
                linewidth=1.2,
                label=label,
                **_lone_marker(points),
            )
            rows += _rows(runs, name, label, points)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        _epoch_axis(ax, runs)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    _run_legend(fig, runs, colors)
    title = "Training: every logged quantity against the step"
    notes = [why for run in runs if (why := run.no_training_records())]
    if notes:  # a run in the legend with no curve says why, in the figure as on the terminal
        title += "\n" + "\n".join(notes)
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(
        out_dir,
        "training_losses",
        fig,
        {"runs": _describe(runs), "series": series, "notes": notes},
        title=title,
        rows=rows,
    )


def plot_learning_rates(runs: Sequence[RunLog], out_dir: Path) -> FigureFiles | None:
    series = lr_series(runs)
    if not series:
        return None
    nrows, ncols = _grid(len(series))
    fig, axes = new_figure(5.2 * ncols, 3.4 * nrows, nrows, ncols)
    rows: list[dict[str, Any]] = []
    for ax, (label, groups) in zip(axes.flat, series.items(), strict=False):
        # groups on the very same schedule are one line, named by all of them
        curves: dict[tuple, list[str]] = {}
        for group, points in groups.items():
            curves.setdefault(tuple(points), []).append(group)
            rows += _rows(runs, f"lr/{group}", label, points)
        for k, (points, names) in enumerate(curves.items()):
            ax.plot(
                *zip(*points, strict=True),
                color=f"C{k}",
                linewidth=1.4,
                label=", ".join(names),
                **_lone_marker(points),
            )
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("learning rate", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
        _epoch_axis(ax, [r for r in runs if r.label == label])
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    title = "Learning rate of every optimizer group (groups on the same schedule share a line)"
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(
        out_dir, "learning_rates", fig, {"runs": _describe(runs), "series": series}, title=title, rows=rows
    )


def plot_validation(runs: Sequence[RunLog], out_dir: Path) -> FigureFiles | None:
    series = validation_series(runs)
    if not series:
        return None
    colors = _colors(runs)
    fig, axes = new_figure(12, 4.4, 1, 2, sharey=True)
    rows: list[dict[str, Any]] = []
    for ax, direction in zip(axes[0], ("t2v", "v2t"), strict=True):
        for label, entry in series.items():
            for key, points in entry[direction].items():
                ax.plot(
                    *zip(*points, strict=True),
                    color=colors[label],
                    linestyle=LINESTYLES[key],
                    linewidth=1.2,
                    marker=MARKERS[key],
                    markersize=LONE_MARKER if len(points) == 1 else CURVE_MARKER,
                )
                rows += _rows(runs, f"{direction}/{key}", label, points)
            best = entry["best_step"]
            if best is not None and direction == "t2v" and entry["t2v"].get("R1"):
                ax.axvline(best, color=colors[label], linewidth=0.8, alpha=0.6)
        ax.set_title(f"validation {direction}", fontsize=10)
        ax.set_xlabel("step")
        _epoch_axis(ax, runs)
    axes[0, 0].set_ylabel("recall (%)")
    from matplotlib.lines import Line2D

    axes[0, 0].legend(
        [Line2D([], [], color="#444444", linestyle=LINESTYLES[k], marker=MARKERS[k]) for k in RECALLS],
        [k.replace("R", "R@") for k in RECALLS],
        fontsize=7,
        loc="lower right",
    )
    _run_legend(fig, [r for r in runs if r.label in series], colors)
    metrics = {entry["select_metric"] for entry in series.values()} - {None}
    title = (
        "Validation recall (vertical line: the step best.pt was saved at, by "
        f"{', '.join(sorted(metrics)) or 'the selection metric'})"
    )
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(out_dir, "validation", fig, {"runs": _describe(runs), "series": series}, title=title, rows=rows)


def plot_inference_setting(runs: Sequence[RunLog], out_dir: Path) -> FigureFiles | None:
    series = setting_series(runs)
    if not series:
        return None
    colors = _colors(runs)
    fig, axes = new_figure(5.5 * len(series), 3.8, 1, len(series))
    rows: list[dict[str, Any]] = []
    for ax, (key, per_run) in zip(axes[0], series.items(), strict=True):
        categories = sorted({str(v) for points in per_run.values() for _, v in points if not _numeric(v)})
        for label, points in per_run.items():
            steps = [s for s, _ in points]
            values = [categories.index(str(v)) if not _numeric(v) else v for _, v in points]
            # a choice made at each validation: points, joined faintly only to guide the eye
            ax.plot(steps, values, color=colors[label], marker="o", markersize=4, linewidth=0.8, linestyle=":")
            best = validation_series([r for r in runs if r.label == label]).get(label, {}).get("best_step")
            if best in steps:
                ax.plot(
                    [best],
                    [values[steps.index(best)]],
                    marker="*",
                    markersize=12,
                    color=colors[label],
                    linestyle="none",
                )
            rows += _rows(runs, key, label, points)
        if categories:
            ax.set_yticks(range(len(categories)), categories)
        ax.set_title(f"selected {key}", fontsize=10)
        ax.set_xlabel("step")
        _epoch_axis(ax, runs)
    _run_legend(fig, [r for r in runs if any(r.label in per_run for per_run in series.values())], colors)
    title = "Inference setting chosen on validation at each evaluation (star: the one stored in best.pt)"
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(
        out_dir, "inference_setting", fig, {"runs": _describe(runs), "series": series}, title=title, rows=rows
    )


def _lone_marker(points: Sequence[Any]) -> dict[str, Any]:
    """Plot options of a curve: a dot big enough to see when it has one point (a line through one point is
    invisible), nothing otherwise."""
    return {"marker": "o", "markersize": LONE_MARKER} if len(points) == 1 else {}


def _run_legend(fig: Any, runs: Sequence[RunLog], colors: dict[str, str]) -> None:
    """One legend for the whole figure: a run's colour is the same in every panel."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors[r.label], linewidth=2) for r in runs]
    labels = [f"{r.label} ({r.head})" if r.head else r.label for r in runs]
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(runs), 4), fontsize=8)


def _describe(runs: Sequence[RunLog]) -> list[dict[str, Any]]:
    return [
        {
            "label": r.label,
            "path": str(r.path),
            "head": r.head,
            "steps_per_epoch": r.steps_per_epoch,
            "train_records": len(r.train),
            "val_records": len(r.val),
        }
        for r in runs
    ]


def plot_runs(run_dirs: Sequence[str | Path], out_dir: str | Path) -> dict[str, Any]:
    """Write the training-curve figures of the runs into ``out_dir`` (PNG + JSON + CSV each) and ``plots.json``
    listing them; figures with nothing to show (no validation log, no inference setting) are listed as skipped, and
    ``notes`` says why a run has no training curve (e.g. fewer steps than ``train.log_every``)."""
    runs = load_runs(run_dirs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    notes = [why for run in runs if (why := run.no_training_records())]
    for name, make in (
        ("training_losses", plot_training),
        ("learning_rates", plot_learning_rates),
        ("validation", plot_validation),
        ("inference_setting", plot_inference_setting),
    ):
        files = make(runs, out)
        if files is None:
            skipped.append(name)
        else:
            written.append(files.to_dict())
    manifest = {"runs": _describe(runs), "figures": written, "skipped": skipped, "notes": notes}
    atomic_write_json(out / "plots.json", manifest)
    return manifest
