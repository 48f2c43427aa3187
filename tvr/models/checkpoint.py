"""Reading tvr checkpoints, and the model a checkpoint describes.

A checkpoint (written by ``tvr train``, ``tvr import-checkpoint``; :func:`tvr.train.checkpoint.save_checkpoint`) is
one ``torch.save`` file of tensors and plain values, read with ``torch.load(weights_only=True)`` only. Besides the
weights it carries the fully resolved run config (``"config"``: model, head and its options, data transforms), so
:func:`load_model` rebuilds the model from the file alone; a config given explicitly still overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from tvr.config import Config, ConfigError, config_from_dict
from tvr.utils.errors import UserError
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.seeding import seed_everything
from tvr.utils.torch_files import TorchFileError, load_torch_file, state_dict_differences

if TYPE_CHECKING:
    from tvr.models.run_spec import RunSpec

FORMAT = "tvr-checkpoint"
VERSION = 1


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file is missing, unreadable, or does not fit the model/optimizer it is loaded into."""


def _why_unreadable(path: Path, exc: str) -> str:
    """What a file that torch.load rejects looks like, so the message says more than the unpickler's opcode."""
    with open(path, "rb") as handle:
        head = handle.read(512)
    if head.startswith(b"PK\x03\x04"):
        return f"a torch.save archive that cannot be read (truncated or corrupt?): {exc}"
    if head[:1] == b"\x80":
        return f"a pickled file that cannot be read as a checkpoint (truncated or corrupt?): {exc}"
    if not head:
        return "an empty file, expected a checkpoint written by tvr train (torch.save)"
    try:
        head.decode("utf-8")
        kind = "a text file"
    except UnicodeDecodeError:
        kind = "neither a torch.save archive nor a pickle"
    return f"{kind}, expected a checkpoint written by tvr train (torch.save; first bytes {head[:16]!r})"


def read_checkpoint(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """Load and validate the raw checkpoint dict (on CPU), or raise :class:`CheckpointError` naming the file.
    ``mmap``: map the tensors instead of reading them (cheap when only the config or the key list is needed)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = load_torch_file(path, mmap=mmap)
    except PickleRefusedError as exc:
        raise CheckpointError(str(exc)) from None
    except TorchFileError as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, … for damaged files
        raise CheckpointError(f"{path}: not a readable checkpoint: {_why_unreadable(path, exc.detail)}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tvr training checkpoint (no '{FORMAT}' marker)")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload.get('version')}, expected {VERSION}")
    return payload


def load_model_state(path: Path, model: nn.Module, saved: dict[str, Any], saved_class: str) -> None:
    missing, unexpected, mismatched = state_dict_differences(
        model.state_dict(), saved, lambda k, theirs, ours: f"{k}: checkpoint {theirs} vs model {ours}"
    )
    if missing or unexpected or mismatched:

        def show(items: list[str]) -> str:
            return ", ".join(items[:20]) + (f", … ({len(items)} in all)" if len(items) > 20 else "") or "none"

        raise CheckpointError(
            f"{path}: checkpoint (model {saved_class}) does not match this {type(model).__name__}: "
            f"missing keys [{show(missing)}]; unexpected keys [{show(unexpected)}]; "
            f"shape mismatches [{show(mismatched)}]"
        )
    model.load_state_dict(saved)


def checkpoint_config_values(payload_or_path: dict[str, Any] | str | os.PathLike) -> dict[str, Any] | None:
    """The resolved run config a checkpoint carries, as the plain mapping it was saved as (None: a checkpoint
    written before checkpoints carried their config)."""
    if isinstance(payload_or_path, dict):
        payload = payload_or_path
    else:
        payload = read_checkpoint(payload_or_path, mmap=True)
    values = payload.get("config")
    return dict(values) if isinstance(values, dict) else None


def checkpoint_config(path: str | os.PathLike) -> Config:
    """The :class:`~tvr.config.Config` a checkpoint was trained with, resolved; CheckpointError when it carries
    none."""
    return checkpoint_run(path).config


def checkpoint_run(path: str | os.PathLike) -> RunSpec:
    """The run a checkpoint was trained with, resolved (:func:`tvr.models.run_spec.resolve_run`); CheckpointError
    when it carries none or its config does not load."""
    from tvr.models.run_spec import resolve_run

    values = checkpoint_config_values(path)
    if values is None:
        raise CheckpointError(
            f"{path}: this checkpoint carries no config (written before checkpoints carried one): pass the run's "
            "config with --config (its config.yaml)"
        )
    try:
        return resolve_run(config_from_dict(values))
    except ConfigError as exc:
        raise CheckpointError(f"{path}: the config it carries does not load: {exc}") from None


def has_backbone_weights(payload: dict[str, Any]) -> bool:
    """Whether a checkpoint holds backbone weights (one trained on cached features holds none: its backbone was
    frozen and is rebuilt from ``model.clip``)."""
    return any(key.startswith("backbone.") for key in payload["model"])


def load_model(checkpoint: str | os.PathLike, cfg: Config | RunSpec | None = None) -> tuple[nn.Module, Config]:
    """Build the model a checkpoint describes and load its weights: ``(model, config)``, the model on the CPU in
    eval mode, and the resolved config it was built from.

    ``cfg`` (a config, or a run a job has resolved already) overrides the config the checkpoint carries (needed for
    checkpoints written before they carried one).
    A checkpoint trained on a feature cache holds no backbone weights (the backbone was frozen): when ``cfg`` does
    not evaluate on a cache, the frozen backbone named by ``model.clip`` is re-attached, built from the same seed
    as the cache was.
    """
    from tvr.models.build import build_backbone, build_model
    from tvr.models.run_spec import RunSpec, resolve_run

    path = Path(checkpoint)
    payload = read_checkpoint(path, mmap=True)
    if cfg is None:
        run = checkpoint_run(path)
    else:
        run = cfg if isinstance(cfg, RunSpec) else resolve_run(cfg)
    cfg = run.config
    cached = bool(cfg.data.features_dir)
    has_backbone = has_backbone_weights(payload)
    seed_everything(cfg.train.seed)
    model = build_model(run, cached=cached or not has_backbone)
    load_model_state(path, model, payload["model"], str(payload.get("model_class")))
    if not cached and not has_backbone:
        seed_everything(cfg.train.seed)
        model.backbone = build_backbone(run)
    return model.eval(), cfg
