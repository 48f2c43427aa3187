"""``torchrun`` sharding of ``tvr index``: two processes over gloo each embed their share of the videos into their own
shards, rank 0 trains the IVF quantizer once and fills it shard by shard in canonical order, and the index equals
the one a single process builds (manifest, row tables, embeddings, FAISS bytes); into a Qdrant collection, rank 0
writes the points and the collection equals a single process's."""

from __future__ import annotations

import importlib.util
import os
import socket
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from test_search import assert_same_index

from tvr.pipeline.search import run_index
from tvr.search.build import IndexOptions

OPTIONS = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, ann_kind="ivf", nlist=2, shard_windows=2)
#: a Qdrant collection is searched by its own graph: no IVF settings
QDRANT_OPTIONS = IndexOptions(window=4.0, stride=2.0, workers=1, progress=False, shard_windows=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, videos: str, out: str, checkpoint: str, qdrant: bool = False) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        report = run_index(videos, out, QDRANT_OPTIONS if qdrant else OPTIONS, checkpoint=checkpoint)
        assert bool(report) == (rank == 0)
    except BaseException:  # noqa: BLE001
        raise AssertionError(f"rank {rank} failed:\n{traceback.format_exc()}") from None


def _two_processes(search_setup, out: str, qdrant: bool = False) -> None:  # noqa: ANN001
    args = (2, _free_port(), str(search_setup.videos), out, str(search_setup.checkpoint), qdrant)
    # spawn, not fork: this test process has run FAISS, and a child forked after OpenMP threads started can hang in
    # its first parallel region
    context = mp.start_processes(_rank, args=args, nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 300
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two-process index build did not finish within 300 s")


def test_two_processes_build_the_single_process_index(search_setup, tmp_path: Path, monkeypatch) -> None:
    # the spawned ranks do not see conftest's folders: what they write in tvr's cache goes to this test's
    monkeypatch.setenv("TVR_CACHE_DIR", str(tmp_path / "cache"))
    _two_processes(search_setup, str(tmp_path / "two"))
    assert_built_like_one_process(search_setup, tmp_path / "two", tmp_path / "one")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("qdrant_client") is None, reason="qdrant-client is not installed")
def test_two_processes_build_the_single_process_collection(search_setup, tmp_path: Path, monkeypatch) -> None:
    """``torchrun … tvr index … --out qdrant+local:PATH``: each rank embeds its share into its own shards, rank 0
    writes the points; the collection equals the one a single process writes (every point, payload and vector)."""
    from test_search_qdrant import assert_same_collection

    monkeypatch.setenv("TVR_CACHE_DIR", str(tmp_path / "cache"))  # the spawned ranks' cache: this test's

    _two_processes(search_setup, f"qdrant+local:{tmp_path / 'two'}", qdrant=True)
    shards = sorted(p.name for p in (tmp_path / "two" / "shards").iterdir())
    assert any("-r000-" in s for s in shards) and any("-r001-" in s for s in shards)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = run_index(
            search_setup.videos, f"qdrant+local:{tmp_path / 'one'}", QDRANT_OPTIONS, checkpoint=search_setup.checkpoint
        )
    finally:
        torch.set_num_threads(threads)
    assert report["processes"] == 1 and report["ann"]["engine"] == "qdrant"
    assert_same_collection(f"qdrant+local:{tmp_path / 'two'}", f"qdrant+local:{tmp_path / 'one'}")


def assert_built_like_one_process(search_setup, index: Path, scratch: Path) -> None:  # noqa: ANN001
    """``index`` was built by two ranks, each writing its own shards, and equals the index one process builds (in
    ``scratch``) with :data:`OPTIONS` on one thread, the ranks' arithmetic."""
    shards = sorted(p.name for p in (index / "shards").iterdir())
    assert any("-r000-" in s for s in shards) and any("-r001-" in s for s in shards)  # each rank wrote its own
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = run_index(search_setup.videos, scratch, OPTIONS, checkpoint=search_setup.checkpoint)
    finally:
        torch.set_num_threads(threads)
    assert report["ann"]["kind"] == "ivf" and report["processes"] == 1
    assert_same_index(scratch, index)
