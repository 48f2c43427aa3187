"""Process-group primitives that any layer may use: rank and world size, small collectives, and the autograd-aware
feature all-gather behind the contrastive loss. Imports nothing from tvr, so models can gather without depending on
the training package. Every helper is a no-op (or the identity) in a single process.

Gradient convention of :func:`gather_features`. Under DDP every rank computes the *same* global loss L on the
gathered batch (spec §1.4). The gather's backward sums the incoming gradient over ranks and returns this rank's
slice; see :mod:`tvr.train.distributed` for why that, followed by DDP's gradient averaging, gives every parameter
exactly the single-process full-batch gradient.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

T = TypeVar("T")

#: tensors with more dimensions than this cannot be gathered (the shape check uses a fixed-size descriptor)
_MAX_DIMS = 8


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main_process() -> bool:
    return get_rank() == 0


def barrier() -> None:
    if get_world_size() > 1:
        dist.barrier()


def all_reduce_mean(x: Tensor) -> Tensor:
    """Mean of ``x`` over ranks (a new tensor; ``x`` itself unchanged). Single process: ``x``."""
    if get_world_size() == 1:
        return x
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / get_world_size()


def all_reduce_max(x: Tensor) -> Tensor:
    if get_world_size() == 1:
        return x
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


def all_gather_object(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order. Single process: ``[obj]``."""
    if get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


# --------------------------------------------------------------------------------------------- all-gather


def _gather_padded(x: Tensor, sizes: list[int]) -> Tensor:
    """All-gather ``x`` whose dim 0 is ``sizes[rank]`` on each rank (other dims equal); result in rank order."""
    world = len(sizes)
    top = max(sizes)
    is_bool = x.dtype == torch.bool
    send = x.to(torch.uint8) if is_bool else x
    send = send.contiguous()
    if send.shape[0] < top:
        pad = send.new_zeros((top - send.shape[0], *send.shape[1:]))
        send = torch.cat([send, pad], dim=0)
    parts = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(parts, send)
    out = torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)], dim=0)
    return out.to(torch.bool) if is_bool else out


class _AllGather(torch.autograd.Function):
    """Forward: concatenate every rank's rows. Backward: sum the gradient over ranks (each rank computed the same
    global loss) and return the rows that belong to this rank."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, sizes: list[int], rank: int) -> Tensor:  # type: ignore[override]
        ctx.sizes = sizes
        ctx.rank = rank
        return _gather_padded(x, sizes)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]], None, None


def _describe(value: Any) -> list[int]:
    if not isinstance(value, Tensor):
        return [-1] * (_MAX_DIMS + 1)
    if value.ndim == 0 or value.ndim > _MAX_DIMS:
        raise ValueError(f"gather_features: can only gather tensors with 1..{_MAX_DIMS} dims, got {tuple(value.shape)}")
    return [value.ndim, *value.shape, *([-1] * (_MAX_DIMS - value.ndim))]


def gather_features(x: T) -> T:
    """All-gather a tensor or every tensor field of a :class:`tvr.types.Sliceable` dataclass along dim 0.

    Single process: ``x`` unchanged. With several ranks the result holds every rank's items in rank order and
    gradients flow back to this rank's slice (see the module docstring). Ranks may hold different numbers of items,
    but every other dimension (e.g. padded frame or word length) must agree; otherwise a ``ValueError`` names the
    field and every rank's shape.
    """
    world = get_world_size()
    if world == 1:
        return x
    if isinstance(x, Tensor):
        names, values = ["tensor"], [x]
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = [f.name for f in dataclasses.fields(x)]
        values = [getattr(x, n) for n in names]
    else:
        raise TypeError(f"gather_features: expected a Tensor or a feature dataclass, got {type(x).__name__}")
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not tensors:
        raise ValueError(f"gather_features: {type(x).__name__} holds no tensor")
    device = tensors[0].device
    desc = torch.tensor([d for v in values for d in _describe(v)], dtype=torch.long, device=device)
    all_desc = [torch.empty_like(desc) for _ in range(world)]
    dist.all_gather(all_desc, desc)
    table = torch.stack(all_desc).cpu().view(world, len(values), _MAX_DIMS + 1)
    rank = get_rank()
    gathered: dict[str, Any] = {}
    for k, (name, value) in enumerate(zip(names, values, strict=True)):
        rows = table[:, k]
        shapes = [tuple(int(d) for d in row[1 : 1 + int(row[0])]) if row[0] >= 0 else None for row in rows]
        if any((s is None) != (shapes[0] is None) for s in shapes) or any(
            s is not None and s[1:] != shapes[0][1:] for s in shapes
        ):
            per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
            raise ValueError(
                f"gather_features: {type(x).__name__}.{name} differs across ranks ({per_rank}); only the item axis "
                "(dim 0) may differ, so pad every rank's batch to the same lengths"
            )
        if value is None:
            gathered[name] = None
            continue
        sizes = [s[0] for s in shapes]  # type: ignore[index]
        if value.requires_grad:
            gathered[name] = _AllGather.apply(value, sizes, rank)
        else:
            gathered[name] = _gather_padded(value, sizes)
    if isinstance(x, Tensor):
        return gathered["tensor"]  # type: ignore[return-value]
    return dataclasses.replace(x, **gathered)  # type: ignore[type-var]
