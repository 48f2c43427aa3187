"""The training log line: one learning rate per distinct rate (not one per parameter group), and an ETA."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tvr.config import load_config
from tvr.models.build import build_model
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config
from tvr.train.logging import TrainProgress, format_duration, format_lrs
from tvr.train.optim import build_optimizer, current_lrs


def test_groups_sharing_a_rate_print_it_once() -> None:
    same = {"backbone": 1e-3, "backbone-nodecay": 1e-3, "head": 1e-3, "head-nodecay": 1e-3}
    assert format_lrs(same) == "1.00e-03"
    split = {"backbone": 1e-7, "backbone-nodecay": 1e-7, "head": 1e-4, "head-nodecay": 1e-4, "proxy": 2e-6}
    assert format_lrs(split) == "backbone 1.00e-07, head 1.00e-04, proxy 2.00e-06"
    assert format_lrs({"head": 1e-4, "proxy": 1e-4, "backbone": 1e-6}) == "head+proxy 1.00e-04, backbone 1.00e-06"
    assert format_lrs({}) == "-"


def test_the_demo_recipe_logs_one_rate(tmp_path: Path) -> None:
    """The demo's four groups (backbone and head, with and without decay) all train at lr 1e-3: one number."""
    cfg = resolve_config(load_config("cpu/clip4clip", [f"data.annotations={tmp_path}"]))
    optimizer = build_optimizer(build_model(resolve_run(cfg)), cfg.train)
    assert len(optimizer.param_groups) == 4
    assert format_lrs(current_lrs(optimizer)) == "1.00e-03"


def test_durations() -> None:
    assert [format_duration(s) for s in (0, 42.4, 185, 7620, -3)] == ["0s", "42s", "3m05s", "2h07m", "0s"]


def test_the_log_line_has_an_eta_from_this_sessions_pace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tvr.train.logging

    clock = {"now": 100.0}
    monkeypatch.setattr(tvr.train.logging.time, "perf_counter", lambda: clock["now"])
    with TrainProgress(total_steps=400, epochs=4, enabled=False) as bar, caplog.at_level(logging.INFO, "tvr.train"):
        bar.set_completed(100)  # resumed at step 100: the earlier steps do not count towards the pace
        assert bar.eta(100) is None
        for _ in range(50):
            bar.advance(1)
        clock["now"] += 25.0  # 50 steps in 25 s: 2 steps/s, 250 steps left
        bar.update(1, 150, 0.5, {"backbone": 1e-3, "head": 1e-3})
    assert bar.eta(150) == pytest.approx(125.0)
    assert caplog.records[-1].getMessage() == "epoch 2/4 step 150/400 loss 0.5000 lr 1.00e-03 2.00 it/s ETA 2m05s"
