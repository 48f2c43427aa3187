"""Stopping a training run on a scheduler's notice (``train.preemption_signals``: SIGTERM and SIGUSR1 by default).

A cluster takes a node back by signalling the job and killing it after a grace period (SLURM's GraceTime,
Kubernetes' ``terminationGracePeriodSeconds``, torchrun's ``--shutdown-timeout``). While a
:class:`PreemptionWatch` is active, the first such signal only records itself; the trainer finishes the step it is
in, every rank agrees to stop after the same step (:meth:`Trainer._stop_if_preempted` reduces the flag over the
ranks, so one signalled rank stops them all), ``last.pt`` is written once, at that position, and
:class:`PreemptedError` ends the job. The command line turns it into exit code :data:`PREEMPTED_EXIT_CODE`.

The first signal also restores that signal's default action, so a second one ends the process at once — even
inside a long C call (a collective, a kernel), where a Python handler would only run after the call returns.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from tvr.utils.errors import RestartableStopError

log = logging.getLogger("tvr.train")

#: the exit code of a run stopped by a preemption signal after writing its checkpoint: 128 + SIGTERM, what a shell
#: reports for a process that SIGTERM ended. Kubeflow's ``restartPolicy: ExitCode`` retries it (as 130, 137, 138),
#: ``restartPolicy: OnFailure`` and torchrun's ``--max-restarts`` restart on any non-zero code
PREEMPTED_EXIT_CODE = 143

_Handler = Callable[[int, FrameType | None], Any] | int | None


class PreemptedError(RestartableStopError):
    """A preemption signal stopped training; ``checkpoint`` (``last.pt``) holds the position it stopped at."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(
        self, signal_name: str, step: int, epoch: int, batch: int, checkpoint: Path, finished: bool = False
    ) -> None:
        self.signal_name = signal_name
        self.step = step
        self.checkpoint = checkpoint
        where = (
            f"after its last step ({step}), before the test; {checkpoint} holds the finished training"
            if finished
            else f"after step {step} (epoch {epoch + 1}, batch {batch}); {checkpoint} holds it"
        )
        super().__init__(
            f"{signal_name}: training stopped {where}, and a resume continues exactly from there (tvr train: the "
            "same command with --resume or --resume auto)"
        )


class PreemptionWatch:
    """Context manager: while active, the listed signals (names such as ``"SIGTERM"``) set :attr:`signal_name`
    instead of ending the process; the previous handlers come back when it exits.

    Signal handlers can only be installed from the main thread: elsewhere the watch stays inactive (``active`` is
    False) and the signals keep their actions. A forked child (a DataLoader worker) that inherits the handler
    ignores the signal: the process that installed it handles the notice for both.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.signals = [signal.Signals[name] for name in names]
        self.signal_name: str | None = None
        self.active = False
        self._previous: dict[signal.Signals, _Handler] = {}
        self._pid = os.getpid()

    def __enter__(self) -> PreemptionWatch:
        if not self.signals:
            return self
        if threading.current_thread() is not threading.main_thread():
            log.info("training outside the main thread: preemption signals keep their default action")
            return self
        self._pid = os.getpid()
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._record)
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        self.active = False

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            return
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
        # a second notice means "now": the default action ends the process wherever it is
        signal.signal(signum, signal.SIG_DFL)


def ignore_signals(names: Sequence[str], worker_id: int | None = None) -> None:
    """Ignore the listed signals in this process: a DataLoader worker's ``worker_init_fn`` (with
    ``functools.partial``), so a signal sent to the whole process group (SLURM signals every process of a job
    step) does not kill the workers while the main process finishes its step and checkpoint. A worker still ends
    with its parent."""
    for name in names:
        signal.signal(signal.Signals[name], signal.SIG_IGN)
