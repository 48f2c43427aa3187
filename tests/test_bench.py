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

from tvr.bench.report import differences_table, holm_table, p_text, results_table
from tvr.bench.runs import (
    BENCH_PRESET_DIR,
    BenchConfigError,
    load_bench_config,
    method_config,
    prepare_data,
    prepare_features,
    results_digest,
    run_bench,
    run_one,
    summarize,
)
from tvr.bench.stats import (
    holm,
    minimum_detectable_difference,
    paired_difference,
    paired_t_test,
    slope,
    slope_test,
    t_interval,
    t_quantile,
    t_test_p,
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


def test_tables_show_mean_plus_minus_half_width_and_bold_only_what_survives_holm() -> None:
    cell = lambda values: t_interval(values).to_dict()  # noqa: E731
    metrics = ("R1", "R5", "R10", "MdR", "MnR")
    base = [10.0, 12.0, 14.0, 11.0, 13.0]
    run = lambda value: {"test": {d: dict.fromkeys(metrics, value) for d in ("t2v", "v2t")}}  # noqa: E731
    runs = {"base": [{"seed": k, **run(v)} for k, v in enumerate(base)],
            "new": [{"seed": k, **run(v)} for k, v in enumerate([20.0, 22.0, 24.0, 21.0, 23.0])],
            "near": [{"seed": k, **run(v)} for k, v in enumerate([11.0, 12.0, 16.0, 12.0, 13.5])]}  # fmt: skip
    summary, differences = summarize(runs, "base")
    results = {"baseline": "base", "summary": summary, "differences": differences}
    table = results_table(results)
    # base: s^2 = (4 + 0 + 4 + 1 + 1) / 4 = 2.5, 2.776 * sqrt(2.5) / sqrt(5) = 1.96
    assert "| base (baseline) | 12.0 ± 2.0 |" in table and "| new | 22.0 ± 2.0 |" in table
    assert summary["base"]["t2v"]["R1"] == cell(base)
    shown = differences_table(results)
    # new − base = 10 at every seed: p = 0 for every one of the 20 cells, so every cell survives Holm
    assert shown.count("**+10.0 [+10.0, +10.0]**") == 10
    # near − base: differences 1, 0, 2, 1, 0.5: mean 0.9, s = 0.742, t = 2.711, two-sided p (4 dof) = 0.0535:
    # its interval [−0.02, +1.82] includes 0 and Holm only raises p, so it is not bold
    near = differences["near"]["t2v"]["R1"]
    assert near["p"] == pytest.approx(0.0535, abs=2e-4) and near["p_holm"] >= near["p"]
    assert "| near | +0.9 [-0.0, +1.8] |" in shown and "**+0.9" not in shown
    assert "0.054" not in holm_table(results) and p_text(near["p_holm"]) in holm_table(results)


def test_holm_p_values_and_detectable_difference_match_a_hand_computation() -> None:
    # Holm, m = 4: sorted 0.005, 0.01, 0.03, 0.04 -> 4 * 0.005, 3 * 0.01, max(0.06, 2 * 0.03), max(0.06, 1 * 0.04)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = holm([0.2, math.nan, 0.9])  # a cell without a test stays without one and does not count in m
    assert adjusted[0] == pytest.approx(0.4) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.9)
    # paired t test of differences 2, 3, 4: t = 3 / (1 / sqrt 3) = 5.196 with 2 dof, where the t CDF is closed-form:
    # p = 1 − t / sqrt(2 + t^2)
    t = 3.0 * math.sqrt(3.0)
    assert paired_t_test([20.0, 24.0, 28.0], [18.0, 21.0, 24.0]) == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert t_test_p([1.0, 1.0, 1.0]) == 0.0 and t_test_p([0.0, 0.0, 0.0]) == 1.0
    assert t_test_p([3.0, 4.0, 5.0], "greater") == pytest.approx((1 - 4 * math.sqrt(3) / math.sqrt(2 + 48)) / 2)
    # MDE at 95 % confidence and 80 % power, 5 seeds: (t(0.975, 4) + t(0.80, 4)) * s / sqrt(5), from a t table:
    # 2.776 + 0.941
    assert minimum_detectable_difference(2.0, 5) == pytest.approx((2.776 + 0.941) * 2.0 / math.sqrt(5), rel=2e-4)
    # 10 seeds: 2.262 + 0.883
    assert minimum_detectable_difference(1.0, 10) == pytest.approx((2.262 + 0.883) / math.sqrt(10), rel=2e-4)
    assert math.isnan(minimum_detectable_difference(1.0, 1))


def test_slope_test_matches_a_hand_computation() -> None:
    xs = [0.0, 0.5, 1.0]
    # slopes: seed 0 (0, 1, 2) -> 2; seed 1 (1, 1, 3) -> 2; seed 2 (0, 2, 2) -> 2; seed 3 (2, 2, 6) -> 4
    trend = slope_test(xs, [[0, 1, 2], [1, 1, 3], [0, 2, 2], [2, 2, 6]])
    assert trend["slopes"] == pytest.approx([2.0, 2.0, 2.0, 4.0])
    assert trend["mean"] == pytest.approx(2.5) and trend["sd"] == pytest.approx(1.0)
    # t = 2.5 / (1 / 2) = 5 with 3 dof; one-sided p from a t table lies between 0.005 (t = 5.841) and 0.01 (4.541)
    assert 0.005 < trend["p_greater"] < 0.01
    with pytest.raises(ValueError, match="two distinct x"):
        slope([1.0, 1.0], [0.0, 1.0])


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
        # names that become folder names (runs/<method>/, transfer/<name>/) are plain names: never a way out
        ({"methods": [{"name": "..", "head": {"name": "clip4clip"}}]}, r"methods\[0\]\.name '\.\.': expected a plain"),
        ({"methods": [{"name": "a\\b", "head": {"name": "clip4clip"}}]}, r"name 'a\\\\b': expected a plain name"),
        ({"transfer": [{"name": "../../x", "data": {}}]}, r"transfer\[0\]\.name '\.\./\.\./x': expected a plain"),
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


def _bench_cli(config: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tvr.cli", "bench", "--config", str(config), "--out", str(out), *extra]


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 240) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_killed_bench_resumes_with_finished_runs_kept_and_ends_as_a_fresh_one(tmp_path: Path) -> None:
    """A bench running two runs at a time, killed with SIGKILL while some runs are finished and others under way:
    its workers die with it, the same command resumes it (finished runs untouched, interrupted ones continued from
    their last.pt), and its results.json equals that of a bench that was never interrupted, run in another folder
    from scratch (data included) — up to the provenance, which says how it went."""
    config = _write_bench(tmp_path, epochs=6)
    out = tmp_path / "killed"
    env = {**os.environ, "TVR_DEBUG": "1"}
    proc = subprocess.Popen(_bench_cli(config, out, "--jobs", "2"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)  # fmt: skip

    def some_finished_some_started() -> bool:
        started = [p for p in out.glob("runs/*/seed*/last.pt") if not (p.parent / "result.json").exists()]
        return bool(list(out.glob("runs/*/seed*/result.json"))) and bool(started)

    _kill_when(proc, some_finished_some_started)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    finished = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("runs/*/seed*/result.json")}
    interrupted = {p.parent for p in out.glob("runs/*/seed*/last.pt") if not (p.parent / "result.json").exists()}
    assert finished and not (out / "results.json").exists()
    time.sleep(1.0)  # a worker the kill left alive would write on: the kernel kills them with their parent
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("runs/*/seed*/result.json")} == finished

    # resumed as a user would: the same command again (one run at a time now: the results do not depend on it)
    subprocess.run(_bench_cli(config, out), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)  # fmt: skip
    resumed = json.loads((out / "results.json").read_text())
    for path, (content, mtime) in finished.items():
        assert path.read_bytes() == content and path.stat().st_mtime_ns == mtime, f"{path} was run again"
    for run in resumed["runs"]:  # the run the kill interrupted continued from its last.pt
        if out / "runs" / run["method"] / f"seed{run['seed']}" in interrupted:
            assert run["provenance"]["resumed"], "the interrupted run started over instead of resuming"
    subprocess.run(_bench_cli(config, tmp_path / "fresh"), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300)  # fmt: skip
    fresh = json.loads((tmp_path / "fresh" / "results.json").read_text())
    assert resumed["results_sha256"] == fresh["results_sha256"] == results_digest(resumed)
    assert [{k: v for k, v in r.items() if k != "provenance"} for r in resumed["runs"]] == [
        {k: v for k, v in r.items() if k != "provenance"} for r in fresh["runs"]
    ]
    assert resumed["summary"] == fresh["summary"] and resumed["differences"] == fresh["differences"]
    for name in ("results.json", "results.md", "val_r1.png", "test_r1.png"):
        assert (out / name).is_file()
    assert (out / "val_r1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    provenance = resumed["provenance"]
    assert resumed["seeds"] == [0, 1, 2] and provenance["packages"]["torch"] == torch.__version__
    assert provenance["timings"]["this_session"]["cpu_seconds"] > 0 and "loadavg_start" in provenance["timings"][
        "this_session"]  # fmt: skip
    assert resumed["dials"]["clip_length"]["frames"] == 8 and len(resumed["runs"]) == 6
    assert not list(out.rglob("*.tvr-*.tmp"))


def test_render_killed_and_resumed_equals_a_fresh_one(tmp_path: Path) -> None:
    """A bench killed while it renders its data (a half-written clip's temporary may be left behind) renders again
    when resumed and ends with exactly the files of a render that was never interrupted, and no temporary."""
    bench_file = _write_bench(tmp_path)
    script = ("import sys; from pathlib import Path; from tvr.bench.runs import load_bench_config, prepare_data; "
              "prepare_data(load_bench_config(sys.argv[1]), Path(sys.argv[2]), progress=False)")  # fmt: skip
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", script, str(bench_file), str(out)])
    _kill_when(proc, lambda: len(list((out / "data" / "videos").glob("video*.mp4"))) >= 10)
    assert proc.returncode == -signal.SIGKILL and not (out / "data" / "synth_meta.json").exists()
    # what a kill in the middle of an encode leaves: a temporary beside the clip
    (out / "data" / "videos" / ".video11.mp4.tvr-abcdefgh.tmp").write_bytes(b"half a clip")
    first = prepare_data(load_bench_config(bench_file), out, progress=False)
    fresh = prepare_data(load_bench_config(bench_file), tmp_path / "fresh", progress=False)
    assert first == fresh
    files = sorted(p.relative_to(out / "data") for p in (out / "data").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "fresh" / "data") for p in (tmp_path / "fresh" / "data").rglob("*")
                           if p.is_file())  # fmt: skip
    for name in files:
        assert (out / "data" / name).read_bytes() == (tmp_path / "fresh" / "data" / name).read_bytes(), name
    assert not list((out / "data").rglob("*.tmp"))


def test_a_finished_run_made_with_another_config_is_refused_naming_the_keys(tmp_path: Path) -> None:
    """Changing epochs and a head option after the runs finished: the bench stops in one line naming what changed
    (exit 2), before any work; --rerun-changed runs the changed runs again and the report is of the new config."""
    from tvr.cli import app

    first = _write_bench(tmp_path, epochs=1)
    out = tmp_path / "out"
    run_bench(load_bench_config(first), out, progress=False)
    raw = yaml.safe_load(first.read_text())
    raw["epochs"] = 2
    raw["methods"][1]["head"]["options"]["alpha"] = 0.5
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(raw, sort_keys=False))
    kept = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/result.json")}
    recorded = (out / "bench_config.yaml").read_bytes()
    result = CliRunner().invoke(app, ["bench", "--config", str(changed), "--out", str(out)])
    assert result.exit_code == 2
    message = next(line for line in result.output.splitlines() if line.startswith("error"))
    assert "6 run(s)" in message and "config.train.epochs: 1 → 2" in message
    assert "config.head.options.alpha: 0.01 → 0.5" in message
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/result.json")} == kept
    assert (out / "bench_config.yaml").read_bytes() == recorded  # the refused config is not recorded as the bench's
    results = run_bench(load_bench_config(changed), out, progress=False, rerun_changed=True)
    assert results["epochs"] == 2 and all(r["config"]["train"]["epochs"] == 2 for r in results["runs"])
    assert all(len(r["val_curve"]) == 2 for r in results["runs"])
    gravialign = [r for r in results["runs"] if r["method"] == "gravialign"]
    assert all(r["config"]["head"]["options"]["alpha"] == 0.5 for r in gravialign)


def test_validation_unlike_the_test_is_refused_unless_asked(tmp_path: Path) -> None:
    """A synthetic set whose validation is held out of the training list (val_like_test: false) poses another task
    than its test: partial captions, twins left in training. The bench names the shares that differ."""
    config = _write_bench(tmp_path, synth={**yaml.safe_load(QUICK.read_text())["synth"], "val_like_test": False})
    bench = load_bench_config(config)
    raw = yaml.safe_load(config.read_text())
    raw["run"]["data"]["val_fraction"] = 0.25
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    bench = load_bench_config(config)
    with pytest.raises(BenchConfigError, match=r"validation is not built like the test \(full_caption_share"):
        run_bench(bench, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "features").exists()
    from tvr.bench.runs import validation_composition

    cfg = method_config(bench, bench.methods[0], 0, tmp_path / "out")
    composition = validation_composition(cfg, allow_unlike=True)
    assert composition["test"]["full_caption_share"] == 1.0 and composition["val"]["full_caption_share"] < 0.9
    assert composition["differs"] and composition["tolerance"] == 0.05


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("colour_count=1,2", "unknown dial 'colour_count'"),
        ("shared_attributes=0,1.5", r"shared_attributes=1.5: SynthConfig.shared_attributes must be in \[0, 1\]"),
        ("shared_attributes=0.5", "at least two values"),
        ("shared_attributes=0,x", "value 'x' is not a number"),
        ("shared_attributes=0,0.0", "value 0 is given twice"),
        ("shared_attributes", "expected DIAL=v1,v2"),
    ],
)
def test_a_bad_sweep_is_one_line_before_any_work(tmp_path: Path, sweep: str, message: str) -> None:
    import re

    from tvr.cli import app

    result = CliRunner().invoke(app, ["bench", "--config", "quick", "--out", str(tmp_path / "out"), "--sweep", sweep])
    assert result.exit_code == 2 and re.search(message, result.output.splitlines()[0]), result.output
    assert not (tmp_path / "out").exists()


def test_a_sweep_decides_a_pre_registered_hypothesis(tmp_path: Path) -> None:
    """A sweep runs one bench per dial value and decides each pre-registered hypothesis on that dial by the
    per-seed slope test; the hypothesis's numbers are the slope test of the per-seed gains in the point benches."""
    from tvr.bench.sweep import parse_sweep, run_sweep

    hypothesis = {"id": "H1", "method": "gravialign", "metric": "t2v/R1", "dial": "distractor_prob",
                  "expect": "increases", "statement": "GraviAlign gains more with distractors"}  # fmt: skip
    config = _write_bench(tmp_path, epochs=1, hypotheses=[hypothesis])
    bench = load_bench_config(config)
    record = run_sweep(bench, parse_sweep("distractor_prob=0,1", bench), tmp_path / "sweep", progress=False,
                       allow_unlike_validation=True)  # fmt: skip
    points = [json.loads((tmp_path / "sweep" / f"distractor_prob={v}" / "results.json").read_text()) for v in (0, 1)]
    gains = [
        [next(r["test"]["t2v"]["R1"] for r in p["runs"] if r["method"] == "gravialign" and r["seed"] == seed)
         - next(r["test"]["t2v"]["R1"] for r in p["runs"] if r["method"] == "clip4clip" and r["seed"] == seed)
         for p in points]
        for seed in (0, 1, 2)
    ]  # fmt: skip
    trend = slope_test([0.0, 1.0], gains)
    (decided,) = record["hypotheses"]
    assert decided["slope"] == pytest.approx(trend["mean"]) and decided["p_one_sided"] == pytest.approx(
        trend["p_greater"], nan_ok=True)  # fmt: skip
    assert decided["held"] == (trend["p_greater"] < 0.05)
    assert record["points"][1]["dials"]["distractors"]["distractor_prob"] == 1.0
    assert (tmp_path / "sweep" / "sweep.md").read_text().count("| slope per unit |") == 1
    assert record["results_sha256"] == results_digest(record)


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
