"""The exact rerank of one query, alone: gather the stored GARE state of 100 shortlisted windows and score them, as
``tvr.search.index.exact_scores`` does, over a 100k-window float16 state (``benchmarks/search.py``'s synthetic
windows and ψ, without its 1M shortlist graph: the rows are 100 random windows a query, the part of issue 35 item 7's
latency that is not the shortlist).

With ``--against DIR`` (a checkout of another commit, e.g. ``git worktree add /tmp/base 0f0eab1``) the runs alternate
between that checkout's ``tvr`` and this one's, each in a fresh process on the same state files and rows, so the two
codes meet the same machine (this machine's speed drifts by tens of per cent between hours).

    .venv/bin/python benchmarks/rerank_latency.py --against /tmp/base --runs 3

Writes benchmarks/results/rerank_latency.json: per run, gather / score / total p50 and p95 (ms) over the queries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "rerank_latency.json"
WINDOWS = 100_000
FRAMES, DIM, SHARD = 12, 512, 5000
#: the marker a finished state folder holds
DONE = "done"


def _workload():
    """The scale benchmark's module, its synthetic windows and the GARE head (ψ scaled as benchmarks/search.py
    scales it)."""
    import numpy as np
    import torch

    sys.path.insert(1, str(HERE))
    import search as bench  # benchmarks/search.py: the scale benchmark's synthetic data and helpers

    from tvr.config import HeadConfig
    from tvr.models.heads.base import LN_100
    from tvr.models.heads.registry import build_head

    synth = bench.Synthetic(DIM)
    gallery = np.concatenate([synth.windows(a, a + bench.CHUNK).numpy() for a in range(0, WINDOWS, bench.CHUNK)])
    torch.manual_seed(0)
    head = build_head(HeadConfig(name="gare"), DIM, LN_100).eval()
    bench.scale_psi(head, synth, gallery, FRAMES, 0.1)
    return bench, synth, gallery, head


def build(state: Path) -> None:
    """The float16 rerank state of the first :data:`WINDOWS` windows, written to ``state`` (a half-built one is
    replaced)."""
    sys.path.insert(0, str(ROOT))
    bench, _, gallery, head = _workload()
    shutil.rmtree(state, ignore_errors=True)
    bench.build_state(head, gallery, WINDOWS, FRAMES, state, True, "gare", SHARD)
    (state / DONE).write_text("built\n")


def child(root: Path, state: Path, passes: int) -> dict:
    """One run in this process on the ``tvr`` of ``root``: an untimed pass over the queries, then ``passes`` timed
    ones."""
    sys.path.insert(0, str(root))
    import numpy as np
    import torch

    import tvr
    from tvr.search.store import ShardReader

    torch.set_num_threads(1)  # as a search runs a query (tvr.search.encoders.one_torch_thread)
    bench, synth, _, head = _workload()
    readers = [ShardReader(state / name) for name in sorted(os.listdir(state)) if name != DONE]
    probe = bench.VideoFeatures(torch.randn(1, FRAMES, DIM), torch.ones(1, FRAMES))
    cls = type(head.rerank_state(head.encode_videos(probe)))
    rng = np.random.default_rng(0)
    queries = synth.queries(torch.from_numpy(rng.choice(WINDOWS, 200, replace=False))).numpy()
    rows = [rng.choice(1_000_000, 100, replace=False) for _ in queries]  # a 1M index's rows, stored modulo 100k
    lookup = bench.state_lookup(WINDOWS, SHARD)
    timed: dict[str, list[float]] = {"gather": [], "score": [], "total": []}
    with torch.inference_mode():
        for number in range(passes + 1):
            for q, r in zip(queries, rows, strict=True):
                gather_ms, score_ms, _ = bench.rerank_once(head, readers, cls, lookup, q, r)
                if number:
                    timed["gather"].append(gather_ms)
                    timed["score"].append(score_ms)
                    timed["total"].append(gather_ms + score_ms)
    return {
        "tvr": str(Path(tvr.__file__).resolve().parents[1]),
        **{
            f"{k}_{p}_ms": round(float(np.percentile(v, q)), 3)
            for k, v in timed.items()
            for p, q in (("p50", 50), ("p95", 95))
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, default=None, help="another checkout whose tvr runs in alternation")
    parser.add_argument("--runs", type=int, default=3, help="runs of each checkout")
    parser.add_argument("--passes", type=int, default=2, help="timed passes over the 200 queries in a run")
    parser.add_argument("--state", type=Path, default=Path("/tmp/tvr-rerank-latency-state"), help="state folder")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.state, args.passes)), flush=True)
        return
    if not (args.state / DONE).is_file():
        build(args.state)
    roots = [ROOT] + ([args.against.resolve()] if args.against else [])
    record: dict = {
        "command": "python benchmarks/rerank_latency.py " + " ".join(sys.argv[1:]),
        "windows": WINDOWS,
        "rows_per_query": 100,
        "queries": 200,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "runs": [],
    }
    for run in range(args.runs):
        for root in roots if run % 2 == 0 else roots[::-1]:
            started = time.perf_counter()
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(root),
                    "--state",
                    str(args.state),
                    "--passes",
                    str(args.passes),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            result = {"run": run, "root": str(root), **json.loads(out.stdout.strip().splitlines()[-1])}
            result["seconds"] = round(time.perf_counter() - started, 1)
            record["runs"].append(result)
            print(json.dumps(result), flush=True)
    record["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    record["median_of_runs"] = {
        str(root): {
            key: sorted(r[key] for r in record["runs"] if r["root"] == str(root))[args.runs // 2]
            for key in ("gather_p50_ms", "score_p50_ms", "total_p50_ms", "total_p95_ms")
        }
        for root in roots
    }
    sys.path.insert(0, str(ROOT))
    from tvr.utils.io import atomic_write_json

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, record)
    print(json.dumps(record["median_of_runs"], indent=2))


if __name__ == "__main__":
    main()
