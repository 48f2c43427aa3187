"""The one place a device setting (``train.device``) becomes a :class:`torch.device`.

Training, evaluation, the feature-cache builder and the demo all go through :func:`resolve_device`, so ``auto``,
a bare ``cuda`` under torchrun, and a device this machine does not have mean the same thing everywhere.
"""

from __future__ import annotations

import torch

from tvr.utils.errors import UserError


class DeviceError(UserError, ValueError):
    """The configured device does not exist on this machine."""


def available_devices() -> list[str]:
    """The device names this process can use, for error messages: ``cpu``, then ``cuda:0``… and ``mps`` if present."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{k}" for k in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def resolve_device(name: str = "auto", local_rank: int = 0, *, setting: str = "train.device") -> torch.device:
    """Turn a device setting into a device this process can use.

    ``auto`` → ``cuda:<local_rank>`` when CUDA is available, else ``cpu``. A bare ``cuda`` gets the local rank's GPU
    (under torchrun every process owns the GPU numbered by its ``LOCAL_RANK``); an explicit ``cuda:K`` is kept.
    A malformed name, or a device this machine lacks, is a ``ValueError`` naming ``setting`` and listing the devices
    that are available, rather than a CUDA error deep inside the first forward.
    """
    raw = str(name).strip()
    if raw == "auto":
        raw = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(raw)
    except (RuntimeError, ValueError):
        raise DeviceError(
            f"{setting}={name!r} is not a device name; expected 'auto', 'cpu', 'cuda', 'cuda:K' "
            f"(available here: {', '.join(available_devices())})"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"{setting}={name!r} but CUDA is not available in this process (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'none'}); available: {', '.join(available_devices())}. "
                f"Use {setting}=auto or {setting}=cpu"
            )
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"{setting}={name!r} (local rank {local_rank}) needs GPU {device.index}, but this process sees "
                f"{torch.cuda.device_count()}; available: {', '.join(available_devices())}"
            )
    elif device.type == "mps" and "mps" not in available_devices():
        raise DeviceError(f"{setting}={name!r} but MPS is not available; available: {', '.join(available_devices())}")
    return device
