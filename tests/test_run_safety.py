"""From raw download to a safe run: a run that would trip stops before its first step, user errors are one or two
lines (exit 2), a finished training is never lost to its evaluation, stale temporaries go, counts are reported.
Each test reproduces a defect of the earlier build on a small fixture."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from annotation_fixtures import write_generic
from test_end_to_end import make_msrvtt, tiny_config
from typer.testing import CliRunner
from videos import write_test_video

from tvr.cli import app
from tvr.config import config_from_dict
from tvr.data.annotations import AnnotationError, load_split
from tvr.pipeline import PreflightError, run_train


def _no_checkpoints(out: Path) -> bool:
    return not (out / "last.pt").exists() and not (out / "best.pt").exists()


def test_unreadable_validation_split_stops_before_training(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    cfg = config_from_dict(values)
    for video_id in load_split(cfg.data, "val").videos:
        (tmp_path / "data" / "videos" / f"{video_id}.mp4").write_bytes(b"not a video at all")
    out = tmp_path / "run"
    started = time.perf_counter()
    with pytest.raises(PreflightError, match=r"validation split: none of its \d+ videos can be read"):
        run_train(cfg, out)
    assert time.perf_counter() - started < 60  # seconds, not a training run
    assert _no_checkpoints(out) and not (out / "train_log.jsonl").exists()


def _generic_without_split(root: Path) -> dict:
    rows = [{"video": f"clip{k}.mp4", "caption": f"clip number {k} shows thing {k % 3}"} for k in range(12)]
    path = write_generic(root, rows, fmt="csv")
    (root / "videos").mkdir(parents=True, exist_ok=True)
    for k in range(12):
        write_test_video(root / "videos" / f"clip{k}.mp4", num_frames=5, fps=4, size=(32, 32))
    return tiny_config("generic", root, generic_file=path.name, video_pattern="{video_id}")


def test_missing_test_split_is_reported_before_training(tmp_path: Path) -> None:
    """The generic format without a split column has no test split: say so before step 1, suggest --no-test."""
    cfg = config_from_dict(_generic_without_split(tmp_path / "data"))
    out = tmp_path / "run"
    with pytest.raises(AnnotationError, match=r"test split: .*--no-test"):
        run_train(cfg, out)
    assert _no_checkpoints(out)
    summary = run_train(cfg, out, final_test=False)  # without the test split the run is fine
    assert summary["steps"] >= 1 and "test" not in summary


def test_small_validation_split_warns_and_metrics_record_counts(tmp_path: Path, caplog) -> None:
    values = make_msrvtt(tmp_path / "data")
    cfg = config_from_dict(values)
    (tmp_path / "data" / "videos" / "video8.mp4").unlink()  # a test video goes missing
    with caplog.at_level("WARNING"):
        summary = run_train(cfg, tmp_path / "run")
    assert any("validation split has only" in w and "steps of" in w for w in summary["preflight_warnings"])
    assert "validation split has only" in caplog.text
    metrics = json.loads((tmp_path / "run" / "test_last" / "metrics.json").read_text())
    assert (metrics["expected_videos"], metrics["num_videos"]) == (3, 2)
    assert metrics["expected_texts"] == 3 and metrics["num_texts"] == 2


def test_stale_temporaries_are_removed_when_a_run_resumes(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    values["train"]["max_steps"] = 1
    cfg = config_from_dict(values)
    out = tmp_path / "run"
    run_train(cfg, out, final_test=False)
    # what a kill -9 inside atomic writes leaves behind, in the run folder and below it
    stale = [out / ".last.pt.tvr-a1b2c3d4.tmp", out / "test_last" / ".metrics.json.tvr-0f0f0f0f.tmp"]
    for path in stale:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"half")
    # not ours: a plain name, and another program's temporary of tempfile's shape
    keep = [out / "notes.tmp", out / ".notes.a1b2c3d4.tmp", out / "test_last" / ".x.abcdefgh.tmp"]
    for path in keep:
        path.write_text("user file")
    cfg.train.max_steps = 2
    run_train(cfg, out, resume=True, final_test=False)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in keep)


def test_written_files_honour_the_umask(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    values["train"]["max_steps"] = 1
    old = os.umask(0o022)
    try:
        run_train(config_from_dict(values), tmp_path / "run", final_test=False)
    finally:
        os.umask(old)
    for name in ("last.pt", "best.pt", "config.yaml", "splits.json", "summary.json"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o644, name


# --------------------------------------------------------------------------------------------- the command line


def _config_file(tmp_path: Path, values: dict) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _short_error(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "─ Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) <= 3, result.output  # one or two lines of message + the --debug hint
    assert needle in " ".join(result.output.split()), result.output


def test_user_errors_are_short_and_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    values = make_msrvtt(tmp_path / "data")

    missing_dir = dict(values, data={**values["data"], "video_dir": str(tmp_path / "nowhere")})
    result = runner.invoke(app, ["train", "-c", str(_config_file(tmp_path, missing_dir)), "-o", str(tmp_path / "r1")])
    _short_error(result, "video folder not found")

    (tmp_path / "data" / "MSRVTT_data.json").write_text("{ this is not json")
    result = runner.invoke(app, ["train", "-c", str(_config_file(tmp_path, values)), "-o", str(tmp_path / "r2")])
    _short_error(result, "MSRVTT_data.json")

    values = make_msrvtt(tmp_path / "data2")
    cfg_path = _config_file(tmp_path, values)
    out_file = tmp_path / "a_file"
    out_file.write_text("x")
    result = runner.invoke(app, ["train", "-c", str(cfg_path), "-o", str(out_file)])
    _short_error(result, "is a file; expected a folder (existing or new)")

    text_ckpt = tmp_path / "notes.pt"
    text_ckpt.write_text("hello")
    eval_args = ["eval", "-c", str(cfg_path), "--checkpoint", str(text_ckpt), "-o", str(tmp_path / "e")]
    result = runner.invoke(app, eval_args)
    _short_error(result, "a text file, expected a checkpoint")

    import torch

    if not torch.cuda.is_available():
        result = runner.invoke(
            app, ["train", "-c", str(cfg_path), "-o", str(tmp_path / "r3"), "--set", "train.device=cuda"]
        )
        _short_error(result, "CUDA is not available")
        assert not (tmp_path / "r3").exists()

    # --debug shows the traceback instead
    result = runner.invoke(app, ["--debug", *eval_args])
    assert result.exit_code != 0 and result.exception is not None


def test_a_frame_cache_trains_like_the_videos_and_a_mismatched_one_stops_the_run(tmp_path: Path) -> None:
    from tvr.config import ConfigError
    from tvr.data.frame_cache import FrameSettings
    from tvr.data.prepare import extract_frames
    from tvr.train.logging import read_jsonl

    values = make_msrvtt(tmp_path / "data")
    values["data"]["augment"] = True  # augmentation runs on cached frames exactly as on decoded ones
    values["train"]["max_steps"] = 2
    data = values["data"]
    extract_frames(
        data["video_dir"],
        tmp_path / "cache",
        FrameSettings(data["max_frames"], data["frame_rate"], data["image_size"], "clip4clip"),
        progress=False,
    )
    plain = run_train(config_from_dict(values), tmp_path / "plain")
    cached_values = {**values, "data": {**data, "frame_cache": str(tmp_path / "cache")}}
    cached = run_train(config_from_dict(cached_values), tmp_path / "cached")
    assert plain["test"]["last"]["t2v"] == cached["test"]["last"]["t2v"]

    def losses(run: str) -> list[float]:
        return [r["loss"] for r in read_jsonl(tmp_path / run / "train_log.jsonl") if "loss" in r]

    assert len(losses("plain")) == 2 and losses("plain") == losses("cached")

    mismatched = {**values, "data": {**data, "frame_cache": str(tmp_path / "cache"), "max_frames": 3}}
    with pytest.raises(ConfigError, match="other frame settings"):
        run_train(config_from_dict(mismatched), tmp_path / "mismatched")
    assert not (tmp_path / "mismatched").exists()
