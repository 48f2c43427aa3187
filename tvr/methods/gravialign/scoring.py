"""GraviAlign's fast test-time S_align of every (text, video) pair (docs/methods/gravialign.md, "Where the s_align
time goes").

The pure function ``losses.sgi_align_pairwise`` defines the values (and carries the gradient the contrastive
objective needs); :func:`s_align_scores` computes the same values without autograd, faster: cache-sized blocks in
reused buffers, variances multiplied over groups of dimensions before one log per group (:func:`sgi_product_group`
proves the products stay in float32's range) and, on a CPU, text stripes shared among single-threaded workers of one
pool (:class:`ScoringPool`) that lives as long as the process and is created on first use — never per call, and
never by a training step (the head scores in the calling thread there).
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from tvr.methods.gravialign.losses import (
    SgiParams,
    all_pairs_inputs,
    sgi_terms_from_moments,
    sum_terms,
)

#: [texts, videos, D] elements of one scratch block of :func:`s_align_scores` (two such buffers per worker)
SGI_BLOCK_ELEMENTS = 1 << 20
SGI_TEXT_CHUNK = 8
#: largest group of dimensions whose variances are multiplied before one log (see :func:`sgi_product_group`)
SGI_MAX_GROUP = 64
#: |log| bound of a product of grouped variances: e^±80 stays inside float32's normal range (e^−87.3 to e^88.7)
_LOG_PRODUCT_LIMIT = 80.0
_LN2 = 0.6931471805599453


def sgi_product_group(logvar_v: Tensor, logvar_t: Tensor, max_group: int = SGI_MAX_GROUP) -> tuple[int, int]:
    """(g, k) for :func:`s_align_scores`: Σ_k log s_k may be computed as Σ over groups of g dimensions of
    log Π s̃_k with s̃ = s·2^−k, because every such product provably stays inside float32's normal range.

    Proof of the bound: s = σ_v² + σ_t² is increasing in both log variances, so every s_k of every pair lies in
    [e^lo, e^hi] with lo = logaddexp(min logvar_v, min logvar_t) and hi = logaddexp(max logvar_v, max logvar_t).
    Scaling by the power of two 2^−k nearest the centre (exact in floating point) puts every log s̃_k in [−h, h],
    h = max(hi − k·ln 2, k·ln 2 − lo), so a product of g of them has |log| ≤ g·h; g is the largest power of two
    ≤ ``max_group`` with g·h ≤ 80 (float32 normals span e^−87.3 to e^88.7; the product's own rounding is a relative
    g·2^−24). With the default clamp log σ² ∈ [−10, 5], h ≤ 7.8 and g ≥ 8 whatever the data. Without a clamp the
    range is the data's: a wide one (or a non-finite input, or a variance outside e^±80) gives g = 1, one log per
    dimension."""
    if logvar_v.numel() == 0 or logvar_t.numel() == 0 or max_group <= 1:
        return 1, 0
    lo_v, hi_v = (float(x) for x in torch.aminmax(logvar_v.detach()))
    lo_t, hi_t = (float(x) for x in torch.aminmax(logvar_t.detach()))
    lo, hi = _logaddexp(lo_v, lo_t), _logaddexp(hi_v, hi_t)
    # a variance that is subnormal or overflows in float32 is already rounded away: keep one log per dimension
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < -80.0 or hi > 80.0:
        return 1, 0
    k = round((lo + hi) / (2.0 * _LN2))
    h = max(hi - k * _LN2, k * _LN2 - lo)
    dim = logvar_v.shape[-1]
    g = 1
    while 2 * g <= max_group and 2 * g <= dim and 2 * g * h <= _LOG_PRODUCT_LIMIT:
        g *= 2
    return (g, k) if g > 1 else (1, 0)  # one log per dimension needs no rescaling


def _logaddexp(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return a if a == b else max(a, b)
    top = max(a, b)
    return top + math.log1p(math.exp(min(a, b) - top))


# --------------------------------------------------------------------------------------------- worker pool


def _openmp_runtimes() -> list[str]:
    """The OpenMP runtimes torch may use, as files: its bundled one first (pip wheels), then the common sonames."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    found = [
        p
        for pattern in ("libgomp*.so*", "libomp*.so*", "libiomp5*.so*", "libomp*.dylib", "libiomp5*.dylib")
        for p in sorted(glob.glob(os.path.join(lib, pattern)))
    ]
    return found + ["libgomp.so.1", "libomp.so", "libiomp5.so"]


def _single_thread_this_thread() -> bool:
    """Make torch's intra-op parallelism single-threaded in the calling thread only: OpenMP's thread count is a
    per-thread setting (``omp_set_num_threads`` touches the calling thread's ICV), whereas ``torch.set_num_threads``
    also changes the process-wide default that every new thread starts from. True when it worked (checked through
    ``torch.get_num_threads()``, which reads the same per-thread value)."""
    torch.get_num_threads()  # torch initialises this thread's setting from the process default on first use
    if torch.get_num_threads() == 1:
        return True
    for path in _openmp_runtimes():
        try:
            runtime = ctypes.CDLL(path)
            runtime.omp_set_num_threads(ctypes.c_int(1))
        except (OSError, AttributeError):
            continue
        if torch.get_num_threads() == 1:
            return True
    return False


class ScoringPool:
    """``workers`` threads, each single-threaded for torch, created once and reused by every :func:`s_align_scores`
    call of the process (:func:`scoring_pool`).

    Why threads of our own: with torch's intra-op threads every small block op is an OpenMP parallel region with a
    barrier, and on a machine where another process holds a core those barriers cost more than the arithmetic;
    workers that each take whole text stripes never wait for each other. Each worker makes itself single-threaded
    without touching process-wide state (:func:`_single_thread_this_thread`); only where that is impossible (an
    OpenMP runtime we cannot reach) does it fall back to ``torch.set_num_threads(1)``, and the pool then restores
    the process default once, when its workers have started. Idle workers cost nothing; the pool shuts down at
    interpreter exit (``concurrent.futures`` joins its threads) or by :meth:`shutdown`. Threads do not survive
    ``fork``: a forked child starts a new pool on first use (see :func:`scoring_pool`)."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"ScoringPool: workers must be >= 1, got {workers}")
        self.workers = workers
        self.pid = os.getpid()
        self.fallbacks = 0
        default = torch.get_num_threads()
        ready = threading.Barrier(workers + 1)
        lock = threading.Lock()

        def start() -> None:
            try:
                if not _single_thread_this_thread():
                    torch.set_num_threads(1)  # this thread's setting, and (the fallback's cost) the process default
                    with lock:
                        self.fallbacks += 1
            finally:
                ready.wait()

        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sgi_align")
        # start every worker now (each runs ``start`` once, all waiting at the barrier so none is reused), so no
        # thread is created later, mid-scoring
        try:
            started = [self._executor.submit(start) for _ in range(workers)]
            ready.wait()
            for future in started:
                future.result()
        except BaseException:
            ready.abort()  # a thread that could not start: release the ones waiting at the barrier
            self._executor.shutdown(wait=False)
            raise
        if self.fallbacks:
            torch.set_num_threads(default)  # the fallback changed the default new threads start from: restore it

    def map_stripes(self, job: _PairwiseJob, starts: list[int]) -> None:
        """Score ``starts`` (text stripes of ``job``) on up to ``workers`` workers; each worker allocates its
        buffers once and pulls stripes until none is left (dynamic: a descheduled worker holds no one up)."""
        tasks = min(self.workers, len(starts))
        pending = iter(starts)
        lock = threading.Lock()

        def work() -> None:
            buffers = job.buffers()
            with torch.no_grad():  # grad mode is thread-local
                while True:
                    with lock:
                        a = next(pending, None)
                    if a is None:
                        return
                    job.stripe(a, buffers)

        for future in [self._executor.submit(work) for _ in range(tasks)]:
            future.result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


#: the process's pools by size (normally one); reset in a forked child, whose copies have no threads
_POOLS: dict[int, ScoringPool] = {}
_POOLS_LOCK = threading.Lock()


def _forget_pools_after_fork() -> None:
    # the child has no worker threads, and the lock may have been held by a thread that does not exist there
    global _POOLS, _POOLS_LOCK
    _POOLS = {}
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_after_fork)


def scoring_pool(workers: int) -> ScoringPool:
    """The process's :class:`ScoringPool` with ``workers`` threads: created on first use, then reused by every call
    (a pool inherited through ``fork`` is never used: its threads are not in the child)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None or pool.pid != os.getpid():
            pool = _POOLS[workers] = ScoringPool(workers)
        return pool


def shutdown_scoring_pools() -> None:
    """Stop the process's pools (a later :func:`s_align_scores` call starts a new one). Idle pools cost nothing, and
    interpreter exit joins their threads anyway; this is for callers that want the threads gone now."""
    with _POOLS_LOCK:
        pools = [p for p in _POOLS.values() if p.pid == os.getpid()]
        _POOLS.clear()
    for pool in pools:
        pool.shutdown()


# --------------------------------------------------------------------------------------------- the kernel


@torch.no_grad()
def s_align_scores(
    mu_v: Tensor,
    logvar_v: Tensor,
    mu_t: Tensor,
    logvar_t: Tensor,
    params: SgiParams | None = None,
    *,
    text_chunk: int | None = None,
    video_chunk: int | None = None,
    max_group: int = SGI_MAX_GROUP,
    workers: int | None = None,
    **fields: Any,
) -> Tensor:
    """S_align of every (text, video) pair, [N_t, N_v] (videos first in the arguments, texts on the rows): the values
    of ``losses.sgi_align_pairwise`` (same ``params``, an ``SgiParams`` or its fields as keyword arguments), without
    autograd.

    The pairs are scored in blocks of ``text_chunk`` × ``video_chunk`` (default 8 texts × as many videos as fit
    ``SGI_BLOCK_ELEMENTS`` with D); working memory is two such blocks plus a row stripe per worker, whatever N_t and
    N_v. Per block: s and δ into two reused buffers, δ² /= s in place and summed (q), then the variances are
    multiplied over groups of g dimensions (one strided product) and one log per group gives Σ log s
    (:func:`sgi_product_group`; ``max_group=1`` is one log per dimension). The qualities and variances are computed
    once per item, not per pair.

    ``workers``: CPU stripes of ``text_chunk`` texts are shared among that many workers of the process's
    :class:`ScoringPool` (default: ``torch.get_num_threads()``); 1 scores in the calling thread with the caller's
    torch settings, and never creates a pool. On CUDA: one loop, 16× larger blocks (not measured: no GPU here)."""
    inputs = (x.detach() for x in (mu_v, logvar_v, mu_t, logvar_t))
    params, mu_v, logvar_v, mu_t, logvar_t = all_pairs_inputs("s_align_scores", *inputs, params, fields)
    if workers is not None and workers < 1:
        raise ValueError(f"s_align_scores: workers must be >= 1, got {workers}")
    n_v, dim = mu_v.shape
    n_t = mu_t.shape[0]
    if text_chunk is not None and text_chunk < 1 or video_chunk is not None and video_chunk < 1:
        raise ValueError(f"s_align_scores: chunks must be >= 1, got text_chunk={text_chunk}, video_chunk={video_chunk}")
    text_chunk = min(max(1, n_t), text_chunk or SGI_TEXT_CHUNK)
    # a GPU has no cache to fit and pays per kernel launch: 16× larger blocks there (not measured: no GPU here)
    budget = SGI_BLOCK_ELEMENTS * (16 if mu_v.is_cuda else 1)
    video_chunk = min(max(1, n_v), video_chunk or max(1, budget // (text_chunk * max(1, dim))))
    out = mu_v.new_empty(n_t, n_v)
    if n_t == 0 or n_v == 0:
        return out
    m_v, m_t = params.qualities(logvar_v, logvar_t)
    g, k = sgi_product_group(logvar_v, logvar_t, max_group)
    scale = 2.0**-k  # exact: a power of two
    # Σ log s = Σ log s̃ + D·k·ln 2 and Σ δ²/s = 2^−k·Σ δ²/s̃ (s̃ = 2^−k·s)
    job = _PairwiseJob(
        mu_v=mu_v,
        var_v=logvar_v.exp().mul_(scale),
        mu_t=mu_t,
        var_t=logvar_t.exp().mul_(scale),
        m_v=m_v,
        m_t=m_t,
        group=g,
        q_scale=scale / dim if params.per_dim_mean else scale,
        c_scale=1.0 / dim if params.per_dim_mean else 1.0,
        c_shift=k * _LN2 * (1.0 if params.per_dim_mean else dim),
        text_chunk=text_chunk,
        video_chunk=video_chunk,
        params=params,
        softening=params.softening(dim),
        out=out,
    )
    starts = list(range(0, n_t, text_chunk))
    wanted = 1 if mu_v.is_cuda else (workers or torch.get_num_threads())
    if wanted <= 1 or len(starts) <= 1:
        buffers = job.buffers()
        for a in starts:
            job.stripe(a, buffers)
        return out
    scoring_pool(wanted).map_stripes(job, starts)
    return out


@dataclasses.dataclass
class _PairwiseJob:
    """The all-pairs computation of :func:`s_align_scores`, one stripe of texts at a time (so stripes can run on
    worker threads, each writing its own rows of ``out``). Variances are pre-scaled by 2^−k."""

    mu_v: Tensor
    var_v: Tensor
    mu_t: Tensor
    var_t: Tensor
    m_v: Tensor | None
    m_t: Tensor | None
    group: int
    q_scale: float
    c_scale: float
    c_shift: float
    text_chunk: int
    video_chunk: int
    params: SgiParams
    softening: float
    out: Tensor

    def buffers(self) -> tuple[Tensor, ...]:
        """Scratch of one worker: the s and δ blocks, the block's group products, and the stripe's q and Σ log s
        rows."""
        dim = self.mu_v.shape[1]
        block = self.text_chunk * self.video_chunk * dim
        n_v = self.mu_v.shape[0]
        new = self.mu_v.new_empty
        products = self.text_chunk * self.video_chunk * (dim // self.group)
        return new(block), new(block), new(products), new(self.text_chunk, n_v), new(self.text_chunk, n_v)

    def stripe(self, a: int, buffers: tuple[Tensor, ...]) -> None:
        s_buf, d_buf, p_buf, q_row, c_row = buffers
        n_v, dim = self.mu_v.shape
        g = self.group
        n_groups = dim // g
        grouped = n_groups * g  # the first g·⌊D/g⌋ dimensions go through products; the rest (< g) log directly
        nt = min(self.text_chunk, self.mu_t.shape[0] - a)
        vt, mt = self.var_t[a : a + nt, None], self.mu_t[a : a + nt, None]
        for b in range(0, n_v, self.video_chunk):
            nv = min(self.video_chunk, n_v - b)
            s = s_buf[: nt * nv * dim].view(nt, nv, dim)
            d = d_buf[: nt * nv * dim].view(nt, nv, dim)
            torch.add(vt, self.var_v[None, b : b + nv], out=s)
            torch.sub(mt, self.mu_v[None, b : b + nv], out=d)
            d.mul_(d).div_(s)
            torch.sum(d, dim=-1, out=q_row[:nt, b : b + nv])
            logs = c_row[:nt, b : b + nv]
            if g == 1:
                torch.sum(s.log_(), dim=-1, out=logs)
                continue
            # Σ log s̃ as Σ over groups of log Π: the product over the group axis (strided, so it vectorises across
            # the D/g contiguous products), then one log per group
            products = p_buf[: nt * nv * n_groups].view(nt, nv, n_groups)
            torch.prod(s[..., :grouped].view(nt, nv, g, n_groups), dim=2, out=products)
            torch.sum(products.log_(), dim=-1, out=logs)
            if grouped < dim:
                logs += s[..., grouped:].log().sum(dim=-1)
        q = q_row[:nt].mul_(self.q_scale)
        logdet = c_row[:nt].mul_(self.c_scale).add_(self.c_shift)
        m_v = self.m_v[None] if self.m_v is not None else None
        m_t = self.m_t[a : a + nt, None] if self.m_t is not None else None
        total = sum_terms(sgi_terms_from_moments(q, logdet, m_v, m_t, self.params, self.softening))
        self.out[a : a + nt] = total
