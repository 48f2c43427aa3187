"""The first-try CPU presets (``cpu/clip4clip``, ``cpu/gare``, ``cpu/proxy``, ``cpu/gravialign``): each trains and
evaluates through ``tvr train`` / ``tvr eval`` (here in the suite's tiny form: a tiny synthetic set, two steps), each
equals the demo of its method, and the ``tvr synth`` command their comments give renders the demo's set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tvr.bench.demo import DEMO_PRESET, demo_config, demo_synth_config
from tvr.bench.synthetic import SynthConfig, generate_synthetic_dataset
from tvr.cli import app
from tvr.config import config_to_dict, load_config
from tvr.pipeline import resolve_config

METHODS = ["clip4clip", "gare", "proxy", "gravialign"]


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cpu_presets") / "synth"
    generate_synthetic_dataset(
        root, SynthConfig(num_videos=12, num_test=4, captions_per_video=2, fps=4, seconds=1.0, size=32)
    )
    return root


def data_overrides(root: Path) -> list[str]:
    return [f"data.annotations={root}", f"data.video_dir={root / 'videos'}"]


@pytest.mark.parametrize("method", METHODS)
def test_a_cpu_preset_trains_and_evaluates(method: str, synth: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    tiny = ["train.max_steps=2", "train.batch_size=4", "data.num_workers=0", "data.val_fraction=0.25"]
    sets = [arg for text in data_overrides(synth) + tiny for arg in ("--set", text)]
    result = CliRunner().invoke(app, ["train", "--config", f"cpu/{method}", "--out", str(run), *sets])
    assert result.exit_code == 0, result.output
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["head"]["name"] == method and recorded["model"]["clip"] == "tiny"
    assert recorded["model"]["backbone"] == ("clipvip" if method == "proxy" else "clip")
    assert recorded["train"]["device"] == "cpu"
    for tag in ("last", "best"):
        metrics = json.loads((run / f"test_{tag}" / "metrics.json").read_text())
        assert set(metrics["t2v"]) == {"R1", "R5", "R10", "MdR", "MnR"}
    # the checkpoint alone evaluates (it carries the preset's resolved config)
    result = CliRunner().invoke(app, ["eval", "--checkpoint", str(run / "best.pt"), "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    evaluated = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    best = json.loads((run / "test_best" / "metrics.json").read_text())
    assert evaluated["t2v"] == pytest.approx(best["t2v"]) and evaluated["v2t"] == pytest.approx(best["v2t"])


@pytest.mark.parametrize("method", METHODS)
def test_a_cpu_preset_is_the_demo_of_its_method(method: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    demo = resolve_config(demo_config(data, method=method))
    preset = resolve_config(load_config(f"cpu/{method}", data_overrides(data)))
    assert config_to_dict(preset) == config_to_dict(demo)
    assert DEMO_PRESET == "cpu/clip4clip"


def test_the_synth_command_the_presets_give_renders_the_demos_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tvr.bench.synthetic

    asked: list[SynthConfig] = []

    def generate(out: Path, cfg: SynthConfig, progress: bool) -> dict:
        asked.append(cfg)
        counts = {"num_train": 189, "num_validate": 21, "num_test": 30, "num_sentences": 1200, "num_frames": 24}
        return {"num_videos": cfg.num_videos, "codec": "libx264", **counts}

    monkeypatch.setattr(tvr.bench.synthetic, "generate_synthetic_dataset", generate)
    comments = (Path(__file__).resolve().parents[1] / "tvr" / "configs" / "cpu" / "clip4clip.yaml").read_text()
    command = next(line for line in comments.splitlines() if "tvr synth --out" in line)
    args = command.split("#")[1].split()[2:6]  # "--out synth --num-videos 240"
    assert args[:2] == ["--out", "synth"]
    result = CliRunner().invoke(app, ["synth", "--out", str(tmp_path / "synth"), *args[2:]])
    assert result.exit_code == 0, result.output
    assert asked == [demo_synth_config(quick=False)]
    # what was written and the next step, in words (it printed the summary as a raw Python dict)
    said = " ".join(result.output.split())
    assert "wrote 240 videos (210 train, 30 test; 24 frames each, libx264) and 1200 captions" in said
    assert f"tvr train --config cpu/clip4clip --set data.annotations={tmp_path / 'synth'}" in said
    assert "{" not in result.output


def test_num_workers_is_capped_at_the_cpus_with_one_note(
    synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The GPU presets ask for 8 decoding workers; on a 2-CPU machine torch warned about it on every loader (train,
    validation, test). Capped at the CPUs, nothing warns, and the cap is noted once."""
    import logging
    import os
    import warnings

    import tvr.utils.parallel

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # torch's check reads the same mask
    monkeypatch.setitem(tvr.utils.parallel._CAP_NOTED, "done", False)
    assert tvr.utils.parallel.loader_workers(1) == 1 and tvr.utils.parallel.loader_workers(2) == 2
    tiny = ["train.max_steps=2", "train.batch_size=4", "data.val_fraction=0.25", "data.num_workers=8"]
    sets = [arg for text in data_overrides(synth) + tiny for arg in ("--set", text)]
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="tvr.utils.parallel"):
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, ["train", "--config", "cpu/clip4clip", "--out", str(tmp_path / "run"), *sets])
    assert result.exit_code == 0, result.output
    assert not [w for w in caught if "worker processes in total" in str(w.message)]
    notes = [r.getMessage() for r in caplog.records if r.name == "tvr.utils.parallel"]
    assert notes == ["data.num_workers 8: 2 decoding worker(s), one per CPU this process may use"]
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["num_workers"] == 8  # as asked
