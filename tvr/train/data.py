"""What the trainer consumes: an epoch-indexed, resumable stream of batch dicts."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from tvr.train.distributed import epoch_permutation, shard_batches
from tvr.train.preemption import ignore_signals


@runtime_checkable
class TrainData(Protocol):
    """A source of training batches with a deterministic order per (seed, epoch).

    ``batches(epoch, start_batch)`` must yield exactly the batches ``start_batch, start_batch + 1, …`` of that epoch's
    order, so a run resumed at (epoch, start_batch) sees the same data as one that never stopped.
    """

    def len_epoch(self) -> int:
        """Number of batches (optimizer steps, at most) per epoch on this rank."""
        ...

    def batches(self, epoch: int, start_batch: int = 0) -> Iterator[dict[str, Any]]: ...


class DatasetTrainData:
    """:class:`TrainData` over a map-style dataset: a permutation seeded by ``seed + epoch``, cut into global
    batches of ``batch_size × world_size`` of which this rank loads its ``batch_size`` slice (see
    :func:`tvr.train.distributed.shard_batches`).

    ``batch_size`` is per rank. Batches before ``start_batch`` are never loaded. The dataset's ``set_epoch(epoch)``
    is called, when it has one, before the epoch's loader starts, so per-sample randomness (augmentation, frame
    jitter) can be derived from (seed, epoch, index) and then survives a resume; randomness drawn from a worker's
    running RNG stream is only reproduced exactly with ``num_workers=0``.

    ``worker_ignored_signals``: signal names the loader's worker processes ignore (the run's preemption signals:
    the main process finishes its step and checkpoints, see :mod:`tvr.train.preemption`).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        collate_fn: Callable[[list[Any]], dict[str, Any]] | None = None,
        seed: int = 0,
        num_workers: int = 0,
        drop_last: bool = True,
        rank: int = 0,
        world_size: int = 1,
        pin_memory: bool = False,
        worker_ignored_signals: Sequence[str] = (),
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"DatasetTrainData: batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"DatasetTrainData: rank {rank} outside world_size {world_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.collate_fn = collate_fn
        self.seed = int(seed)
        self.num_workers = int(num_workers)
        self.drop_last = bool(drop_last)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.pin_memory = bool(pin_memory)
        self.worker_ignored_signals = tuple(worker_ignored_signals)

    def __len__(self) -> int:
        return self.len_epoch()

    def len_epoch(self) -> int:
        full, rest = divmod(len(self.dataset), self.batch_size * self.world_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_plan(self, epoch: int) -> list[list[int]]:
        """Dataset indices of every batch this rank gets in ``epoch``."""
        order = epoch_permutation(len(self.dataset), self.seed, epoch)
        return shard_batches(order, self.batch_size, self.rank, self.world_size, self.drop_last)

    def batches(self, epoch: int, start_batch: int = 0) -> Iterator[dict[str, Any]]:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        plan = self.epoch_plan(epoch)[start_batch:]
        loaded = [b for b in plan if b]
        if not loaded:
            for _ in plan:
                yield {"video_ids": [], "skipped": []}
            return
        # An explicit generator keeps the loader from drawing its worker base seed from the global torch RNG,
        # which would shift the dropout stream of a resumed run.
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=loaded,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            generator=torch.Generator().manual_seed(self.seed + epoch),
            worker_init_fn=functools.partial(ignore_signals, self.worker_ignored_signals)
            if self.worker_ignored_signals and self.num_workers > 0
            else None,
        )
        it = iter(loader)
        for indices in plan:
            # only the final partial batch of a multi-rank epoch can be empty on some ranks
            yield next(it) if indices else {"video_ids": [], "skipped": []}
