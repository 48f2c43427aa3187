"""TensorBoard scalars beside the JSONL / CSV logs: the event file a run writes, read back with TensorBoard's own
``EventAccumulator``, holds every number of ``train_log.jsonl`` (each loss component, each group's learning rate,
each validation metric) at its step, and nothing else; a resumed run's event file, like its JSONL, holds each step
once; without the ``tensorboard`` package training runs as before and writes no event file. (Under torchrun only
rank 0 writes: tests/test_distributed.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the optional tensorboard extra (in dev) is not installed")

from test_checkpoint_resume import StopError, make_model, make_trainer  # noqa: E402

from tvr.train.logging import read_jsonl  # noqa: E402

TRAIN_POSITION = {"kind", "step", "epoch", "batch", "seconds", "lr"}


def event_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``run_dir/tensorboard`` as TensorBoard reads it: tag → [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={SCALARS: 0})  # 0: keep every one
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()[SCALARS]}


def jsonl_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What the event file should hold, from ``train_log.jsonl``: ``train/<key>`` for each number of a training
    record but its position, ``lr/<group>`` for each learning rate, ``val/<direction>/<metric>`` for each metric
    of a validation record."""
    expected: dict[str, list[tuple[int, float]]] = {}

    def add(tag: str, step: int, value) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            expected.setdefault(tag, []).append((step, float(value)))

    for record in read_jsonl(run_dir / "train_log.jsonl"):
        step = record["step"]
        if record["kind"] == "train":
            for group, lr in record["lr"].items():
                add(f"lr/{group}", step, lr)
            for key, value in record.items():
                if key not in TRAIN_POSITION:
                    add(f"train/{key}", step, value)
        else:
            for direction, metrics in record["metrics"].items():
                if direction != "info":
                    for name, value in metrics.items():
                        add(f"val/{direction}/{name}", step, value)
    return expected


def assert_events_equal_jsonl(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    written, expected = event_scalars(run_dir), jsonl_scalars(run_dir)
    assert set(written) == set(expected)
    for tag, points in expected.items():
        assert [step for step, _ in written[tag]] == [step for step, _ in points], tag
        assert [value for _, value in written[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag
    return written


def test_the_event_file_holds_every_number_of_the_jsonl(tmp_path: Path) -> None:
    make_trainer(tmp_path).fit()  # 18 steps, each logged; validations at steps 5, 6, 10, 12, 15, 18
    written = assert_events_equal_jsonl(tmp_path)
    losses = {"train/loss", "train/infonce", "train/scale", "train/loss_avg"}  # the head's loss components too
    assert losses | {"train/grad_norm", "train/it_s", "lr/head"} <= set(written)
    assert [step for step, _ in written["train/loss"]] == list(range(1, 19))
    assert [step for step, _ in written["val/t2v/R1"]] == [5, 6, 10, 12, 15, 18]
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_a_resumed_run_holds_each_step_once_as_an_uninterrupted_one(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    make_trainer(straight).fit()

    def crash(trainer, record):
        if trainer.global_step == 11:  # the last checkpoint is at step 8: steps 9 to 11 are logged, then lost
            raise StopError

    stopped = tmp_path / "stopped"
    with pytest.raises(StopError):
        make_trainer(stopped, step_callback=crash).fit()
    assert max(step for step, _ in event_scalars(stopped)["train/loss"]) == 11
    make_trainer(stopped, model=make_model(seed=99)).fit(resume=True)
    resumed = assert_events_equal_jsonl(stopped)
    assert [step for step, _ in resumed["train/loss"]] == list(range(1, 19))  # 9, 10, 11 once each
    assert [step for step, _ in resumed["val/t2v/R1"]] == [5, 6, 10, 12, 15, 18]
    uninterrupted = event_scalars(straight)
    for tag in ("train/loss", "train/infonce", "train/grad_norm", "lr/head", "val/t2v/R1"):  # bit-exact resume
        assert resumed[tag] == uninterrupted[tag], tag


def test_a_validation_logged_before_a_kill_is_written_once(tmp_path: Path) -> None:
    """The epoch-end validation is logged, then the run dies before the checkpoint that records it: the resume runs
    it again, and TensorBoard, like the JSONL, shows it once."""
    trainer = make_trainer(tmp_path)
    log_eval = trainer.logger.eval

    def log_then_die(record: dict) -> None:
        log_eval(record)
        if record["step"] == 12:
            raise StopError("killed after the log line")

    trainer.logger.eval = log_then_die
    with pytest.raises(StopError):
        trainer.fit()
    make_trainer(tmp_path, model=make_model(seed=99)).fit(resume=True)
    assert [step for step, _ in assert_events_equal_jsonl(tmp_path)["val/t2v/R1"]] == [5, 6, 10, 12, 15, 18]


def test_without_tensorboard_training_runs_and_writes_no_event_file(tmp_path: Path, monkeypatch) -> None:
    # as if the package were not installed: importing it fails, and it cannot be found
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    summary = make_trainer(tmp_path).fit()
    assert summary["steps"] == 18 and len(read_jsonl(tmp_path / "train_log.jsonl")) == 18 + 6
    assert not (tmp_path / "tensorboard").exists()


def test_overwrite_removes_the_earlier_runs_event_files(tmp_path: Path) -> None:
    from tvr.pipeline.run_folder import clear_run_state

    make_trainer(tmp_path).fit()
    assert "tensorboard/" in clear_run_state(tmp_path) and not (tmp_path / "tensorboard").exists()
