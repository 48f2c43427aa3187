"""What the scoring benchmarks share: memory readings inside a worker process, running one worker per timed call
(so each call's peak RSS is its own), and the summary of repeated runs (the minimum time is kept)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rss_mib() -> float:
    """Resident memory of this process now."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def run_worker_process(script: str | Path, arguments: list[str]) -> dict:
    """Run ``script`` with ``arguments`` in a fresh interpreter; its last stdout line is the JSON record it returns."""
    res = subprocess.run(
        [sys.executable, str(script), *arguments], check=True, capture_output=True, text=True, cwd=REPO
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def report_worker_call(method: str, seconds: float, rss_before: float, peak: float) -> None:
    """Print a worker's record for :func:`run_worker_process` (its last stdout line): the timed call's seconds,
    the peak RSS read right after it (``peak``), the RSS before the call and the increase, torch's thread count."""
    import torch

    record = {
        "method": method,
        "seconds": seconds,
        "peak_rss_mib": round(peak, 1),
        "rss_before_call_mib": round(rss_before, 1),
        "rss_increase_mib": round(peak - rss_before, 1),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(record))


def summarize_runs(runs: list[dict], digits: int = 4) -> dict:
    """Min and all of the records' ``seconds``, the largest peak RSS and RSS increase, and the fastest run's
    ``threads`` when the records carry it."""
    best = min(runs, key=lambda r: r["seconds"])
    summary = {
        "seconds_min": round(best["seconds"], digits),
        "seconds_all": [round(r["seconds"], digits) for r in runs],
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "rss_increase_mib_max": max(r["rss_increase_mib"] for r in runs),
    }
    if "threads" in best:
        summary["threads"] = best["threads"]
    return summary


def index_to_measure(index: Path | None, videos: Path, prefix: str) -> tuple[Path, dict[str, str]]:
    """The search index a benchmark runs against (``index``, or ``tvr index`` of ``videos`` with the default encoder
    into a scratch folder) and the environment its commands run in (``TVR_CACHE_DIR``: the caller's, else one in the
    scratch folder, where ``tvr index`` leaves the exported query encoder)."""
    import os
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    env = {**os.environ, "TVR_CACHE_DIR": os.environ.get("TVR_CACHE_DIR", str(scratch / "cache"))}
    if index is None:
        index = scratch / "idx"
        command = [sys.executable, "-m", "tvr.cli", "index", str(videos), "--out", str(index)]
        subprocess.run(command, check=True, env=env, cwd=REPO)
    return index, env
