"""The shortlist index (FAISS, inner product on the head's shortlist embedding).

Kinds: ``flat`` — exact inner product over every window (``IndexFlatIP``); ``hnsw`` — a navigable small-world graph
over float16 copies of the vectors whose candidates are re-scored from the float32 ones (``IndexHNSWSQ`` inside
``IndexRefineFlat``; before issue 35 item 7, ``IndexHNSWFlat`` over float32, which still loads): what it finds
carries its exact inner product; ``ivf`` — an inverted
file of k-means cells (``IndexIVFFlat``: the query scans the ``nprobe`` best cells). ``auto`` picks ``flat`` below
:data:`AUTO_THRESHOLD` windows and ``hnsw`` above: text queries sit across a modality gap from the windows they look
for, and on such queries (``benchmarks/search.py``) IVF needs to scan a large share of the collection to keep
recall@10 near 0.95, while the graph reaches it visiting a few thousand windows.

Deterministic by construction, so an index built by one process, by several (``torchrun``), or resumed after a kill
is the same index, byte for byte: rows are added in canonical order (videos sorted by path, windows in time order)
in fixed blocks; the HNSW graph is built on one thread (its parallel insertion depends on thread timing; its levels
come from FAISS's fixed seed); the IVF quantizer is trained on a seeded sample of rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tvr.search.defaults import ANN_KINDS, AUTO_THRESHOLD, HNSW_STORAGES
from tvr.utils.errors import UserError
from tvr.utils.io import atomic_output

#: training rows per IVF cell (FAISS warns below 39)
TRAIN_PER_CELL = 64
#: cells probed per query, as a fraction of the cells (at least MIN_NPROBE), tuned with benchmarks/search.py
NPROBE_FRACTION = 1 / 16
MIN_NPROBE = 8
#: graph degree and construction beam (64 before issue 35 item 7: at 1M cross-modal windows, 96 reaches recall@10
#: 0.97 with beam 448 where 64 needed 768 for 0.957; the build takes ≈ 1.4× as long, docs/benchmarks.md)
HNSW_M = 24
HNSW_EF_CONSTRUCTION = 96
#: how a new graph keeps its vectors (one of HNSW_STORAGES): ``float32`` (``IndexHNSWFlat``, every index before
#: issue 35 item 7) or ``float16`` (``IndexHNSWSQ``, half the bytes a visited node reads, inside an
#: ``IndexRefineFlat`` that re-scores the candidates in float32, so the scores returned stay exact inner products);
#: an index records its own in the manifest
HNSW_STORAGE = "float16"
#: the smallest search beam (recall@10 ≈ 0.99 on the benchmark's 200k cross-modal queries), and the beam per
#: million windows a larger graph gets (:func:`hnsw_ef_search`)
HNSW_EF_SEARCH = 256
HNSW_EF_PER_MILLION = 448
#: rows added per FAISS call (fixed: HNSW inserts a batch's higher-level nodes first, so batches must not vary)
ADD_BLOCK = 65536
SEED = 1234


@functools.cache  # once: setting a logger's level clears every logger's cache (milliseconds a query)
def _faiss():
    import logging

    # the loader logs at INFO which CPU build it tried first (a ModuleNotFoundError that is no error)
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
        raise ImportError("tvr search needs FAISS: pip install faiss-cpu") from exc
    return faiss


@dataclasses.dataclass
class AnnSettings:
    """The kind actually built and its parameters (recorded in the manifest)."""

    kind: str
    rows: int
    dim: int
    nlist: int = 0
    nprobe: int = 0
    hnsw_m: int = 0
    ef_search: int = 0
    #: HNSW only (absent from manifests before issue 35 item 7: float32, construction beam 64)
    storage: str = ""
    ef_construction: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def hnsw_ef_search(rows: int) -> int:
    """The default search beam of an HNSW graph of ``rows`` windows: :data:`HNSW_EF_PER_MILLION` per million windows
    (a multiple of 64), at least :data:`HNSW_EF_SEARCH`. With the beam fixed, cross-modal recall falls as the graph
    grows (``benchmarks/search.py``, the default graph: recall@10 0.99 at 200k windows, 0.94 at 1M with 256); at
    1M, 448 finds 0.971 of the exact top 10 (docs/benchmarks.md). An index records its beam, and one built
    before keeps the beam it recorded (its graph, built with construction beam 64, needs more)."""
    beam = 64 * math.ceil(HNSW_EF_PER_MILLION * rows / 1_000_000 / 64)
    return max(HNSW_EF_SEARCH, beam)


def choose(kind: str, rows: int, dim: int, threshold: int = AUTO_THRESHOLD, nlist: int = 0) -> AnnSettings:
    """The settings ``kind`` (auto | flat | ivf | hnsw) means for ``rows`` windows of ``dim`` floats."""
    if kind not in ANN_KINDS:
        raise ValueError(f"--ann {kind!r}: expected one of {list(ANN_KINDS)}")
    if kind == "auto":
        kind = "flat" if rows < threshold else "hnsw"
    if kind == "ivf":
        if nlist <= 0:
            # ≈ 4·√N cells, a power of two, at most one per TRAIN_PER_CELL rows
            nlist = 2 ** max(0, round(math.log2(max(1.0, 4.0 * math.sqrt(rows)))))
        nlist = max(1, min(nlist, rows // TRAIN_PER_CELL if rows >= TRAIN_PER_CELL else 1, rows))
        nprobe = min(nlist, max(MIN_NPROBE, round(nlist * NPROBE_FRACTION)))
        return AnnSettings("ivf", rows, dim, nlist=nlist, nprobe=nprobe)
    if kind == "hnsw":
        return AnnSettings(
            "hnsw",
            rows,
            dim,
            hnsw_m=HNSW_M,
            ef_search=hnsw_ef_search(rows),
            storage=HNSW_STORAGE,
            ef_construction=HNSW_EF_CONSTRUCTION,
        )
    return AnnSettings("flat", rows, dim)


def training_rows(rows: int, settings: AnnSettings) -> np.ndarray:
    """The rows (sorted) an IVF quantizer is trained on: all of them, or a seeded sample of TRAIN_PER_CELL per cell."""
    want = settings.nlist * TRAIN_PER_CELL
    if rows <= want:
        return np.arange(rows)
    return np.sort(np.random.default_rng(SEED).choice(rows, size=want, replace=False))


def build(settings: AnnSettings, training: np.ndarray | None, blocks: Iterable[np.ndarray]):
    """Build the FAISS index: train on ``training`` (IVF), then add ``blocks`` of float32 rows in order (blocks of
    :data:`ADD_BLOCK` rows, for HNSW)."""
    faiss = _faiss()
    with _omp_threads(faiss, _all_cpus()):
        dim = settings.dim
        if settings.kind == "flat":
            index = faiss.IndexFlatIP(dim)
        elif settings.kind == "hnsw":
            index = _hnsw(faiss, settings)
        else:
            quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFFlat(quantizer, dim, settings.nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = SEED
            if training is None:
                raise ValueError("an IVF index needs training rows")
            index.train(np.ascontiguousarray(training, dtype=np.float32))
            index.nprobe = settings.nprobe
        # parallel HNSW insertion would make the graph depend on thread timing
        with _omp_threads(faiss, 1 if settings.kind == "hnsw" else _all_cpus()):
            for block in blocks:
                if len(block):
                    index.add(np.ascontiguousarray(block, dtype=np.float32))
    if index.ntotal != settings.rows:
        raise RuntimeError(f"ANN index holds {index.ntotal} rows, expected {settings.rows}")
    return index


def _hnsw(faiss, settings: AnnSettings):
    """An empty HNSW graph as ``settings`` describe it."""
    storage = settings.storage or "float32"
    if storage not in HNSW_STORAGES:
        raise ValueError(f"HNSW storage {storage!r}: expected one of {list(HNSW_STORAGES)}")
    if storage == "float32":
        graph = faiss.IndexHNSWFlat(settings.dim, settings.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index = graph
    else:
        fp16 = faiss.ScalarQuantizer.QT_fp16
        graph = faiss.IndexHNSWSQ(settings.dim, fp16, settings.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        # float16 needs no training; adding to the wrapper adds every row to the graph and to the float32 copy
        index = faiss.IndexRefineFlat(graph)
        index.own_fields = True  # the wrapper frees the graph with itself
        graph.this.disown()
    graph.hnsw.efConstruction = settings.ef_construction or HNSW_EF_CONSTRUCTION
    graph.hnsw.efSearch = settings.ef_search
    return index


def hnsw_graph(index):
    """The HNSW graph of a shortlist index (itself, or the graph a float32 re-scoring wrapper holds): where its
    search beam is set (``hnsw_graph(index).hnsw.efSearch``)."""
    faiss = _faiss()
    if isinstance(index, faiss.IndexRefine):
        return faiss.downcast_index(index.base_index)
    return index


def search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows) of the top ``k`` per query. One query is answered on one thread: a single IVF / flat scan
    gains little from OpenMP, and OpenMP threads spinning beside torch's slow both down on a busy machine (measured:
    a 20k-row flat scan took 6× longer with two OpenMP threads than with one on the 2-core benchmark machine)."""
    faiss = _faiss()
    with _omp_threads(faiss, 1 if len(queries) == 1 else _all_cpus()):
        return index.search(np.ascontiguousarray(queries, dtype=np.float32), k)


def _all_cpus() -> int:
    """The thread count of a FAISS call that may use the whole machine."""
    return os.cpu_count() or 1


@contextlib.contextmanager
def _omp_threads(faiss, threads: int) -> Iterator[None]:
    """FAISS's OpenMP thread count for one call, restored afterwards: a process-wide setting would leak into every
    later FAISS call of the caller (and OpenMP keeps it per calling thread)."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def save(index, path: Path) -> None:
    faiss = _faiss()
    with atomic_output(path) as tmp:
        faiss.write_index(index, str(tmp))


def load(path: Path, settings: dict[str, Any], nprobe: int | None = None, ef_search: int | None = None):
    for name, value in (("nprobe", nprobe), ("ef_search", ef_search)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"{name}={value!r}: expected a positive integer")
    faiss = _faiss()
    index = faiss.read_index(str(path))
    if settings.get("kind") == "ivf":
        faiss.extract_index_ivf(index).nprobe = int(nprobe or settings.get("nprobe") or MIN_NPROBE)
    elif settings.get("kind") == "hnsw":
        hnsw_graph(index).hnsw.efSearch = int(ef_search or settings.get("ef_search") or HNSW_EF_SEARCH)
    return index
