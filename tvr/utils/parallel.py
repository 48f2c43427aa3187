"""Run a function over many items in worker processes, with a progress bar; results come back as they finish.

Workers start from a clean interpreter ("forkserver" where available, else "spawn"), never by forking the caller:
a caller that has decoded video or run torch holds library threads, and a forked child can inherit one of their
locks in the locked state and hang forever. The function and its items must therefore be picklable (a module-level
function and plain values).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from tvr.utils.progress import progress_bar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one: a container's or taskset's limit)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(limit: int = 8) -> int:
    """One worker per CPU this process may use, at most ``limit``."""
    return max(1, min(limit, available_cpus()))


#: whether this process has said that it capped ``data.num_workers`` (one note a process, not one a loader)
_CAP_NOTED = {"done": False}


def loader_workers(requested: int) -> int:
    """``data.num_workers`` for a DataLoader, capped at the CPUs this process may use: more decoding processes than
    CPUs only compete for them (torch warns about it on every loader). The presets ask for 8, a GPU machine's
    count; the first cap in a process logs one note."""
    cpus = available_cpus()
    if requested <= cpus:
        return requested
    if not _CAP_NOTED["done"]:
        _CAP_NOTED["done"] = True
        log.info("data.num_workers %d: %d decoding worker(s), one per CPU this process may use", requested, cpus)
    return cpus


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the caller: the terminal sends SIGINT to the whole process group, and a worker that
    raised KeyboardInterrupt would print its own traceback; the caller stops the pool and says what was kept."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def parallel_map(
    fn: Callable[[T], R], items: Sequence[T], workers: int = 0, description: str = "", progress: bool = True
) -> Iterator[R]:
    """Yield ``fn(item)`` for every item, in completion order, from ``workers`` processes (0 = one per CPU, at most
    8; 1 = in this process). ``fn`` should catch its own errors and return them: an exception raised in a worker
    stops the whole map."""
    workers = workers or default_workers()
    if workers <= 1 or len(items) <= 1:
        yield from progress_bar(map(fn, items), description, enabled=progress, total=len(items))
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    processes = min(workers, len(items))
    chunk = max(1, min(16, len(items) // (processes * 8)))
    with context.Pool(processes, initializer=_ignore_interrupts) as pool:
        yield from progress_bar(
            pool.imap_unordered(fn, items, chunksize=chunk), description, enabled=progress, total=len(items)
        )
