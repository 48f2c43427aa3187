"""Cold ``tvr search`` from the shell: seconds from starting the command to its printed result, in fresh processes.

Each run starts ``tvr search INDEX QUERY --json`` as a new process (the page cache is warm after the first run: the
runs measure imports and loading, not the disk) and records its wall time, its CPU time (user + system, from the
child's rusage: less sensitive than wall time to other work on the machine) and what it printed on stderr. Three
ways of loading the model are timed side by side:

* ``numpy``: the query side written as numpy data by ``tvr index`` (tvr.search.numpy_query: no torch import) — the
  default for a two-tower index;
* ``export``: ``TVR_NUMPY_QUERIES=0``, the text side exported with TorchScript (tvr.search.query_encoder);
* ``full``: ``TVR_QUICK_QUERIES=0``, the whole model built as before (imports transformers, sentence-transformers,
  the image tower);
* and, as floors, ``python -c "import torch"`` and ``python -c pass``.

Then ``--queries FILE`` with every caption of the index's folder, answered by one process. The load average is
recorded before and after: on a busy machine wall times grow with it, CPU times much less.

    python benchmarks/search_cli.py                          # indexes ../shared/data/real-scenes-2 first
    python benchmarks/search_cli.py --index ~/videos.idx --runs 7

Writes benchmarks/results/search_cli.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.measure import index_to_measure  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "search_cli.json"
SHARED = Path(os.environ.get("TVR_SHARED_DATA", ROOT.parent / "shared" / "data"))
TVR = [sys.executable, "-m", "tvr.cli"]


def timed(command: list[str], env: dict[str, str]) -> dict:
    """Run ``command``; its wall seconds, CPU seconds (user + system of the child), stdout and stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "stdout": done.stdout, "stderr": done.stderr}


def summary(runs: list[dict]) -> dict:
    walls = sorted(r["wall_s"] for r in runs)
    cpus = sorted(r["cpu_s"] for r in runs)
    return {
        "wall_s_min": walls[0],
        "wall_s_median": walls[len(walls) // 2],
        "cpu_s_min": cpus[0],
        "cpu_s_median": cpus[len(cpus) // 2],
        "wall_s_all": [r["wall_s"] for r in runs],
        "cpu_s_all": [r["cpu_s"] for r in runs],
        "stderr_bytes_max": max(len(r.get("stderr", "")) for r in runs),
    }


def hits(answer: list[dict]) -> list[tuple]:
    return [(hit["video"], hit["start"], hit["end"], hit["rank"]) for hit in answer]


def captions_of(folder: Path) -> list[str]:
    with open(folder / "captions.csv", newline="", encoding="utf-8") as handle:
        return [row["caption"] for row in csv.DictReader(handle)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, help="an index (default: index --videos into a scratch folder)")
    parser.add_argument("--videos", type=Path, default=SHARED / "real-scenes-2", help="clips with a captions.csv")
    parser.add_argument("--query", default="a man dribbling a basketball")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    index, env = index_to_measure(args.index, args.videos, "tvr-search-cli-")
    scratch = Path(tempfile.mkdtemp(prefix="tvr-search-cli-queries-"))
    load_before = os.getloadavg()
    search = [*TVR, "search", str(index), args.query, "--json"]
    modes = {
        "numpy": (search, env),
        "export": (search, {**env, "TVR_NUMPY_QUERIES": "0"}),
        "full": (search, {**env, "TVR_QUICK_QUERIES": "0"}),
        "import_torch": ([sys.executable, "-c", "import torch"], env),
        "python": ([sys.executable, "-c", "pass"], env),
    }
    timed(search, env)  # the export is written after the index's first full load if tvr index did not write it
    runs: dict[str, list[dict]] = {name: [] for name in modes}
    for _ in range(args.runs):  # interleaved: drift in the machine's load hits every mode alike
        for name, (command, mode_env) in modes.items():
            runs[name].append(timed(command, mode_env))
    answers = {name: json.loads(runs[name][0]["stdout"]) for name in ("numpy", "export", "full")}
    queries = scratch / "queries.txt"
    texts = captions_of(args.videos) if (args.videos / "captions.csv").is_file() else [args.query]
    queries.write_text("\n".join(texts) + "\n", encoding="utf-8")
    many = timed([*TVR, "search", str(index), "--queries", str(queries)], env)
    lines = [json.loads(line) for line in many["stdout"].splitlines()]
    record = {
        "index": str(index),
        "query": args.query,
        "runs": args.runs,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "modes": {name: summary(r) for name, r in runs.items()},
        "same_hits_export_and_full": answers["export"] == answers["full"],
        "same_hits_numpy_and_full": hits(answers["numpy"]) == hits(answers["full"]),
        "largest_score_difference_numpy_and_full": max(
            abs(a["score"] - b["score"]) for a, b in zip(answers["numpy"], answers["full"], strict=True)
        ),
        "stderr_numpy_first_run": runs["numpy"][0]["stderr"],
        "queries_file": {
            "queries": len(texts),
            "answered": sum("hits" in line for line in lines),
            "wall_s": many["wall_s"],
            "cpu_s": many["cpu_s"],
            "stderr_bytes": len(many["stderr"]),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "stderr_numpy_first_run"}, indent=2))


if __name__ == "__main__":
    main()
