"""How small a difference can a bench see? The minimum detectable paired difference against test-gallery size and
seeds, measured on a finished bench.

A bench's paired comparison of method and baseline detects (95 % two-sided, 80 % power) a true difference of
``MDE = (t(0.975, n − 1) + t(0.80, n − 1)) · s_d / √n`` (tvr.bench.stats), where s_d is the spread over seeds of the
per-seed differences. s_d has two parts: which queries two models happen to rank differently (it shrinks as the
test gallery grows) and how much a model's quality moves with its seed (it does not). This script re-scores every
run's validation-selected checkpoint of a finished bench on the first K test videos (the K × K corner of its score
matrix: the same protocol, a smaller gallery) for several K, and reports per K and method the per-seed t2v R@1, s_d,
the MDE at the bench's seed count, and the MDE projected to other seed counts from the same s_d — with the bench's
measured cost per run, so MDE can be set against CPU time.

    .venv/bin/python benchmarks/bench_power.py BENCH_FOLDER --sizes 100,250,500,1000 --out benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.bench.stats import minimum_detectable_difference  # noqa: E402
from tvr.eval.protocol import evaluate  # noqa: E402
from tvr.eval.runner import score_matrices  # noqa: E402
from tvr.models.checkpoint import load_model  # noqa: E402
from tvr.pipeline import SplitEvaluator  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

PROJECT_SEEDS = (5, 10, 15, 20, 30)


def corner_recall(sim: torch.Tensor, size: int, tie_mode: str) -> float:
    """t2v R@1 of the first ``size`` one-to-one test pairs ranked among themselves."""
    return float(evaluate(sim[:size, :size], list(range(size)), "one_to_one", tie_mode=tie_mode)["t2v"]["R1"])


def run_recalls(run_dir: Path, sizes: list[int]) -> dict[int, float]:
    model, cfg = load_model(run_dir / "best.pt")  # the checkpoint's config: its feature cache, its setting
    device = torch.device("cpu")
    evaluator = SplitEvaluator(cfg, "test")
    encoded = evaluator.encode(model.to(device), device)
    if encoded.protocol != "one_to_one":
        raise SystemExit(f"{run_dir}: the test split is {encoded.protocol}; this script needs one_to_one")
    with torch.inference_mode():
        sim = score_matrices(model, encoded, cfg, device)[0]
    return {k: corner_recall(sim, k, cfg.eval.tie_mode) for k in sizes if k <= sim.shape[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", type=Path, help="a finished bench folder (results.json, runs/)")
    parser.add_argument("--sizes", default="100,250,500,1000")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = json.loads((args.bench / "results.json").read_text())
    baseline = results["baseline"]
    sizes = [int(s) for s in args.sizes.split(",")]
    load_start, wall_start, cpu_start = os.getloadavg(), time.perf_counter(), time.process_time()
    recalls: dict[str, dict[str, dict[int, float]]] = {}
    for run in results["runs"]:
        run_dir = args.bench / "runs" / run["method"] / f"seed{run['seed']}"
        recalls.setdefault(run["method"], {})[str(run["seed"])] = got = run_recalls(run_dir, sizes)
        recorded = run["test"]["t2v"]["R1"]
        if (
            results["composition"]["test"]["videos"] in got
            and got[results["composition"]["test"]["videos"]] != recorded
        ):
            raise SystemExit(f"{run_dir}: re-scored t2v R@1 on the whole gallery differs from the bench's {recorded}")
        print(run["method"], run["seed"], recalls[run["method"]][str(run["seed"])], flush=True)
    table: dict[str, dict] = {}
    for size in sizes:
        per_method = {}
        for method, by_seed in recalls.items():
            if method == baseline:
                continue
            seeds = sorted(set(by_seed) & set(recalls[baseline]), key=int)
            diffs = [by_seed[s][size] - recalls[baseline][s][size] for s in seeds if size in by_seed[s]]
            n = len(diffs)
            if n < 2:
                continue
            mean = sum(diffs) / n
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
            per_method[method] = {
                "differences": diffs,
                "mean": mean,
                "sd": sd,
                "mde": minimum_detectable_difference(sd, n),
                "mde_projected": {str(k): minimum_detectable_difference(sd, k) for k in PROJECT_SEEDS},
            }
        if per_method:
            pooled = math.sqrt(sum(m["sd"] ** 2 for m in per_method.values()) / len(per_method))
            table[str(size)] = {
                "methods": per_method,
                "pooled_sd": pooled,
                "worst_sd": max(m["sd"] for m in per_method.values()),
                "mde_projected_pooled": {str(k): minimum_detectable_difference(pooled, k) for k in PROJECT_SEEDS},
            }
    timings = results.get("provenance", {}).get("timings") or {}
    record = {
        "command": "python benchmarks/bench_power.py " + " ".join(sys.argv[1:]),
        "bench": str(args.bench),
        "bench_results_sha256": results.get("results_sha256"),
        "bench_seconds": timings
        or {
            "seconds_this_session": results.get("seconds_this_session"),
            "run_seconds_total": results.get("run_seconds_total"),
        },  # fmt: skip
        "baseline": baseline,
        "seeds": results["seeds"],
        "sizes": sizes,
        "per_seed_t2v_r1": recalls,
        "by_size": table,
        "wall_seconds": round(time.perf_counter() - wall_start, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    atomic_write_json(args.out, record)
    for size, entry in table.items():
        line = ", ".join(f"{m} sd {v['sd']:.2f} mde {v['mde']:.2f}" for m, v in entry["methods"].items())
        print(f"K={size}: pooled sd {entry['pooled_sd']:.2f}; {line}; pooled MDE by seeds "
              + ", ".join(f"{k}: {v:.2f}" for k, v in entry["mde_projected_pooled"].items()))  # fmt: skip


if __name__ == "__main__":
    main()
