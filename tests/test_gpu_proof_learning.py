"""benchmarks/gpu_proof.py's learning and agreement parts on the CPU (``--cpu-smoke``): a model of one preset learns
one fixed batch within the steps the GPU run takes (the loss falls below 0.9 × its start), and every scorer's scores
are compared per dtype against the CPU reference with the stated tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_proof.py"


def test_learning_and_agreement_parts_run_and_are_judged(tmp_path: Path) -> None:
    out = tmp_path / "gpu_proof.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--devices", "1", "--parts", "learning,agreement",
         "--learning-presets", "gare/msrvtt", "--learning-steps", "10", "--amp-dtypes", "bf16",
         "--agreement-size", "8", "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.is_file(), run.stdout[-2000:] + run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert run.returncode == 0 and record["failures"] == [], record["failures"]
    (row,) = record["parts"]["learning"]["rows"]
    assert row["head"] == "gare" and row["lr"] == 1e-4 and len(row["losses"]) == 10
    assert row["learned"] and row["last_mean"] < 0.9 * row["first_mean"]
    rows = record["parts"]["agreement"]["rows"]
    assert {r["head"] for r in rows} == {"clip4clip", "gare", "proxy", "gravialign"}
    for r in rows:
        assert set(r["dtypes"]) == {"float32", "tf32"}
        assert all(
            c["within_tolerance"] and c["max_relative_difference"] <= c["tolerance"] for c in r["dtypes"].values()
        )
    # a loss that does not fall is a failure of the record
    sys.path.insert(0, str(SCRIPT.parent))
    from gpu_proof import failures_of

    flat = {"parts": {"learning": {"rows": [{**row, "learned": False}]}}}
    assert any("did not fall" in line for line in failures_of(flat))
