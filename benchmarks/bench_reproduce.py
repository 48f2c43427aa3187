"""Does a finished bench reproduce? Its data rendered again in a fresh process, and some of its runs trained again.

A bench's results are a pure function of its config (docs/bench.md#reproducibility); tests/test_bench.py proves it
on a small bench. This script checks it on a full-size one at a fraction of its cost: it renders the bench's
synthetic set again into a scratch folder (a new process, a new folder) and compares the data's digest — the
annotation files and every clip's decoded-frame SHA-256 — with the one the committed results.json records; then it
trains the named (method, seed) runs again from the bench's feature cache into the scratch folder and compares
each run's best step, chosen inference setting, validation curve and test metrics with the committed ones, exactly.

    .venv/bin/python benchmarks/bench_reproduce.py benchmarks/results/bench_default.json \\
        --bench /work/bench-runs/default --scratch /tmp/repro --runs clip4clip:0,tv-proxynet:3 \\
        --out benchmarks/results/bench_reproduce.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.bench.runs import OUT_MARK, load_bench_config, prepare_data, run_one  # noqa: E402
from tvr.config import config_from_dict  # noqa: E402
from tvr.pipeline import resolve_config  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

COMPARED = ("best_step", "best_epoch", "inference_setting", "val_curve", "test")


def localised(values: object, bench: Path) -> object:
    """A run record's portable config with the bench folder written back in place of ``$OUT``."""
    if isinstance(values, dict):
        return {k: localised(v, bench) for k, v in values.items()}
    if isinstance(values, list):
        return [localised(v, bench) for v in values]
    if isinstance(values, str) and values.startswith(OUT_MARK):
        return str(bench) + values[len(OUT_MARK) :]
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the committed results.json of the bench")
    parser.add_argument("--bench", type=Path, required=True, help="the bench folder (its feature cache is reused)")
    parser.add_argument("--scratch", type=Path, required=True, help="an empty folder for the re-render and re-runs")
    parser.add_argument("--runs", default="clip4clip:0", help="METHOD:SEED,... to train again")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.scratch.exists() and any(args.scratch.iterdir()):
        raise SystemExit(f"{args.scratch}: expected an empty or new folder")
    results = json.loads(args.results.read_text())
    record: dict = {"command": "python benchmarks/bench_reproduce.py " + " ".join(sys.argv[1:]),
                    "bench_results_sha256": results["results_sha256"], "loadavg_start": os.getloadavg()}  # fmt: skip

    wall, cpu = time.perf_counter(), time.process_time()
    bench = load_bench_config(results["provenance"]["config_file"])
    data = prepare_data(bench, args.scratch, progress=False)
    record["data"] = {"digest": data["digest"], "committed_digest": results["data_digest"],
                      "equal": data["digest"] == results["data_digest"],
                      "wall_seconds": round(time.perf_counter() - wall, 1),
                      "cpu_seconds": round(time.process_time() - cpu, 1)}  # fmt: skip
    print(f"data: digest {'equal' if record['data']['equal'] else 'DIFFERENT'}", flush=True)

    record["runs"] = []
    committed = {(r["method"], r["seed"]): r for r in results["runs"]}
    for item in args.runs.split(","):
        method, _, seed = item.partition(":")
        run = committed[(method, int(seed))]
        cfg = resolve_config(config_from_dict(localised(run["config"], args.bench)))
        wall, cpu = time.perf_counter(), time.process_time()
        again = run_one(cfg, args.scratch / "runs" / method / f"seed{seed}")
        differing = [key for key in COMPARED if again[key] != run[key]]
        record["runs"].append({"method": method, "seed": int(seed), "equal": not differing, "differing": differing,
                               "test_t2v_R1": again["test"]["t2v"]["R1"],
                               "committed_test_t2v_R1": run["test"]["t2v"]["R1"],
                               "wall_seconds": round(time.perf_counter() - wall, 1),
                               "cpu_seconds": round(time.process_time() - cpu, 1)})  # fmt: skip
        print(f"{method} seed {seed}: {'equal' if not differing else 'DIFFERENT: ' + ', '.join(differing)}", flush=True)
    record["loadavg_end"] = os.getloadavg()
    atomic_write_json(args.out, record)


if __name__ == "__main__":
    main()
