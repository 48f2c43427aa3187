"""Joining the torchrun process group for the length of one job — training, evaluation or indexing — and what a
process learns from it (:class:`DistInfo`: rank, world size, this rank's device). Nothing here is specific to
training; the DistributedDataParallel wrapper and the epoch shards are :mod:`tvr.train.distributed`."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tvr.utils.device import resolve_device


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r}: expected an integer (set by torchrun)") from None


def init_distributed(
    device: str = "auto", timeout_minutes: float | None = None, setting: str = "train.device"
) -> DistInfo:
    """Join the torchrun process group when ``WORLD_SIZE > 1`` (NCCL on CUDA, gloo on CPU); otherwise a no-op.

    ``device`` is the ``train.device`` setting, resolved by :func:`tvr.utils.device.resolve_device` with this
    process's ``LOCAL_RANK`` (so a bare ``cuda`` means this rank's GPU); ``setting`` names it in messages (``tvr
    index``: ``--device``).

    The timeout defaults to ``$TVR_DIST_TIMEOUT_MIN`` or 60 minutes, long enough for rank 0 to run a validation
    pass while the other ranks wait at their next collective. Calling it again returns the same information.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank if world_size > 1 else 0)
    if world_size <= 1 and not dist.is_initialized():
        return DistInfo(0, 1, 0, resolve_device(device, 0, setting=setting))
    dev = resolve_device(device, local_rank, setting=setting)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        if timeout_minutes is None:
            timeout_minutes = float(os.environ.get("TVR_DIST_TIMEOUT_MIN", "60"))
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev)


@contextlib.contextmanager
def distributed_job(device: str = "auto", setting: str = "train.device") -> Iterator[DistInfo]:
    """:func:`init_distributed` for the length of one job. A process group this call created is destroyed when the
    job returns (torch asks every process to do so before it exits); one that already existed is left to its owner,
    and a job that raises leaves the group to the exiting process.

    Run the job in a function that has returned before the block ends: every DDP reducer holds the group, and one
    still alive after the group is destroyed would later drop the group's last reference with the GIL held, when
    gloo's destructor joins a worker thread that may be waiting for that GIL (the deadlock
    ``tests/test_distributed.py`` met). The garbage of the job is collected before the group is destroyed.
    """
    created = not (dist.is_available() and dist.is_initialized())
    info = init_distributed(device, setting=setting)
    yield info
    if created and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
