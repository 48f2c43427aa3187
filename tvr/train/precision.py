"""Mixed precision of a training run: which dtype the forward pass autocasts to, and the gradient scaler fp16 needs.

``train.amp`` switches autocast on or off; ``train.amp_dtype`` picks the dtype. ``auto`` keeps what the trainer
always did: on CUDA bf16 where the GPU supports it, else fp16; on CPU no autocast (CPU autocast is rarely faster
and would change every CPU run). ``bf16`` / ``fp16`` autocast on any device, the CPU included (tests run both there).

The weights stay float32 (the optimizer's master copy); autocast runs matrix products and convolutions in the low
dtype and keeps reductions such as the cross-entropy in float32. fp16's 5-bit exponent underflows small gradients,
so fp16 runs scale the loss before the backward and unscale before clipping and the step
(``torch.amp.GradScaler``; its state is saved in ``last.pt``, so a resumed run continues the same scale). bf16 has
float32's exponent range and needs no scaler.
"""

from __future__ import annotations

import contextlib

import torch

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(device: torch.device, amp: bool, amp_dtype: str) -> torch.dtype | None:
    """The dtype the training forward autocasts to on ``device`` (None: no autocast)."""
    if not amp:
        return None
    if amp_dtype in _DTYPES:
        return _DTYPES[amp_dtype]
    if amp_dtype != "auto":
        raise ValueError(f"train.amp_dtype = {amp_dtype!r}: expected auto, bf16 or fp16")
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 autocast on ``device``; None for bf16 and float32."""
    if dtype != torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type, or a no-op context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
