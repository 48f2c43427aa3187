"""One command line for a cluster: ``tvr train --resume auto`` starts a run or continues it, a preemption signal
ends it with exit code 143 after writing last.pt, and under ``torchrun --max-restarts`` the restarted workers,
running the very same command, continue the run to the result of a run that never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_end_to_end import make_msrvtt
from two_process import run_two_processes, torchrun
from typer.testing import CliRunner

import tvr.train.trainer as trainer_module
from tvr.cli import app
from tvr.config import config_from_dict
from tvr.pipeline import PREEMPTED_EXIT_CODE
from tvr.train.checkpoint import read_checkpoint
from tvr.train.logging import read_jsonl

runner = CliRunner()


@pytest.fixture(scope="module")
def data_values(tmp_path_factory) -> dict:
    return make_msrvtt(tmp_path_factory.mktemp("data"))


def _config(tmp_path: Path, values: dict, **train: object) -> Path:
    values = json.loads(json.dumps(values))
    values["train"].update(train)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_resume_auto_on_the_command_line(data_values, tmp_path: Path) -> None:
    config, out = _config(tmp_path, data_values, max_steps=1), tmp_path / "run"
    command = ["train", "-c", str(config), "-o", str(out), "--no-test"]
    first = runner.invoke(app, [*command, "--resume", "auto"])
    assert first.exit_code == 0, first.output
    assert read_checkpoint(out / "last.pt")["state"]["global_step"] == 1
    again = runner.invoke(app, command)  # a plain rerun names every way on
    assert again.exit_code == 2
    assert "pass --resume (or --resume auto) to continue it, or --overwrite to start over" in " ".join(
        again.output.split()
    )
    longer = runner.invoke(app, [*command, "--resume", "auto", "--set", "train.max_steps=2"])
    assert longer.exit_code == 0, longer.output
    assert read_checkpoint(out / "last.pt")["state"]["global_step"] == 2
    for wrong in (["--resume", "later"], ["auto"]):
        result = runner.invoke(app, [*command, *wrong])
        assert result.exit_code == 2 and "the only word tvr train takes is 'auto', after --resume" in result.output


def test_a_preempted_command_exits_143_and_the_same_command_continues(
    data_values, tmp_path: Path, monkeypatch, caplog
) -> None:
    config, out = _config(tmp_path, data_values, epochs=2), tmp_path / "run"
    command = ["train", "-c", str(config), "-o", str(out), "--no-test", "--resume", "auto"]
    consume = trainer_module.Trainer._consume

    def signalled_during_step_1(self, *args):  # noqa: ANN001, ANN202
        trained = consume(self, *args)
        if self.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return trained

    monkeypatch.setattr(trainer_module.Trainer, "_consume", signalled_during_step_1)
    stopped = runner.invoke(app, command)
    assert stopped.exit_code == PREEMPTED_EXIT_CODE == 143, stopped.output
    assert "SIGTERM: training stopped after step 1 (epoch 1, batch 1)" in " ".join(stopped.output.split())
    # said once: a warning logged the same notice before the command printed it
    assert stopped.output.count("SIGTERM") == 1 and not [r for r in caplog.records if "SIGTERM" in r.getMessage()]
    state = read_checkpoint(out / "last.pt")["state"]
    assert (state["epoch"], state["batch_in_epoch"], state["global_step"]) == (0, 1, 1)
    monkeypatch.undo()
    finished = runner.invoke(app, command)
    assert finished.exit_code == 0, finished.output
    assert json.loads((out / "summary.json").read_text())["steps"] == 4

    straight = tmp_path / "straight"
    assert runner.invoke(app, ["train", "-c", str(config), "-o", str(straight), "--no-test"]).exit_code == 0
    for key, value in torch.load(straight / "last.pt", weights_only=True)["model"].items():
        assert torch.equal(torch.load(out / "last.pt", weights_only=True)["model"][key], value), key


def _signalled_at_the_last_epoch_end(phase: str):
    """Patches of the Trainer that send SIGTERM to this process during the last epoch end's ``phase``: the
    checkpoint written before its validation, the validation, or the checkpoint written after it."""
    at_end = lambda self: self.epoch == self.tc.epochs  # noqa: E731 - after the last epoch's counter moved on
    if phase == "validation":
        evaluate = trainer_module.Trainer._evaluate

        def during_validation(self):  # noqa: ANN001, ANN202
            if at_end(self):
                os.kill(os.getpid(), signal.SIGTERM)
            return evaluate(self)

        return "_evaluate", during_validation
    save = trainer_module.Trainer._save_last

    def during_checkpoint(self, pending_eval: bool = False):  # noqa: ANN001, ANN202
        if at_end(self) and pending_eval == (phase == "checkpoint before validation"):
            os.kill(os.getpid(), signal.SIGTERM)
        return save(self, pending_eval)

    return "_save_last", during_checkpoint


def _test_metrics(run: Path) -> dict:
    """The test metrics of the last and best checkpoints, without where the checkpoint lies and the scoring time."""
    metrics = {tag: json.loads((run / f"test_{tag}" / "metrics.json").read_text()) for tag in ("last", "best")}
    return {
        tag: {k: v for k, v in m.items() if k not in ("checkpoint", "scoring_seconds")} for tag, m in metrics.items()
    }


@pytest.mark.parametrize("phase", ["checkpoint before validation", "validation", "checkpoint after validation"])
def test_a_notice_during_the_last_epoch_end_stops_the_run_before_its_test(
    data_values, tmp_path: Path, monkeypatch, phase: str
) -> None:
    """The last epoch's end (checkpoint, validation, checkpoint) used to drop the notice: the run went on through
    the test and exited 0. It stops with exit 143 once last.pt holds the finished training, and the same command
    then runs the test, ending bit-identical to a run that never stopped."""
    config, out = _config(tmp_path, data_values, epochs=2), tmp_path / "run"
    command = ["train", "-c", str(config), "-o", str(out), "--resume", "auto"]
    monkeypatch.setattr(trainer_module.Trainer, *_signalled_at_the_last_epoch_end(phase))
    stopped = runner.invoke(app, command)
    assert stopped.exit_code == PREEMPTED_EXIT_CODE, stopped.output
    assert "SIGTERM: training stopped after its last step (4)" in " ".join(stopped.output.split())
    state = read_checkpoint(out / "last.pt")["state"]
    assert (state["epoch"], state["batch_in_epoch"], state["global_step"], state["pending_eval"]) == (2, 0, 4, False)
    assert not (out / "test_last").exists() and not (out / "summary.json").exists()
    monkeypatch.undo()
    finished = runner.invoke(app, command)
    assert finished.exit_code == 0, finished.output
    assert json.loads((out / "summary.json").read_text())["steps"] == 4

    straight = tmp_path / "straight"
    assert runner.invoke(app, ["train", "-c", str(config), "-o", str(straight)]).exit_code == 0
    for name in ("last.pt", "best.pt"):
        ours = torch.load(out / name, weights_only=True)["model"]
        for key, value in torch.load(straight / name, weights_only=True)["model"].items():
            assert torch.equal(ours[key], value), (name, key)
    assert _log_records(out) == _log_records(straight) and _test_metrics(out) == _test_metrics(straight)


# --------------------------------------------------------------------------------------------- torchrun


def _children(parent: int) -> dict[int, int]:
    """rank → pid of the processes ``parent`` started (torchrun's workers), from /proc."""
    ranks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != parent:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        rank = [entry[5:] for entry in environ if entry.startswith(b"RANK=")]
        if rank:
            ranks[int(rank[0])] = int(stat.parent.name)
    return ranks


def _straight_run(rank: int, world: int, info, values: dict, out: str) -> None:  # noqa: ANN001
    from tvr.pipeline import run_train

    run_train(config_from_dict(values), out, final_test=False)


def _log_records(run: Path) -> list[dict]:
    """The training log without wall-clock figures (validation records: step and metrics)."""
    records = []
    for r in read_jsonl(run / "train_log.jsonl"):
        if r["kind"] == "eval":
            records.append({"step": r["step"], **{k: v for k, v in r["metrics"].items() if k != "info"}})
        else:
            records.append({k: v for k, v in r.items() if k not in ("seconds", "it_s")})
    return records


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
def test_torchrun_max_restarts_continues_a_preempted_run_with_the_same_command(data_values, tmp_path: Path) -> None:
    """Two workers under ``torchrun --max-restarts 1`` run ``tvr train --resume auto``; rank 1 alone gets SIGUSR1
    mid-run: both workers stop after the same step and exit 143, torchrun restarts them with the same command, they
    continue from last.pt, and the run ends bit-identical to a two-process run that never stopped."""
    values = json.loads(json.dumps(data_values))
    values["train"].update({"epochs": 5, "num_threads": 0})  # 2 steps per epoch; threads: OMP_NUM_THREADS=1
    config = _config(tmp_path, values)
    out, log = tmp_path / "run", tmp_path / "torchrun.log"
    command = [
        torchrun(), "--standalone", "--nproc_per_node", "2", "--max-restarts", "1", "--monitor-interval", "0.5",
        "-m", "tvr.cli", "train", "-c", str(config), "-o", str(out), "--no-test", "--resume", "auto",
    ]  # fmt: skip
    # torch 2.13's c10d rendezvous shares its store with the workers, and restarted workers then read the previous
    # round's addresses and fail to connect (pytorch/pytorch#135712): docs/scaling.md gives this setting
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agent = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and agent.poll() is None:
            logged = out / "train_log.jsonl"
            if logged.is_file() and len(logged.read_text().splitlines()) >= 2:
                break
            time.sleep(0.1)
        workers = _children(agent.pid)
        assert sorted(workers) == [0, 1], log.read_text()[-3000:]
        os.kill(workers[1], signal.SIGUSR1)
        code = agent.wait(timeout=420)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert "SIGUSR1: training stopped after step" in text and "(exitcode: 143)" in text, text[-4000:]
    assert "resumed from" in text, text[-4000:]
    # each start's warnings and validations said by one rank, not by every rank
    assert text.count("the validation split has only") == 2 and text.count("step 2: t2v/R1") == 1, text[-4000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 10

    run_two_processes(_straight_run, values, str(tmp_path / "straight"))
    ours = torch.load(out / "last.pt", weights_only=True)["model"]
    for key, value in torch.load(tmp_path / "straight" / "last.pt", weights_only=True)["model"].items():
        assert torch.equal(ours[key], value), key
    assert _log_records(out) == _log_records(tmp_path / "straight")
