"""Process-group primitives that any layer may use: rank and world size, small collectives, the differentiable
all-gather and all-reduce behind the training loss, and :class:`RowShard`, one rank's share of a gathered batch.
Imports nothing from tvr, so models can gather without depending on the training package. Every helper is a no-op
(or the identity) in a single process.

Differentiable collectives. :func:`gather_features`, :meth:`RowShard.gather` and :meth:`RowShard.sum` run on torch's
functional collectives (``torch.distributed._functional_collectives``): torch 2.13 deprecates the autograd
collectives of ``torch.distributed.nn.functional`` in their favour (its FutureWarning names them). Their backward
passes are the exact adjoints of the forward: the gradient of an all-gather is the reduce-scatter (sum over ranks)
of the incoming gradients, the gradient of a sum over ranks is the sum over ranks of the incoming gradients. With
every rank evaluating the *same* global loss through such collectives, DDP's gradient averaging gives every
parameter exactly the single-process gradient of the global batch; :mod:`tvr.train.distributed` has the argument.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
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
    """Mean of ``x`` over ranks (a new tensor; ``x`` itself unchanged; no gradient). Single process: ``x``."""
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


# --------------------------------------------------------------------------------------------- differentiable


@functools.cache
def _functional_collectives() -> Any:
    """torch's functional collectives (imported on first use: a single process never needs them)."""
    try:  # the public name the torch documentation gives them in later releases
        from torch.distributed import functional_collectives  # type: ignore[attr-defined]
    except ImportError:
        from torch.distributed import _functional_collectives as functional_collectives
    return functional_collectives


def all_gather_rows(x: Tensor, sizes: Sequence[int]) -> Tensor:
    """Every rank's ``x`` concatenated along dim 0 in rank order, where rank r holds ``sizes[r]`` rows (the other
    dimensions agree). Differentiable: the backward is the reduce-scatter (sum over ranks) of the gradients, so the
    rows of this rank receive the sum of every rank's gradient for them. Single process: ``x``."""
    world = len(sizes)
    if world == 1:
        return x
    if x.shape[0] != sizes[get_rank()]:
        raise ValueError(f"all_gather_rows: this rank holds {x.shape[0]} rows, sizes say {sizes[get_rank()]}")
    top = max(sizes)
    is_bool = x.dtype == torch.bool
    send = x.to(torch.uint8) if is_bool else x
    if send.shape[0] < top:
        send = torch.cat([send, send.new_zeros((top - send.shape[0], *send.shape[1:]))], dim=0)
    group = dist.group.WORLD
    out = _functional_collectives().all_gather_single(send.contiguous(), 0, group)
    out = out.wait() if hasattr(out, "wait") else out  # a plain tensor, still in the autograd graph
    if any(n != top for n in sizes):
        parts = out.view(world, top, *out.shape[1:])
        out = torch.cat([parts[r, :n] for r, n in enumerate(sizes)], dim=0)
    return out.to(torch.bool) if is_bool else out


def all_reduce_sum(x: Tensor) -> Tensor:
    """Σ over ranks of ``x`` (same shape on every rank), on every rank. Differentiable: the gradient that reaches
    ``x`` is the sum over ranks of the gradients of the result. Single process: ``x``."""
    if get_world_size() == 1:
        return x
    out = _functional_collectives().all_reduce(x.contiguous(), "sum", dist.group.WORLD)
    return out.wait() if hasattr(out, "wait") else out


# --------------------------------------------------------------------------------------------- the batch's shard


@dataclasses.dataclass(frozen=True)
class RowShard:
    """This rank's rows of a set of items spread over the ranks: rank ``rank`` of ``len(sizes)`` holds ``sizes[r]``
    items per rank r, and its own items are the rows :attr:`rows` of the gathered set (rank order).

    Training: a head's ``loss(text, video, shard=...)`` gets the shard of the gathered batch and splits its pairwise
    work by rows: this rank computes the expensive per-pair work only for its own texts against every gathered video
    (``sizes[rank] × total`` pairs, a 1/W share), assembles what the loss needs on the whole batch with
    :meth:`gather` (e.g. the B × B logits from each rank's rows) or :meth:`sum` (a sum over pairs from each rank's
    partial sum), and evaluates the rest of the loss identically on every rank. Every rank then holds the same
    global loss value, and the exact-adjoint backward of both collectives makes the DDP-averaged gradient that of
    one process on the whole batch (:mod:`tvr.train.distributed`). Every rank must call the same collectives in
    the same order.

    Evaluation: :meth:`split` shares out the texts (or videos) of a split evenly; each rank scores its rows and
    :meth:`gather` assembles the whole score matrix on every rank.

    In a single process (:meth:`whole`) the shard is every row and both collectives are the identity, so a caller
    has one code path.
    """

    rank: int
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.sizes or any(n < 0 for n in self.sizes) or not 0 <= self.rank < len(self.sizes):
            raise ValueError(f"RowShard: rank {self.rank} with item counts {self.sizes}")

    @classmethod
    def whole(cls, n: int) -> RowShard:
        """The shard of a single process: every one of the ``n`` items."""
        return cls(0, (int(n),))

    @classmethod
    def split(cls, n: int, rank: int, world_size: int) -> RowShard:
        """``n`` items shared out in rank order as evenly as possible (counts differ by at most one)."""
        base, extra = divmod(int(n), int(world_size))
        return cls(int(rank), tuple(base + (1 if r < extra else 0) for r in range(int(world_size))))

    @property
    def world_size(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        """Items in the gathered batch."""
        return sum(self.sizes)

    @property
    def start(self) -> int:
        return sum(self.sizes[: self.rank])

    @property
    def stop(self) -> int:
        return self.start + self.sizes[self.rank]

    @property
    def rows(self) -> slice:
        """This rank's items in the gathered batch."""
        return slice(self.start, self.stop)

    def local(self, x: T) -> T:
        """The rows of a gathered tensor (or sliceable feature container) that belong to this rank."""
        return x[self.rows]  # type: ignore[index]

    def positives(self, block: Tensor) -> Tensor:
        """The aligned pairs (local item k with gathered item ``start + k``) of a [n_local, total, ...] block."""
        index = torch.arange(block.shape[0], device=block.device)
        return block[index, index + self.start]

    def gather(self, block: Tensor) -> Tensor:
        """Every rank's ``block`` (dim 0 = its own rows) in rank order: [total, ...]. Differentiable."""
        if self.world_size == 1:
            return block
        return all_gather_rows(block, self.sizes)

    def sum(self, partial: Tensor) -> Tensor:
        """Σ over ranks of each rank's ``partial`` (e.g. a sum over its own pairs), the same on every rank.
        Differentiable."""
        if self.world_size == 1:
            return partial
        return all_reduce_sum(partial)


# --------------------------------------------------------------------------------------------- feature all-gather


def _describe(value: Any) -> list[int]:
    if not isinstance(value, Tensor):
        return [-1] * (_MAX_DIMS + 1)
    if value.ndim == 0 or value.ndim > _MAX_DIMS:
        raise ValueError(f"gather_features: can only gather tensors with 1..{_MAX_DIMS} dims, got {tuple(value.shape)}")
    return [value.ndim, *value.shape, *([-1] * (_MAX_DIMS - value.ndim))]


def _fields(x: Any) -> tuple[list[str], list[Any]]:
    if isinstance(x, Tensor):
        return ["tensor"], [x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = [f.name for f in dataclasses.fields(x)]
        return names, [getattr(x, n) for n in names]
    raise TypeError(f"gather_features: expected a Tensor or a feature dataclass, got {type(x).__name__}")


def _gather_all(items: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """All-gather every tensor field of every item (one shape exchange for all of them); returns the gathered items
    and the item count of each rank (the first tensor's dim 0)."""
    world = get_world_size()
    described = [_fields(x) for x in items]
    flat = [
        (k, name, value)
        for k, (names, values) in enumerate(described)
        for name, value in zip(names, values, strict=True)
    ]
    tensors = [v for _, _, v in flat if isinstance(v, Tensor)]
    if not tensors:
        raise ValueError(f"gather_features: {', '.join(type(x).__name__ for x in items)} holds no tensor")
    desc = torch.tensor([d for _, _, v in flat for d in _describe(v)], dtype=torch.long, device=tensors[0].device)
    all_desc = [torch.empty_like(desc) for _ in range(world)]
    dist.all_gather(all_desc, desc)
    table = torch.stack(all_desc).cpu().view(world, len(flat), _MAX_DIMS + 1)
    gathered: list[dict[str, Any]] = [{} for _ in items]
    counts: list[int] | None = None
    for column, (k, name, value) in enumerate(flat):
        rows = table[:, column]
        shapes = [tuple(int(d) for d in row[1 : 1 + int(row[0])]) if row[0] >= 0 else None for row in rows]
        if any((s is None) != (shapes[0] is None) for s in shapes) or any(
            s is not None and s[1:] != shapes[0][1:] for s in shapes
        ):
            per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(shapes))
            raise ValueError(
                f"gather_features: {type(items[k]).__name__}.{name} differs across ranks ({per_rank}); only the item "
                "axis (dim 0) may differ, so pad every rank's batch to the same lengths"
            )
        if value is None:
            gathered[k][name] = None
            continue
        sizes = [s[0] for s in shapes]  # type: ignore[index]
        counts = counts if counts is not None else sizes
        gathered[k][name] = all_gather_rows(value, sizes)
    out = [
        g["tensor"] if isinstance(x, Tensor) else dataclasses.replace(x, **g)
        for x, g in zip(items, gathered, strict=True)
    ]
    return out, counts  # type: ignore[return-value]


def gather_features(x: T) -> T:
    """All-gather a tensor or every tensor field of a :class:`tvr.types.Sliceable` dataclass along dim 0.

    Single process: ``x`` unchanged. With several ranks the result holds every rank's items in rank order and
    gradients flow back to this rank's slice as the sum over ranks of their gradients (the module docstring).
    Ranks may hold different numbers of items, but every other dimension (e.g. padded frame or word length) must
    agree; otherwise a ``ValueError`` names the field and every rank's shape.
    """
    if get_world_size() == 1:
        return x
    return _gather_all([x])[0][0]


def gather_batch(text: T, video: Any) -> tuple[T, Any, RowShard]:
    """:func:`gather_features` of a batch's text and video features (one shape exchange for both) and this rank's
    :class:`RowShard` of the gathered batch. Single process: the inputs and :meth:`RowShard.whole`."""
    world = get_world_size()
    if world == 1:
        return text, video, RowShard.whole(len(text))  # type: ignore[arg-type]
    (text, video), counts = _gather_all([text, video])
    return text, video, RowShard(get_rank(), tuple(counts))
