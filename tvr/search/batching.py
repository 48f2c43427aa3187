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
        # queue.Queue, not queue.SimpleQueue: with several workers taking from one SimpleQueue, CPython 3.11's
        # get(timeout=...) can wait forever instead -- a worker that wins the wake-up for a query the other worker
        # then takes, and gets the interpreter back after its deadline, waits with a negative time, which is "no
        # limit", until the next query arrives, its gathered batch unanswered meanwhile. Queue.get rechecks the
        # queue and the time left under one condition (tests/test_search_server.py hands it 8,000 racing queries).
        self._waiting: queue.Queue[tuple[Query, Future] | None] = queue.Queue()
        self._workers = [
            threading.Thread(target=self._run, name=f"tvr-query-batcher-{n}", daemon=True) for n in range(workers)
        ]
        self._closed = False
        # held while a query is handed in and while closing: no query lands behind the workers' stop signals
        self._handing_in = threading.Lock()
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
        done: Future = Future()
        with self._handing_in:
            if self._closed:
                raise RuntimeError("the micro-batcher is closed")
            self._waiting.put((Query(text, k, rerank, all_windows, where), done))
        return done

    def close(self) -> None:
        """Stop the workers once the queries already handed in are answered."""
        with self._handing_in:
            if self._closed:
                return
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
            self._answer(batch)
            if stop:
                return

    def _answer(self, batch: list[tuple[Query, Future]]) -> None:
        """Settle every future of ``batch``: its answer, its query's error, or the error that failed the batch."""
        # a query whose caller stopped waiting (its future cancelled: the server's time limit) is not run; the others
        # are marked running, so that no cancel can come between their answer and setting it
        live = [(query, done) for query, done in batch if done.set_running_or_notify_cancel()]
        if not live:
            return
        with self._count:
            self.batches += 1
            self.queries += len(live)
        try:
            answers = self.index.answer([query for query, _ in live])
            if len(answers) != len(live):
                raise RuntimeError(f"the index answered {len(answers)} of a batch's {len(live)} queries")
        except BaseException as exc:  # noqa: BLE001 - every caller of the failed batch gets the error
            for _, done in live:
                done.set_exception(exc)
            return
        for (_, done), answer in zip(live, answers, strict=True):
            if isinstance(answer, QueryError):
                done.set_exception(answer)
            else:
                done.set_result(answer)
