"""Small helpers of the training loop: seeding, RNG isolation, moving batches, reading metrics."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from tvr.utils.json_values import plain_json
from tvr.utils.metric_paths import higher_is_better, lookup_metric, metric_paths  # noqa: F401
from tvr.utils.seeding import seed_everything  # noqa: F401


@contextlib.contextmanager
def preserve_rng() -> Iterator[None]:
    """Run a block (e.g. validation) without advancing the training RNG streams, so a run with and without
    evaluation — or one resumed from a checkpoint — draws exactly the same dropout masks afterwards."""
    py_state = random.getstate()
    np_state = np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def move_to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """Tensors go to ``device`` (non-blocking from pinned memory); lists and strings stay as they are."""
    non_blocking = device.type == "cuda"
    return {
        k: (v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()
    }


def batch_item_count(batch: Any) -> int:
    """How many pairs a batch holds: ``len(video_ids)`` when present, else the first tensor's leading size."""
    if batch is None:
        return 0
    if not isinstance(batch, Mapping):
        raise TypeError(f"training batches must be dicts, got {type(batch).__name__}")
    if "video_ids" in batch:
        return len(batch["video_ids"])
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
    return 0


def skipped_entries(batch: Any) -> list[dict[str, Any]]:
    """Unreadable videos a batch reports: ``batch["skipped"]`` as ids (with an optional parallel
    ``batch["errors"]``), ``(id, error)`` pairs, or ``{"id", "error"}`` dicts → ``[{"id", "error"}]``."""
    if not isinstance(batch, Mapping):
        return []
    skipped = batch.get("skipped") or []
    errors = batch.get("errors") or []
    out = []
    for k, item in enumerate(skipped):
        if isinstance(item, Mapping):
            out.append({"id": item.get("id"), "error": item.get("error")})
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            out.append({"id": item[0], "error": item[1]})
        else:
            out.append({"id": item, "error": errors[k] if k < len(errors) else None})
    return out


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON: tensors and arrays become numbers or lists, non-finite floats strings."""
    return plain_json(obj, _training_value)


def _training_value(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.item() if obj.numel() == 1 else obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj
