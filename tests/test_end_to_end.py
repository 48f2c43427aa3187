"""End to end: tiny mp4s + each dataset's annotation format → train (a few steps) → validation → one test eval.

These run the real pipeline (PyAV decoding, tiny random CLIP, seqTransf, heads, trainer, metrics) on CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from annotation_fixtures import write_activitynet, write_didemo, write_generic, write_msrvtt, write_msvd
from typer.testing import CliRunner
from videos import write_test_video

from tvr.cli import app
from tvr.config import config_from_dict, load_config
from tvr.data.annotations import load_split
from tvr.data.feature_cache import load_cached_split
from tvr.pipeline import build_feature_cache, resolve_config, run_eval, run_train

TINY = {
    "embed_dim": 32,
    "text_width": 32,
    "text_layers": 2,
    "text_heads": 2,
    "vision_width": 32,
    "vision_layers": 1,
    "vision_heads": 2,
    "image_size": 32,
    "patch_size": 16,
}


def tiny_config(dataset: str, root: Path, **data: object) -> dict:
    return {
        "data": {
            "dataset": dataset,
            "annotations": str(root),
            "video_dir": str(root / "videos"),
            "max_words": 16,
            "max_frames": 4,
            "frame_rate": 2.0,
            "image_size": 32,
            "val_fraction": 0.25,
            **data,
        },
        "model": {"clip": "tiny", "temporal": "seqTransf", "temporal_layers": 2, "tiny": TINY},
        "head": {"name": "clip4clip"},
        "train": {
            "epochs": 1,
            "batch_size": 4,
            "lr": 1e-3,
            "backbone_lr_coef": 1.0,
            "log_every": 1,
            "device": "cpu",
            "num_threads": 1,
        },
        "eval": {"batch_size": 8},
    }


def write_videos(root: Path, ids: list[str], suffix: str = ".mp4") -> None:
    (root / "videos").mkdir(parents=True, exist_ok=True)
    for k, vid in enumerate(ids):
        write_test_video(root / "videos" / f"{vid}{suffix}", num_frames=6 + k % 3, fps=4, size=(32, 32))


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{k}" for k in range(n)]


def make_msrvtt(root: Path) -> dict:
    vids = ids("video", 10)
    write_msrvtt(root, vids, captions_per_video=2, test_ids=vids[7:])
    write_videos(root, vids)
    return tiny_config("msrvtt", root)


def make_msvd(root: Path) -> dict:
    train, val, test = ids("tr", 6), ids("va", 2), ids("te", 3)
    write_msvd(root, train, val, test, captions_per_video=[2, 3, 1, 2, 2, 2])
    write_videos(root, train + val + test, suffix=".avi")
    return tiny_config("msvd", root, video_pattern="{video_id}.avi")


def make_didemo(root: Path) -> dict:
    splits = {"train": ids("d", 6), "val": ids("dv", 2), "test": ids("dt", 3)}
    write_didemo(root, splits, sentences_per_video=2, layout="original")
    write_videos(root, [v for s in splits.values() for v in s])
    return tiny_config("didemo", root)


def make_activitynet(root: Path) -> dict:
    splits = {"train": ids("v_a", 8), "test": ids("v_t", 3)}
    write_activitynet(root, splits, sentences_per_video=2, layout="original")
    write_videos(root, [v for s in splits.values() for v in s])
    return tiny_config("activitynet", root)


def make_generic(root: Path) -> dict:
    rows = [
        {
            "video": f"clip{k}.mp4",
            "caption": f"clip number {k} shows thing {k % 3}",
            "split": "test" if k >= 7 else ("val" if k == 6 else "train"),
        }
        for k in range(10)
    ]
    rows += [{"video": f"clip{k}.mp4", "caption": f"another caption for clip {k}", "split": "train"} for k in range(6)]
    path = write_generic(root, rows, fmt="jsonl")
    (root / "videos").mkdir(parents=True, exist_ok=True)
    for k in range(10):
        write_test_video(root / "videos" / f"clip{k}.mp4", num_frames=5, fps=4, size=(32, 32))
    return tiny_config("generic", root, generic_file=path.name, video_pattern="{video_id}")


FORMATS = {
    "msrvtt": (make_msrvtt, "one_to_one"),
    "msvd": (make_msvd, "multi_caption"),
    "didemo": (make_didemo, "paragraph"),
    "activitynet": (make_activitynet, "paragraph"),
    "generic": (make_generic, "one_to_one"),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_train_then_test_on_every_annotation_format(tmp_path: Path, fmt: str) -> None:
    make, protocol = FORMATS[fmt]
    cfg = config_from_dict(make(tmp_path / "data"))
    out = tmp_path / "run"
    summary = run_train(cfg, out)

    assert summary["steps"] >= 1
    assert (out / "config.yaml").is_file() and (out / "splits.json").is_file()
    resolved = resolve_config(cfg)
    assert resolve_config(load_config(out / "config.yaml")) == resolved  # the resolved config round-trips
    for tag in ("last", "best"):
        metrics = json.loads((out / f"test_{tag}" / "metrics.json").read_text())
        assert set(metrics) >= {"t2v", "v2t"}
        for direction in ("t2v", "v2t"):
            assert set(metrics[direction]) == {"R1", "R5", "R10", "MdR", "MnR"}
            assert 0.0 <= metrics[direction]["R1"] <= metrics[direction]["R5"] <= metrics[direction]["R10"] <= 100.0
    assert summary["test"]["last"]["info"]["protocol"] == protocol
    val_lines = (out / "val_log.jsonl").read_text().splitlines()
    assert val_lines, "validation ran"
    log_lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert any("loss" in rec for rec in log_lines)


def test_unreadable_videos_are_skipped_and_reported(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    values["train"]["batch_size"] = 2  # 10 training pairs: every pair is visited in the epoch
    cfg = config_from_dict(values)
    train_videos = load_split(cfg.data, "train").videos
    videos = tmp_path / "data" / "videos"
    (videos / f"{train_videos[0]}.mp4").write_bytes(b"this is not a video")  # corrupt
    (videos / f"{train_videos[1]}.mp4").write_bytes(b"")  # zero length
    (videos / "video8.mp4").unlink()  # missing, in test
    out = tmp_path / "run"
    summary = run_train(cfg, out)

    report = json.loads((out / "skipped_videos.json").read_text())
    assert {v["id"] for v in report["videos"]} == set(train_videos[:2])
    assert report["count"] == len(report["videos"])
    test_report = json.loads((out / "test_last" / "skipped_videos.json").read_text())
    assert [v["id"] for v in test_report["videos"]] == ["video8"]
    assert summary["test"]["last"]["info"]["num_videos"] == 2  # 3 test videos, one missing


def test_feature_cache_then_train_and_eval_via_cli(tmp_path: Path) -> None:
    values = make_msrvtt(tmp_path / "data")
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(values))
    runner = CliRunner()
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["features", "-c", str(config_path), "-o", str(cache), "--fp32"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((cache / "manifest.json").read_text())
    assert all(manifest["splits"][s]["complete"] for s in ("train", "val", "test"))

    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "train",
            "-c",
            str(config_path),
            "-o",
            str(out),
            "--set",
            f"data.features_dir={cache}",
            "--set",
            "model.freeze_backbone=true",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (out / "best.pt").is_file()

    eval_out = tmp_path / "eval"
    result = runner.invoke(
        app,
        [
            "eval",
            "-c",
            str(config_path),
            "--checkpoint",
            str(out / "best.pt"),
            "-o",
            str(eval_out),
            "--set",
            f"data.features_dir={cache}",
        ],
    )
    assert result.exit_code == 0, result.output
    cached_metrics = json.loads((eval_out / "metrics.json").read_text())
    assert "| t2v |" in (eval_out / "metrics.md").read_text()

    # the same checkpoint evaluated from the video files gives the same ranking metrics as from the cache
    raw = run_eval(config_from_dict(values), out / "best.pt", tmp_path / "eval_raw")
    for direction in ("t2v", "v2t"):
        for key, value in cached_metrics[direction].items():
            assert raw[direction][key] == pytest.approx(value, abs=1e-6)


def test_cli_reports_config_errors(tmp_path: Path) -> None:
    config_path = tmp_path / "bad.yaml"
    config_path.write_text("train:\n  epochz: 3\n")
    result = CliRunner().invoke(app, ["train", "-c", str(config_path), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "epochz" in result.output


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    assert "| t2v |" in result.output and "| v2t |" in result.output
    metrics = json.loads((tmp_path / "demo" / "run" / "test_best" / "metrics.json").read_text())
    assert set(metrics["t2v"]) == {"R1", "R5", "R10", "MdR", "MnR"}
    assert (tmp_path / "demo" / "data" / "MSRVTT_data.json").is_file()


@pytest.mark.parametrize("variant", [{}, {"corrected_side": "video", "context": "words", "mask_frames": True}])
def test_gare_trains_and_ranks_every_pair(tmp_path: Path, variant: dict) -> None:
    values = make_msrvtt(tmp_path / "data")
    values["head"] = {"name": "gare", "gare": variant}
    out = tmp_path / "run"
    summary = run_train(config_from_dict(values), out)
    metrics = json.loads((out / "test_best" / "metrics.json").read_text())
    assert set(metrics["t2v"]) == {"R1", "R5", "R10", "MdR", "MnR"}
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    components = {key for rec in log for key in rec}
    assert {"kl", "radius", "direction", "infonce"} <= components
    assert summary["test"]["best"]["info"]["num_videos"] == 3


def test_torchrun_two_process_training_on_cpu(tmp_path: Path) -> None:
    """DDP through torchrun (gloo on CPU): both ranks train, rank 0 validates and tests."""
    import shutil
    import socket
    import subprocess
    import sys

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists() and shutil.which("torchrun") is None:
        pytest.skip("torchrun not installed")
    values = make_msrvtt(tmp_path / "data")
    config_path = tmp_path / "c.yaml"
    config_path.write_text(yaml.safe_dump(values))
    out = tmp_path / "run"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        [
            str(torchrun if torchrun.exists() else "torchrun"),
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            "-m",
            "tvr.cli",
            "train",
            "-c",
            str(config_path),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    # global batch 4 = 2 ranks x 2; 5 training videos x 2 captions = 10 pairs -> 2 full batches in the epoch
    assert summary["steps"] == 2
    assert set(json.loads((out / "test_best" / "metrics.json").read_text())) >= {"t2v", "v2t"}


def test_resume_from_raw_videos_is_bit_exact(tmp_path: Path) -> None:
    """Stop after 2 steps, resume to 4: identical weights to an uninterrupted 4-step run (pixels, augmentation on)."""
    import torch

    values = make_msrvtt(tmp_path / "data")
    values["train"].update({"batch_size": 2, "epochs": 2})
    values["data"]["augment"] = True

    def cfg(max_steps: int):
        v = json.loads(json.dumps(values))
        v["train"]["max_steps"] = max_steps
        return config_from_dict(v)

    run_train(cfg(4), tmp_path / "straight", final_test=False)
    run_train(cfg(2), tmp_path / "resumed", final_test=False)
    run_train(cfg(4), tmp_path / "resumed", resume=True, final_test=False)
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "resumed" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_real_clips_through_the_feature_cache(shared_data: Path, tmp_path: Path) -> None:
    """The 19 real captioned clips (various fps, square and portrait) decode, sample and encode without a skip."""
    scenes = shared_data / "real-scenes"
    values = tiny_config(
        "generic",
        scenes,
        generic_file="captions.csv",
        video_pattern="{video_id}",
        max_frames=8,
        frame_rate=1.0,
        val_fraction=0.1,
    )
    values["data"]["video_dir"] = str(scenes)
    cfg = config_from_dict(values)
    manifest = build_feature_cache(cfg, tmp_path / "cache", ["train", "val"], progress=False)
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    assert train["skipped"] == [] and val["skipped"] == []
    assert train["num_videos"] + val["num_videos"] == 19
    cached = load_cached_split(tmp_path / "cache", "train")
    assert cached.frames.shape == (train["num_videos"], 8, TINY["embed_dim"])
    assert torch.isfinite(cached.frames.float()).all()
    # 2-second clips give 2 one-fps frames, the 8-second ones 8: the mask records exactly the sampled frames
    lengths = dict(zip(cached.video_ids, cached.frame_mask.sum(1).tolist(), strict=True))
    expected = {"bus_road.mp4": 2, "parakeet_ladder.mp4": 8, "jeep_mountain_road.mp4": 8}
    checked = {name: lengths[name] for name in expected if name in lengths}
    assert len(checked) >= 2  # at most 2 of the 19 clips are held out for validation
    assert checked == {name: expected[name] for name in checked}
