"""Checkpoints and the training loop: bit-for-bit resume (after an exception, after SIGKILL at an epoch end and
mid-epoch, after a preemption signal), ``resume="auto"``, atomic saves, clear load errors, skipped-video reporting,
best-checkpoint selection, grad clipping, logit-scale clamping."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tvr.config import Config, TrainConfig
from tvr.losses import symmetric_infonce
from tvr.models.heads.base import RetrievalHead
from tvr.models.model import RetrievalModel
from tvr.train.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from tvr.train.logging import read_jsonl
from tvr.train.preemption import PREEMPTED_EXIT_CODE, PreemptedError
from tvr.train.schedule import warmup_cosine
from tvr.train.trainer import DatasetTrainData, Trainer

DIM, EMB, FRAMES, N_ITEMS, BATCH, EPOCHS = 8, 6, 4, 24, 4, 3  # 6 batches per epoch, 18 steps


# --------------------------------------------------------------------------------------------- toy set-up


class IdentityTemporal(nn.Module):
    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return frames


class ToyHead(RetrievalHead):
    """Linear projections + masked mean + symmetric InfoNCE; dropout so the RNG stream matters."""

    def __init__(self, dropout: float = 0.25, logit_scale_init: float = math.log(10.0), logit_scale_max: float = 4.6):
        super().__init__(DIM, logit_scale_init=logit_scale_init, logit_scale_max=logit_scale_max)
        self.text_proj = nn.Linear(DIM, EMB)
        self.video_proj = nn.Linear(DIM, EMB)
        self.norm = nn.LayerNorm(EMB)
        self.drop = nn.Dropout(dropout)

    def encode_texts(self, text):
        return F.normalize(self.drop(self.text_proj(text.eot)), dim=-1)

    def encode_videos(self, video):
        x = self.video_proj(video.frames)
        m = video.frame_mask.float().unsqueeze(-1)
        x = (x * m).sum(1) / m.sum(1).clamp(min=1.0)
        return F.normalize(self.drop(self.norm(x)), dim=-1)

    def score_block(self, text_state, video_state):
        return text_state @ video_state.t()

    def loss(self, text, video):
        logits = self.logit_scale.exp() * self.score_block(self.encode_texts(text), self.encode_videos(video))
        loss = symmetric_infonce(logits)
        return {"loss": loss, "infonce": loss.detach(), "scale": self.logit_scale.detach().exp()}


def make_model(seed: int = 0, **head_kwargs) -> RetrievalModel:
    torch.manual_seed(seed)
    return RetrievalModel(None, IdentityTemporal(), ToyHead(**head_kwargs))


class ToyDataset(torch.utils.data.Dataset):
    """Cached-feature pairs; ``__getitem__`` adds noise from the global torch RNG (data randomness must resume too).
    Items listed in ``bad`` are unreadable."""

    def __init__(self, n: int = N_ITEMS, bad: tuple[int, ...] = ()) -> None:
        g = torch.Generator().manual_seed(123)
        self.frames = torch.randn(n, FRAMES, DIM, generator=g)
        self.mask = torch.ones(n, FRAMES, dtype=torch.long)
        self.mask[::3, -1] = 0
        self.text = self.frames.mean(1) + 0.3 * torch.randn(n, DIM, generator=g)
        self.bad = set(bad)
        self.loaded: list[int] = []
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, k: int) -> dict:
        self.loaded.append(k)
        if k in self.bad:
            return {"video_id": f"v{k}", "error": "unreadable"}
        return {
            "text_eot": self.text[k] + 0.05 * torch.randn(DIM),
            "frame_feats": self.frames[k],
            "video_mask": self.mask[k],
            "video_id": f"v{k}",
        }


def collate(items: list[dict]) -> dict:
    good = [i for i in items if "error" not in i]
    out = {
        "video_ids": [i["video_id"] for i in good],
        "skipped": [i["video_id"] for i in items if "error" in i],
        "errors": [i["error"] for i in items if "error" in i],
    }
    if good:
        for key in ("text_eot", "frame_feats", "video_mask"):
            out[key] = torch.stack([i[key] for i in good])
    return out


def make_config(**train) -> Config:
    values = dict(
        epochs=EPOCHS,
        batch_size=BATCH,
        lr=1e-2,
        backbone_lr_coef=1.0,
        warmup=0.1,
        seed=3,
        device="cpu",
        save_every_steps=4,
        log_every=1,
        eval_every=5,
        grad_clip=1.0,
    )
    values.update(train)
    return Config(train=TrainConfig(**values))


class ToyEval:
    """t2v R@1 on a fixed validation set; draws from the global RNG to prove validation does not disturb training."""

    def __init__(self) -> None:
        ds = ToyDataset(n=10)
        self.text, self.frames, self.mask = ds.text, ds.frames, ds.mask
        self.calls = 0

    def __call__(self, model: RetrievalModel) -> dict:
        self.calls += 1
        torch.rand(3)
        head = model.head
        from tvr.types import TextFeatures, VideoFeatures

        t = head.encode_texts(TextFeatures(self.text))
        v = head.encode_videos(VideoFeatures(self.frames, self.mask))
        scores = head.score_block(t, v)
        r1 = (scores.argmax(1) == torch.arange(len(t))).float().mean().item() * 100
        return {"t2v": {"R1": r1, "MdR": 1.0}, "info": {"n": len(t)}}


def make_trainer(out_dir: Path, model=None, dataset=None, cfg=None, evaluate=True, **kwargs) -> Trainer:
    cfg = cfg or make_config()
    dataset = dataset or ToyDataset()
    data = DatasetTrainData(dataset, cfg.train.batch_size, collate, seed=cfg.train.seed)
    return Trainer(model or make_model(), cfg, data, out_dir, evaluate_fn=ToyEval() if evaluate else None, **kwargs)


def train_records(out_dir: Path) -> list[dict]:
    """Training log records without wall-clock fields."""
    drop = {"seconds", "it_s", "eval_seconds"}
    return [{k: v for k, v in r.items() if k not in drop} for r in read_jsonl(out_dir / "train_log.jsonl")]


def assert_same_params(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


class StopError(Exception):
    pass


# --------------------------------------------------------------------------------------------- full runs


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> tuple[Path, RetrievalModel, dict]:
    out = tmp_path_factory.mktemp("full")
    trainer = make_trainer(out)
    summary = trainer.fit()
    return out, trainer.model, summary


def test_full_run_logs_schedule_and_summary(full_run) -> None:
    out, model, summary = full_run
    total = EPOCHS * (N_ITEMS // BATCH)
    assert summary["steps"] == total and summary["epochs"] == EPOCHS and not summary["stopped_early"]
    records = [r for r in read_jsonl(out / "train_log.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == list(range(1, total + 1))
    for r in records:
        # the lr logged at step k is the one that step used: lr · f((k − 1) / t_total)
        assert r["lr"]["head"] == pytest.approx(1e-2 * warmup_cosine((r["step"] - 1) / total, 0.1), abs=1e-15)
        assert set(r) >= {"loss", "infonce", "scale", "grad_norm", "loss_avg", "epoch", "batch", "seconds"}
    assert summary["final_loss"] == records[-1]["loss"]
    # the CSV mirrors the JSONL, with the lr flattened per group
    lines = (out / "train_log.csv").read_text().splitlines()
    assert len(lines) == total + 1 and "lr/head" in lines[0].split(",")
    evals = read_jsonl(out / "val_log.jsonl")
    # every 5 steps (5, 10, 15) plus the three epoch ends (6, 12, 18)
    assert [e["step"] for e in evals] == [5, 6, 10, 12, 15, 18]
    best = max(evals, key=lambda e: (e["value"], -e["step"]))
    assert summary["best_metric"] == best["value"] and summary["best_step"] == best["step"]
    assert read_checkpoint(out / "best.pt")["state"]["global_step"] == best["step"]
    last = read_checkpoint(out / "last.pt")["state"]
    assert (last["epoch"], last["batch_in_epoch"], last["global_step"]) == (EPOCHS, 0, total)


def test_resume_after_exception_is_bit_exact(full_run, tmp_path) -> None:
    full_out, full_model, _ = full_run

    def crash(trainer, record):
        if trainer.global_step == 11:
            raise StopError

    with pytest.raises(StopError):
        make_trainer(tmp_path, step_callback=crash).fit()
    state = read_checkpoint(tmp_path / "last.pt")["state"]
    assert (state["global_step"], state["epoch"], state["batch_in_epoch"]) == (8, 1, 2)  # mid-epoch
    assert max(r["step"] for r in read_jsonl(tmp_path / "train_log.jsonl")) == 11

    resumed = make_trainer(tmp_path, model=make_model(seed=99))
    summary = resumed.fit(resume=True)
    assert summary["steps"] == EPOCHS * (N_ITEMS // BATCH)
    assert_same_params(resumed.model, full_model)
    assert train_records(tmp_path) == train_records(full_out)
    assert [e["metrics"] for e in read_jsonl(tmp_path / "val_log.jsonl")] == [
        e["metrics"] for e in read_jsonl(full_out / "val_log.jsonl")
    ]


class FailingEval(ToyEval):
    """Fails on its ``fail_on``-th call, like a validation whose videos all turned out unreadable."""

    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.fail_on = fail_on

    def __call__(self, model: RetrievalModel) -> dict:
        if self.calls + 1 == self.fail_on:
            self.calls += 1
            raise StopError("validation failed")
        return super().__call__(model)


def test_failed_epoch_end_validation_keeps_the_finished_training(full_run, tmp_path) -> None:
    """The epoch-end checkpoint is written before the validation: a validation that fails costs nothing, and
    resuming runs the pending validation first, then goes on exactly as the uninterrupted run."""
    full_out, full_model, _ = full_run
    trainer = make_trainer(tmp_path)
    trainer.evaluate_fn = FailingEval(fail_on=4)  # evaluations at steps 5, 6, 10, 12: the one at epoch end 2
    with pytest.raises(StopError):
        trainer.fit()
    state = read_checkpoint(tmp_path / "last.pt")["state"]
    assert (state["global_step"], state["epoch"], state["batch_in_epoch"]) == (12, 2, 0)
    assert state["pending_eval"] is True
    assert [e["step"] for e in read_jsonl(tmp_path / "val_log.jsonl")] == [5, 6, 10]

    resumed = make_trainer(tmp_path, model=make_model(seed=99))
    summary = resumed.fit(resume=True)
    assert summary["steps"] == EPOCHS * (N_ITEMS // BATCH)
    assert_same_params(resumed.model, full_model)
    assert train_records(tmp_path) == train_records(full_out)
    assert [(e["step"], e["metrics"]) for e in read_jsonl(tmp_path / "val_log.jsonl")] == [
        (e["step"], e["metrics"]) for e in read_jsonl(full_out / "val_log.jsonl")
    ]
    assert read_checkpoint(tmp_path / "last.pt")["state"]["pending_eval"] is False


def test_kill_between_a_validation_record_and_its_checkpoint_logs_it_once(full_run, tmp_path) -> None:
    """The epoch-end validation is logged, then the run dies before the checkpoint that records it: the resume
    runs that validation again, and its record appears once, as in the uninterrupted run."""
    full_out, full_model, _ = full_run
    trainer = make_trainer(tmp_path)
    log_eval = trainer.logger.eval

    def log_then_die(record: dict) -> None:
        log_eval(record)
        if record["step"] == 12:  # the epoch-end validation of epoch 2
            raise StopError("killed after the log line")

    trainer.logger.eval = log_then_die
    with pytest.raises(StopError):
        trainer.fit()
    assert read_checkpoint(tmp_path / "last.pt")["state"]["pending_eval"] is True
    assert [e["step"] for e in read_jsonl(tmp_path / "val_log.jsonl")] == [5, 6, 10, 12]

    resumed = make_trainer(tmp_path, model=make_model(seed=99))
    resumed.fit(resume=True)
    assert_same_params(resumed.model, full_model)
    assert [e["step"] for e in read_jsonl(tmp_path / "val_log.jsonl")] == [5, 6, 10, 12, 15, 18]
    assert train_records(tmp_path) == train_records(full_out)
    evals = [(r["step"], r["metrics"]) for r in read_jsonl(tmp_path / "train_log.jsonl") if r["kind"] == "eval"]
    assert evals == [(r["step"], r["metrics"]) for r in read_jsonl(full_out / "train_log.jsonl") if r["kind"] == "eval"]


def _child(out_dir: str, kill_step: int, threads: int) -> None:
    """Entry point of the subprocesses of the SIGKILL and second-signal tests: train, and at ``kill_step`` say READY
    and wait inside the step's callback."""
    torch.set_num_threads(threads)

    def announce(trainer, record):
        if trainer.global_step == kill_step:
            print("READY", flush=True)
            time.sleep(120)

    make_trainer(Path(out_dir), step_callback=announce).fit()


def _start_child(out_dir: Path, kill_step: int) -> subprocess.Popen:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_checkpoint_resume as t; "
        f"t._child({str(out_dir)!r}, {kill_step}, {torch.get_num_threads()})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        proc.wait()
        pytest.fail(f"the training subprocess did not reach step {kill_step}:\n{proc.stderr.read()}")
    return proc


def _signal_child(proc: subprocess.Popen, *signums: int) -> int:
    """Send ``signums`` in turn (the child must outlive every one but the last) and return its exit status; the child
    never outlives the test."""
    try:
        for k, signum in enumerate(signums):
            if k:
                time.sleep(0.5)  # let the handler run, not a measurement
                assert proc.poll() is None, f"signal {signums[k - 1]} ended the child:\n{proc.stderr.read()}"
            os.kill(proc.pid, signum)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


# save_every_steps=4 with 6 batches per epoch: last.pt at steps 4, 6 (epoch end), 8, 12 (epoch end), 16, 18
@pytest.mark.parametrize(("kill_step", "position"), [(15, (12, 2, 0)), (10, (8, 1, 2))], ids=["epoch_end", "mid_epoch"])
def test_resume_after_sigkill_is_bit_exact(full_run, tmp_path, kill_step, position) -> None:
    full_out, full_model, _ = full_run
    assert _signal_child(_start_child(tmp_path, kill_step), signal.SIGKILL) == -signal.SIGKILL
    state = read_checkpoint(tmp_path / "last.pt")["state"]
    assert (state["global_step"], state["epoch"], state["batch_in_epoch"]) == position
    assert not list(tmp_path.glob(".*.tmp"))

    resumed = make_trainer(tmp_path, model=make_model(seed=7))
    resumed.fit(resume=str(tmp_path / "last.pt"))
    assert_same_params(resumed.model, full_model)
    assert train_records(tmp_path) == train_records(full_out)


def _signal_self(at_step: int, signum: int = signal.SIGTERM):
    """A step callback that sends this process ``signum`` once, during step ``at_step``."""

    def send(trainer, record):
        if trainer.global_step == at_step:
            os.kill(os.getpid(), signum)

    return send


@pytest.mark.parametrize(
    ("at_step", "signum", "position"),
    [(10, signal.SIGTERM, (1, 4, 10)), (12, signal.SIGUSR1, (2, 0, 12))],
    ids=["mid_epoch", "epoch_end"],
)
def test_a_preemption_signal_stops_after_the_step_and_the_resume_is_bit_exact(
    full_run, tmp_path, at_step, signum, position
) -> None:
    """The signal arrives during a step: that step finishes, last.pt is written once at the position after it (at
    an epoch end the epoch-end checkpoint and validation come first, then nothing more is written), the run stops
    with PreemptedError, and the previous handler is back. The resume equals the uninterrupted run."""
    full_out, full_model, _ = full_run
    before = signal.getsignal(signum)
    trainer = make_trainer(tmp_path, step_callback=_signal_self(at_step, signum))
    saves = []
    save_last = trainer._save_last
    trainer._save_last = lambda pending_eval=False: (
        saves.append((trainer.global_step, pending_eval)) or save_last(pending_eval)
    )
    with pytest.raises(PreemptedError, match=rf"{signal.Signals(signum).name}: training stopped after step {at_step}"):
        trainer.fit()
    assert signal.getsignal(signum) == before
    state = read_checkpoint(tmp_path / "last.pt")["state"]
    assert (state["epoch"], state["batch_in_epoch"], state["global_step"]) == position
    assert state["pending_eval"] is False
    # every checkpoint of the uninterrupted run up to here, then the one of the stop (at an epoch end: none more)
    expected = [(4, False), (6, True), (6, False), (8, False)] + ([(10, False)] if at_step == 10 else [])
    expected += [(12, True), (12, False)] if at_step == 12 else []
    assert saves == expected
    assert max(r["step"] for r in read_jsonl(tmp_path / "train_log.jsonl")) == at_step

    resumed = make_trainer(tmp_path, model=make_model(seed=99))
    resumed.fit(resume="auto")
    assert_same_params(resumed.model, full_model)
    assert train_records(tmp_path) == train_records(full_out)
    assert [e["metrics"] for e in read_jsonl(tmp_path / "val_log.jsonl")] == [
        e["metrics"] for e in read_jsonl(full_out / "val_log.jsonl")
    ]


def test_a_second_signal_ends_the_process_at_once(tmp_path) -> None:
    """The first SIGTERM is recorded while the step's callback still runs; the second, before that step is over,
    ends the process with the signal's default action: no checkpoint of the interrupted step, no temporary left."""
    assert _signal_child(_start_child(tmp_path, 10), signal.SIGTERM, signal.SIGTERM) == -signal.SIGTERM
    state = read_checkpoint(tmp_path / "last.pt")["state"]
    assert (state["global_step"], state["epoch"], state["batch_in_epoch"]) == (8, 1, 2)
    assert not list(tmp_path.glob(".*.tmp"))


def test_preemption_signals_can_be_turned_off(tmp_path) -> None:
    """``preemption_signals: []`` leaves the signals alone: SIGUSR1 keeps the handler it had."""
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        cfg = make_config(max_steps=3, preemption_signals=())
        make_trainer(tmp_path, cfg=cfg, evaluate=False, step_callback=_signal_self(2, signal.SIGUSR1)).fit()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [signal.SIGUSR1]
    assert read_checkpoint(tmp_path / "last.pt")["state"]["global_step"] == 3
    assert PREEMPTED_EXIT_CODE == 128 + signal.SIGTERM


def test_resume_auto_starts_a_new_run_or_continues_the_one_there(full_run, tmp_path) -> None:
    full_out, full_model, _ = full_run

    def crash(trainer, record):
        if trainer.global_step == 9:
            raise StopError

    with pytest.raises(StopError):
        make_trainer(tmp_path, step_callback=crash).fit(resume="auto")  # no last.pt: a new run
    assert read_checkpoint(tmp_path / "last.pt")["state"]["global_step"] == 8
    resumed = make_trainer(tmp_path, model=make_model(seed=5))
    resumed.fit(resume="auto")  # last.pt: continued
    assert_same_params(resumed.model, full_model)
    assert train_records(tmp_path) == train_records(full_out)


def test_resume_mid_epoch_without_evaluation_matches(tmp_path) -> None:
    """Validation is RNG-neutral: the same run with and without evaluate_fn trains identically."""
    a = make_trainer(tmp_path / "a", cfg=make_config(max_steps=9))
    a.fit()
    b = make_trainer(tmp_path / "b", cfg=make_config(max_steps=9, save_every_steps=0), evaluate=False)
    summary = b.fit()
    assert summary["stopped_early"] and summary["steps"] == 9
    assert_same_params(a.model, b.model)
    # max_steps leaves a resumable checkpoint mid-epoch; resuming with a larger budget continues from there
    state = read_checkpoint(tmp_path / "b" / "last.pt")["state"]
    assert (state["epoch"], state["batch_in_epoch"], state["global_step"]) == (1, 3, 9)


# --------------------------------------------------------------------------------------------- checkpoint files


def test_failed_save_leaves_previous_checkpoint(tmp_path, monkeypatch) -> None:
    model = make_model()
    path = tmp_path / "last.pt"
    save_checkpoint(path, model, state={"global_step": 1})
    before = path.read_bytes()

    def broken_save(obj, handle, *args, **kwargs):
        handle.write(b"partial garbage")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with torch.no_grad():
        model.head.text_proj.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, state={"global_step": 2})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    fresh = make_model()
    assert load_checkpoint(path, fresh)["global_step"] == 1


def test_checkpoint_roundtrip_restores_everything(tmp_path) -> None:
    import random

    import numpy as np

    trainer = make_trainer(tmp_path, cfg=make_config(max_steps=3), evaluate=False)
    trainer.fit()
    model, opt, sched = trainer.model, trainer.optimizer, trainer.scheduler
    save_checkpoint(tmp_path / "c.pt", model, opt, sched, None, {"global_step": 3, "best_metric": 0.5})
    expected = (random.random(), np.random.rand(), torch.rand(2))

    other = make_trainer(tmp_path / "other", model=make_model(seed=5), evaluate=False)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    state = load_checkpoint(tmp_path / "c.pt", other.model, other.optimizer, other.scheduler)
    assert state["global_step"] == 3 and state["best_metric"] == 0.5
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(2), expected[2])
    assert_same_params(other.model, model)
    assert other.scheduler.last_epoch == sched.last_epoch == 3
    assert other.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for p_new, p_old in zip(other.params, trainer.params, strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(other.optimizer.state[p_new][key], opt.state[p_old][key])


def test_load_errors_name_the_file(tmp_path) -> None:
    model = make_model()
    missing = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match="nope.pt"):
        load_checkpoint(missing, model)

    path = tmp_path / "ok.pt"
    save_checkpoint(path, model, state={})
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="corrupt.pt.*not a readable checkpoint: a torch.save archive"):
        load_checkpoint(corrupt, model)
    text = tmp_path / "notes.pt"
    text.write_text("hello, this is not a checkpoint\n")
    with pytest.raises(CheckpointError, match=r"notes.pt: not a readable checkpoint: a text file, expected a checkp"):
        load_checkpoint(text, model)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="an empty file"):
        load_checkpoint(tmp_path / "empty.pt", model)

    other = RetrievalModel(None, IdentityTemporal(), ToyHead())
    other.head.extra = nn.Linear(2, 2)
    del other.head.norm
    other.head.text_proj = nn.Linear(DIM, EMB + 1)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, other)
    message = str(info.value)
    assert "ok.pt" in message
    assert "head.extra.weight" in message  # missing from the file
    assert "head.norm.weight" in message  # unexpected in the file
    assert "head.text_proj.weight: checkpoint (6, 8) vs model (7, 8)" in message

    # best.pt holds weights only: resuming an optimizer from it is refused
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load_checkpoint(path, model, opt)


def test_resume_without_checkpoint_is_an_error(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="last.pt"):
        make_trainer(tmp_path, evaluate=False).fit(resume=True)


# --------------------------------------------------------------------------------------------- loop details


class ScriptedData:
    """TrainData yielding, per epoch: a good batch, an all-unreadable batch, a partially unreadable batch."""

    def __init__(self) -> None:
        self.ds = ToyDataset()

    def len_epoch(self) -> int:
        return 3

    def batches(self, epoch: int, start_batch: int = 0):
        plans = [[0, 1, 2, 3], [], [4, 5, 6]]
        skipped = [[], ["bad1", "bad2"], ["bad3"] if epoch == 0 else ["bad1"]]
        for k in range(start_batch, 3):
            batch = collate([self.ds[i] for i in plans[k]]) if plans[k] else {"video_ids": []}
            batch["skipped"] = skipped[k]
            batch["errors"] = [f"cannot decode {v}" for v in skipped[k]]
            yield batch


def test_skipped_videos_reported_and_empty_batches_skipped(tmp_path) -> None:
    cfg = make_config(epochs=2, save_every_steps=0, eval_every=0)
    trainer = Trainer(make_model(), cfg, ScriptedData(), tmp_path)
    summary = trainer.fit()
    assert summary["steps"] == 4  # 2 of 3 batches per epoch train
    report = json.loads((tmp_path / "skipped_videos.json").read_text())
    assert report == {
        "count": 3,
        "videos": [
            {"id": "bad1", "error": "cannot decode bad1"},
            {"id": "bad2", "error": "cannot decode bad2"},
            {"id": "bad3", "error": "cannot decode bad3"},
        ],
    }
    assert summary["skipped_videos"] == 3
    assert read_checkpoint(tmp_path / "last.pt")["state"]["skipped"][2]["id"] == "bad3"


def test_skipped_report_written_when_the_run_dies(tmp_path) -> None:
    def crash(trainer, record):
        raise StopError

    trainer = Trainer(make_model(), make_config(), ScriptedData(), tmp_path, step_callback=crash)
    with pytest.raises(StopError):
        trainer.fit()
    assert json.loads((tmp_path / "skipped_videos.json").read_text())["count"] == 0

    def crash_at_2(trainer, record):
        if trainer.global_step == 2:  # the third batch of epoch 0: after the empty one, with bad3
            raise StopError

    trainer = Trainer(make_model(), make_config(), ScriptedData(), tmp_path / "b", step_callback=crash_at_2)
    with pytest.raises(StopError):
        trainer.fit()
    report = json.loads((tmp_path / "b" / "skipped_videos.json").read_text())
    assert [v["id"] for v in report["videos"]] == ["bad1", "bad2", "bad3"]


def test_dataset_unreadable_items_are_skipped(tmp_path) -> None:
    dataset = ToyDataset(bad=tuple(range(N_ITEMS - 4)))  # most items unreadable: some batches come back empty
    cfg = make_config(epochs=1, save_every_steps=0, eval_every=0)
    data = DatasetTrainData(dataset, BATCH, collate, seed=cfg.train.seed)
    plan = data.epoch_plan(0)
    expected_steps = sum(any(i >= N_ITEMS - 4 for i in b) for b in plan)
    assert 0 < expected_steps < len(plan)
    summary = Trainer(make_model(), cfg, data, tmp_path).fit()
    assert summary["steps"] == expected_steps
    report = json.loads((tmp_path / "skipped_videos.json").read_text())
    assert report["count"] == N_ITEMS - 4
    assert {v["id"] for v in report["videos"]} == {f"v{k}" for k in range(N_ITEMS - 4)}


def test_gradient_clipping_applied(tmp_path) -> None:
    clip = 1e-3
    norms = []

    def check(trainer, record):
        total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.params if p.grad is not None]))
        norms.append((record["grad_norm"], float(total)))

    make_trainer(tmp_path, cfg=make_config(grad_clip=clip, max_steps=4), evaluate=False, step_callback=check).fit()
    assert len(norms) == 4
    for before, after in norms:
        assert before > clip  # the raw norm was larger ...
        assert after == pytest.approx(clip, rel=1e-4)  # ... and the gradient the optimizer saw was clipped


def test_logit_scale_clamped_after_every_step(tmp_path) -> None:
    seen = []
    model = make_model(logit_scale_init=5.0, logit_scale_max=2.0)
    make_trainer(
        tmp_path,
        model=model,
        cfg=make_config(max_steps=2, lr=1e-3),
        evaluate=False,
        step_callback=lambda t, r: seen.append(t.model.head.logit_scale.item()),
    ).fit()
    # one AdamW step moves a parameter by about lr (1e-3), so only the clamp can take it from 5 to 2
    assert seen[0] == 2.0
    assert 2.0 - 2e-3 < seen[1] <= 2.0


def test_best_checkpoint_follows_select_metric(tmp_path) -> None:
    values = iter([10.0, 30.0, 20.0, 30.0])

    def evaluate(model):
        return {"t2v": {"R1": next(values)}, "v2t": {"R1": 0.0}}

    cfg = make_config(epochs=2, eval_every=2, save_every_steps=0)
    data = DatasetTrainData(ToyDataset(n=12), BATCH, collate, seed=1)  # 3 steps per epoch
    summary = Trainer(make_model(), cfg, data, tmp_path, evaluate_fn=evaluate).fit()
    evals = read_jsonl(tmp_path / "val_log.jsonl")
    assert [(e["step"], e["value"], e["best"]) for e in evals] == [
        (2, 10, True),
        (3, 30, True),
        (4, 20, False),
        (6, 30, False),
    ]
    assert summary["best_metric"] == 30.0 and summary["best_step"] == 3
    best = read_checkpoint(tmp_path / "best.pt")
    assert best["state"]["global_step"] == 3 and best["optimizer"] is None

    bad = make_config(epochs=1, select_metric="t2v/R5")
    data = DatasetTrainData(ToyDataset(n=4), BATCH, collate, seed=1)
    with pytest.raises(KeyError, match="t2v/R1"):
        Trainer(make_model(), bad, data, tmp_path / "bad", evaluate_fn=lambda m: {"t2v": {"R1": 1.0}}).fit()


class _WorkerSignals(torch.utils.data.Dataset):
    """Reports, from inside the DataLoader worker that loads it, whether SIGUSR1 is ignored there."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, k: int) -> dict:
        return {"ignored": torch.tensor(signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)}


def test_dataloader_workers_ignore_the_preemption_signals() -> None:
    """A signal sent to the whole process group must not kill the workers while the main process checkpoints."""
    for names, expected in ((("SIGUSR1",), True), ((), False)):
        data = DatasetTrainData(_WorkerSignals(), 2, seed=0, num_workers=1, worker_ignored_signals=names)
        assert [bool(b["ignored"].all()) for b in data.batches(0)] == [expected, expected]
    assert signal.getsignal(signal.SIGUSR1) != signal.SIG_IGN  # the main process keeps its own handler
