"""TensorBoard scalars of a training run, beside its JSONL / CSV logs (:mod:`tvr.train.logging`), so that
``tensorboard --logdir runs/`` shows every run under ``runs/``: each loss component, the learning rate of each
parameter group, the gradient norm and the steps per second of every logged step, and each validation metric.

Written only where the optional ``tensorboard`` package is installed (``pip install 'tvr[tensorboard]'``); without it
nothing else changes. Only the main process writes (it alone holds an enabled :class:`~tvr.train.logging.RunLogger`).

The scalars are the JSONL records' numbers, under tags named after their keys (:func:`train_scalars`,
:func:`eval_scalars`), and the event file holds exactly what ``train_log.jsonl`` holds: a resume cuts the JSONL back
to its checkpoint's step, and the event files are then written anew from the records kept, so no step appears
twice, whatever a killed run had written after its last checkpoint. (TensorBoard's own ``purge_step`` would hide
those steps too, but reads the files in name order, which is wall-clock seconds and then process ids: a restart
within the same second could be read before the run it continues.)
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("tvr.train")

#: the run folder's sub-folder holding the event files (``tensorboard --logdir RUN`` or ``--logdir runs/``)
TENSORBOARD_FOLDER = "tensorboard"
#: the event files TensorBoard's writer names ``events.out.tfevents.<time>.<host>.<pid>.<n>``
_EVENT_FILES = "events.out.tfevents.*"
#: numbers of a training record that say where it is, not how training goes (the step is the x axis)
_POSITION = ("step", "epoch", "batch", "seconds")


def tensorboard_installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def _numbers(values: dict[str, Any], prefix: str) -> dict[str, float]:
    """Every number in ``values`` (nested dicts joined with ``/``), tagged ``prefix/key``; no booleans, no text."""
    out: dict[str, float] = {}
    for key, value in values.items():
        tag = f"{prefix}/{key}"
        if isinstance(value, dict):
            out.update(_numbers(value, tag))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[tag] = float(value)
    return out


def train_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of a ``train_log.jsonl`` training record: ``lr/<group>`` for each learning rate and
    ``train/<key>`` for every other number (``train/loss``, each loss component, ``train/loss_avg``,
    ``train/grad_norm``, ``train/it_s``); where it is (step, epoch, batch, seconds) is not a scalar."""
    lrs = record.get("lr") or {}
    rest = {k: v for k, v in record.items() if k not in (*_POSITION, "lr", "kind")}
    return {**_numbers(lrs, "lr"), **_numbers(rest, "train")}


def eval_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of a validation record: ``val/<direction>/<metric>`` for each number of its metrics
    (``val/t2v/R1``, ``val/v2t/MdR``, …; the evaluation's ``info`` is not a metric)."""
    metrics = {k: v for k, v in (record.get("metrics") or {}).items() if k != "info"}
    return _numbers(metrics, "val")


class TensorBoardLog:
    """The event files of one run folder, written by the main process (see the module docstring)."""

    def __init__(self, out_dir: str | Path, enabled: bool = True) -> None:
        self.folder = Path(out_dir) / TENSORBOARD_FOLDER
        self.enabled = enabled and tensorboard_installed()
        if enabled and not self.enabled:
            log.debug("tensorboard is not installed: no TensorBoard logs (pip install 'tvr[tensorboard]')")
        self._writer: Any = None

    def start(self, history: Iterable[dict[str, Any]] = ()) -> None:
        """Begin the run's event files anew with ``history`` (the records ``train_log.jsonl`` holds: nothing for a
        fresh run, what the resume kept for a resumed one)."""
        if not self.enabled:
            return
        self.close()
        if self.folder.is_dir():
            for path in self.folder.glob(_EVENT_FILES):
                path.unlink()
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(self.folder))
        for record in history:
            self._write(eval_scalars(record) if record.get("kind") == "eval" else train_scalars(record), record)
        self._writer.flush()

    def train(self, record: dict[str, Any]) -> None:
        self._record(train_scalars(record), record)

    def eval(self, record: dict[str, Any]) -> None:
        self._record(eval_scalars(record), record)

    def _record(self, scalars: dict[str, float], record: dict[str, Any]) -> None:
        if self._writer is None:
            return
        self._write(scalars, record)
        self._writer.flush()  # as the JSONL lines: a crash loses at most the record being written

    def _write(self, scalars: dict[str, float], record: dict[str, Any]) -> None:
        step = int(record["step"])
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
