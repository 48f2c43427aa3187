"""The run folder's record: what a run folder holds, when a run may start, resume or start over in it, and how the
record keeps describing what actually ran.

* A fresh run never starts over an earlier run's checkpoints unless asked (``--overwrite``), and ``--overwrite``
  removes the earlier run's state (checkpoints, logs, test results, tokenizer) *before* the new run writes
  anything, so a new run killed before its first checkpoint cannot leave the old ``last.pt`` for ``--resume`` to
  continue under the new run's config.
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
from typing import Any

import yaml

from tvr.config import Config, ConfigError, UntrustedCodeError, config_from_dict, config_to_dict, save_config
from tvr.utils.io import atomic_write_text, remove_stale_temporaries

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
RUN_FOLDERS = ("test_last", "test_best", "tokenizer")
#: settings a resume may change: how the run executes and how often it logs, validates and checkpoints, and where
#: the same videos / frame cache now lie. Every ``eval.*`` setting may change too (validation only).
RESUME_MAY_CHANGE = (
    "train.max_steps",
    "train.device",
    "train.num_threads",
    "train.log_every",
    "train.checkpoint_every",
    "train.eval_every",
    "data.num_workers",
    "data.video_dir",
    "data.frame_cache",
    "model.frame_chunk",
)


class RunFolderError(ConfigError):
    """The run folder holds an earlier run that this command may not continue or replace as asked."""


def check_run_folder(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run over an earlier run's checkpoints unless ``overwrite`` (``resume`` continues)."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other")
    if resume or overwrite:
        return
    found = [name for name in RUN_CHECKPOINTS if (out_dir / name).exists()]
    if found:
        raise RunFolderError(
            f"run folder {out_dir} holds checkpoints of an earlier run ({', '.join(found)}); pass --resume to "
            "continue it or --overwrite to start over"
        )


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
    from tvr.models.heads.registry import resolve_head_config

    path = out_dir / CONFIG
    if not path.is_file():
        return None
    try:
        recorded = config_from_dict(yaml.safe_load(path.read_text()) or {}, where=str(path))
        resolve_head_config(recorded.head)  # head.options as the head's dataclass, as in the run's own config
    except UntrustedCodeError:  # the record is fine: it needs --trust-code, as the run did
        raise
    except (yaml.YAMLError, ConfigError, UnicodeDecodeError) as exc:
        raise RunFolderError(
            f"{path}: unreadable ({exc}); it records what the run in {out_dir} ran with, so the resume cannot be "
            "checked against it: restore it, or start over with --overwrite"
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
            f"the run as it was recorded: resume with --config {out_dir / CONFIG}, or start a new run (another "
            "--out, or --overwrite)"
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
