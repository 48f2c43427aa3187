"""The run folder's record describes what ran: a resume with other settings is refused before anything is written
(or, for settings that may change, recorded as a change); ``--overwrite`` removes the earlier run before the new
one starts; one job per folder (a lock, released by a crash as well)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from test_end_to_end import make_msrvtt

from tvr.config import config_from_dict
from tvr.pipeline import RunFolderError, run_train
from tvr.train.checkpoint import CheckpointError, read_checkpoint
from tvr.utils.errors import UserError
from tvr.utils.lock import LOCK_NAME, FolderBusyError, folder_lock


@pytest.fixture(scope="module")
def data_values(tmp_path_factory) -> dict:
    values = make_msrvtt(tmp_path_factory.mktemp("data"))
    values["train"]["max_steps"] = 1
    return values


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_with_another_learning_rate_is_refused_and_writes_nothing(data_values, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_train(config_from_dict(data_values), out, final_test=False)
    before = _snapshot(out)
    changed = json.loads(json.dumps(data_values))
    changed["train"]["lr"] = 0.5
    changed["train"]["max_steps"] = 2
    with pytest.raises(RunFolderError, match=r"train\.lr: 0\.001 in the run, 0\.5 now") as info:
        run_train(config_from_dict(changed), out, resume=True, final_test=False)
    assert "--config" in str(info.value) and "config.yaml" in str(info.value)
    assert _snapshot(out) == before  # config.yaml still records the run's own settings


def test_resume_may_change_how_long_and_how_it_runs_and_records_it(data_values, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_train(config_from_dict(data_values), out, final_test=False)
    longer = json.loads(json.dumps(data_values))
    longer["train"]["max_steps"] = 2
    longer["eval"]["batch_size"] = 2
    summary = run_train(config_from_dict(longer), out, resume=True, final_test=False)
    assert summary["steps"] == 2
    record = yaml.safe_load((out / "config.yaml").read_text())
    assert record["train"]["max_steps"] == 2 and record["eval"]["batch_size"] == 2
    (entry,) = [json.loads(line) for line in (out / "config_changes.jsonl").read_text().splitlines()]
    assert entry["resumed_at_step"] == 1
    assert entry["changes"] == {
        "eval.batch_size": {"before": 8, "after": 2},
        "train.max_steps": {"before": 1, "after": 2},
    }


def test_overwrite_removes_the_earlier_run_before_the_new_one_starts(data_values, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "run"
    run_train(config_from_dict(data_values), out)  # with its test results
    assert (out / "last.pt").is_file() and (out / "test_last" / "metrics.json").is_file()
    (out / "notes.txt").write_text("mine")

    import tvr.train.trainer as trainer_module

    def killed(self, batch, *args):  # the new run dies at its first step, before its first checkpoint
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module.Trainer, "_consume", killed)
    other = json.loads(json.dumps(data_values))
    other["train"]["lr"] = 0.5
    with pytest.raises(KeyboardInterrupt):
        run_train(config_from_dict(other), out, overwrite=True)
    left = sorted(p.name for p in out.iterdir())
    assert "last.pt" not in left and "best.pt" not in left and "test_last" not in left and "summary.json" not in left
    assert "notes.txt" in left and LOCK_NAME not in left  # the user's file stays; the lock went with the job
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["lr"] == 0.5
    monkeypatch.undo()
    # nothing of the old run is left to continue under the new config
    with pytest.raises(RunFolderError, match=r"--resume: run folder .* holds no last\.pt"):
        run_train(config_from_dict(other), out, resume=True, final_test=False)


def test_a_second_job_on_the_same_folder_is_refused(data_values, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with folder_lock(out, "run folder"):
        busy = rf"run folder .*run is in use by another tvr job \(pid {os.getpid()}"
        with pytest.raises(FolderBusyError, match=busy):
            run_train(config_from_dict(data_values), out, final_test=False)
    assert not (out / "last.pt").exists()
    run_train(config_from_dict(data_values), out, final_test=False)  # free again once the holder is done
    assert (out / "last.pt").is_file() and not (out / LOCK_NAME).exists()


def test_a_killed_holder_leaves_no_lock_behind(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "dst"
    script = textwrap.dedent(
        f"""
        import time
        from tvr.utils.lock import folder_lock
        with folder_lock({str(folder)!r}):
            print("LOCKED", flush=True)
            time.sleep(120)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    try:
        assert proc.stdout.readline().strip() == "LOCKED"
        with pytest.raises(FolderBusyError, match=rf"pid {proc.pid}"):
            with folder_lock(folder):
                pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert (folder / LOCK_NAME).exists()  # the crashed holder's file stays, but no process holds it
    with caplog.at_level("WARNING"), folder_lock(folder):
        pass
    assert f"pid {proc.pid}" in caplog.text and "never released" in caplog.text
    assert not (folder / LOCK_NAME).exists()


def test_a_resume_reads_the_checkpoint_it_recorded(data_values, tmp_path: Path) -> None:
    """A resume without changes leaves no change record."""
    out = tmp_path / "run"
    run_train(config_from_dict(data_values), out, final_test=False)
    same = json.loads(json.dumps(data_values))
    same["train"]["max_steps"] = 1
    run_train(config_from_dict(same), out, resume=True, final_test=False)
    assert not (out / "config_changes.jsonl").exists()
    assert read_checkpoint(out / "last.pt")["state"]["global_step"] == 1


def test_resume_auto_starts_then_continues_with_one_command(data_values, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = run_train(config_from_dict(data_values), out, resume="auto", final_test=False)  # nothing there: a new run
    assert first["steps"] == 1 and not (out / "config_changes.jsonl").exists()
    longer = json.loads(json.dumps(data_values))
    longer["train"]["max_steps"] = 2
    second = run_train(config_from_dict(longer), out, resume="auto", final_test=False)  # last.pt: continued
    assert second["steps"] == 2
    (entry,) = [json.loads(line) for line in (out / "config_changes.jsonl").read_text().splitlines()]
    assert entry["resumed_at_step"] == 1 and entry["changes"] == {"train.max_steps": {"before": 1, "after": 2}}
    # a resume (auto or not) is still checked against the folder's record
    other = json.loads(json.dumps(longer))
    other["train"]["lr"] = 0.5
    with pytest.raises(RunFolderError, match=r"train\.lr: 0\.001 in the run, 0\.5 now"):
        run_train(config_from_dict(other), out, resume="auto", final_test=False)
    with pytest.raises(RunFolderError, match="exclude each other"):
        run_train(config_from_dict(longer), out, resume="auto", overwrite=True)


def test_a_folder_with_best_pt_but_no_last_pt_is_not_restarted_silently(data_values, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_train(config_from_dict(data_values), out, final_test=False)
    (out / "last.pt").unlink()
    before = _snapshot(out)
    for resume in (False, True, "auto"):
        with pytest.raises(RunFolderError, match=r"holds best\.pt of an earlier run but no last\.pt.*--overwrite"):
            run_train(config_from_dict(data_values), out, resume=resume, final_test=False)
    assert _snapshot(out) == before


def test_resume_without_last_pt_is_refused_and_writes_nothing(data_values, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(RunFolderError, match=r"--resume: run folder .* holds no last\.pt.*--resume auto"):
        run_train(config_from_dict(data_values), out, resume=True, final_test=False)
    assert not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="holds no last.pt"):
        run_train(config_from_dict(data_values), out, resume=True, final_test=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def _failing_model_build(monkeypatch) -> None:
    import tvr.models.build

    def fails(*args, **kwargs):
        raise RuntimeError("the model could not be loaded")

    monkeypatch.setattr(tvr.models.build, "build_model", fails)


def test_a_start_that_fails_before_training_leaves_nothing_behind(data_values, tmp_path: Path, monkeypatch) -> None:
    """A new run whose model fails to load: the folder it created is gone, and in a folder that held the user's own
    files only those remain (no config.yaml, splits.json, tokenizer/)."""
    _failing_model_build(monkeypatch)
    out = tmp_path / "run"
    for resume in (False, "auto"):
        with pytest.raises(RuntimeError, match="could not be loaded"):
            run_train(config_from_dict(data_values), out, resume=resume, final_test=False)
        assert not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="could not be loaded"):
        run_train(config_from_dict(data_values), out, final_test=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_resume_that_fails_before_training_puts_the_record_back(data_values, tmp_path: Path, monkeypatch) -> None:
    """The resume would record a changed setting; its model fails to load: config.yaml and the change log are as
    before, byte for byte, and so is everything else."""
    out = tmp_path / "run"
    run_train(config_from_dict(data_values), out, final_test=False)
    longer = json.loads(json.dumps(data_values))
    longer["train"]["max_steps"] = 2
    before = _snapshot(out)
    _failing_model_build(monkeypatch)
    with pytest.raises(RuntimeError, match="could not be loaded"):
        run_train(config_from_dict(longer), out, resume="auto", final_test=False)
    assert _snapshot(out) == before
    monkeypatch.undo()
    import tvr.train.checkpoint as checkpoint_module

    def does_not_fit(path, *args, **kwargs):
        raise CheckpointError(f"{path}: model state does not fit the current model")

    monkeypatch.setattr(checkpoint_module, "read_checkpoint", does_not_fit)
    with pytest.raises(CheckpointError, match="does not fit"):
        run_train(config_from_dict(longer), out, resume=True, final_test=False)
    assert _snapshot(out) == before


@pytest.mark.parametrize("kind", ["symlink", "dangling", "hardlink", "fifo", "folder"])
def test_a_planted_lock_file_is_refused_and_nothing_outside_is_written(tmp_path: Path, kind: str) -> None:
    """A folder that arrives with ``.tvr.lock`` pointing elsewhere: the lock never writes through it."""
    folder, victim = tmp_path / "job", tmp_path / "victim.txt"
    folder.mkdir()
    victim.write_text("precious\n")
    lock = folder / LOCK_NAME
    if kind == "symlink":
        lock.symlink_to(os.path.relpath(victim, folder))
    elif kind == "dangling":
        lock.symlink_to("../created-outside.txt")
    elif kind == "hardlink":
        os.link(victim, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    expected = {"symlink": "a symbolic link", "dangling": "a symbolic link", "hardlink": "a file with 2 names"}
    with pytest.raises(UserError, match=rf"job: \.tvr\.lock is {expected.get(kind, 'not a plain file|a folder')}"):
        with folder_lock(folder, "run folder"):
            pass
    assert victim.read_text() == "precious\n" and not (tmp_path / "created-outside.txt").exists()
    assert lock.is_symlink() or lock.exists()  # what was there is left for the user to inspect


def test_tvr_train_stops_on_a_planted_lock_link(data_values, tmp_path: Path) -> None:
    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / LOCK_NAME).symlink_to("../victim.txt")
    with pytest.raises(UserError, match="symbolic link"):
        run_train(config_from_dict(data_values), out, final_test=False)
    assert victim.read_text() == "precious\n" and not (out / "last.pt").exists()


def test_resume_without_config_continues_the_recorded_run(data_values, tmp_path: Path) -> None:
    """``tvr train --out RUN --resume`` needs no ``--config``: the run folder's config.yaml records it. ``--set``
    applies to it under the resume's rules, and a ``--config`` that differs is refused as before."""
    from typer.testing import CliRunner

    from tvr.cli import app

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(data_values))
    out = tmp_path / "run"
    runner = CliRunner()
    started = runner.invoke(app, ["train", "--config", str(config), "--out", str(out), "--no-test"])
    assert started.exit_code == 0, started.output

    longer = runner.invoke(app, ["train", "--out", str(out), "--resume", "--set", "train.max_steps=2", "--no-test"])
    assert longer.exit_code == 0, longer.output
    assert read_checkpoint(out / "last.pt")["state"]["global_step"] == 2
    (entry,) = [json.loads(line) for line in (out / "config_changes.jsonl").read_text().splitlines()]
    assert entry["changes"] == {"train.max_steps": {"before": 1, "after": 2}}
    again = runner.invoke(app, ["train", "--out", str(out), "--resume", "auto", "--no-test"])  # nothing more to do
    assert again.exit_code == 0, again.output

    before = _snapshot(out)
    other = json.loads(json.dumps(data_values))
    other["train"]["lr"] = 0.5
    config.write_text(yaml.safe_dump(other))
    for refused in (["--config", str(config)], ["--set", "train.lr=0.5"]):
        result = runner.invoke(app, ["train", "--out", str(out), "--resume", *refused, "--no-test"])
        assert result.exit_code == 2 and "train.lr: 0.001 in the run, 0.5 now" in result.output
        assert "resume without --config" in result.output and "Traceback" not in result.output
    assert _snapshot(out) == before

    empty = tmp_path / "empty"
    result = runner.invoke(app, ["train", "--out", str(empty), "--resume"])
    assert result.exit_code == 2 and f"{empty} holds no config.yaml" in result.output and not empty.exists()
    result = runner.invoke(app, ["train", "--out", str(out)])
    assert result.exit_code == 2 and "tvr train needs --config" in result.output
