"""Activation memory of a training step: the bytes autograd keeps from the forward pass for the backward.

:class:`SavedTensorMeter` counts every distinct tensor storage saved for backward inside its block (tensors that
share a storage count once; the storages of ``exclude``, e.g. the parameters, not at all). It works on any device,
the ``meta`` device included, where tensors have shapes and no data: running a step on meta tensors gives the exact
activation bytes of sizes that would not fit in memory. Storages saved inside ``torch.utils.checkpoint`` regions
are dropped by the checkpoint's own hooks and never reach the meter, so it also shows what gradient checkpointing
saves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor


class SavedTensorMeter:
    """``with SavedTensorMeter(model.parameters()) as meter: loss = step()``; then ``meter.bytes`` and
    ``meter.count`` (distinct storages). Keep the graph alive (do not call backward) inside the block."""

    def __init__(self, exclude: Iterable[Tensor] = ()) -> None:
        self._exclude = {_key(t) for t in exclude}
        self._seen: dict[Any, int] = {}
        self._hooks: Any = None

    def _pack(self, tensor: Tensor) -> Tensor:
        key = _key(tensor)
        if key not in self._exclude and key not in self._seen:
            self._seen[key] = tensor.untyped_storage().nbytes()
        return tensor

    def __enter__(self) -> SavedTensorMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    @property
    def count(self) -> int:
        return len(self._seen)


def _key(tensor: Tensor) -> tuple[str, int]:
    # the StorageImpl's address: unique per storage on every device (meta tensors have no data pointer)
    return tensor.device.type, tensor.untyped_storage()._cdata
