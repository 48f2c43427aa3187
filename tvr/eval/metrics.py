"""Retrieval metrics from a query × gallery similarity matrix (spec §6.1).

Conventions
-----------
* ``sim[q, j]`` is the score of gallery item ``j`` for query ``q`` (higher = better); ``gt[q]`` is the index of
  query ``q``'s correct gallery item (the diagonal when ``gt`` is None, which needs a square matrix).
* Ranks are 1-based. R@K is in percent, MdR is the median rank, MnR the mean rank.
* **NaN scores count as −inf** everywhere: a NaN gallery item never outranks anything, and a NaN GT score ranks
  below every finite score. (The reference code sorts NaN inconsistently between numpy and torch; a fixed rule
  keeps results deterministic.)

Tie modes
---------
``optimistic`` (library default): rank = 1 + #{j : sim[q, j] > sim[q, gt[q]]}, i.e. ties are resolved in the
query's favour. Deterministic and independent of the gallery order.

``reference``: CLIP4Clip's ``compute_metrics``. Each row is sorted descending and *every* sorted position whose
value equals the GT score becomes its own rank entry, so a query tied with k−1 other items contributes the k ranks
``1+g, …, g+k`` (g = #strictly higher) and the denominator of R@K / MdR / MnR is the total number of entries, not the
number of queries. A query whose GT score is not finite contributes no entry (in the reference, ``inf − inf`` is
NaN and never equals 0). The reference needs a diagonal GT; here any ``gt`` is accepted and the result equals the
reference applied after permuting the columns so that the GT lands on the diagonal (ranks do not depend on the
column order).

Both modes only count (no argsort): rows are processed in chunks so a 27k × 670 or 5k × 5k matrix needs a few
MiB of scratch memory, and all statistics come from a histogram over rank values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

TIE_MODES = ("optimistic", "reference")
RANK_TIES = ("optimistic", "stable")
METRIC_KEYS = ("R1", "R5", "R10", "MdR", "MnR")
RECALL_KS = (1, 5, 10)

#: matrix elements compared per chunk of rows (bounds the scratch memory; a module constant so tests can shrink it)
CHUNK_ELEMENTS = 1 << 22


# ------------------------------------------------------------------------------------------ input handling


def as_score_tensor(sim: Any, name: str = "sim") -> Tensor:
    """A 2-D floating torch view of ``sim`` (numpy arrays are wrapped without copying where possible)."""
    if isinstance(sim, np.ndarray):
        if sim.dtype in (np.float16, np.float32, np.float64):
            sim = torch.from_numpy(np.ascontiguousarray(sim))
        else:
            sim = torch.from_numpy(np.asarray(sim, dtype=np.float64))
    elif not isinstance(sim, Tensor):
        raise TypeError(f"{name}: expected a torch tensor or numpy array, got {type(sim).__name__}")
    if sim.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D [queries, gallery] matrix, got shape {tuple(sim.shape)}")
    if sim.shape[0] == 0 or sim.shape[1] == 0:
        raise ValueError(f"{name}: empty similarity matrix of shape {tuple(sim.shape)}")
    if not sim.is_floating_point():
        sim = sim.double()
    return sim.detach()


def as_index_tensor(gt: Any, n_queries: int, n_gallery: int, device: torch.device, name: str = "gt") -> Tensor:
    """Validate a per-query GT index vector and return it as a long tensor on ``device``."""
    if isinstance(gt, Tensor):
        idx = gt.detach().to("cpu")
    else:
        try:
            idx = torch.as_tensor(np.asarray(gt))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name}: expected a sequence of integer indices ({exc})") from None
    if idx.ndim != 1 or idx.shape[0] != n_queries:
        raise ValueError(f"{name}: expected {n_queries} indices (one per query), got shape {tuple(idx.shape)}")
    if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        raise TypeError(f"{name}: expected integer indices, got dtype {idx.dtype}")
    idx = idx.long()
    bad = ((idx < 0) | (idx >= n_gallery)).nonzero().flatten()
    if bad.numel():
        q = int(bad[0])
        raise ValueError(
            f"{name}[{q}] = {int(idx[q])} is outside the gallery [0, {n_gallery}) ({bad.numel()} bad entries)"
        )
    return idx.to(device)


def _prepare(sim: Any, gt: Any) -> tuple[Tensor, Tensor]:
    sim = as_score_tensor(sim)
    n_q, n_g = sim.shape
    if gt is None:
        if n_q != n_g:
            raise ValueError(
                f"sim has shape {tuple(sim.shape)}: a diagonal ground truth (gt=None) needs a square matrix; "
                "pass gt=[index of the correct gallery item per query]"
            )
        return sim, torch.arange(n_q, device=sim.device)
    return sim, as_index_tensor(gt, n_q, n_g, sim.device)


def _nan_to_neg_inf(x: Tensor) -> Tensor:
    return torch.where(torch.isnan(x), torch.full((), float("-inf"), dtype=x.dtype, device=x.device), x)


# ------------------------------------------------------------------------------------------ counting


def count_ties(sim: Tensor, gt: Tensor) -> dict[str, np.ndarray]:
    """Per query: #items strictly above the GT score, #items equal to it (GT included), #equal items with a smaller
    gallery index, and whether the GT score is finite. ``sim``/``gt`` as returned by :func:`_prepare`."""
    n_q, n_g = sim.shape
    rows = max(1, CHUNK_ELEMENTS // n_g)
    cols = torch.arange(n_g, device=sim.device)
    greater, equal, before, finite = [], [], [], []
    for a in range(0, n_q, rows):
        x = _nan_to_neg_inf(sim[a : a + rows])
        g_idx = gt[a : a + rows, None]
        g = x.gather(1, g_idx)
        same = x == g
        greater.append((x > g).sum(1))
        equal.append(same.sum(1))
        before.append((same & (cols[None, :] < g_idx)).sum(1))
        finite.append(torch.isfinite(g[:, 0]))
    return {
        "greater": torch.cat(greater).cpu().numpy().astype(np.int64),
        "equal": torch.cat(equal).cpu().numpy().astype(np.int64),
        "before": torch.cat(before).cpu().numpy().astype(np.int64),
        "finite": torch.cat(finite).cpu().numpy(),
    }


def gt_ranks(sim: Any, gt: Any = None, ties: str = "optimistic") -> np.ndarray:
    """1-based rank of each query's GT item, as an int64 array of length n_queries.

    ``ties="optimistic"``: 1 + #strictly higher scores. ``ties="stable"``: the GT's position in a stable descending
    sort (equal scores keep gallery order), i.e. 1 + #higher + #equal items with a smaller index.
    NaN scores count as −inf.
    """
    if ties not in RANK_TIES:
        raise ValueError(f"ties={ties!r}: expected one of {RANK_TIES}")
    sim, gt = _prepare(sim, gt)
    counts = count_ties(sim, gt)
    ranks = 1 + counts["greater"]
    if ties == "stable":
        ranks = ranks + counts["before"]
    return ranks


# ------------------------------------------------------------------------------------------ summaries


def summarise_histogram(hist: np.ndarray, median: str = "average") -> dict[str, float]:
    """Metrics from ``hist[r]`` = number of rank entries equal to r (r ≥ 1; ``hist[0]`` must be 0).

    ``median="average"`` is numpy's median (mean of the two middle entries for an even count); ``"lower"`` is
    torch's (the lower middle entry), which the reference multi-caption code uses.
    """
    hist = np.asarray(hist, dtype=np.int64)
    total = int(hist.sum())
    if total <= 0:
        raise ValueError("no rank entries to summarise (every query was dropped or the matrix is empty)")
    cum = np.cumsum(hist)
    last = len(hist) - 1
    out = {f"R{k}": 100.0 * float(cum[min(k, last)]) / total for k in RECALL_KS}

    def kth(k: int) -> int:  # k-th smallest entry, 0-based
        return int(np.searchsorted(cum, k + 1, side="left"))

    if median == "average":
        out["MdR"] = (kth((total - 1) // 2) + kth(total // 2)) / 2.0
    elif median == "lower":
        out["MdR"] = float(kth((total - 1) // 2))
    else:
        raise ValueError(f"median={median!r}: expected 'average' or 'lower'")
    out["MnR"] = float(np.dot(np.arange(len(hist), dtype=np.float64), hist) / total)
    return out


def ranks_histogram(ranks: np.ndarray, n_gallery: int) -> np.ndarray:
    return np.bincount(np.asarray(ranks, dtype=np.int64), minlength=n_gallery + 1)


def expanded_histogram(first: np.ndarray, count: np.ndarray, n_gallery: int) -> np.ndarray:
    """Histogram of the union of the integer ranges [first_q, first_q + count_q − 1] (tie expansion), built with a
    difference array so nothing of size Σ count is materialised."""
    first = np.asarray(first, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    size = n_gallery + 2
    diff = np.bincount(first, minlength=size) - np.bincount(first + count, minlength=size)
    return np.cumsum(diff)[: n_gallery + 1]


def chance_metrics(n_gallery: int) -> dict[str, float]:
    """The metrics of a uniformly random ranking of ``n_gallery`` items with one correct item per query (expected
    values): R@K = 100·min(K, N)/N, MdR = MnR = (N + 1)/2. The floor a trained model's row is read against."""
    if isinstance(n_gallery, bool) or not isinstance(n_gallery, int) or n_gallery < 1:
        raise ValueError(f"chance_metrics: n_gallery = {n_gallery!r}, expected a positive integer")
    out = {f"R{k}": 100.0 * min(k, n_gallery) / n_gallery for k in RECALL_KS}
    out["MdR"] = out["MnR"] = (n_gallery + 1) / 2.0
    return out


def retrieval_metrics(sim: Any, gt: Any = None, tie_mode: str = "optimistic") -> dict[str, float]:
    """R1, R5, R10 (percent), MdR, MnR of ``sim`` [n_queries, n_gallery] against ``gt`` (see module docstring).

    Accepts torch tensors (any device; computed there) or numpy arrays. NaN scores count as −inf.
    """
    if tie_mode not in TIE_MODES:
        raise ValueError(f"tie_mode={tie_mode!r}: expected one of {TIE_MODES}")
    sim, gt = _prepare(sim, gt)
    n_g = sim.shape[1]
    counts = count_ties(sim, gt)
    if tie_mode == "optimistic":
        hist = ranks_histogram(1 + counts["greater"], n_g)
    else:
        keep = counts["finite"]
        if not keep.any():
            raise ValueError("tie_mode='reference': every query has a non-finite GT score, so no rank entry remains")
        hist = expanded_histogram(1 + counts["greater"][keep], counts["equal"][keep], n_g)
    return summarise_histogram(hist, median="average")
