"""Run a check in two CPU processes joined over gloo (the robust pattern of tests/test_distributed.py): fork, one
thread per process, a deadline instead of a hang, and every DDP reducer freed before the process group is destroyed
(a reducer that drops the group's last reference with the GIL held can deadlock gloo's destructor)."""

from __future__ import annotations

import gc
import os
import shutil
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from tvr.train.distributed import init_distributed


def torchrun() -> str:
    """The torchrun beside this interpreter (or on PATH); skips the test when there is none."""
    local = Path(sys.executable).with_name("torchrun")
    found = str(local) if local.exists() else shutil.which("torchrun")
    if found is None:
        pytest.skip("torchrun not installed")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, check: Callable[..., None], args: tuple[Any, ...]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    info = init_distributed("cpu")
    failure = None
    try:
        check(rank, world, info, *args)
    except BaseException:  # noqa: BLE001 - reported below, after the process group is torn down
        failure = traceback.format_exc()
    gc.collect()
    torch.distributed.destroy_process_group()
    if failure is not None:
        raise AssertionError(f"rank {rank} failed:\n{failure}")


def run_two_processes(check: Callable[..., None], *args: Any, timeout: float = 300.0) -> None:
    """``check(rank, world_size, dist_info, *args)`` in two forked processes; fails the test if either fails or the
    pair has not finished within ``timeout`` seconds."""
    context = mp.start_processes(_worker, args=(2, free_port(), check, args), nprocs=2, join=False, start_method="fork")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the two-process check did not finish within {timeout:.0f} s")
