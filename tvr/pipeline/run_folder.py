"""The run folder's record: what a run folder holds, when a run may start, resume or start over in it, and how the
record keeps describing what actually ran.

* A fresh run never starts over an earlier run's checkpoints unless asked (``--overwrite``), and ``--overwrite``
  removes the earlier run's state (checkpoints, logs, test results, tokenizer) *before* the new run writes
  anything, so a new run killed before its first checkpoint cannot leave the old ``last.pt`` for ``--resume`` to
  continue under the new run's config.
* ``--resume`` needs ``last.pt``; ``--resume auto`` continues from it when it is there and starts a new run when
  the folder holds no checkpoint, so one command line serves a first launch and every restart (torchrun
  ``--max-restarts``, a requeued job).
* A start that fails before training begins (the model does not build, the checkpoint does not fit, a split
  cannot be read) leaves the folder as it found it (:class:`StartUndo`).
* A resume must run the configuration the folder records (``config.yaml``). Settings that only change how the run
  executes or how often it logs, validates and saves (:data:`RESUME_MAY_CHANGE`, and the ``eval`` section) may
  differ: the new values are written to ``config.yaml`` and the change is appended to ``config_changes.jsonl``.
  Any other difference refuses the resume before anything is written, naming each setting.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tvr.config import Config, ConfigError, UntrustedCodeError, config_from_dict, config_to_dict, save_config
from tvr.train.tensorboard import TENSORBOARD_FOLDER
from tvr.utils.data_files import DataFileError, read_yaml
from tvr.utils.errors import reason
from tvr.utils.io import atomic_write_bytes, atomic_write_text, remove_stale_temporaries

log = logging.getLogger(__name__)

CONFIG = "config.yaml"
CONFIG_CHANGES = "config_changes.jsonl"
#: files whose presence means a run folder holds an earlier run's training
RUN_CHECKPOINTS = ("last.pt", "best.pt")
#: everything a training run writes into its folder (files, then folders); ``--overwrite`` removes these and only
#: these, so a user's own files in the folder survive
RUN_FILES = (
    "last.pt",
    "best.pt",
    CONFIG,
    CONFIG_CHANGES,
    "summary.json",
    "splits.json",
    "train_log.jsonl",
    "train_log.csv",
    "val_log.jsonl",
    "skipped_videos.json",
    "skipped_videos_cache.json",
)
RUN_FOLDERS = ("test_last", "test_best", "tokenizer", TENSORBOARD_FOLDER)
#: settings a resume may change: how the run executes and how often it logs, validates and checkpoints, and where
#: the same videos / frame cache now lie. Every ``eval.*`` setting may change too (validation only).
RESUME_MAY_CHANGE = (
    "train.max_steps",
    "train.device",
    "train.num_threads",
    "train.log_every",
    "train.save_every_steps",
    "train.preemption_signals",
    "train.eval_every",
    "data.num_workers",
    "data.video_dir",
    "data.frame_cache",
    "model.frame_chunk",
)


#: ``resume`` value that continues a run when its folder holds ``last.pt`` and starts one otherwise
RESUME_AUTO = "auto"


class RunFolderError(ConfigError):
    """The run folder holds an earlier run that this command may not continue or replace as asked."""


def check_run_folder(out_dir: Path, resume: bool | str, overwrite: bool) -> bool:
    """Whether this start continues the run in ``out_dir`` (``resume``: False, True or ``"auto"``); refuses a fresh
    run over an earlier run's checkpoints unless ``overwrite``, and a resume with no ``last.pt`` to continue."""
    if resume not in (False, True, RESUME_AUTO):
        raise RunFolderError(f"--resume {resume!r}: expected --resume alone or --resume {RESUME_AUTO}")
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other")
    if overwrite:
        return False
    found = [name for name in RUN_CHECKPOINTS if (out_dir / name).exists()]
    if (out_dir / "last.pt").exists():
        if resume:
            return True
        raise RunFolderError(
            f"run folder {out_dir} holds checkpoints of an earlier run ({', '.join(found)}); pass --resume (or "
            "--resume auto) to continue it, or --overwrite to start over"
        )
    if found:  # best.pt alone holds weights, not the training state: nothing can continue from it
        raise RunFolderError(
            f"run folder {out_dir} holds best.pt of an earlier run but no last.pt to continue from; pass --overwrite "
            "to start over there, or use another --out"
        )
    if resume is True:
        raise RunFolderError(
            f"--resume: run folder {out_dir} holds no last.pt, so there is nothing to continue (a run stopped before "
            f"its first checkpoint leaves none); --resume {RESUME_AUTO} starts a new run where there is nothing to "
            "continue"
        )
    return False


class StartUndo:
    """Puts a job's folder back as a start found it when the start fails before its work begins (a run folder
    before training; a feature cache before its first shard, :mod:`tvr.pipeline.features`).

    ``record()`` (under the folder's lock, after ``--overwrite`` removed what it removes) notes which of the job's
    files and folders exist and keeps the bytes of the few small files a start rewrites before its work; when the
    block exits with an exception and ``keep()`` was not called, the files written since are removed, the rewritten
    ones restored, and a folder the start created is removed when nothing else is in it. Files that are not the
    job's (by default a run's: :data:`RUN_FILES`, :data:`RUN_FOLDERS`) are never touched.
    """

    #: the files a training start rewrites before its first step (the record, the splits read)
    REWRITTEN = (CONFIG, CONFIG_CHANGES, "splits.json", "skipped_videos_cache.json")

    def __init__(
        self,
        out_dir: Path,
        created_folder: bool,
        files: tuple[str, ...] = RUN_FILES,
        folders: tuple[str, ...] = RUN_FOLDERS,
        rewritten: tuple[str, ...] = REWRITTEN,
        work: str = "training",
    ) -> None:
        self.out_dir = out_dir
        self.created_folder = created_folder
        self.files, self.folders, self.rewritten, self.work = files, folders, rewritten, work
        self.kept = False
        self._existed: set[str] | None = None
        self._saved: dict[str, bytes] = {}

    def record(self) -> None:
        names = (*self.files, *self.folders)
        self._existed = {name for name in names if (self.out_dir / name).exists()}
        self._saved = {n: (self.out_dir / n).read_bytes() for n in self.rewritten if (self.out_dir / n).is_file()}

    def keep(self) -> None:
        """The work has begun: from here on the folder is the job's."""
        self.kept = True

    def __enter__(self) -> StartUndo:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc_type is None or self.kept:
            return
        undone = self.undo()
        if undone:
            log.info(
                "the start failed before %s: put %s back as it was (%s)", self.work, self.out_dir, ", ".join(undone)
            )

    def undo(self) -> list[str]:
        undone = []
        if self._existed is not None:
            for name in self.files:
                path = self.out_dir / name
                if name in self._saved:
                    if not path.is_file() or path.read_bytes() != self._saved[name]:
                        atomic_write_bytes(path, self._saved[name])
                        undone.append(f"{name} restored")
                elif name not in self._existed and (path.is_file() or path.is_symlink()):
                    path.unlink()
                    undone.append(f"{name} removed")
            for name in self.folders:
                path = self.out_dir / name
                if name not in self._existed and path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                    undone.append(f"{name}/ removed")
        if self.created_folder and self.out_dir.is_dir() and not any(self.out_dir.iterdir()):
            self.out_dir.rmdir()
        return undone


def clear_run_state(out_dir: Path) -> list[str]:
    """Remove what an earlier run wrote into ``out_dir`` (:data:`RUN_FILES`, :data:`RUN_FOLDERS`); returns the
    names removed. Other files are left alone."""
    removed = []
    for name in RUN_FILES:
        path = out_dir / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    for name in RUN_FOLDERS:
        path = out_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed.append(name + "/")
    return removed


def sweep_temporaries(out_dir: Path) -> list[Path]:
    """Temporaries of writes a killed run left, in the folders a run writes (never elsewhere below ``out_dir``)."""
    removed = remove_stale_temporaries(out_dir)
    for name in RUN_FOLDERS:
        if (out_dir / name).is_dir() and not (out_dir / name).is_symlink():
            removed += remove_stale_temporaries(out_dir / name)
    return removed


def _flat(values: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(values, dict):
        return {prefix: values}
    out: dict[str, Any] = {}
    for key, value in values.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _recorded_config(out_dir: Path) -> dict[str, Any] | None:
    """The settings ``config.yaml`` records, flattened to dotted names (None when the folder has none)."""
    from tvr.models.run_spec import resolve_run

    path = out_dir / CONFIG
    if not path.is_file():
        return None
    try:
        # resolved as the run's own config is (a resolved record resolves to itself)
        recorded = resolve_run(config_from_dict(read_yaml(path) or {}, where=str(path))).config
    except UntrustedCodeError:  # the record is fine: it needs --trust-code, as the run did
        raise
    except (DataFileError, ConfigError) as exc:
        raise RunFolderError(
            f"{path}: unreadable ({reason(exc)}); it records what the run in {out_dir} ran with, so the resume cannot "
            "be checked against it: restore it, or start over with --overwrite"
        ) from None
    return _flat(config_to_dict(recorded))


def resume_changes(cfg: Config, out_dir: Path) -> dict[str, tuple[Any, Any]]:
    """The settings (dotted name → (recorded, now)) in which ``cfg`` differs from the run folder's record, when all
    of them may change on a resume; raises :class:`RunFolderError` naming the others."""
    before = _recorded_config(out_dir)
    if before is None:
        return {}
    now = _flat(config_to_dict(cfg))
    changed = {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)}
    refused = {k: v for k, v in changed.items() if k not in RESUME_MAY_CHANGE and not k.startswith("eval.")}
    if refused:
        shown = "; ".join(f"{k}: {a!r} in the run, {b!r} now" for k, (a, b) in list(refused.items())[:8])
        more = f"; … ({len(refused)} in all)" if len(refused) > 8 else ""
        raise RunFolderError(
            f"--resume: the run in {out_dir} was trained with other settings ({shown}{more}); a resume continues "
            f"the run as it was recorded: resume without --config (it reads {out_dir / CONFIG}), or start a new "
            "run (another --out, or --overwrite)"
        )
    return changed


def record_config(cfg: Config, out_dir: Path, changes: dict[str, tuple[Any, Any]], step: int | None) -> None:
    """Write ``config.yaml``; a resume that changed settings also appends them to ``config_changes.jsonl``."""
    if changes:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "resumed_at_step": step,
            "changes": {k: {"before": a, "after": b} for k, (a, b) in changes.items()},
        }
        path = out_dir / CONFIG_CHANGES
        previous = path.read_text() if path.is_file() else ""
        atomic_write_text(path, previous + json.dumps(entry) + "\n")
        log.info(
            "resume with changed settings (recorded in %s): %s",
            path,
            ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()),
        )
    save_config(cfg, out_dir / CONFIG)
