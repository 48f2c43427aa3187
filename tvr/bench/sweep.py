"""``tvr bench --sweep DIAL=v1,v2,...``: does a method's gain over the baseline change with a property of the data?

A paper claims a mechanism ("GARE relieves the gradient conflict of false negatives"); a mechanism predicts how the
gain should move when the data has more of what the mechanism is about. A sweep renders the bench's synthetic set
once per value of one dial (:data:`tvr.bench.runs.SWEEP_DIALS`), runs the whole bench on each
(``OUT/<dial>=<value>/``: every bench guarantee holds per point — resumable, reproducible, validation like the test),
and reports per method the paired gain over the baseline at each value and the trend: each seed's least-squares
slope of gain on dial value is one replicate, and a one-sided t test over seeds asks whether the mean slope has the
expected sign (:func:`tvr.bench.stats.slope_test`). A bench config's ``hypotheses`` (pre-registered in
docs/bench.md before the sweep ran) are decided by that test at :data:`tvr.bench.runs.ALPHA`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tvr.bench.runs import (
    ALPHA,
    DIRECTIONS,
    METRICS,
    SWEEP_DIALS,
    BenchConfig,
    BenchConfigError,
    Clock,
    ProgressFn,
    package_versions,
    run_bench,
    sealed,
    source_commit,
    synth_config,
)
from tvr.utils.io import atomic_write_json, atomic_write_text

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
SWEEP_FORMAT = 1


@dataclass(frozen=True)
class Sweep:
    """One dial and the values it takes, in the order given."""

    dial: str
    values: tuple[float, ...]


def value_text(value: float) -> str:
    """``0.25`` → ``0.25``, ``1.0`` → ``1``: how a value names its folder and its table row."""
    return f"{value:g}"


def parse_sweep(text: str, bench: BenchConfig) -> Sweep:
    """``shared_attributes=0,0.25,0.5`` → a :class:`Sweep`, checked against ``bench`` before any work: a known dial
    of a synthetic bench, at least two distinct values, each one a valid value of the dial."""
    dial, sep, listed = (text or "").partition("=")
    dial = dial.strip()
    if not sep or not dial:
        raise BenchConfigError(f"--sweep {text!r}: expected DIAL=v1,v2,... (dials: {', '.join(sorted(SWEEP_DIALS))})")
    if dial not in SWEEP_DIALS:
        raise BenchConfigError(
            f"--sweep: unknown dial {dial!r}; a sweep varies one of {', '.join(sorted(SWEEP_DIALS))}"
        )
    if bench.synth is None:
        raise BenchConfigError(f"--sweep {dial}: {bench.source} reads an annotation folder; a sweep renders synth data")
    values: list[float] = []
    for item in listed.split(","):
        try:
            value = float(item.strip())
        except ValueError:
            raise BenchConfigError(f"--sweep {dial}: value {item.strip()!r} is not a number") from None
        if not math.isfinite(value):
            raise BenchConfigError(f"--sweep {dial}: value {item.strip()!r} is not a finite number")
        if value in values:
            raise BenchConfigError(f"--sweep {dial}: value {value_text(value)} is given twice")
        try:
            synth_config(point_bench(bench, dial, value))
        except BenchConfigError as exc:
            raise BenchConfigError(f"--sweep {dial}={value_text(value)}: {str(exc).split(': ', 1)[-1]}") from None
        values.append(value)
    if len(values) < 2:
        raise BenchConfigError(f"--sweep {dial}: a sweep needs at least two values, got {listed!r}")
    return Sweep(dial, tuple(values))


def point_bench(bench: BenchConfig, dial: str, value: float) -> BenchConfig:
    """``bench`` with its synthetic set's ``dial`` set to ``value``."""
    point = copy.deepcopy(bench)
    point.synth = {**(bench.synth or {}), dial: value}
    point.raw = {**bench.raw, "synth": point.synth, "name": f"{bench.name} ({dial}={value_text(value)})"}
    point.name = point.raw["name"]
    return point


def point_folder(out_dir: Path, dial: str, value: float) -> Path:
    return out_dir / f"{dial}={value_text(value)}"


def _per_seed(results: dict[str, Any]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """``{method: {seed: {direction: {metric: value}}}}`` of one bench's test metrics."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for run in results["runs"]:
        out.setdefault(run["method"], {})[str(run["seed"])] = {
            d: {m: run["test"][d][m] for m in METRICS} for d in DIRECTIONS
        }
    return out


def gain_curves(points: list[dict[str, Any]], baseline: str) -> dict[str, Any]:
    """Per non-baseline method and ``direction/metric``: the paired gain at each value (from each point's
    differences) and the trend over values (:func:`tvr.bench.stats.slope_test` of the per-seed gains)."""
    from tvr.bench.stats import slope_test

    xs = [p["value"] for p in points]
    methods = [m for m in points[0]["per_seed"] if m != baseline]
    curves: dict[str, Any] = {}
    for method in methods:
        seeds = sorted(set.intersection(*(set(p["per_seed"][method]) & set(p["per_seed"][baseline]) for p in points)),
                       key=int)  # fmt: skip
        curves[method] = {}
        for d in DIRECTIONS:
            for m in METRICS:
                per_seed = [
                    [p["per_seed"][method][s][d][m] - p["per_seed"][baseline][s][d][m] for p in points] for s in seeds
                ]
                curves[method][f"{d}/{m}"] = {
                    "values": xs,
                    "gain": [p["differences"][method][d][m] for p in points],
                    "per_seed_gain": {s: g for s, g in zip(seeds, per_seed, strict=True)},
                    "trend": slope_test(xs, per_seed),
                }
    return curves


def decide(hypothesis: dict[str, Any], curves: dict[str, Any]) -> dict[str, Any]:
    """The pre-registered rule: the hypothesis holds when the mean per-seed slope of the method's paired gain on the
    dial has the expected sign with one-sided p < :data:`ALPHA` (t test over seeds)."""
    from tvr.bench.stats import slope_test

    curve = curves[hypothesis["method"]][hypothesis["metric"]]
    trend = curve["trend"]
    if hypothesis["expect"] == "decreases":  # the same test on the negated gains
        p = slope_test(curve["values"], [[-g for g in gains] for gains in curve["per_seed_gain"].values()])
        p_value = p["p_greater"]
    else:
        p_value = trend["p_greater"]
    return {**hypothesis, "slope": trend["mean"], "slope_low": trend["low"], "slope_high": trend["high"],
            "p_one_sided": p_value, "held": bool(p_value < ALPHA)}  # fmt: skip


def run_sweep(bench: BenchConfig, sweep: Sweep, out_dir: str | Path, *, command: str = "", **options: Any) -> dict:
    """One bench per value into ``OUT/<dial>=<value>``, then ``OUT/sweep.json`` and ``OUT/sweep.md``. ``options``:
    :func:`tvr.bench.runs.run_bench`'s (``progress``, ``echo``, ``jobs``, ``rerun_changed``,
    ``allow_unlike_validation``), for every point."""
    from tvr.bench.report import plot_sweep, sweep_markdown

    echo: ProgressFn | None = options.get("echo")
    say = echo or (lambda line: None)
    out_dir = Path(out_dir)
    clock = Clock()
    points = []
    for value in sweep.values:
        say(f"sweep {sweep.dial}={value_text(value)}")
        results = run_bench(
            point_bench(bench, sweep.dial, value), point_folder(out_dir, sweep.dial, value), command=command, **options
        )
        points.append({
            "value": value,
            "folder": point_folder(out_dir, sweep.dial, value).name,
            "results_sha256": results["results_sha256"],
            "dials": results["dials"],
            "composition": results["composition"],
            "summary": results["summary"],
            "differences": results["differences"],
            "per_seed": _per_seed(results),
            "timings": results["provenance"]["timings"],
        })  # fmt: skip
    curves = gain_curves(points, bench.baseline)
    hypotheses = [decide(h, curves) for h in bench.hypotheses if h["dial"] == sweep.dial]
    record: dict[str, Any] = {
        "format": SWEEP_FORMAT,
        "name": bench.name,
        "description": bench.description,
        "dial": sweep.dial,
        "dial_meaning": SWEEP_DIALS[sweep.dial],
        "values": list(sweep.values),
        "config": bench.raw,
        "baseline": bench.baseline,
        "seeds": bench.seeds,
        "epochs": bench.epochs,
        "alpha": ALPHA,
        "points": points,
        "curves": curves,
        "hypotheses": hypotheses,
    }
    record["provenance"] = {
        "command": command,
        "config_file": bench.source,
        "source": source_commit(),
        "packages": package_versions(),
        "jobs": options.get("jobs", 1),
        "timings": clock.lap(),
    }
    for point in points:  # timings are provenance: the digest covers the rest
        record["provenance"].setdefault("point_timings", {})[point["folder"]] = point.pop("timings")
    record = sealed(record)
    atomic_write_json(out_dir / SWEEP_JSON, record)
    plot_sweep(record, out_dir / "sweep_gain.png")
    atomic_write_text(out_dir / SWEEP_MD, sweep_markdown(record, figure="sweep_gain.png"))
    return record


__all__ = ["Sweep", "decide", "gain_curves", "parse_sweep", "point_bench", "run_sweep", "value_text"]
