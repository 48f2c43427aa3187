"""Training logs: ``train_log.jsonl`` / ``train_log.csv`` (one record per ``log_every`` steps), ``val_log.jsonl``
(one record per validation), their numbers as TensorBoard scalars in ``tensorboard/`` where TensorBoard is installed
(:mod:`tvr.train.tensorboard`), and a rich progress bar on interactive terminals.

Log lines are appended and flushed one at a time (a crash loses at most the line being written). On resume the
logs are cut back to the checkpoint's step, so a resumed run's log equals an uninterrupted run's log.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from pathlib import Path
from typing import Any

from tvr.train.tensorboard import TensorBoardLog
from tvr.utils.data_files import read_jsonl
from tvr.utils.io import atomic_write_text, naming_errors

__all__ = ["RunLogger", "TrainProgress", "flatten", "format_duration", "format_lrs", "read_jsonl"]

log = logging.getLogger("tvr.train")

TRAIN_JSONL = "train_log.jsonl"
TRAIN_CSV = "train_log.csv"
VAL_JSONL = "val_log.jsonl"


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"lr": {"head": 1e-4}}`` → ``{"lr/head": 1e-4}`` (CSV columns)."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        else:
            out[name] = value
    return out


class RunLogger:
    """Writes the run's logs under ``out_dir``. Only the main process should hold an enabled logger."""

    def __init__(self, out_dir: str | Path, enabled: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self.train_jsonl = self.out_dir / TRAIN_JSONL
        self.train_csv = self.out_dir / TRAIN_CSV
        self.val_jsonl = self.out_dir / VAL_JSONL
        self._csv_columns: list[str] | None = None
        self.tensorboard = TensorBoardLog(self.out_dir, enabled=enabled)

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Start a fresh run: drop logs left in ``out_dir`` by an earlier one."""
        if not self.enabled:
            return
        for path in (self.train_jsonl, self.train_csv, self.val_jsonl):
            path.unlink(missing_ok=True)
        self._csv_columns = None
        self.tensorboard.start()

    def truncate_after(self, step: int, eval_pending: bool = False) -> None:
        """Drop records newer than ``step`` (written after the checkpoint a run resumes from). ``eval_pending``: the
        checkpoint was written before its step's validation, which the resume runs again, so a validation record
        of ``step`` (logged before a kill that came ahead of the next checkpoint) goes too."""
        if not self.enabled:
            return

        def keep(record: dict[str, Any], validation: bool) -> bool:
            at = int(record.get("step", 0))
            return at < step or (at == step and not (eval_pending and validation))

        for path in (self.train_jsonl, self.val_jsonl):
            if path.is_file():
                kept = [r for r in read_jsonl(path) if keep(r, path == self.val_jsonl or r.get("kind") == "eval")]
                atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        if self.train_csv.is_file():
            with open(self.train_csv, newline="") as handle:
                reader = csv.DictReader(handle)
                columns = list(reader.fieldnames or [])
                rows = [r for r in reader if r.get("step") and int(float(r["step"])) <= step]
            self._rewrite_csv(columns, rows)
        self._csv_columns = None
        # the event files anew from the records kept: each step once, as in the JSONL
        self.tensorboard.start(read_jsonl(self.train_jsonl) if self.train_jsonl.is_file() else [])

    def close(self) -> None:
        """The run (or this session of it) is over: finish the TensorBoard event file."""
        self.tensorboard.close()

    # ------------------------------------------------------------------ records
    def _rewrite_csv(self, columns: list[str], rows: list[dict[str, Any]]) -> None:
        """Replace the CSV log atomically with ``rows`` under the header ``columns``."""
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.train_csv, buf.getvalue())

    def _append_jsonl(self, path: Path, record: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with naming_errors(path), open(path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()

    def _append_csv(self, row: dict[str, Any]) -> None:
        if self._csv_columns is None and self.train_csv.is_file():
            with open(self.train_csv, newline="") as handle:
                self._csv_columns = next(csv.reader(handle), None)
        columns = self._csv_columns
        if columns is None or any(key not in columns for key in row):
            # first row, or a new column appeared: rewrite the file with the widened header
            old_rows: list[dict[str, Any]] = []
            if columns is not None and self.train_csv.is_file():
                with open(self.train_csv, newline="") as handle:
                    old_rows = list(csv.DictReader(handle))
            columns = list(columns or []) + [key for key in row if key not in (columns or [])]
            self._rewrite_csv(columns, old_rows)
            self._csv_columns = columns
        with naming_errors(self.train_csv), open(self.train_csv, "a", newline="") as handle:
            csv.DictWriter(handle, fieldnames=columns).writerow(row)
            handle.flush()

    def train(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._append_jsonl(self.train_jsonl, {"kind": "train", **record})
        self._append_csv(flatten(record))
        self.tensorboard.train(record)

    def eval(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._append_jsonl(self.val_jsonl, record)
        self._append_jsonl(self.train_jsonl, {"kind": "eval", **record})
        self.tensorboard.eval(record)


#: suffix of a parameter group that differs from its namesake only by having no weight decay (same rate)
_NO_DECAY = "-nodecay"


def format_lrs(lrs: dict[str, float]) -> str:
    """The learning rates of a log line: one rate when every group has it; else each distinct rate once, after the
    groups that have it (``head 1.00e-04, backbone 1.00e-07``). A ``-nodecay`` group is named by its namesake."""
    by_rate: dict[str, list[str]] = {}
    for name, lr in lrs.items():
        names = by_rate.setdefault(f"{lr:.2e}", [])
        base = name.removesuffix(_NO_DECAY)
        if base not in names:
            names.append(base)
    if len(by_rate) <= 1:
        return next(iter(by_rate), "-")
    return ", ".join(f"{'+'.join(names)} {rate}" for rate, names in by_rate.items())


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: an ETA's precision."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class TrainProgress:
    """A rich progress bar over optimizer steps (epoch, step, loss, lr, it/s) when ``enabled`` (a TTY on the main
    process); ``update`` also writes a log line so non-interactive runs still report progress."""

    def __init__(self, total_steps: int, epochs: int, enabled: bool, log_enabled: bool = True) -> None:
        self.total_steps = total_steps
        self.epochs = epochs
        self.enabled = enabled
        self.log_enabled = log_enabled
        self._progress: Any = None
        self._task: Any = None
        self._window_start = time.perf_counter()
        self._window_steps = 0
        # the ETA: steps and time of this session (a resumed run's earlier steps took another session's time); the
        # time includes the validations so far, as the remaining time will
        self._session_start = self._window_start
        self._session_first_step = 0

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("epoch {task.fields[epoch]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[its]} it/s"),
                TimeRemainingColumn(),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(
                "train", total=self.total_steps, epoch=f"1/{self.epochs}", loss="-", lr="-", its="-"
            )
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def set_completed(self, step: int) -> None:
        self._session_start, self._session_first_step = time.perf_counter(), step
        if self._progress is not None:
            self._progress.update(self._task, completed=step)

    def advance(self, epoch: int) -> None:
        self._window_steps += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, epoch=f"{epoch + 1}/{self.epochs}")

    def eta(self, step: int) -> float | None:
        """Seconds left to ``total_steps`` at this session's pace so far (None before its first step)."""
        done = step - self._session_first_step
        if done <= 0:
            return None
        return (self.total_steps - step) * (time.perf_counter() - self._session_start) / done

    def update(self, epoch: int, step: int, loss: float, lrs: dict[str, float]) -> float:
        """Refresh the shown values; returns the steps per second since the previous update."""
        now = time.perf_counter()
        its = self._window_steps / max(now - self._window_start, 1e-9)
        self._window_start, self._window_steps = now, 0
        if self._progress is not None:
            self._progress.update(
                self._task,
                epoch=f"{epoch + 1}/{self.epochs}",
                loss=f"{loss:.4f}",
                lr=format_lrs(lrs),
                its=f"{its:.2f}",
            )
        if self.log_enabled:
            eta = self.eta(step)
            log.info(
                "epoch %d/%d step %d/%d loss %.4f lr %s %.2f it/s ETA %s",
                epoch + 1,
                self.epochs,
                step,
                self.total_steps,
                loss,
                format_lrs(lrs),
                its,
                "-" if eta is None else format_duration(eta),
            )
        return its
