"""benchmarks/gpu_proof.py on the CPU (``--cpu-smoke``): the one-device path runs every part and records the
distributed part as not run instead of failing; a failing part is recorded in the JSON, which is written anyway;
the scoring roofline stays below every measured time. (The two-device path, two gloo ranks under torchrun, is the
script's default smoke run: docs/scaling.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_proof.py"


def _smoke(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu_proof.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out), *args], capture_output=True, text=True
    )
    assert out.is_file(), run.stdout[-2000:] + run.stderr[-2000:]
    return run, json.loads(out.read_text())


def test_the_one_device_path_runs_every_part(tmp_path: Path) -> None:
    run, record = _smoke(
        tmp_path, "--devices", "1", "--presets", "gare/msrvtt", "--amp-dtypes", "fp16", "--texts", "16", "--videos", "8"
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert record["failures"] == []
    env = record["environment"]
    assert {"torch", "cuda", "device_count", "devices", "devices_used"} <= set(env) and env["devices_used"] == 1
    (step,) = record["parts"]["steps"]["rows"]
    assert step["loss_finite"] and step["grad_scaler"] and step["autocast_dtype"] == "float16"
    # fp16: the scaler skips while it finds its scale, then the measured step is not skipped
    assert step["skipped_steps"] == sum(s["skipped"] for s in step["steps"]) and not step["steps"][-1]["skipped"]
    assert "needs two or more devices" in record["parts"]["distributed"]["not_run"]
    scoring = record["parts"]["scoring"]
    assert scoring["peaks"]["flops_per_second"] > 0
    assert {row["head"] for row in scoring["rows"]} == {"clip4clip", "gare", "proxy", "gravialign"}
    for row in scoring["rows"]:
        # a lower bound: the minimal work at the peak rate never takes longer than the scorer did
        assert row["bound_holds"] and 0 < row["efficiency"] <= 1 and row["roofline_seconds"] <= row["seconds"], row


def test_a_failing_part_is_recorded_and_the_json_written(tmp_path: Path) -> None:
    run, record = _smoke(
        tmp_path, "--devices", "1", "--parts", "steps,no_such_part", "--presets", "nope/none", "--amp-dtypes", "bf16"
    )
    assert run.returncode == 1
    (row,) = record["parts"]["steps"]["rows"]
    assert row["preset"] == "nope/none" and "no shipped preset of that name" in row["error"]
    assert "unknown part(s) ['no_such_part']" in record["parts"]["arguments"]["error"]
    assert any(f.startswith("steps: nope/none") for f in record["failures"])
