"""``tvr demo`` keeps its data honest: a set generated with other settings (the quick demo's 60 videos before the
full demo) is regenerated, and the demo says what it replaces (data and run)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import yaml

from tvr.bench.demo import DEMO_VALIDATION, _describe_run, demo_config, demo_synth_config, prepare_demo_data, run_demo
from tvr.bench.synthetic import SynthConfig
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config
from tvr.pipeline.preflight import preflight
from tvr.utils.errors import UserError

TINY = SynthConfig(num_videos=4, num_test=1, fps=4, seconds=1.0, size=16, captions_per_video=2)


def videos(data: Path) -> list[str]:
    return sorted(p.name for p in (data / "videos").iterdir())


def test_the_quick_and_full_demos_use_different_sets() -> None:
    quick, full = demo_synth_config(True), demo_synth_config(False)
    assert (quick.num_videos, quick.num_test, full.num_videos, full.num_test) == (60, 20, 240, 30)


def test_a_set_with_other_settings_is_regenerated_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    prepare_demo_data(data, TINY)
    assert videos(data) == [f"video{i}.mp4" for i in range(4)]
    first = (data / "videos" / "video0.mp4").stat().st_mtime_ns

    with caplog.at_level(logging.INFO, logger="tvr.bench.demo"):
        prepare_demo_data(data, TINY)  # the same settings: reused, not rendered again
    assert (data / "videos" / "video0.mp4").stat().st_mtime_ns == first
    assert "reusing the synthetic set" in caplog.text

    bigger = dataclasses.replace(TINY, num_videos=6, num_test=2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tvr.bench.demo"):
        prepare_demo_data(data, bigger)
    assert f"regenerating the synthetic set in {data}" in caplog.text
    assert "num_videos 4 → 6, num_test 1 → 2" in caplog.text
    assert videos(data) == [f"video{i}.mp4" for i in range(6)]

    smaller = dataclasses.replace(TINY, num_videos=3)
    prepare_demo_data(data, smaller)
    assert videos(data) == [f"video{i}.mp4" for i in range(3)]  # nothing of the bigger set is left behind


def test_an_interrupted_set_is_regenerated_and_a_foreign_folder_is_left_alone(tmp_path: Path) -> None:
    interrupted = tmp_path / "interrupted"
    (interrupted / "videos").mkdir(parents=True)
    (interrupted / "videos" / "video0.mp4").write_bytes(b"half a file")
    prepare_demo_data(interrupted, TINY)
    assert (interrupted / "MSRVTT_data.json").is_file() and len(videos(interrupted)) == 4

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("my own files")
    with pytest.raises(UserError, match="holds files that are not a tvr demo set"):
        prepare_demo_data(foreign, TINY)
    assert (foreign / "notes.txt").read_text() == "my own files"


def test_the_demo_says_which_run_it_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tvr.bench.demo
    import tvr.pipeline

    calls = []
    monkeypatch.setattr(tvr.bench.demo, "prepare_demo_data", lambda data, synth: calls.append(synth))
    monkeypatch.setattr(
        tvr.pipeline,
        "run_train",
        lambda cfg, out, overwrite, small_val_reason: {"out": out, "overwrite": overwrite},
    )
    out = tmp_path / "demo"
    with caplog.at_level(logging.WARNING, logger="tvr.bench.demo"):
        summary = run_demo(out, quick=True)
    assert summary == {"out": out / "run", "overwrite": True} and calls == [demo_synth_config(True)]
    assert "replacing" not in caplog.text  # nothing to replace yet

    (out / "run").mkdir(parents=True)
    (out / "run" / "config.yaml").write_text(yaml.safe_dump({"head": {"name": "proxy"}, "train": {"max_steps": 4}}))
    (out / "run" / "best.pt").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="tvr.bench.demo"):
        run_demo(out, quick=False)
    assert f"replacing the previous demo run in {out / 'run'} (head proxy, quick, 4 steps)" in caplog.text
    assert calls[-1] == demo_synth_config(False)


def test_describe_run(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"head": {"name": "gare"}, "train": {"max_steps": 0, "epochs": 15}})
    )
    assert _describe_run(tmp_path) == "head gare, 15 epochs"
    (tmp_path / "config.yaml").write_text(": not yaml [")
    assert _describe_run(tmp_path) == "a run whose config.yaml cannot be read"


def test_the_demo_says_what_its_small_validation_split_means_instead_of_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo holds out a tenth of its training videos (21 of 210) on purpose: a run on real data is warned that
    such a split is a coarse signal, the demo says what it means for the demo instead."""
    data = tmp_path / "data"
    prepare_demo_data(data, TINY)
    cfg = resolve_config(demo_config(data, quick=True))
    with caplog.at_level(logging.INFO, logger="tvr.pipeline.preflight"):
        plain = preflight(resolve_run(cfg), tmp_path / "run", progress=False)
    assert any("raise data.val_fraction" in w for w in plain.warnings)
    assert "raise data.val_fraction" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tvr.pipeline.preflight"):
        demo = preflight(resolve_run(cfg), tmp_path / "run", progress=False, small_val_reason=DEMO_VALIDATION)
    assert demo.warnings == []
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert (
        "R@1 in steps of 100 points: the demo's choice" in caplog.text and "raise data.val_fraction" not in caplog.text
    )
