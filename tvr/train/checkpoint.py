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

from tvr.utils.errors import UserError
from tvr.utils.io import atomic_torch_save

FORMAT = "tvr-checkpoint"
VERSION = 1

log = logging.getLogger("tvr.train")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint file is missing, unreadable, or does not fit the model/optimizer it is loaded into."""


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
) -> Path:
    """Write everything needed to continue training bit for bit, atomically.

    ``state`` holds the loop position and bookkeeping (epoch, batch in epoch, global step, data seed, best metric…);
    the RNG states of this process are added under ``"rng"``.
    """
    model = unwrap_model(model)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "model_class": type(model).__name__,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "state": dict(state or {}),
        "rng": capture_rng_state(),
    }
    return atomic_torch_save(payload, path)


def _why_unreadable(path: Path, exc: Exception) -> str:
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


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load and validate the raw checkpoint dict (on CPU), or raise :class:`CheckpointError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, … for damaged files
        raise CheckpointError(f"{path}: not a readable checkpoint: {_why_unreadable(path, exc)}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tvr training checkpoint (no '{FORMAT}' marker)")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload.get('version')}, expected {VERSION}")
    return payload


def _load_model_state(path: Path, model: nn.Module, saved: dict[str, Any], saved_class: str) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    mismatched = [
        f"{k}: checkpoint {tuple(saved[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(saved))
        if isinstance(saved[k], torch.Tensor) and saved[k].shape != own[k].shape
    ]
    if missing or unexpected or mismatched:

        def show(items: list[str]) -> str:
            return ", ".join(items[:20]) + (f", … ({len(items)} in all)" if len(items) > 20 else "") or "none"

        raise CheckpointError(
            f"{path}: checkpoint (model {saved_class}) does not match this {type(model).__name__}: "
            f"missing keys [{show(missing)}]; unexpected keys [{show(unexpected)}]; "
            f"shape mismatches [{show(mismatched)}]"
        )
    model.load_state_dict(saved)


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
    _load_model_state(path, target, payload["model"], str(payload.get("model_class")))
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
