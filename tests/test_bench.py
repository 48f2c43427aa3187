"""tvr bench: interval arithmetic against a hand computation, seed determinism, selection on validation only
(a bench whose test split differs chooses exactly the same), and a killed bench resuming with its finished runs
kept and its numbers equal to an uninterrupted bench's."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from tvr.eval.bench_report import differences_table, results_table
from tvr.eval.stats import paired_difference, t_interval, t_quantile
from tvr.pipeline.bench import (
    BENCH_PRESET_DIR,
    BenchConfigError,
    load_bench_config,
    method_config,
    prepare_data,
    prepare_features,
    run_bench,
    run_one,
)

QUICK = BENCH_PRESET_DIR / "quick.yaml"

# --------------------------------------------------------------------------------------------- statistics


def test_t_interval_matches_a_hand_computation() -> None:
    # [10, 12, 14]: mean 12, s^2 = (4 + 0 + 4) / 2 = 4, s = 2; Student t table, 2 dof, 97.5 %: 4.303
    interval = t_interval([10.0, 12.0, 14.0])
    assert interval.mean == 12.0 and interval.sd == 2.0 and interval.n == 3
    assert interval.half_width == pytest.approx(4.303 * 2.0 / math.sqrt(3), rel=1e-4)
    assert (interval.low, interval.high) == pytest.approx((12.0 - 4.9683, 12.0 + 4.9683), abs=1e-3)
    # five seeds, 4 dof: t = 2.776; s^2 = (4 + 1 + 0 + 1 + 4) / 4 = 2.5
    five = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert five.half_width == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5), rel=2e-4)
    assert t_quantile(0.95, 1) == pytest.approx(12.706, rel=1e-4)
    assert t_quantile(0.90, 10) == pytest.approx(1.812, rel=1e-3)
    one = t_interval([7.0])
    assert one.mean == 7.0 and math.isnan(one.half_width) and not one.excludes_zero()


def test_paired_difference_is_the_interval_of_per_seed_differences() -> None:
    method, baseline = [20.0, 24.0, 28.0], [18.0, 21.0, 24.0]  # differences 2, 3, 4: mean 3, s = 1
    diff = paired_difference(method, baseline)
    assert diff.mean == 3.0 and diff.sd == 1.0
    assert diff.half_width == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert diff.excludes_zero() and diff.low == pytest.approx(3.0 - 2.4842, abs=1e-3)
    # the unpaired intervals overlap although every seed improves: pairing is what removes the shared variation
    assert t_interval(method).low < t_interval(baseline).high
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([1.0, 2.0], [1.0, 2.0, 3.0])


def test_tables_show_mean_plus_minus_half_width_and_bold_exclusions() -> None:
    cell = lambda values: t_interval(values).to_dict()  # noqa: E731
    metrics = ("R1", "R5", "R10", "MdR", "MnR")
    results = {
        "baseline": "base",
        "summary": {
            "base": {d: {m: cell([10.0, 12.0, 14.0]) for m in metrics} for d in ("t2v", "v2t")},
            "new": {d: {m: cell([20.0, 22.0, 27.0]) for m in metrics} for d in ("t2v", "v2t")},
        },
        "differences": {
            "new": {"t2v": {m: paired_difference([20.0, 24.0, 28.0], [18.0, 21.0, 24.0]).to_dict() for m in metrics},
                    "v2t": {m: paired_difference([20.0, 22.0, 27.0], [18.0, 21.0, 24.0]).to_dict() for m in metrics}}
        },
    }  # fmt: skip
    table = results_table(results)
    # base: s = 2, 4.303 * 2 / sqrt(3) = 4.97; new: s^2 = (9 + 1 + 16) / 2, 4.303 * 3.606 / sqrt(3) = 8.96
    assert "| base (baseline) | 12.0 ± 5.0 |" in table and "| new | 23.0 ± 9.0 |" in table
    differences = differences_table(results)
    assert "| **+3.0 [+0.5, +5.5]** |" in differences  # differences 2, 3, 4: the interval excludes 0
    assert "| +2.0 [-0.5, +4.5] |" in differences  # differences 2, 1, 3: low = -0.48, it includes 0


# --------------------------------------------------------------------------------------------- configs


def _write_bench(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load(QUICK.read_text())
    if "methods" in changes:
        raw.pop("baseline")  # the first method then
    raw.update(changes)
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_shipped_bench_configs_load() -> None:
    for path in sorted(BENCH_PRESET_DIR.glob("*.yaml")):
        bench = load_bench_config(path.stem)
        assert len(bench.seeds) >= 3 and bench.baseline in [m.name for m in bench.methods]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seeds": 2}, "at least 3 distinct seeds"),
        ({"seeds": [1, 1, 2]}, "at least 3 distinct seeds"),
        ({"baseline": "nope"}, "baseline: 'nope' is not one of the methods"),
        ({"epoch": 3}, r"unknown key\(s\) \['epoch'\]"),
        ({"methods": [{"name": "x", "head": {"name": "gare", "options": {"no_such_option": 1}}}]}, "no_such_option"),
        ({"methods": [{"name": "x"}]}, "head .* or a preset"),
        ({"synth": {"num_videos": 10, "colour_count": 3}}, "synth: unknown key"),
        ({"synth": {"num_videos": 10, "size": "big"}}, r"synth: '>=' not supported"),
        ({"synth": None, "data": {"dataset": "generic"}}, "data: expected .* at least annotations"),
    ],
)
def test_bench_config_mistakes_are_named(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(BenchConfigError, match=message):
        load_bench_config(_write_bench(tmp_path, **change))


def test_cli_reports_a_bad_bench_config_in_one_line(tmp_path: Path) -> None:
    from tvr.cli import app

    result = CliRunner().invoke(app, ["bench", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "no shipped bench config" in result.output


# --------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def quick_cache(tmp_path_factory: pytest.TempPathFactory):
    """The quick bench's data and feature cache, built once for the run-level tests."""
    out = tmp_path_factory.mktemp("bench")
    bench = load_bench_config(QUICK)
    prepare_data(bench, out, progress=False)
    method = next(m for m in bench.methods if m.name == "gravialign")
    cache = prepare_features(method_config(bench, method, 42, out), out, progress=False)
    return bench, method, out, cache


def test_same_seed_same_numbers(quick_cache, tmp_path: Path) -> None:
    bench, method, out, cache = quick_cache
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        cfg = method_config(bench, method, seed, out, str(cache))
        runs[name] = (run_one(cfg, tmp_path / name), torch.load(tmp_path / name / "best.pt", weights_only=True))
    (a, wa), (b, wb), (_, wc) = runs["a"], runs["b"], runs["c"]
    assert (
        a["test"] == b["test"] and a["val_curve"] == b["val_curve"] and a["inference_setting"] == b["inference_setting"]
    )
    assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])
    assert any(not torch.equal(wa["model"][k], wc["model"][k]) for k in wa["model"])


def test_test_split_never_influences_selection(quick_cache, tmp_path: Path) -> None:
    """Two data sets that differ only in the test split's captions: every choice made on validation (checkpoint,
    inference setting, validation curve) is identical, while the test metrics differ."""
    bench, method, out, _ = quick_cache
    original = out / "data"
    altered = tmp_path / "altered"
    shutil.copytree(original, altered, ignore=shutil.ignore_patterns("videos"))
    (altered / "videos").symlink_to(original / "videos")
    data = json.loads((altered / "MSRVTT_data.json").read_text())
    test_ids = sorted({v["video_id"] for v in data["videos"] if v["split"] == "test"})
    rotate = dict(zip(test_ids, test_ids[1:] + test_ids[:1], strict=True))
    for sentence in data["sentences"]:  # every test caption now belongs to another test video
        sentence["video_id"] = rotate.get(sentence["video_id"], sentence["video_id"])
    (altered / "MSRVTT_data.json").write_text(json.dumps(data))
    lines = (altered / "MSRVTT_JSFUSION_test.csv").read_text().splitlines()
    header, rows = lines[0], [row.split(",") for row in lines[1:]]
    for row in rows:
        row[2] = rotate[row[2]]
    (altered / "MSRVTT_JSFUSION_test.csv").write_text("\n".join([header, *(",".join(r) for r in rows)]) + "\n")

    results = {}
    for name, folder in (("original", original), ("altered", altered)):
        cfg = method_config(bench, method, 7, tmp_path / name)
        cfg.data.annotations, cfg.data.video_dir = str(folder), str(folder / "videos")
        cache = prepare_features(cfg, tmp_path / name, progress=False)
        cfg.data.features_dir = str(cache)
        results[name] = run_one(cfg, tmp_path / name / "run")
    a, b = results["original"], results["altered"]
    assert a["inference_setting"] is not None  # GraviAlign chose a mode on validation
    for key in ("best_step", "best_epoch", "best_value", "inference_setting", "val_curve"):
        assert a[key] == b[key], key
    assert a["test"] != b["test"]
    # the test split was evaluated once, with the validation-selected checkpoint only
    run = tmp_path / "original" / "run"
    assert (run / "test_best" / "metrics.json").is_file() and not (run / "test_last").exists()


# --------------------------------------------------------------------------------------------- resume


def _comparable(results: dict) -> list[tuple]:
    return [(r["method"], r["seed"], r["best_step"], json.dumps(r["test"], sort_keys=True),
             json.dumps(r["val_curve"], sort_keys=True)) for r in results["runs"]]  # fmt: skip


def test_killed_bench_resumes_with_finished_runs_kept(tmp_path: Path) -> None:
    config = _write_bench(tmp_path, epochs=6)
    out = tmp_path / "killed"
    env = {**os.environ, "TVR_DEBUG": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tvr.cli", "bench", "--config", str(config), "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    finished: dict[Path, tuple[bytes, int]] = {}
    interrupted: set[Path] = set()
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            results = sorted(out.glob("runs/*/seed*/result.json"))
            started = [p for p in out.glob("runs/*/seed*/last.pt") if not (p.parent / "result.json").exists()]
            if results and started:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                finished = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("runs/*/seed*/result.json")}
                interrupted = {
                    p.parent for p in out.glob("runs/*/seed*/last.pt") if not (p.parent / "result.json").exists()
                }
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert finished and not (out / "results.json").exists()

    # resumed as a user would: the same command again (a fresh process, like the uninterrupted reference below)
    subprocess.run([sys.executable, "-m", "tvr.cli", "bench", "--config", str(config), "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)  # fmt: skip
    resumed = json.loads((out / "results.json").read_text())
    for path, (content, mtime) in finished.items():
        assert path.read_bytes() == content and path.stat().st_mtime_ns == mtime, f"{path} was run again"
    for run in resumed["runs"]:  # the run the kill interrupted continued from its last.pt
        if out / "runs" / run["method"] / f"seed{run['seed']}" in interrupted:
            assert run["resumed"], "the interrupted run started over instead of resuming"
    # the reference trains on the very clips the killed bench rendered: libx264 does not always encode a clip to the
    # same bytes (docs/bench.md#reproducibility), and on 12 test videos one pixel level can flip a tie
    shutil.copytree(out / "data", tmp_path / "uninterrupted" / "data")
    subprocess.run([sys.executable, "-m", "tvr.cli", "bench", "--config", str(config), "--out",
                    str(tmp_path / "uninterrupted")], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)  # fmt: skip
    reference = json.loads((tmp_path / "uninterrupted" / "results.json").read_text())
    assert _comparable(resumed) == _comparable(reference)
    assert resumed["summary"] == reference["summary"] and resumed["differences"] == reference["differences"]
    for name in ("results.json", "results.md", "val_r1.png", "test_r1.png"):
        assert (out / name).is_file()
    assert (out / "val_r1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recorded = json.loads((out / "results.json").read_text())
    assert recorded["seeds"] == [0, 1, 2] and recorded["packages"]["torch"] == torch.__version__
    assert recorded["dials"]["clip_length"]["frames"] == 8 and len(recorded["runs"]) == 6


def test_transfer_sets_are_evaluated_zero_shot_or_skipped(tmp_path: Path, shared_data: Path) -> None:
    scenes = shared_data / "real-scenes"
    if not (scenes / "captions.csv").is_file():
        pytest.skip(f"{scenes} not found")
    transfer = [
        {"name": "real-scenes", "split": "train",
         "data": {"dataset": "generic", "annotations": str(scenes), "video_dir": str(scenes),
                  "generic_file": "captions.csv", "video_pattern": "{video_id}", "val_fraction": 0.0}},
        {"name": "absent", "data": {"dataset": "generic", "annotations": str(tmp_path / "nowhere")}},
    ]  # fmt: skip
    methods = [{"name": "clip4clip", "head": {"name": "clip4clip", "logit_scale_init": 2.6592}}]
    config = _write_bench(tmp_path, epochs=1, methods=methods, transfer=transfer)
    results = run_bench(load_bench_config(config), tmp_path / "out", progress=False)
    assert results["transfer"]["absent"] == {"skipped": f"annotation folder {tmp_path / 'nowhere'} not found"}
    scenes_report = results["transfer"]["real-scenes"]
    runs = scenes_report["runs"]["clip4clip"]
    assert [r["seed"] for r in runs] == [0, 1, 2]
    assert all(r["info"]["num_videos"] == 19 and r["info"]["num_texts"] == 19 for r in runs)
    recall = [r["t2v"]["R1"] for r in runs]
    assert scenes_report["summary"]["clip4clip"]["t2v"]["R1"]["mean"] == pytest.approx(sum(recall) / 3)
    for seed in (0, 1, 2):
        assert (tmp_path / "out" / "runs" / "clip4clip" / f"seed{seed}" / "transfer_real-scenes.json").is_file()
    report = (tmp_path / "out" / "results.md").read_text()
    assert "### Zero-shot transfer: real-scenes" in report and "Skipped: annotation folder" in report
