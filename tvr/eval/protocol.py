"""Evaluation protocols: which matrix each direction ranks and what the ground truth is (spec §6.2-§6.5).

Input everywhere: ``sim`` [N_texts, N_videos] (rows = text queries) and ``text_video[k]`` = index of text k's video.

* ``one_to_one`` (MSR-VTT 1k-A) and ``paragraph`` (DiDeMo, ActivityNet; one concatenated paragraph per video):
  the matrix is square and ``text_video`` a permutation. t2v ranks ``sim`` against ``text_video``; v2t ranks
  ``simᵀ`` against the inverse map (each video's single text).
* ``multi_caption`` (MSVD, CLIP4Clip protocol §6.4): every caption is a t2v query ranking all videos, and the
  metrics average over captions. For v2t each video's caption *group* is scored by its best caption:
  M[g, v] = max_{k: text_video[k] = g} sim[k, v], giving a [videos × videos] matrix whose group axis is ordered like
  the videos; a video query ranks the groups (Mᵀ) with the diagonal as GT. A video without any caption is an error.

``tie_mode="reference"`` reproduces the reference numbers:

* single-GT matrices (one_to_one/paragraph t2v and v2t, multi_caption v2t): CLIP4Clip's ``compute_metrics`` tie
  expansion (see :mod:`tvr.eval.metrics`);
* multi_caption t2v: CLIP4Clip's ``tensor_text_to_video_metrics``, which ranks by a double argsort (rank = position
  in a descending sort), drops queries whose GT score is ±inf or NaN (its −inf padding) and reports torch's *lower*
  median. Its argsort is unstable, so its tie order is unspecified; we break ties like a **stable** descending sort
  (equal scores keep gallery order) to stay deterministic.

With ``dsl=True`` the result also holds ``t2v_dsl`` / ``v2t_dsl``: the same metrics after dual softmax over the query
axis of the matrix each direction ranks (for multi_caption v2t that is the group-max matrix Mᵀ, normalised over
video queries). Plain scores are always reported too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from tvr.data.formats.registry import builtin_dataset_formats, dataset_format
from tvr.eval.metrics import (
    TIE_MODES,
    as_index_tensor,
    as_score_tensor,
    count_ties,
    ranks_histogram,
    retrieval_metrics,
    summarise_histogram,
)
from tvr.eval.postprocess import dual_softmax

PROTOCOLS = ("one_to_one", "paragraph", "multi_caption")
#: protocol of each built-in dataset, as its format declares it (the generic format's files decide)
DATASET_PROTOCOLS = {
    name: dataset_format(name).protocol for name in builtin_dataset_formats() if dataset_format(name).protocol
}

#: matrix elements reduced per chunk in :func:`group_max`
CHUNK_ELEMENTS = 1 << 22


def _missing_summary(indices: np.ndarray, limit: int = 10) -> str:
    shown = ", ".join(str(int(i)) for i in indices[:limit])
    more = f" … ({len(indices)} in all)" if len(indices) > limit else ""
    return shown + more


def inverse_permutation(text_video: Tensor, n_videos: int) -> Tensor:
    """video → its single text, checking that ``text_video`` is a permutation of range(n_videos)."""
    counts = torch.bincount(text_video.cpu(), minlength=n_videos).numpy()
    if (counts != 1).any():
        missing = np.flatnonzero(counts == 0)
        repeated = np.flatnonzero(counts > 1)
        parts = []
        if len(missing):
            parts.append(f"videos with no text: {_missing_summary(missing)}")
        if len(repeated):
            parts.append(f"videos with several texts: {_missing_summary(repeated)}")
        raise ValueError(
            "text_video must map the texts one-to-one onto the videos for this protocol "
            f"(use protocol='multi_caption' for several captions per video); {'; '.join(parts)}"
        )
    inverse = torch.empty(n_videos, dtype=torch.long, device=text_video.device)
    inverse[text_video] = torch.arange(n_videos, device=text_video.device)
    return inverse


def group_max(sim: Tensor, text_video: Tensor, n_groups: int) -> Tensor:
    """M[g, v] = max over the texts k with text_video[k] == g of sim[k, v] (NaN counts as −inf; empty group → −inf).

    Reduced in row chunks with ``scatter_reduce`` so no padded [groups, max_caps, videos] tensor is built.
    """
    n_t, n_v = sim.shape
    out = torch.full((n_groups, n_v), float("-inf"), dtype=sim.dtype, device=sim.device)
    rows = max(1, CHUNK_ELEMENTS // n_v)
    neg_inf = torch.full((), float("-inf"), dtype=sim.dtype, device=sim.device)
    for a in range(0, n_t, rows):
        x = sim[a : a + rows]
        x = torch.where(torch.isnan(x), neg_inf, x)
        index = text_video[a : a + rows, None].expand(-1, n_v)
        out.scatter_reduce_(0, index, x, reduce="amax", include_self=True)
    return out


def _reference_multi_caption_t2v(sim: Tensor, gt: Tensor) -> dict[str, float]:
    """CLIP4Clip ``tensor_text_to_video_metrics``: stable descending-sort position, non-finite GT dropped, lower
    median."""
    counts = count_ties(sim, gt)
    keep = counts["finite"]
    if not keep.any():
        raise ValueError("multi_caption t2v (reference): every caption has a non-finite GT score")
    ranks = 1 + counts["greater"][keep] + counts["before"][keep]
    return summarise_histogram(ranks_histogram(ranks, sim.shape[1]), median="lower")


def _check_protocol(protocol: str, tie_mode: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}: expected one of {PROTOCOLS}")
    if tie_mode not in TIE_MODES:
        raise ValueError(f"tie_mode={tie_mode!r}: expected one of {TIE_MODES}")


def evaluate(
    sim: Any,
    text_video: Any,
    protocol: str,
    tie_mode: str = "optimistic",
    dsl: bool = False,
    dsl_temperature: float = 100.0,
    v2t_sim: Any = None,
) -> dict[str, dict[str, float]]:
    """t2v and v2t metrics (``{"t2v": {R1, R5, R10, MdR, MnR}, "v2t": {...}}``) under ``protocol``.

    ``sim``: [N_texts, N_videos] torch tensor (any device) or numpy array. ``text_video``: N_texts video indices.
    ``v2t_sim``: the matrix the v2t direction ranks, in the same [N_texts, N_videos] layout (default ``sim``; two-stage
    scoring shortlists each direction separately). ``dsl=True`` adds ``t2v_dsl`` and ``v2t_dsl`` (dual softmax
    with ``dsl_temperature`` over the query axis).
    """
    _check_protocol(protocol, tie_mode)
    S = as_score_tensor(sim)
    n_t, n_v = S.shape
    tv = as_index_tensor(text_video, n_t, n_v, S.device, name="text_video")
    V = S if v2t_sim is None else as_score_tensor(v2t_sim, "v2t_sim").to(S.device)
    if V.shape != S.shape:
        raise ValueError(f"v2t_sim has shape {tuple(V.shape)}, expected that of sim {tuple(S.shape)}")

    if protocol in ("one_to_one", "paragraph"):
        if n_t != n_v:
            raise ValueError(
                f"protocol {protocol!r} needs a square similarity matrix (one text per video), got {n_t} texts × "
                f"{n_v} videos"
            )
        vt = inverse_permutation(tv, n_v)
        t2v_matrix, v2t_matrix, v2t_gt = S, V.t(), vt

        def t2v_metrics(m: Tensor) -> dict[str, float]:
            return retrieval_metrics(m, tv, tie_mode)

    else:
        counts = torch.bincount(tv.cpu(), minlength=n_v).numpy()
        missing = np.flatnonzero(counts == 0)
        if len(missing):
            raise ValueError(
                f"multi_caption: every video needs at least one caption; videos without one: "
                f"{_missing_summary(missing)}"
            )
        t2v_matrix, v2t_matrix, v2t_gt = S, group_max(V, tv, n_v).t(), None

        def t2v_metrics(m: Tensor) -> dict[str, float]:
            if tie_mode == "reference":
                return _reference_multi_caption_t2v(m, tv)
            return retrieval_metrics(m, tv, "optimistic")

    results = {
        "t2v": t2v_metrics(t2v_matrix),
        "v2t": retrieval_metrics(v2t_matrix, v2t_gt, tie_mode),
    }
    if dsl:
        results["t2v_dsl"] = t2v_metrics(dual_softmax(t2v_matrix, dsl_temperature, dim=0))
        results["v2t_dsl"] = retrieval_metrics(dual_softmax(v2t_matrix, dsl_temperature, dim=0), v2t_gt, tie_mode)
    return results


def default_protocol(dataset: str) -> str:
    """The evaluation protocol of a built-in dataset (spec §6)."""
    try:
        return DATASET_PROTOCOLS[dataset]
    except KeyError:
        raise ValueError(
            f"no default protocol for dataset {dataset!r}; known: {sorted(DATASET_PROTOCOLS)} "
            f"(choose one of {PROTOCOLS})"
        ) from None
