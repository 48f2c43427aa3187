"""Score post-processing applied after scoring, before ranking (spec §6.5).

Dual softmax (DSL), the inverted softmax and QB-Norm's dynamic inverted softmax. The papers we reproduce report
plain scores; each of these is an extra, clearly labelled row (``t2v_dsl``, ``t2v_invsoftmax``, ``t2v_qbnorm``),
never the headline number.

Inverted softmax and QB-Norm re-weigh each gallery item by how strongly a *query bank* (captions of the training
split, encoded by the same model) retrieves it, which damps "hubs" that are close to every query:

* inverted softmax (Smith et al., ICLR 2017, eq. 7; used with a query bank by Bogolin et al., CVPR 2022, eq. 2):
  IS(q, g) = exp(β·s(q, g)) / Σ_{b ∈ B} exp(β·s(b, g));
* dynamic inverted softmax = QB-Norm (Bogolin et al., CVPR 2022, §3.2): the activation set A holds every gallery
  item that is among the top-k results of at least one bank query; a test query q is normalised with IS only when
  its own top-1 result lies in A, otherwise its scores are kept, which avoids hurting queries whose best match is
  not a hub.

Only rankings within one query row change meaning here, so both are computed in log space:
log IS(q, g) = β·s(q, g) − LSE_b(β·s(b, g)), and un-normalised QB-Norm rows carry β·s(q, g) (the log of the
exp(β·s) the paper's formula leaves them at). Columns are not comparable across rows afterwards, which is why only
the t2v direction (rows = text queries, bank = training captions) is reported with these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tvr.eval.metrics import as_score_tensor

#: matrix elements processed per slice (bounds the float scratch memory besides the output)
CHUNK_ELEMENTS = 1 << 22


def dual_softmax(sim: Any, temperature: float = 100.0, dim: int = 0) -> Any:
    """DSL: ``sim ⊙ softmax_dim(temperature · sim)``.

    ``dim`` is the **query** axis (0 = rows): for t2v on a [texts, videos] matrix each video's column is
    normalised over all text queries, so a gallery item that scores high for every query is damped. ``temperature``
    multiplies the scores (the reference uses 100, the inverse of CLIP's τ = 0.01).

    The softmax needs the whole ``dim`` axis, so the matrix is processed in slices along the other axis; memory is the
    output plus one slice. NaN scores are treated as −inf before the softmax (so one NaN cannot poison its whole
    slice); entries that are −inf get weight 0 and come out as NaN (−inf · 0), which the metrics count as −inf again.
    Returns the same kind of object as the input (numpy array or torch tensor, same dtype and device).
    """
    if dim not in (0, 1, -1, -2):
        raise ValueError(f"dual_softmax: dim={dim} must be 0 or 1 for a 2-D matrix")
    if not np.isfinite(temperature):
        raise ValueError(f"dual_softmax: temperature={temperature} must be finite")
    is_numpy = isinstance(sim, np.ndarray)
    x = as_score_tensor(sim)
    dim = dim % 2
    other = 1 - dim
    # softmax in at least float32: fp16 exp(100·s) loses most of its mantissa
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    step = max(1, CHUNK_ELEMENTS // x.shape[dim])
    for a in range(0, x.shape[other], step):
        block = x.narrow(other, a, min(step, x.shape[other] - a)).to(work)
        block = torch.where(torch.isnan(block), torch.full((), float("-inf"), dtype=work, device=x.device), block)
        weights = torch.softmax(block * temperature, dim=dim)
        out.narrow(other, a, block.shape[other]).copy_(block * weights)
    return out.cpu().numpy() if is_numpy else out


# --------------------------------------------------------------------------------------------- query banks


def querybank_statistics(bank_blocks: Iterable[Any], beta: float = 20.0, k: int = 1) -> tuple[Tensor, Tensor]:
    """Per-gallery-item statistics of a query bank, from its scores given block by block.

    ``bank_blocks`` yields [n_b, N_g] score blocks (bank queries × the whole gallery; rows may be split over any
    number of blocks, so a 180k-caption bank never needs its full matrix in memory). Returns

    * ``log_norm`` [N_g]: LSE_b(β·s(b, g)), the log of the inverted-softmax denominator Σ_b exp(β·s(b, g));
    * ``active`` [N_g] bool: whether g is among the top-``k`` results of at least one bank query (QB-Norm's
      activation set; ties at the k-th place are broken towards the lower gallery index).

    NaN scores count as −inf. A gallery item that no bank query scores finitely gets the smallest finite
    normaliser of the gallery (it is the least hub-like item there is), so dividing by it stays finite.
    """
    if k < 1:
        raise ValueError(f"querybank_statistics: k={k} must be >= 1")
    if not (beta > 0 and torch.isfinite(torch.tensor(float(beta)))):
        raise ValueError(f"querybank_statistics: beta={beta} must be a positive finite number")
    log_norm: Tensor | None = None
    active: Tensor | None = None
    rows = 0
    for block in bank_blocks:
        if block.shape[0] == 0:
            continue
        x = as_score_tensor(block, "bank scores")
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.to(work)
        x = torch.where(torch.isnan(x), torch.full((), float("-inf"), dtype=work, device=x.device), x)
        if log_norm is not None and x.shape[1] != log_norm.shape[0]:
            raise ValueError(f"bank score blocks disagree on the gallery size: {x.shape[1]} vs {log_norm.shape[0]}")
        rows += x.shape[0]
        part = torch.logsumexp(beta * x, dim=0)
        log_norm = part if log_norm is None else torch.logaddexp(log_norm, part)
        top = x.topk(min(k, x.shape[1]), dim=1).indices.reshape(-1)
        hit = torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)
        hit[top] = True
        active = hit if active is None else (active | hit)
    if log_norm is None or active is None or rows == 0:
        raise ValueError("querybank_statistics: the query bank is empty")
    finite = torch.isfinite(log_norm)
    if not bool(finite.all()):
        floor = log_norm[finite].min() if bool(finite.any()) else torch.zeros((), dtype=log_norm.dtype)
        log_norm = torch.where(finite, log_norm, floor.to(log_norm.device))
    return log_norm, active


def inverted_softmax(sim: Any, log_norm: Tensor, beta: float = 20.0) -> Any:
    """Log inverted softmax of every row: β·s(q, g) − log_norm[g], with ``log_norm`` from
    :func:`querybank_statistics` (or from the queries themselves: ``querybank_statistics([sim])``, the transductive
    form of Smith et al.). Returns the same kind of object as ``sim`` (numpy or torch, same dtype and device)."""
    is_numpy = isinstance(sim, np.ndarray)
    x = as_score_tensor(sim)
    norm = log_norm.to(device=x.device)
    if norm.shape != (x.shape[1],):
        raise ValueError(f"inverted_softmax: log_norm has shape {tuple(norm.shape)}, expected ({x.shape[1]},)")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = (beta * x.to(work) - norm.to(work)).to(x.dtype)
    return out.cpu().numpy() if is_numpy else out


def dynamic_inverted_softmax(sim: Any, log_norm: Tensor, active: Tensor, beta: float = 20.0) -> tuple[Any, Tensor]:
    """QB-Norm: rows whose top-1 gallery item is in the activation set ``active`` get the log inverted softmax,
    the others β·s (their ranking unchanged). Returns (scores like ``sim``, bool [N_q] which rows were normalised).
    A row whose scores are all NaN/−inf is left as it is."""
    is_numpy = isinstance(sim, np.ndarray)
    x = as_score_tensor(sim)
    act = active.to(device=x.device, dtype=torch.bool)
    if act.shape != (x.shape[1],):
        raise ValueError(f"dynamic_inverted_softmax: active has shape {tuple(act.shape)}, expected ({x.shape[1]},)")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xw = x.to(work)
    clean = torch.where(torch.isnan(xw), torch.full((), float("-inf"), dtype=work, device=x.device), xw)
    top1 = clean.argmax(dim=1)
    has_score = torch.isfinite(clean.max(dim=1).values)
    normalise = act[top1] & has_score
    scaled = beta * xw
    normalised = scaled - log_norm.to(device=x.device, dtype=work)
    out = torch.where(normalise[:, None], normalised, scaled).to(x.dtype)
    return (out.cpu().numpy() if is_numpy else out), normalise.cpu()


def qb_norm(sim: Any, bank_sim: Any, beta: float = 20.0, k: int = 1) -> Any:
    """QB-Norm of ``sim`` [N_q, N_g] with the bank scores ``bank_sim`` [N_b, N_g] (whole-matrix convenience)."""
    log_norm, active = querybank_statistics([bank_sim], beta, k)
    return dynamic_inverted_softmax(sim, log_norm, active, beta)[0]
