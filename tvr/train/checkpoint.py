"""Training checkpoints: model, optimizer, scheduler, grad scaler, RNG states and loop position in one file.

Files are written atomically (temporary file + rename), so a crash during a save leaves the previous checkpoint
intact. Everything is stored as tensors and plain Python values, so ``torch.load(weights_only=True)`` reads it.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tvr.config import Config, config_to_dict
from tvr.models.checkpoint import (  # noqa: F401 (CheckpointError, read_checkpoint: this module's API too)
    FORMAT,
    VERSION,
    CheckpointError,
    load_model_state,
    read_checkpoint,
)
from tvr.utils.io import atomic_torch_save

log = logging.getLogger("tvr.train")


# --------------------------------------------------------------------------------------------- RNG state


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and every CUDA device) generator states, as weights-only-loadable values."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": str(np_state[0]),
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            raise CheckpointError(
                f"checkpoint holds RNG states for {len(cuda)} CUDA devices, "
                f"this process sees {torch.cuda.device_count()}"
            )
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


# --------------------------------------------------------------------------------------------- save / load


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module whose ``state_dict`` is saved (strips DDP/DataParallel ``.module`` and ``torch.compile``)."""
    model = getattr(model, "_orig_mod", model)
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    scaler: Any | None = None,
    state: dict[str, Any] | None = None,
    config: Config | None = None,
) -> Path:
    """Write everything needed to continue training bit for bit, atomically.

    ``state`` holds the loop position and bookkeeping (epoch, batch in epoch, global step, data seed, best metric…);
    the RNG states of this process are added under ``"rng"``. ``config`` (the resolved run config) makes the file
    self-describing: :func:`tvr.models.checkpoint.load_model` rebuilds the model from it with no other file.
    """
    model = unwrap_model(model)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "model_class": type(model).__name__,
        "config": config_to_dict(config) if config is not None else None,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "state": dict(state or {}),
        "rng": capture_rng_state(),
    }
    return atomic_torch_save(payload, path)


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    scaler: Any | None = None,
    restore_rng: bool | None = None,
) -> dict[str, Any]:
    """Restore the model (and, when given, optimizer/scheduler/scaler); return ``state`` (plus the saved ``"rng"``).

    RNG states are restored when ``restore_rng`` is true; the default (``None``) restores them only when an optimizer
    is given, i.e. when resuming training rather than loading weights for evaluation.

    Raises :class:`CheckpointError` naming the file when it is missing, unreadable, or does not fit: the message lists
    missing/unexpected keys and shape mismatches. Asking for an optimizer state the file does not hold (e.g. a
    ``best.pt``, which stores weights only) is an error too.
    """
    path = Path(path)
    payload = read_checkpoint(path)
    target = unwrap_model(model)
    load_model_state(path, target, payload["model"], str(payload.get("model_class")))
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        if obj is None:
            continue
        saved = payload.get(name)
        if saved is None and name == "scaler":
            # fp16 grad-scaler state is just the dynamic loss scale; it re-calibrates within a few steps
            log.warning("%s: no grad-scaler state (saved without fp16 AMP); starting from a fresh scale", path)
            continue
        if saved is None:
            raise CheckpointError(f"{path}: holds no {name} state (weights-only checkpoint?); cannot resume from it")
        try:
            obj.load_state_dict(saved)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: {name} state does not fit the current {name}: {exc}") from exc
    if restore_rng or (restore_rng is None and optimizer is not None):
        restore_rng_state(payload["rng"])
    state = dict(payload.get("state") or {})
    state["rng"] = payload["rng"]
    return state
