"""``tvr bench``'s report: the markdown tables and the two plots, from a ``results.json`` dict.

Tables: mean ± half-width of the 95 % interval over seeds for t2v and v2t R@1/5/10/MdR/MnR; then each method's
paired per-seed difference from the baseline, ``+Δ [low, high]``, in bold where the interval excludes 0 (for MdR
and MnR lower is better, so a negative difference is the improvement). Plots (matplotlib, Agg): validation R@1
against epoch per method with a band over seeds, and test R@1 per method with its interval.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from tvr.eval.stats import t_interval
from tvr.utils.io import atomic_write_bytes

METRICS = ("R1", "R5", "R10", "MdR", "MnR")
DIRECTIONS = ("t2v", "v2t")
LABELS = {"R1": "R@1", "R5": "R@5", "R10": "R@10", "MdR": "MdR", "MnR": "MnR"}


def _number(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.1f}"


def _cell(interval: dict[str, float]) -> str:
    return f"{_number(interval['mean'])} ± {_number(interval['half_width'])}"


def _difference(interval: dict[str, float]) -> str:
    text = f"{interval['mean']:+.1f} [{interval['low']:+.1f}, {interval['high']:+.1f}]"
    excludes = not math.isnan(interval["half_width"]) and (interval["low"] > 0 or interval["high"] < 0)
    return f"**{text}**" if excludes else text


def _header() -> list[str]:
    cols = [f"{d} {LABELS[m]}" for d in DIRECTIONS for m in METRICS]
    return ["| method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]


def interval_table(summary: dict[str, Any], baseline: str | None = None) -> str:
    """Mean ± 95 % CI half-width over seeds per method, from a ``{method: {direction: {metric: interval}}}``."""
    lines = _header()
    for method in summary:
        row = [_cell(summary[method][d][m]) for d in DIRECTIONS for m in METRICS]
        name = f"{method} (baseline)" if method == baseline else method
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def results_table(results: dict[str, Any]) -> str:
    """The test split's table: mean ± 95 % CI half-width over seeds per method."""
    return interval_table(results["summary"], results["baseline"])


def transfer_lines(results: dict[str, Any]) -> list[str]:
    """Each transfer set: its table, or why it was skipped."""
    out = []
    for name, entry in (results.get("transfer") or {}).items():
        out += [f"### Zero-shot transfer: {name}", ""]
        if "skipped" in entry:
            out += [f"Skipped: {entry['skipped']}.", ""]
            continue
        folder = entry["data"].get("annotations")
        out += [
            f"Every run's validation-selected checkpoint, evaluated without training on `{folder}` (split "
            f"{entry['split']}); mean ± 95 % interval over seeds.",
            "",
            interval_table(entry["summary"]),
            "",
        ]
    return out


def differences_table(results: dict[str, Any]) -> str:
    """Paired per-seed difference (method − baseline): mean [95 % CI]."""
    if not results["differences"]:
        return "(one method only: nothing to compare)"
    lines = _header()
    lines[0] = lines[0].replace("| method |", f"| method − {results['baseline']} |", 1)
    for method, diff in results["differences"].items():
        row = [_difference(diff[d][m]) for d in DIRECTIONS for m in METRICS]
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def selection_lines(results: dict[str, Any]) -> list[str]:
    """What validation chose per method: best epochs and inference settings over seeds."""
    out = []
    by_method: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        by_method.setdefault(run["method"], []).append(run)
    for method, runs in by_method.items():
        epochs = ", ".join(str(r["best_epoch"]) for r in runs)
        settings = Counter(
            ", ".join(f"{k}={v}" for k, v in r["inference_setting"].items()) for r in runs if r["inference_setting"]
        )
        text = f"- {method}: best validation epoch per seed {epochs}"
        if settings:
            text += "; inference setting chosen on validation: " + ", ".join(
                f"{s} ({n} seed{'s' if n > 1 else ''})" for s, n in settings.most_common()
            )
        out.append(text)
    return out


def render_markdown(results: dict[str, Any], figures: dict[str, str] | None = None) -> str:
    seeds = results["seeds"]
    lines = [
        f"# tvr bench: {results['name']}",
        "",
        results.get("description", ""),
        "",
        f"Command: `{results['command']}`",
        "",
        f"{len(results['summary'])} methods × {len(seeds)} seeds ({', '.join(map(str, seeds))}), {results['epochs']} "
        f"epochs each. {results['selection']}. Test metrics: mean ± half-width of the 95 % Student-t interval over "
        "seeds (R@k in %, MdR / MnR: ranks, lower is better).",
        "",
        results_table(results),
        "",
        f"Paired per-seed difference from the baseline ({results['baseline']}): mean [95 % interval]; **bold** where "
        "the interval excludes 0 (for MdR / MnR a negative difference is an improvement).",
        "",
        differences_table(results),
        "",
        "Selection (validation only):",
        "",
        *selection_lines(results),
        "",
    ]
    if figures:
        lines += [
            f"![validation R@1 per epoch]({figures['val']})",
            "",
            f"![test R@1 with 95 % intervals]({figures['test']})",
            "",
        ]
    return "\n".join(lines + transfer_lines(results))


def _figure_bytes(fig) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    return buffer.getvalue()


def plot_validation_curves(results: dict[str, Any], path: str | Path, direction: str = "t2v") -> Path:
    """Validation R@1 against epoch, one line per method (mean over seeds) with its 95 % band."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    by_method: dict[str, dict[int, list[float]]] = {}
    for run in results["runs"]:
        for point in run["val_curve"]:
            by_method.setdefault(run["method"], {}).setdefault(point["epoch"], []).append(point[direction]["R1"])
    for method, per_epoch in by_method.items():
        epochs = sorted(per_epoch)
        intervals = [t_interval(per_epoch[e]) for e in epochs]
        means = [i.mean for i in intervals]
        line = ax.plot(epochs, means, marker="o", markersize=3, label=method)[0]
        if all(not math.isnan(i.half_width) for i in intervals):
            ax.fill_between(epochs, [i.low for i in intervals], [i.high for i in intervals], color=line.get_color(),
                            alpha=0.15, linewidth=0)  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation {direction} R@1 (%)")
    seeds = len(results["seeds"])
    ax.set_title(f"{results['name']}: validation {direction} R@1, mean and 95 % band over {seeds} seeds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    data = _figure_bytes(fig)
    plt.close(fig)
    return atomic_write_bytes(path, data)


def plot_test_recall(results: dict[str, Any], path: str | Path, metric: str = "R1") -> Path:
    """Test R@1 (t2v and v2t) per method: bars at the mean over seeds, error bars the 95 % interval."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    methods = list(results["summary"])
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(methods) + 1.5), 3.8))
    width = 0.38
    for k, direction in enumerate(DIRECTIONS):
        cells = [results["summary"][m][direction][metric] for m in methods]
        xs = [i + (k - 0.5) * width for i in range(len(methods))]
        errors = [0.0 if math.isnan(c["half_width"]) else c["half_width"] for c in cells]
        ax.bar(xs, [c["mean"] for c in cells], width, yerr=errors, capsize=3, label=direction)
    ax.set_xticks(range(len(methods)), methods, rotation=15, fontsize=8)
    ax.set_ylabel(f"test {LABELS[metric]} (%)")
    seeds = len(results["seeds"])
    ax.set_title(f"{results['name']}: test {LABELS[metric]}, mean and 95 % interval over {seeds} seeds", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    data = _figure_bytes(fig)
    plt.close(fig)
    return atomic_write_bytes(path, data)


__all__ = [
    "differences_table",
    "interval_table",
    "plot_test_recall",
    "plot_validation_curves",
    "render_markdown",
    "results_table",
]
