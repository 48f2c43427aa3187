"""Sharded evaluation under torchrun: every rank encodes its share of a split's videos and captions and scores its
share of the captions against the whole gallery; features and score rows are all-gathered in rank order, so every
rank ends with the encoded split and the score matrices one process computes (the same items in the same order;
values equal up to the float rounding of a different batch composition). Every rank must make the same calls.

Collectives run on the evaluation device (NCCL moves CUDA tensors only); results come back to the CPU like the
single-process path's. In a single process every helper is the identity.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
from torch import Tensor

from tvr.utils.distributed import RowShard, all_gather_object, gather_features, get_rank, get_world_size

T = TypeVar("T")


def shard_of(n: int) -> RowShard:
    """This rank's even share of ``n`` items (every item in a single process)."""
    return RowShard.split(n, get_rank(), get_world_size())


def gather_lists(items: list[T]) -> list[T]:
    """Every rank's list, concatenated in rank order (picklable items)."""
    if get_world_size() == 1:
        return items
    return [item for part in all_gather_object(items) for item in part]


def _layout(part: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype] | None] | None:
    if part is None:
        return None
    return {
        f.name: (tuple(v.shape[1:]), v.dtype) if isinstance(v, Tensor) else None
        for f in dataclasses.fields(part)
        for v in [getattr(part, f.name)]
    }


@torch.no_grad()
def gather_encoded(part: T | None, template: type, device: torch.device) -> T | None:
    """Every rank's feature container (``TextFeatures`` / ``VideoFeatures``, on the CPU) concatenated in rank
    order, on the CPU. A rank with nothing to contribute passes None (its share was empty or unreadable); the
    result is None when every rank did."""
    if get_world_size() == 1:
        return part
    layouts = all_gather_object(_layout(part))
    layout = next((entry for entry in layouts if entry is not None), None)
    if layout is None:
        return None
    if part is None:
        fields = {
            name: None if spec is None else torch.empty((0, *spec[0]), dtype=spec[1]) for name, spec in layout.items()
        }
        part = template(**fields)
    gathered = gather_features(part.to(device))  # type: ignore[union-attr]
    return gathered.to("cpu")


@torch.no_grad()
def gather_rows(block: Tensor, shard: RowShard, device: torch.device) -> Tensor:
    """This rank's rows of a score matrix → the whole matrix on every rank (CPU)."""
    if shard.world_size == 1:
        return block
    return shard.gather(block.to(device)).cpu()
