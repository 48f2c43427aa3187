"""Micro-batching concurrent queries: many users share one loaded model without waiting for each other's passes.

A query's cost is mostly the text encoder's forward pass, and a pass over 20 queries costs little more than a pass
over one. So concurrent callers of :meth:`MicroBatcher.search` hand their query to a worker thread; a worker takes
whatever has arrived within a short tick after the first query (at most ``max_batch``), runs the text encoder once
over all of them (:meth:`~tvr.search.index.SearchIndex.answer`), shortlists and reranks each query on its own, and
hands every caller its own answer. While a worker runs a batch, the next one gathers. There is one worker per core
(:func:`default_workers`): a pass's arithmetic runs without Python's global lock, so two workers' passes run at once on
two cores (one worker, and the server, used one core of two). Each answer is the one a query alone gets (queries are
encoded on one torch thread, where the encoder's rows do not depend on their batch neighbours:
``tests/test_search.py``, ``tests/test_search_server.py`` and ``benchmarks/search_serve.py`` compare them with serial
queries).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from tvr.search.filters import WindowFilter
from tvr.search.index import Hit, Query, QueryError, SearchIndex

#: seconds the worker waits after a batch's first query for others to join it
DEFAULT_TICK = 0.002
#: queries per text-encoder pass at most
DEFAULT_MAX_BATCH = 64
#: workers at most by default, however many cores: each holds a batch's activations, and past a few the batches get
#: too small to share a pass
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """One worker per core this process may run on, at most :data:`MAX_DEFAULT_WORKERS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


class MicroBatcher:
    """Answers :meth:`search` calls from many threads in shared text-encoder batches (module docstring)."""

    def __init__(
        self,
        index: SearchIndex,
        tick: float = DEFAULT_TICK,
        max_batch: int = DEFAULT_MAX_BATCH,
        workers: int | None = None,
    ) -> None:
        workers = default_workers() if workers is None else workers
        if tick < 0 or max_batch < 1 or workers < 1:
            raise ValueError(f"tick must be >= 0, max_batch and workers >= 1, got {tick}, {max_batch}, {workers}")
        self.index = index
        self.tick = float(tick)
        self.max_batch = int(max_batch)
        self._waiting: queue.SimpleQueue[tuple[Query, Future] | None] = queue.SimpleQueue()
        self._workers = [
            threading.Thread(target=self._run, name=f"tvr-query-batcher-{n}", daemon=True) for n in range(workers)
        ]
        self._closed = False
        self._count = threading.Lock()
        #: batches run and queries answered so far (their ratio: how much sharing happened)
        self.batches = 0
        self.queries = 0
        for worker in self._workers:
            worker.start()

    @property
    def workers(self) -> int:
        """Batches that may run at once."""
        return len(self._workers)

    def search(self, text: str, k: int = 10, **options: Any) -> list[Hit]:
        """What ``index.search(text, k, ...)`` returns, computed in a batch with the queries that arrive with it
        (``options``: :meth:`submit`'s)."""
        return self.submit(text, k, **options).result()

    def submit(
        self,
        text: str,
        k: int = 10,
        *,
        rerank: int | None = None,
        all_windows: bool = False,
        where: WindowFilter | None = None,
    ) -> Future[list[Hit]]:
        """Hand a query in and return at once: the future's result is :meth:`search`'s answer (its exception the
        query's :class:`QueryError`). An async caller awaits it (``asyncio.wrap_future``) without holding a thread.
        ``where``: the videos and times it may answer from (:mod:`tvr.search.filters`)."""
        if self._closed:
            raise RuntimeError("the micro-batcher is closed")
        done: Future = Future()
        self._waiting.put((Query(text, k, rerank, all_windows, where), done))
        return done

    def close(self) -> None:
        """Stop the workers once the queries already handed in are answered."""
        if not self._closed:
            self._closed = True
            for _ in self._workers:
                self._waiting.put(None)
            for worker in self._workers:
                worker.join()

    def _run(self) -> None:
        while True:
            first = self._waiting.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.tick
            stop = False
            while len(batch) < self.max_batch:
                try:
                    item = self._waiting.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            with self._count:
                self.batches += 1
                self.queries += len(batch)
            try:
                answers = self.index.answer([query for query, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - every caller of the failed batch gets the error
                for _, done in batch:
                    done.set_exception(exc)
            else:
                for (_, done), answer in zip(batch, answers, strict=True):
                    if isinstance(answer, QueryError):
                        done.set_exception(answer)
                    else:
                        done.set_result(answer)
            if stop:
                return
