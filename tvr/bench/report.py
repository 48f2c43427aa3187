"""``tvr bench``'s report: the markdown tables and the two plots, from a ``results.json`` dict.

Tables: mean ± half-width of the 95 % interval over seeds for t2v and v2t R@1/5/10/MdR/MnR; then each method's
paired per-seed difference from the baseline, ``+Δ [low, high]``, in bold where its Holm-adjusted p-value (over
every cell of the table) is below 0.05 (for MdR and MnR lower is better, so a negative difference is the
improvement); the adjusted p-values; and each comparison's minimum detectable difference (95 % confidence, 80 %
power, from its per-seed spread). Plots (matplotlib, Agg): validation R@1 against epoch per method with a band
over seeds, and test R@1 per method with its interval.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from tvr.bench.stats import t_interval
from tvr.utils.io import atomic_write_bytes

METRICS = ("R1", "R5", "R10", "MdR", "MnR")
DIRECTIONS = ("t2v", "v2t")
LABELS = {"R1": "R@1", "R5": "R@5", "R10": "R@10", "MdR": "MdR", "MnR": "MnR"}


def setting_text(setting: dict[str, Any] | None) -> str:
    """``{"mode": "cos_mu"}`` → ``mode=cos_mu``."""
    return ", ".join(f"{k}={v}" for k, v in (setting or {}).items())


def _number(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.1f}"


def _cell(interval: dict[str, float]) -> str:
    return f"{_number(interval['mean'])} ± {_number(interval['half_width'])}"


#: the family-wise level a difference must reach, Holm-adjusted, to be printed bold
ALPHA = 0.05


def _difference(interval: dict[str, float]) -> str:
    text = f"{interval['mean']:+.1f} [{interval['low']:+.1f}, {interval['high']:+.1f}]"
    return f"**{text}**" if significant(interval) else text


def significant(cell: dict[str, float]) -> bool:
    """A paired difference whose Holm-adjusted p-value is below :data:`ALPHA` (a NaN p never is)."""
    return cell.get("p_holm", math.nan) < ALPHA


def p_text(p: float) -> str:
    """``0.003``, ``<0.001``, ``1``; ``–`` when no test was possible."""
    if math.isnan(p):
        return "–"
    if p < 0.001:
        return "<0.001"
    return "1" if p >= 0.9995 else f"{p:.3f}"


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


def _comparison_table(results: dict[str, Any], cell) -> str:
    if not results["differences"]:
        return "(one method only: nothing to compare)"
    lines = _header()
    lines[0] = lines[0].replace("| method |", f"| method − {results['baseline']} |", 1)
    for method, diff in results["differences"].items():
        row = [cell(diff[d][m]) for d in DIRECTIONS for m in METRICS]
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def control_label(method: str, control: str) -> str:
    """``gare − gare-control``; a control that is the method's own runs at a setting: ``tv-proxynet at gamma=0``."""
    return f"{method} at {control[1:]}" if control.startswith("@") else control


def _control_comparison_table(results: dict[str, Any], cell) -> str:
    controls = results.get("controls") or {}
    if not controls:
        return "(no method names a control)"
    lines = _header()
    lines[0] = lines[0].replace("| method |", "| method − its control |", 1)
    for method, entry in controls.items():
        row = [cell(entry["differences"][d][m]) for d in DIRECTIONS for m in METRICS]
        lines.append(f"| {method} − {control_label(method, entry['control'])} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def control_differences_table(results: dict[str, Any]) -> str:
    """Each method's paired per-seed difference from its own control: mean [95 % CI], bold where the Holm-adjusted
    p (over the whole table: baseline and control comparisons together) is below 0.05."""
    return _control_comparison_table(results, _difference)


def control_holm_table(results: dict[str, Any]) -> str:
    return _control_comparison_table(results, lambda c: p_text(c["p_holm"]))


def control_mde_table(results: dict[str, Any]) -> str:
    return _control_comparison_table(results, lambda c: _number(c["mde"]))


def _by_method(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    by_method: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        by_method.setdefault(run["method"], []).append(run)
    return by_method


def norms_table(results: dict[str, Any]) -> str:
    """Per method, the mean over seeds of the feature norms the head read on the validation split, at
    initialisation and at the chosen checkpoint: text feature, per-video mean of the real frames, their ratio."""
    lines = [
        "| method | ‖t‖ init | ‖v̄‖ init | ‖v̄‖ / ‖t‖ init | ‖t‖ chosen | ‖v̄‖ chosen | ‖v̄‖ / ‖t‖ chosen |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method, runs in _by_method(results).items():
        norms = [r["feature_norms"] for r in runs if "feature_norms" in r]
        if not norms:
            continue
        cells = []
        for when in ("init", "best"):
            mean = lambda values: sum(values) / len(values)  # noqa: E731
            cells += [
                f"{mean([n[when]['text']['mean'] for n in norms]):.2f}",
                f"{mean([n[when]['video_mean']['mean'] for n in norms]):.2f}",
                f"{mean([n[when]['video_to_text'] for n in norms]):.2f}",
            ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "(no run recorded its feature norms)"


def direction_selection_table(results: dict[str, Any]) -> str:
    """Per method and seed: the epoch (and inference setting) validation chose by the bench's criterion, and what it
    would have chosen by t2v alone and by v2t alone."""
    select = results.get("select_metric", "t2v/R1")
    metric = select.split("/")[-1]
    views = list(dict.fromkeys((select, f"t2v/{metric}", f"v2t/{metric}")))
    lines = ["| method | " + " | ".join(f"by {v}: epoch (setting) per seed" for v in views) + " |",
             "|---|" + "---|" * len(views)]  # fmt: skip
    for method, runs in _by_method(results).items():
        if not all("selection_by_direction" in r for r in runs):
            continue
        cells = []
        for view in views:
            picks = [r["selection_by_direction"].get(view) for r in runs]
            cells.append(", ".join(
                "–" if p is None else str(p["epoch"]) + (f" ({setting_text(p['inference_setting'])})"
                                                         if p["inference_setting"] else "") for p in picks
            ))  # fmt: skip
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "(no run recorded its per-direction choices)"


def differences_table(results: dict[str, Any]) -> str:
    """Paired per-seed difference (method − baseline): mean [95 % CI], bold where Holm-adjusted p < 0.05."""
    return _comparison_table(results, _difference)


def holm_table(results: dict[str, Any]) -> str:
    """The Holm-adjusted p-value of every paired comparison (paired t test, two-sided)."""
    return _comparison_table(results, lambda c: p_text(c["p_holm"]))


def mde_table(results: dict[str, Any]) -> str:
    """The minimum detectable paired difference of every comparison (95 % confidence, 80 % power)."""
    return _comparison_table(results, lambda c: _number(c["mde"]))


def composition_lines(results: dict[str, Any]) -> list[str]:
    """Validation beside test: gallery, queries and the shares of full captions, twins and false negatives."""
    composition = results.get("composition") or {}
    if not composition:
        return []
    rows = [
        "| split | videos | queries | full-caption queries | videos with their twin in the gallery | queries with a "
        "false negative in the gallery | twins in other splits |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("val", "validation"), ("test", "test")):
        c = composition[name]
        rows.append(
            f"| {label} | {c['videos']} | {c['queries']} | {100 * c['full_caption_share']:.1f} % | "
            f"{100 * c['twin_share']:.1f} % | {100 * c['false_negative_share']:.1f} % | {c['twins_in_other_splits']} |"
        )
    verdict = "differs beyond it: " + "; ".join(composition["differs"]) if composition["differs"] else "within it"
    return [*rows, "", f"Tolerance on each share: {composition['tolerance']}; validation {verdict}.", ""]


def selection_lines(results: dict[str, Any]) -> list[str]:
    """What validation chose per method: best epochs and inference settings over seeds."""
    out = []
    by_method: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        by_method.setdefault(run["method"], []).append(run)
    for method, runs in by_method.items():
        epochs = ", ".join(str(r["best_epoch"]) for r in runs)
        settings = Counter(setting_text(r["inference_setting"]) for r in runs if r["inference_setting"])
        text = f"- {method}: best validation epoch per seed {epochs}"
        if settings:
            text += "; inference setting chosen on validation: " + ", ".join(
                f"{s} ({n} seed{'s' if n > 1 else ''})" for s, n in settings.most_common()
            )
        out.append(text)
    return out


def render_markdown(results: dict[str, Any], figures: dict[str, str] | None = None) -> str:
    seeds = results["seeds"]
    command = results.get("provenance", {}).get("command") or results.get("command", "")
    lines = [
        f"# tvr bench: {results['name']}",
        "",
        results.get("description", ""),
        "",
        f"Command: `{command}`",
        "",
        *composition_lines(results),
        f"{len(results['summary'])} methods × {len(seeds)} seeds ({', '.join(map(str, seeds))}), {results['epochs']} "
        f"epochs each. {results['selection']}. Test metrics: mean ± half-width of the 95 % Student-t interval over "
        "seeds (R@k in %, MdR / MnR: ranks, lower is better).",
        "",
        results_table(results),
        "",
        f"Paired per-seed difference from the baseline ({results['baseline']}): mean [95 % interval]; **bold** where "
        "the Holm-adjusted p-value over the whole table is below 0.05 (for MdR / MnR a negative difference is an "
        "improvement).",
        "",
        differences_table(results),
        "",
        "Holm-adjusted p-values (paired t test, two-sided):",
        "",
        holm_table(results),
        "",
        "Minimum detectable paired difference (95 % confidence, 80 % power, from each comparison's per-seed spread):",
        "",
        mde_table(results),
        "",
    ]
    if results.get("controls"):
        lines += [
            "Paired per-seed difference from each method's own control (the same seeds; bold where the Holm-adjusted "
            "p-value, over this table and the one above together, is below 0.05):",
            "",
            control_differences_table(results),
            "",
            "Their Holm-adjusted p-values:",
            "",
            control_holm_table(results),
            "",
            "Their minimum detectable differences:",
            "",
            control_mde_table(results),
            "",
        ]
    lines += ["Selection (validation only):", "", *selection_lines(results), ""]
    if any("selection_by_direction" in r for r in results["runs"]):
        lines += ["What validation would have chosen by each direction alone:", "", direction_selection_table(results),
                  ""]  # fmt: skip
    if any("feature_norms" in r for r in results["runs"]):
        lines += ["Feature norms the heads read (validation split, mean over seeds):", "", norms_table(results), ""]
    if figures:
        lines += [
            f"![validation R@1 per epoch, both directions]({figures['val']})",
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


def plot_validation_curves(results: dict[str, Any], path: str | Path, directions: tuple[str, ...] = DIRECTIONS) -> Path:
    """Validation R@1 against epoch, one panel per direction, one line per method (mean over seeds) with its 95 %
    band: a method that collapses in one direction shows it in that direction's panel."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(directions), figsize=(6.4 * len(directions), 4.0), squeeze=False)
    seeds = len(results["seeds"])
    for ax, direction in zip(axes[0], directions, strict=True):
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
                ax.fill_between(epochs, [i.low for i in intervals], [i.high for i in intervals],
                                color=line.get_color(), alpha=0.15, linewidth=0)  # fmt: skip
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"validation {direction} R@1 (%)")
        ax.set_title(f"{results['name']}: validation {direction} R@1, mean and 95 % band over {seeds} seeds",
                     fontsize=9)  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
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
    ax.set_ylim(0, None)  # a recall is never below 0, whatever an interval's lower end says
    ax.set_ylabel(f"test {LABELS[metric]} (%)")
    seeds = len(results["seeds"])
    ax.set_title(f"{results['name']}: test {LABELS[metric]}, mean and 95 % interval over {seeds} seeds", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    data = _figure_bytes(fig)
    plt.close(fig)
    return atomic_write_bytes(path, data)


# ------------------------------------------------------------------------------------------------ dial sweeps

#: the gains a sweep's tables show (direction/metric)
SWEEP_COLUMNS = ("t2v/R1", "t2v/R5", "t2v/R10", "v2t/R1")


def _dial_value(value: float) -> str:
    return f"{value:g}"


def _metric_label(key: str) -> str:
    direction, _, metric = key.partition("/")
    return f"{direction} {LABELS[metric]}"


def _trend_text(trend: dict[str, Any]) -> str:
    return f"{trend['mean']:+.1f} [{trend['low']:+.1f}, {trend['high']:+.1f}], p = {p_text(trend['p_greater'])}"


def sweep_table(record: dict[str, Any], method: str) -> str:
    """One method's paired gain over the baseline at each dial value (mean [95 % CI], bold where the point's
    Holm-adjusted p < 0.05), the test split's composition there, and the trend: the mean per-seed slope of the gain
    per unit of the dial with its interval and one-sided p (H1: slope > 0)."""
    curves = record["curves"][method]
    header = (
        f"| {record['dial']} | test: twins in gallery | test: false negatives | "
        + " | ".join(f"{_metric_label(k)} gain" for k in SWEEP_COLUMNS)
        + " |"
    )
    lines = [header, "|---:|---:|---:|" + "---:|" * len(SWEEP_COLUMNS)]
    for k, point in enumerate(record["points"]):
        test = (point.get("composition") or {}).get("test")
        shares = f"{100 * test['twin_share']:.0f} % | {100 * test['false_negative_share']:.0f} %" if test else "– | –"
        cells = [_difference(curves[key]["gain"][k]) for key in SWEEP_COLUMNS]
        lines.append(f"| {_dial_value(point['value'])} | {shares} | " + " | ".join(cells) + " |")
    trends = [_trend_text(curves[key]["trend"]) for key in SWEEP_COLUMNS]
    lines.append("| slope per unit | | | " + " | ".join(trends) + " |")
    return "\n".join(lines)


def hypotheses_table(hypotheses: list[dict[str, Any]]) -> str:
    """Each pre-registered hypothesis: its claim, the measured slope with its interval, the one-sided p and the
    verdict of the rule (held when p < 0.05)."""
    if not hypotheses:
        return "(no pre-registered hypothesis names this dial)"
    lines = [
        "| id | hypothesis | slope of the gain per unit of the dial [95 % CI] | one-sided p | held? |",
        "|---|---|---:|---:|---|",
    ]
    for h in hypotheses:
        slope = f"{h['slope']:+.1f} [{h['slope_low']:+.1f}, {h['slope_high']:+.1f}]"
        verdict = "**yes**" if h["held"] else "no"
        if h.get("decision") == "holm":  # its rule is the Holm-adjusted p over the whole family (docs/results.md)
            verdict += " (by p alone; decided with Holm over all hypotheses in the results document)"
        lines.append(f"| {h['id']} | {h['statement']} | {slope} | {p_text(h['p_one_sided'])} | {verdict} |")
    return "\n".join(lines)


def sweep_lines(record: dict[str, Any]) -> list[str]:
    """A sweep in a few lines: per method the t2v R@1 gain at each value and the trend; each hypothesis's verdict."""
    out = []
    for method, curves in record["curves"].items():
        curve = curves["t2v/R1"]
        gains = ", ".join(
            f"{_dial_value(v)}: {g['mean']:+.1f}" for v, g in zip(curve["values"], curve["gain"], strict=True)
        )
        out.append(f"{method} t2v R@1 gain over {record['baseline']} by {record['dial']}: {gains}; slope "
                   f"{_trend_text(curve['trend'])}")  # fmt: skip
    for h in record["hypotheses"]:
        out.append(f"{h['id']} ({h['method']}, {h['metric']}, {h['expect']}): {'held' if h['held'] else 'did not hold'}"
                   f" (slope {h['slope']:+.1f}, one-sided p {p_text(h['p_one_sided'])})")  # fmt: skip
    return out


def sweep_markdown(record: dict[str, Any], figure: str | None = None) -> str:
    """The sweep's report: per method its gain-versus-dial table, then the hypotheses it decides."""
    command = record.get("provenance", {}).get("command", "")
    lines = [
        f"# tvr bench sweep: {record['name']}, {record['dial']} = "
        + ", ".join(_dial_value(v) for v in record["values"]),
        "",
        record.get("description", ""),
        "",
        f"Command: `{command}`",
        "",
        f"Dial: `{record['dial']}` ({record['dial_meaning']}). One bench per value ({len(record['seeds'])} seeds, "
        f"{record['epochs']} epochs); gains are paired per seed over {record['baseline']}, mean [95 % interval], bold "
        "where that bench's Holm-adjusted p < 0.05. Slope: the mean over seeds of each seed's least-squares slope of "
        "gain on the dial, per unit of the dial, with its 95 % interval and one-sided p (H1: slope > 0).",
        "",
    ]
    for method in record["curves"]:
        lines += [f"## {method} − {record['baseline']}", "", sweep_table(record, method), ""]
    lines += ["## Pre-registered hypotheses", "", hypotheses_table(record["hypotheses"]), ""]
    if figure:
        lines += [f"![paired t2v R@1 gain against {record['dial']}]({figure})", ""]
    return "\n".join(lines)


def plot_sweep(record: dict[str, Any], path: str | Path, key: str = "t2v/R1") -> Path:
    """Each method's paired gain over the baseline against the dial, with 95 % intervals, and the zero line."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    methods = list(record["curves"])
    span = max(record["values"]) - min(record["values"])
    for k, method in enumerate(methods):
        curve = record["curves"][method][key]
        shift = (k - (len(methods) - 1) / 2) * 0.015 * span  # side by side, so the intervals do not hide each other
        xs = [v + shift for v in curve["values"]]
        means = [g["mean"] for g in curve["gain"]]
        errors = [[g["mean"] - g["low"] for g in curve["gain"]], [g["high"] - g["mean"] for g in curve["gain"]]]
        ax.errorbar(xs, means, yerr=errors, marker="o", markersize=4, capsize=3, label=method)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel(record["dial"])
    # two lines: on one, a long baseline name (gare-control) runs past the axes and the label is cut off
    ax.set_ylabel(f"paired {_metric_label(key)} gain\nover {record['baseline']} (points)")
    ax.set_title(f"{record['name']}: gain against {record['dial']}, mean and 95 % interval over "
                 f"{len(record['seeds'])} seeds", fontsize=9)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    data = _figure_bytes(fig)
    plt.close(fig)
    return atomic_write_bytes(path, data)


__all__ = [
    "composition_lines",
    "control_differences_table",
    "control_holm_table",
    "control_label",
    "control_mde_table",
    "direction_selection_table",
    "norms_table",
    "differences_table",
    "holm_table",
    "hypotheses_table",
    "interval_table",
    "mde_table",
    "plot_sweep",
    "plot_test_recall",
    "plot_validation_curves",
    "render_markdown",
    "results_table",
    "setting_text",
    "sweep_lines",
    "sweep_markdown",
    "sweep_table",
]
