"""Pre-registered H4 (docs/bench.md): is GARE's paired gain over its own control larger in the CLIP-like regime than
in the old one? Decided from two finished benches on the same data and seeds.

Per seed k: g(k) = test t2v R@1 of ``--method`` − that of its control, in each bench; the test is the one-sided paired
t test of mean(g_clip(k) − g_linear(k)) > 0 over the seeds both benches finished (``tvr.bench.stats``). The JSON holds
the per-seed gains, the mean difference with its 95 % interval, the one-sided p, the minimum detectable difference at
this many seeds, and the hypothesis in the form docs/results.md reads (``tvr bench report --source h4=...``), where it
is decided by its Holm-adjusted p over every pre-registered hypothesis (``decision: holm``).

    python benchmarks/regime_hypothesis.py --clip bench/default/results.json \
        --linear bench/gare_regime_linear/results.json --out benchmarks/results/bench_h4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.bench.runs import sealed  # noqa: E402
from tvr.bench.stats import minimum_detectable_difference, t_interval, t_test_p  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

STATEMENT = "GARE's paired t2v R@1 gain over its own control is larger in the CLIP-like regime than in the old one"


def gains(results: dict[str, Any], method: str, control: str, direction: str, metric: str) -> dict[int, float]:
    """Per seed: the method's test metric minus its control's."""
    values: dict[str, dict[int, float]] = {method: {}, control: {}}
    for run in results["runs"]:
        if run["method"] in values:
            values[run["method"]][run["seed"]] = run["test"][direction][metric]
    return {k: values[method][k] - values[control][k] for k in sorted(values[method]) if k in values[control]}


def decide(clip: dict[str, Any], linear: dict[str, Any], method: str, control: str, key: str) -> dict[str, Any]:
    if clip.get("data_digest") != linear.get("data_digest"):
        raise SystemExit("the two benches were run on different data (their data_digest differs)")
    direction, _, metric = key.partition("/")
    g_clip, g_linear = (
        gains(clip, method, control, direction, metric),
        gains(linear, method, control, direction, metric),
    )
    seeds = [k for k in g_clip if k in g_linear]
    if len(seeds) < 2:
        raise SystemExit(f"the benches share {len(seeds)} seed(s) with both {method} and {control}; need 2 or more")
    shifts = [g_clip[k] - g_linear[k] for k in seeds]
    interval = t_interval(shifts)
    p = t_test_p(shifts, "greater")
    hypothesis = {
        "id": "H4", "method": method, "metric": key, "dial": "regime (linear → CLIP-like)", "expect": "increases",
        "statement": STATEMENT, "decision": "holm", "slope": interval.mean, "slope_low": interval.low,
        "slope_high": interval.high, "p_one_sided": p, "held": bool(p < 0.05),
    }  # fmt: skip
    return {
        "hypotheses": [hypothesis],
        "control": control,
        "seeds": seeds,
        "gain_clip": {str(k): g_clip[k] for k in seeds},
        "gain_linear": {str(k): g_linear[k] for k in seeds},
        "gain_clip_interval": t_interval([g_clip[k] for k in seeds]).to_dict(),
        "gain_linear_interval": t_interval([g_linear[k] for k in seeds]).to_dict(),
        "shift": interval.to_dict(),
        "mde": minimum_detectable_difference(interval.sd, interval.n),
        "benches": {
            name: {
                "name": r["name"],
                "results_sha256": r["results_sha256"],
                "data_digest": r["data_digest"],
                "projection": r["config"]["run"]["model"]["two_tower"]["projection"],
            }
            for name, r in (("clip", clip), ("linear", linear))
        },  # fmt: skip
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", type=Path, required=True, help="results.json of the CLIP-like bench")
    parser.add_argument("--linear", type=Path, required=True, help="results.json of the old-regime bench")
    parser.add_argument("--method", default="gare")
    parser.add_argument("--control", default="gare-control")
    parser.add_argument("--metric", default="t2v/R1")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    clip, linear = (json.loads(path.read_text()) for path in (args.clip, args.linear))
    record = decide(clip, linear, args.method, args.control, args.metric)
    record["command"] = " ".join(["python", *sys.argv])
    record = sealed(record)
    atomic_write_json(args.out, record)
    h = record["hypotheses"][0]
    print(f"H4: shift {h['slope']:+.2f} [{h['slope_low']:+.2f}, {h['slope_high']:+.2f}] over {len(record['seeds'])} "
          f"seeds, one-sided p {h['p_one_sided']:.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
