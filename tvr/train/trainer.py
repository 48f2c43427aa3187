"""The training loop: any :class:`RetrievalModel` over any :class:`TrainData`, resumable bit for bit.

Per step: move the batch to the device, ``model(batch)["loss"]`` (under autocast with ``train.amp``, see
:mod:`tvr.train.precision`), backward, clip the global norm, optimizer step, scheduler step,
``model.after_optimizer_step()`` (clamps the logit scale). Validation follows ``eval_every`` and every epoch end;
``last.pt`` is written every ``save_every_steps`` steps and at every epoch end.

Under torchrun the model is wrapped in DistributedDataParallel (:func:`tvr.train.distributed.wrap_model`), which
averages gradients over ranks during the backward; only the training forward goes through the wrapper. Validation
(rank 0), checkpoints, the optimizer and the logit-scale clamp use the unwrapped module, so checkpoints hold the
same keys however many ranks wrote them.

Resuming. ``last.pt`` stores the model, optimizer, scheduler, grad scaler, every rank's RNG states and the loop
position (epoch, next batch of the epoch, global step). Data order is a pure function of (seed, epoch)
(:class:`DatasetTrainData`), validation runs with the training RNG put aside, and logs are cut back to the
checkpoint's step, so ``fit(resume=True)`` after a crash reproduces an uninterrupted run exactly, from an epoch end
or from the middle of an epoch.

Preemption. While training, the ``train.preemption_signals`` (:mod:`tvr.train.preemption`) stop the run after the
current step: every rank stops after the same step, ``last.pt`` is written at that position and
:class:`~tvr.train.preemption.PreemptedError` is raised; a resume continues as if nothing had happened.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tvr.config import Config
from tvr.train.checkpoint import (
    CheckpointError,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from tvr.train.data import DatasetTrainData, TrainData
from tvr.train.distributed import wrap_model
from tvr.train.logging import RunLogger, TrainProgress
from tvr.train.optim import build_optimizer, current_lrs
from tvr.train.precision import autocast, autocast_dtype, grad_scaler
from tvr.train.preemption import PreemptedError, PreemptionWatch
from tvr.train.schedule import build_scheduler
from tvr.train.utils import (
    batch_item_count,
    higher_is_better,
    lookup_metric,
    move_to_device,
    preserve_rng,
    seed_everything,
    skipped_entries,
    to_jsonable,
)
from tvr.utils.distributed import all_gather_object, all_reduce_max, barrier
from tvr.utils.io import atomic_write_json
from tvr.utils.process_group import DistInfo, init_distributed
from tvr.utils.progress import progress_enabled

__all__ = ["DatasetTrainData", "TrainData", "Trainer", "seed_everything"]

log = logging.getLogger("tvr.train")

LAST = "last.pt"
BEST = "best.pt"
SKIPPED = "skipped_videos.json"

#: ``step_callback(trainer, record)`` runs after every optimizer step (and its checkpoint); raising stops the run
StepCallback = Callable[["Trainer", dict[str, Any]], None]


class Trainer:
    """Train ``model`` on ``train_data`` with the recipe in ``cfg.train``; write logs and checkpoints to ``out_dir``.

    ``model(batch)`` must return a dict with a ``"loss"`` entry (:meth:`RetrievalModel.forward`).
    ``evaluate_fn(model) -> metrics`` (nested dict, e.g. ``{"t2v": {"R1": ...}}``) is called with the unwrapped model
    on ranks that have one; ``cfg.train.select_metric`` (a ``/`` path) picks ``best.pt``. Under torchrun give every
    rank a sharded evaluator (``SplitEvaluator(..., distributed=True)``, every rank gets the same metrics), or pass
    ``evaluate_fn=None`` on non-main ranks to validate on rank 0 alone. ``find_unused_parameters`` is passed to
    DistributedDataParallel (see :mod:`tvr.train.distributed`); leave it off unless a trainable parameter takes no
    part in the loss.

    ``self.model`` is the unwrapped module; ``self.train_model`` is what the training step calls (the DDP wrapper
    under torchrun, the module itself otherwise).
    """

    def __init__(
        self,
        model: Any,
        cfg: Config,
        train_data: TrainData,
        out_dir: str | Path,
        evaluate_fn: Callable[[Any], dict[str, Any]] | None = None,
        *,
        dist_info: DistInfo | None = None,
        step_callback: StepCallback | None = None,
        find_unused_parameters: bool = False,
    ) -> None:
        if not isinstance(train_data, TrainData):
            raise TypeError(f"train_data must provide len_epoch() and batches(epoch, start_batch); got {train_data!r}")
        self.cfg = cfg
        self.tc = cfg.train
        self.train_data = train_data
        self.out_dir = Path(out_dir)
        self.evaluate_fn = evaluate_fn
        self.step_callback = step_callback
        self.dist = dist_info or init_distributed(self.tc.device)
        self.device = self.dist.device
        self.is_main = self.dist.is_main

        if self.tc.epochs <= 0:
            raise ValueError(f"train.epochs must be positive, got {self.tc.epochs}")
        self.len_epoch = int(train_data.len_epoch())
        if self.len_epoch <= 0:
            raise ValueError("the training data yields no batch per epoch (fewer items than one batch?)")
        self.schedule_steps = (self.tc.schedule_epochs or self.tc.epochs) * self.len_epoch
        self.planned_steps = self.tc.epochs * self.len_epoch
        if self.tc.max_steps > 0:
            self.planned_steps = min(self.planned_steps, self.tc.max_steps)

        self.model = model.to(self.device)
        # wrapping copies rank 0's parameters to every rank, so all replicas start identical
        self.train_model = wrap_model(self.model, self.dist, find_unused_parameters=find_unused_parameters)
        self._check_unused = self.dist.distributed and not find_unused_parameters
        self.optimizer = build_optimizer(self.model, self.tc)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.scheduler = build_scheduler(self.optimizer, self.tc.schedule, self.schedule_steps, self.tc.warmup)
        # mixed precision (tvr.train.precision): autocast dtype, and a grad scaler for fp16
        self.amp_dtype = autocast_dtype(self.device, self.tc.amp, self.tc.amp_dtype)
        self.scaler = grad_scaler(self.device, self.amp_dtype)

        self.logger = RunLogger(self.out_dir, enabled=self.is_main)
        self.select_metric = self.tc.select_metric
        self.higher_better = higher_is_better(self.select_metric)
        # loop position and bookkeeping (all saved in checkpoints)
        self.epoch = 0
        self.batch_in_epoch = 0
        self.global_step = 0
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.last_loss: float | None = None
        self.train_seconds = 0.0
        self.skipped: dict[str, dict[str, Any]] = {}
        self._window: dict[str, Any] = {"n": 0, "loss": None}
        self._last_loss_t: Tensor | None = None
        self._last_eval_step = -1
        self._last_ckpt_step = -1
        self._last_ckpt_position: tuple[int, int, int] | None = None
        self._pending_eval = False
        self._bar: TrainProgress | None = None
        #: True once fit() has set up the run (fresh, or restored from a checkpoint) and training begins
        self.started = False

    # ------------------------------------------------------------------ paths
    @property
    def last_path(self) -> Path:
        return self.out_dir / LAST

    @property
    def best_path(self) -> Path:
        return self.out_dir / BEST

    # ------------------------------------------------------------------ public
    def fit(self, resume: bool | str | Path = False) -> dict[str, Any]:
        """Train to ``train.epochs`` (or ``train.max_steps``). ``resume=True`` continues from ``out_dir/last.pt``,
        ``"auto"`` does so when that file exists and starts fresh otherwise, a path continues from that checkpoint;
        ``False`` starts a fresh run (stale logs/best.pt are removed).

        Raises :class:`~tvr.train.preemption.PreemptedError` after writing ``last.pt`` when a preemption signal
        arrives during training."""
        try:
            return self._fit(resume)
        finally:
            self.logger.close()  # the TensorBoard event file, however the session ends

    def _fit(self, resume: bool | str | Path) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume == "auto":
            resume = self.last_path.is_file()
        if resume:
            self._resume(self.last_path if resume is True else Path(resume))
        else:
            self._fresh_start()
        self.started = True
        if self._pending_eval:
            # the checkpoint was written before its validation, which did not finish: run it now
            self._checkpoint_then_evaluate()
        self.train_model.train()  # the DDP wrapper's train() also sets the module's
        session_start = time.perf_counter()
        seconds_before = self.train_seconds
        stopped_early = self._reached_max_steps()
        show_bar = self.is_main and progress_enabled()
        try:
            with (
                TrainProgress(self.planned_steps, self.tc.epochs, show_bar, log_enabled=self.is_main) as bar,
                PreemptionWatch(self.tc.preemption_signals) as watch,
            ):
                self._bar = bar
                bar.set_completed(self.global_step)
                while self.epoch < self.tc.epochs and not stopped_early:
                    for batch in self.train_data.batches(self.epoch, self.batch_in_epoch):
                        self.batch_in_epoch += 1
                        trained = self._consume(batch, seconds_before, session_start)
                        if trained and self._reached_max_steps():
                            stopped_early = True
                            break
                        if self.batch_in_epoch < self.len_epoch:  # an epoch end checks after its checkpoint
                            self._stop_if_preempted(watch, seconds_before, session_start)
                    if self.batch_in_epoch >= self.len_epoch or not stopped_early:
                        self._end_epoch(seconds_before, session_start)
                        if not stopped_early and self.epoch < self.tc.epochs:
                            self._stop_if_preempted(watch, seconds_before, session_start)
                if stopped_early:
                    # a smoke run (max_steps) still ends with a validation and a resumable checkpoint
                    self.train_seconds = seconds_before + time.perf_counter() - session_start
                    self._checkpoint_then_evaluate()
                # a notice that came during the last checkpoint or validation stops the job too, before the test
                # split: last.pt holds the finished training, and a resume goes on to the test
                self._stop_if_preempted(watch, seconds_before, session_start)
            self._write_skipped(merge=True)
        finally:
            # on any exit (including an exception) leave the skipped-video report of what this process saw
            self._bar = None
            if self.is_main:
                self._write_skipped(merge=False)
        self.train_seconds = seconds_before + time.perf_counter() - session_start
        return self._summary(stopped_early and self.epoch < self.tc.epochs)

    # ------------------------------------------------------------------ set-up
    def _fresh_start(self) -> None:
        if self.is_main:
            stale = [p for p in (self.best_path, self.out_dir / SKIPPED) if p.exists()]
            if stale or self.last_path.exists():
                log.warning(
                    "%s holds files of an earlier run; starting a new run over them (to continue a run instead: "
                    "tvr train --resume, or --resume auto; Trainer.fit(resume=True))",
                    self.out_dir,
                )
            for path in stale:
                path.unlink()
            self.logger.reset()
        seed_everything(self.tc.seed + self.dist.rank)

    def _resume(self, path: Path) -> None:
        state = load_checkpoint(path, self.model, self.optimizer, self.scheduler, self.scaler, restore_rng=False)
        for key in ("epoch", "batch_in_epoch", "global_step"):
            if key not in state:
                raise CheckpointError(f"{path}: no '{key}' in the training state; not a resumable training checkpoint")
        if state.get("len_epoch") not in (None, self.len_epoch) or state.get("world_size") not in (
            None,
            self.dist.world_size,
        ):
            log.warning(
                "%s was written with %s batches/epoch on %s ranks, now %d on %d: the data order will differ",
                path,
                state.get("len_epoch"),
                state.get("world_size"),
                self.len_epoch,
                self.dist.world_size,
            )
        if state.get("seed") not in (None, self.tc.seed):
            log.warning("%s was trained with seed %s, the config says %d", path, state.get("seed"), self.tc.seed)
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
        self.global_step = int(state["global_step"])
        self.best_metric = state.get("best_metric")
        self.best_step = state.get("best_step")
        self.last_loss = state.get("last_loss")
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.skipped = {str(e["id"]): dict(e) for e in state.get("skipped", [])}
        window = state.get("log_window") or {"n": 0, "loss": None}
        self._window = {
            "n": int(window["n"]),
            "loss": None if window["loss"] is None else torch.tensor(window["loss"], device=self.device),
        }
        per_rank = state.get("rng_per_rank")
        if per_rank is not None and len(per_rank) == self.dist.world_size:
            restore_rng_state(per_rank[self.dist.rank])
        elif self.dist.world_size == 1:
            restore_rng_state(state["rng"])
        else:
            log.warning("%s holds no RNG state for rank %d; re-seeding", path, self.dist.rank)
            seed_everything(self.tc.seed + self.dist.rank + 7919 * self.global_step)
        self._last_eval_step = self._last_ckpt_step = self.global_step
        self._last_ckpt_position = self._position()
        self._pending_eval = bool(state.get("pending_eval", False))
        if self._pending_eval:
            self._last_eval_step = -1
        self.logger.truncate_after(self.global_step, eval_pending=self._pending_eval)
        if self.is_main:
            position = (self.epoch, self.batch_in_epoch, self.global_step)
            log.info("resumed from %s at epoch %d, batch %d, step %d", path, *position)

    # ------------------------------------------------------------------ the loop
    def _reached_max_steps(self) -> bool:
        return self.tc.max_steps > 0 and self.global_step >= self.tc.max_steps

    def _position(self) -> tuple[int, int, int]:
        return self.epoch, self.batch_in_epoch, self.global_step

    def _stop_if_preempted(self, watch: PreemptionWatch, seconds_before: float, session_start: float) -> None:
        """Between steps: when a preemption signal reached any rank, write ``last.pt`` at this position (unless
        it already holds it) and raise :class:`PreemptedError` on every rank. Every rank calls this at the same
        points, so the flag's reduction (one scalar) pairs up."""
        if not watch.active:
            return
        stop = watch.signal_name is not None
        if self.dist.distributed:
            stop = bool(all_reduce_max(torch.tensor([float(stop)], device=self.device)).item())
        if not stop:
            return
        name = watch.signal_name or "a preemption signal to another rank"
        self.train_seconds = seconds_before + time.perf_counter() - session_start
        if self._last_ckpt_position != self._position():
            self._save_last()
        if self.dist.distributed:
            # no rank leaves before rank 0 has written last.pt: under torchrun the first rank to exit makes the agent
            # stop the others
            barrier()
        # the error says it (the command line prints it): a warning here printed the same notice twice
        finished = self.epoch >= self.tc.epochs or self._reached_max_steps()
        raise PreemptedError(name, self.global_step, self.epoch, self.batch_in_epoch, self.last_path, finished)

    def _consume(self, batch: Any, seconds_before: float, session_start: float) -> bool:
        """Train on one batch; returns False when the batch was skipped (no readable item on some rank)."""
        for entry in skipped_entries(batch):
            self.skipped.setdefault(str(entry["id"]), entry)
        empty = batch_item_count(batch) == 0
        if self.dist.distributed:
            # every rank must skip together, or the feature all-gather would hang
            empty = bool(all_reduce_max(torch.tensor([float(empty)], device=self.device)).item())
        if empty:
            log.warning("epoch %d batch %d has no readable video; skipped", self.epoch, self.batch_in_epoch - 1)
            return False

        lrs = current_lrs(self.optimizer)  # the lr this step uses (before the scheduler advances)
        losses, grad_norm = self._train_step(batch)
        self.global_step += 1
        loss = losses["loss"].float()
        self._last_loss_t = loss
        self._window["loss"] = loss if self._window["loss"] is None else self._window["loss"] + loss
        self._window["n"] += 1
        if self._bar is not None:
            self._bar.advance(self.epoch)
        at_epoch_end = self.batch_in_epoch >= self.len_epoch
        record: dict[str, Any] = {}
        if self.tc.log_every > 0 and self.global_step % self.tc.log_every == 0:
            self.train_seconds = seconds_before + time.perf_counter() - session_start
            record = self._log_train(losses, grad_norm, lrs)
        # at an epoch end the epoch-end validation/checkpoint below covers this step
        if not at_epoch_end and self.tc.eval_every > 0 and self.global_step % self.tc.eval_every == 0:
            self._evaluate()
        if not at_epoch_end and self.tc.save_every_steps > 0 and self.global_step % self.tc.save_every_steps == 0:
            self.train_seconds = seconds_before + time.perf_counter() - session_start
            self._save_last()
        if self.step_callback is not None:
            self.step_callback(self, record or {"step": self.global_step, "epoch": self.epoch})
        return True

    def _train_step(self, batch: dict[str, Any]) -> tuple[dict[str, Tensor], Tensor | None]:
        batch = move_to_device(batch, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.amp_dtype):
            out = self.train_model(batch)
        if not isinstance(out, dict) or "loss" not in out:
            raise KeyError(f"{type(self.model).__name__}(batch) must return a dict with a 'loss' entry")
        loss = out["loss"]
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if self._check_unused:
            self._check_all_parameters_used()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = None
        if self.tc.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.tc.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        with warnings.catch_warnings():
            # an fp16 step the scaler skipped (inf/NaN gradients while it finds its scale) still advances the
            # schedule, as in torch's AMP recipe; the scheduler's "step() before optimizer.step()" warning then
            # misreads the skipped step as a wrong call order
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
        self.model.after_optimizer_step()
        return {k: v.detach() for k, v in out.items() if isinstance(v, Tensor)}, grad_norm

    def _check_all_parameters_used(self) -> None:
        """After the first DDP backward: every trainable parameter must have a gradient.

        Without ``find_unused_parameters`` DDP waits for a gradient from every trainable parameter; one that never
        gets one leaves its bucket unreduced (ranks would step with different gradients) and DDP fails only at the
        next forward with an index. Every rank runs the same graph, so all ranks raise here together, before the
        optimizer step, naming the parameters.
        """
        self._check_unused = False
        unused = [name for name, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
        if unused:
            shown = ", ".join(unused[:20]) + (f", … ({len(unused)} in all)" if len(unused) > 20 else "")
            raise RuntimeError(
                f"distributed training: trainable parameters took no part in the loss: {shown}. Freeze them "
                "(requires_grad=False) or construct the Trainer with find_unused_parameters=True"
            )

    def _log_train(self, losses: dict[str, Tensor], grad_norm: Tensor | None, lrs: dict[str, float]) -> dict[str, Any]:
        values = {k: float(v.float().mean()) for k, v in losses.items()}
        window_loss = float(self._window["loss"]) / max(self._window["n"], 1)
        self._window = {"n": 0, "loss": None}
        record: dict[str, Any] = {
            "step": self.global_step,
            "epoch": self.epoch,
            "batch": self.batch_in_epoch,
            "lr": lrs,
            **values,
            "loss_avg": window_loss,
        }
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        its = self._bar.update(self.epoch, self.global_step, values["loss"], lrs) if self._bar is not None else 0.0
        record["seconds"] = round(self.train_seconds, 3)
        record["it_s"] = round(its, 3)
        self.logger.train(record)
        return record

    def _end_epoch(self, seconds_before: float, session_start: float) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0
        self.train_seconds = seconds_before + time.perf_counter() - session_start
        self._write_skipped(merge=True)
        self._checkpoint_then_evaluate()

    def _checkpoint_then_evaluate(self) -> None:
        """Save ``last.pt`` before a due validation, marked as awaiting it, then validate and save again with the
        result: a validation that fails (or a kill during it) never costs the training before it, and ``--resume``
        runs the pending validation first. Every rank calls this (checkpointing gathers RNG states)."""
        eval_due = self._last_eval_step != self.global_step
        if eval_due:
            self._save_last(pending_eval=True)
            self._evaluate()
            self._pending_eval = False
        if eval_due or self._last_ckpt_step != self.global_step:
            self._save_last()

    # ------------------------------------------------------------------ validation
    def _evaluate(self) -> None:
        self._last_eval_step = self.global_step
        if self.evaluate_fn is None:
            return
        started = time.perf_counter()
        self.model.eval()
        try:
            with preserve_rng(), torch.no_grad():
                metrics = self.evaluate_fn(self.model)
        finally:
            self.model.train()
        value = lookup_metric(metrics, self.select_metric)
        improved = self.best_metric is None or (
            value > self.best_metric if self.higher_better else value < self.best_metric
        )
        if improved:
            self.best_metric, self.best_step = value, self.global_step
        record = {
            "step": self.global_step,
            "epoch": self.epoch,
            "batch": self.batch_in_epoch,
            "select_metric": self.select_metric,
            "value": value,
            "best": improved,
            "best_value": self.best_metric,
            "metrics": to_jsonable(metrics),
            "eval_seconds": round(time.perf_counter() - started, 3),
        }
        if improved and self.is_main:
            save_checkpoint(self.best_path, self.model, state=self._state(), config=self.cfg)
        self.logger.eval(record)
        if self.is_main:
            log.info("step %d: %s = %.4f%s", self.global_step, self.select_metric, value, " (best)" if improved else "")

    # ------------------------------------------------------------------ checkpoints
    def _sync_last_loss(self) -> None:
        if self._last_loss_t is not None:
            self.last_loss = float(self._last_loss_t)

    def _state(self) -> dict[str, Any]:
        window_loss = self._window["loss"]
        self._sync_last_loss()
        return {
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "global_step": self.global_step,
            "seed": self.tc.seed,
            "len_epoch": self.len_epoch,
            "world_size": self.dist.world_size,
            "schedule_steps": self.schedule_steps,
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            "select_metric": self.select_metric,
            "last_loss": self.last_loss,
            "train_seconds": self.train_seconds,
            "skipped": list(self.skipped.values()),
            "log_window": {"n": self._window["n"], "loss": None if window_loss is None else float(window_loss)},
        }

    def _save_last(self, pending_eval: bool = False) -> None:
        """All ranks call this (the RNG states and skipped lists are gathered); rank 0 writes ``last.pt``.
        ``pending_eval`` marks a checkpoint written just before this step's validation."""
        self._last_ckpt_step = self.global_step
        self._last_ckpt_position = self._position()
        gathered = all_gather_object({"rng": capture_rng_state(), "skipped": list(self.skipped.values())})
        for part in gathered:
            for entry in part["skipped"]:
                self.skipped.setdefault(str(entry["id"]), entry)
        if not self.is_main:
            return
        state = self._state()
        state["rng_per_rank"] = [part["rng"] for part in gathered]
        state["pending_eval"] = pending_eval
        save_checkpoint(self.last_path, self.model, self.optimizer, self.scheduler, self.scaler, state, self.cfg)

    def _write_skipped(self, merge: bool) -> None:
        """``skipped_videos.json``: every unreadable video met so far (``merge`` gathers all ranks' lists)."""
        if merge:
            for part in all_gather_object(list(self.skipped.values())):
                for entry in part:
                    self.skipped.setdefault(str(entry["id"]), entry)
        if not self.is_main:
            return
        videos = [{"id": e["id"], "error": e.get("error")} for e in self.skipped.values()]
        atomic_write_json(self.out_dir / SKIPPED, {"count": len(videos), "videos": videos})

    # ------------------------------------------------------------------ summary
    def _summary(self, stopped_early: bool) -> dict[str, Any]:
        self._sync_last_loss()
        return {
            "steps": self.global_step,
            "epochs": self.epoch + self.batch_in_epoch / self.len_epoch,
            "len_epoch": self.len_epoch,
            "stopped_early": stopped_early,
            "final_loss": self.last_loss,
            "select_metric": self.select_metric,
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            "train_seconds": round(self.train_seconds, 3),
            "skipped_videos": len(self.skipped),
            "out_dir": str(self.out_dir),
            "last_checkpoint": str(self.last_path) if self.last_path.exists() else None,
            "best_checkpoint": str(self.best_path) if self.best_path.exists() else None,
            "train_log": str(self.logger.train_jsonl),
            "val_log": str(self.logger.val_jsonl),
        }
