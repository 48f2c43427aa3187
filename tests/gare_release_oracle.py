"""The authors' current GARE release restated as a test oracle: its per-batch arithmetic in its own layout.

Restated (not copied) from reading `musicman217/GARE-text-video-retrieval` as the search tools hold it at commit
206a0ce8 (`tvr/models/modeling.py`: ``GARE.similarity``, ``direction_diversity_loss``,
``norm_based_epsilon_regularization_loss``; `tvr/models/psi_module.py` at 7f3fee7a: ``MultiHeadedCrossAttn``,
``Transformer``, ``Psi``) — the release whose README notes the KL as "one multivariate Gaussian event" with
``--beta 1e-4`` (docs/methods/gare.md, "Which release"). What it keeps of that code's arithmetic, on purpose:

* ψ works in the release's layout: the gap queries go in as ``(1, texts, videos, D)``, are turned to
  ``(1, videos, texts, D)``, and every video's keys and values attend over its frames as one batched matrix product
  ``K (videos, F, D) @ Qᵀ (videos, D, texts)`` with the softmax over the frame axis; no key mask is passed;
* the gap query is ``mean over all F frame slots − t_i`` with ``t_i`` not detached;
* the score pools the frames by ``softmax_f(⟨t_i, V_jf⟩ / temp)`` times the frame mask, then the cosine;
* L_IB is ``kl_divergence(Independent(Normal(μ_j, σ_j), 1), Independent(Normal(0, 1), 1)).mean()`` through
  ``torch.distributions`` (σ the unbiased std over texts + 1e-6), L_dir a Python loop over texts, L_ε the hinge on
  the batch mean of the radii's variances;
* the contrastive loss is ``CrossEn`` of the logits scaled by ``exp(logit_scale)`` in both directions, averaged.

The earlier KL (`modeling.py` at a58d6021: an element-wise ``Normal`` KL, ``.mean()`` over videos and dimensions,
``--beta 0.07`` in that commit's `train_msrvtt.sh`) is :func:`release_kl` with ``multivariate=False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributions import Independent, Normal, kl_divergence


@dataclass
class ReleaseWeights:
    """ψ's parameters under the release's names (`psi_module.py`): one cross-attention layer, one head."""

    layer_norm1: tuple[Tensor, Tensor]
    q_proj: tuple[Tensor, Tensor]
    k_proj: tuple[Tensor, Tensor]
    v_proj: tuple[Tensor, Tensor]
    out_proj: tuple[Tensor, Tensor]
    layer_norm2: tuple[Tensor, Tensor]
    linear1: tuple[Tensor, Tensor]
    layer_norm3: tuple[Tensor, Tensor]
    mean_proj: tuple[Tensor, Tensor]


def _linear(x: Tensor, weights: tuple[Tensor, Tensor]) -> Tensor:
    return x @ weights[0].T + weights[1]


def _layer_norm(x: Tensor, weights: tuple[Tensor, Tensor]) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], weights[0], weights[1], eps=1e-5)


def release_psi(w: ReleaseWeights, delta: Tensor, frames: Tensor) -> Tensor:
    """``Psi.forward(delta.unsqueeze(0), frames.unsqueeze(0))``'s mean output (eval mode: no dropout).

    delta [texts, videos, D] (the gap queries), frames [videos, F, D] → Δ [texts, videos, D]."""
    q = delta.unsqueeze(0).permute(0, 2, 1, 3)  # (1, videos, texts, D)
    c = frames.unsqueeze(0).permute(0, 2, 1, 3)  # (1, F, videos, D)
    q, c = _layer_norm(q, w.layer_norm1), _layer_norm(c, w.layer_norm1)  # one LayerNorm for both
    t, b, a, d = q.shape
    queries = _linear(q, w.q_proj).permute(0, 1, 3, 2)  # (1, videos, D, texts)
    video_embeds = c.permute(0, 2, 1, 3)  # (1, videos, F, D)
    keys = _linear(video_embeds, w.k_proj)  # (1, videos, F, D)
    values = _linear(video_embeds, w.v_proj).permute(0, 1, 3, 2)  # (1, videos, D, F)
    logits = keys @ queries / math.sqrt(d)  # (1, videos, F, texts): every pair of a video at once
    weights = torch.softmax(logits, dim=-2)  # over the frames
    attended = (values @ weights).permute(0, 1, 3, 2)  # (1, videos, texts, D)
    out = _linear(attended, w.out_proj).permute(0, 2, 1, 3)  # (1, texts, videos, D)
    h = _layer_norm(out, w.layer_norm2)
    h = _layer_norm(h + _linear(h, w.linear1), w.layer_norm3)
    return _linear(h, w.mean_proj)[0]


def release_similarity(
    w: ReleaseWeights, cls: Tensor, frames: Tensor, frame_mask: Tensor, temp: float
) -> tuple[Tensor, Tensor]:
    """``GARE.similarity``'s logits [texts, videos] and Δ [texts, videos, D]."""
    pool = torch.softmax(torch.einsum("ad,bvd->abv", cls, frames) / temp, dim=-1)
    pool = torch.einsum("abv,bv->abv", pool, frame_mask.to(pool.dtype))
    pooled = torch.einsum("abv,bvd->abd", pool, frames)
    frame_mean = frames.mean(1).unsqueeze(0)  # every slot, padded ones too
    anchor = cls.unsqueeze(1).repeat(1, frames.shape[0], 1)
    delta = release_psi(w, frame_mean - anchor, frames)  # the anchor is not detached
    corrected = anchor + delta
    t = corrected / corrected.norm(dim=-1, keepdim=True)
    v = pooled / pooled.norm(dim=-1, keepdim=True)
    return torch.einsum("abd,abd->ab", t, v), delta


def release_kl(delta: Tensor, multivariate: bool = True) -> Tensor:
    """The relaxed-VIB term, anchored on videos: the current release's one multivariate Gaussian per video
    (``Independent(..., 1)``), or the earlier release's element-wise Gaussians (``multivariate=False``)."""
    mu = delta.mean(dim=0)
    sigma = delta.std(dim=0) + 1e-6
    if multivariate:
        estimated = Independent(Normal(mu, sigma), 1)
        prior = Independent(Normal(torch.zeros_like(mu), torch.ones_like(sigma)), 1)
    else:
        estimated, prior = Normal(mu, sigma), Normal(torch.zeros_like(mu), torch.ones_like(sigma))
    return kl_divergence(estimated, prior).mean()


def release_direction(delta: Tensor, alpha: float) -> Tensor:
    units = F.normalize(delta, dim=2)
    total = 0.0
    for i in range(delta.shape[0]):
        z = units[i]
        total = total + torch.log(torch.exp(-alpha * (1 - z @ z.T)).mean() + 1e-8)
    return total / delta.shape[0]


def release_radius(delta: Tensor, lambda_lower: float) -> Tensor:
    loss = -delta.norm(p=2, dim=2).var(dim=1).mean()
    return loss if loss >= -lambda_lower else torch.zeros((), dtype=delta.dtype)


def _cross_entropy_diagonal(logits: Tensor) -> Tensor:
    """The release's ``CrossEn``: −mean of the log-softmax's diagonal."""
    return -torch.diag(F.log_softmax(logits, dim=-1)).mean()


@dataclass
class ReleaseConfig:
    """The training script's settings (`train_msrvtt.sh` / README of the current release)."""

    temp: float = 3.0
    alpha: float = 2.0
    beta: float = 1e-4
    lambda_dir: float = 0.01
    lambda_epsilon: float = 0.01
    lambda_lower: float = 0.5


def release_loss(
    w: ReleaseWeights, cls: Tensor, frames: Tensor, frame_mask: Tensor, logit_scale: Tensor, cfg: ReleaseConfig
) -> dict[str, Tensor]:
    """``GARE.forward`` in training mode (ψ's dropout off): the total and its four parts."""
    logits, delta = release_similarity(w, cls, frames, frame_mask, cfg.temp)
    scale = logit_scale.exp()
    contrastive = (_cross_entropy_diagonal(logits * scale) + _cross_entropy_diagonal(logits.T * scale)) / 2
    kl = release_kl(delta)
    direction = release_direction(delta, cfg.alpha)
    radius = release_radius(delta, cfg.lambda_lower)
    total = contrastive + cfg.beta * kl + cfg.lambda_dir * direction + cfg.lambda_epsilon * radius
    return {"loss": total, "infonce": contrastive, "kl": kl, "direction": direction, "radius": radius}


__all__ = [
    "ReleaseConfig",
    "ReleaseWeights",
    "release_direction",
    "release_kl",
    "release_loss",
    "release_psi",
    "release_radius",
    "release_similarity",
]
