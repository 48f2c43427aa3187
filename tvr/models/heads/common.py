"""Pooling and scoring helpers shared by heads (and by the base class): no head of its own.

A head imports from here rather than from a sibling head, so heads stay independent of each other; the registry
skips this module when it looks for heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_EPS = 1e-12


def masked_mean(frames: Tensor, frame_mask: Tensor) -> Tensor:
    """Σ_f m_f · frames_f / max(1, Σ_f m_f): the mean of the real frame slots, [N, D] (a video without a real slot
    gets the zero vector, not NaN). ``frames`` [N, F, D], ``frame_mask`` [N, F]."""
    mask = frame_mask.to(frames.dtype).unsqueeze(-1)
    return (frames * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def mean_pooled_video(frames: Tensor, frame_mask: Tensor) -> Tensor:
    """norm(masked mean of norm(frames)): CLIP4Clip's mean-pooled video embedding, [N, D] (zero vector for a video
    without real frames)."""
    return F.normalize(masked_mean(F.normalize(frames, dim=-1, eps=_EPS), frame_mask), dim=-1, eps=_EPS)


def check_frames(frames: Tensor, frame_mask: Tensor) -> None:
    """Raise a ValueError unless ``frames`` is [N, F, D] and ``frame_mask`` [N, F]."""
    if frames.ndim != 3 or tuple(frame_mask.shape) != tuple(frames.shape[:2]):
        raise ValueError(
            f"video features: expected frames [N, F, D] and frame_mask [N, F], got "
            f"{tuple(frames.shape)} and {tuple(frame_mask.shape)}"
        )


def check_pairs(text_index: Tensor, video_index: Tensor, n_t: int, n_v: int) -> tuple[Tensor, Tensor]:
    """``(text_index, video_index)`` as flat CPU long tensors of equal length, every index in range; else a
    ValueError naming what is wrong (the argument check of every ``score_pairs``)."""
    text_index = torch.as_tensor(text_index).reshape(-1).long().cpu()
    video_index = torch.as_tensor(video_index).reshape(-1).long().cpu()
    if text_index.shape != video_index.shape:
        raise ValueError(f"score_pairs: {text_index.numel()} text indices but {video_index.numel()} video indices")
    if text_index.numel():
        if int(text_index.min()) < 0 or int(text_index.max()) >= n_t:
            raise ValueError(f"score_pairs: text indices must lie in [0, {n_t})")
        if int(video_index.min()) < 0 or int(video_index.max()) >= n_v:
            raise ValueError(f"score_pairs: video indices must lie in [0, {n_v})")
    return text_index, video_index


@torch.no_grad()
def top_k_by_dot(queries: Tensor, gallery: Tensor, k: int, chunk: int = 65536) -> tuple[Tensor, Tensor]:
    """Top-``k`` gallery rows per query by dot product, streaming over the gallery: (indices, scores) [N_q, k],
    scores descending. Memory is O(N_q·(k + chunk)), never N_q × N_g."""
    n_q, n_g = queries.shape[0], gallery.shape[0]
    if not 1 <= k <= n_g:
        raise ValueError(f"top_k_by_dot: k = {k}, expected 1 <= k <= {n_g}")
    best_s = torch.full((n_q, 0), float("-inf"), device=queries.device, dtype=queries.dtype)
    best_i = torch.zeros((n_q, 0), dtype=torch.long, device=queries.device)
    for b in range(0, n_g, chunk):
        part = gallery[b : b + chunk].to(queries.device, queries.dtype)
        s = torch.cat([best_s, queries @ part.T], dim=1)
        i = torch.cat([best_i, torch.arange(b, b + part.shape[0], device=queries.device).expand(n_q, -1)], dim=1)
        best_s, pos = s.topk(min(k, s.shape[1]), dim=1)
        best_i = i.gather(1, pos)
    return best_i, best_s


def rerank_to_dense(indices: Tensor, scores: Tensor, n_videos: int, fill: float = float("-inf")) -> Tensor:
    """Scatter (indices, scores) [N_q, K] into a dense [N_q, n_videos] matrix, ``fill`` (−inf) elsewhere."""
    if indices.shape != scores.shape or indices.ndim != 2:
        raise ValueError(f"indices {tuple(indices.shape)} and scores {tuple(scores.shape)} must be equal [N_q, K]")
    dense = torch.full((indices.shape[0], n_videos), fill, dtype=scores.dtype, device=scores.device)
    return dense.scatter_(1, indices.to(scores.device), scores)
