"""How long a first try takes: the synthetic set the CPU presets' comments give (``tvr synth --out synth
--num-videos 240``), then ``tvr train --config cpu/<method>`` for each of the four methods, exactly as a user types
them (each a fresh ``tvr`` process in the data's parent folder), with the test table each run ends on.

Each command's wall time, CPU time (user + system, of the command and its decoding worker) and the load average
before and after are recorded: on a shared machine wall time says more about the neighbours than about tvr, so
compare CPU times, or re-run on a quiet machine.

    .venv/bin/python benchmarks/cpu_presets.py          # writes benchmarks/results/cpu_presets.json
    .venv/bin/python benchmarks/cpu_presets.py --methods gare --work /tmp/first   # one method, a kept folder
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.utils.io import atomic_write_json  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "cpu_presets.json"
METHODS = ["clip4clip", "gare", "proxy", "gravialign"]
TVR = [sys.executable, "-m", "tvr"]


def timed(command: list[str], cwd: Path) -> dict:
    """Run ``command`` in ``cwd``; its wall and CPU seconds (children's rusage: the command and what it started)
    and the load average around it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "command": " ".join(["tvr", *command[len(TVR) :]]),
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: " + ", ".join(METHODS))
    parser.add_argument("--work", type=Path, default=None, help="folder for the data and runs (default: temporary)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    with tempfile.TemporaryDirectory(prefix="tvr-cpu-presets-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        record = {
            "machine": {"platform": platform.platform(), "cpus": len(os.sched_getaffinity(0))},
            "synth": timed([*TVR, "synth", "--out", "synth", "--num-videos", "240"], work),
            "runs": {},
        }
        print(json.dumps(record["synth"]), flush=True)
        for method in methods:
            run = work / "runs" / f"cpu-{method}"
            entry = timed([*TVR, "train", "--config", f"cpu/{method}", "--out", str(run.relative_to(work))], work)
            for tag in ("last", "best"):
                metrics = json.loads((run / f"test_{tag}" / "metrics.json").read_text())
                entry[f"test_{tag}"] = {d: {k: round(v, 1) for k, v in metrics[d].items()} for d in ("t2v", "v2t")}
            entry["steps"] = json.loads((run / "summary.json").read_text()).get("steps")
            record["runs"][method] = entry
            print(json.dumps({method: entry}), flush=True)
    atomic_write_json(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
