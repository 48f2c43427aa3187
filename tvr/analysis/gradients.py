"""The gradient a contrastive loss puts on each text anchor, split pair by pair (the GARE paper, §1, Fig. 2).

For a batch of B aligned pairs the loss L = InfoNCE(τ·S) reads the scores s_ij. When s_ij depends on the texts
only through t_i (true of every head here: a pair's score never looks at another text), the anchor's gradient is a
sum over the videos,

    ∂L/∂t_i = Σ_j g_ij,   g_ij = ∂L/∂s_ij · ∂s_ij/∂t_i,

with g_ii the positive pair's pull and Σ_{j≠i} g_ij the summed push of the negatives. :func:`pair_gradients` gets
every g_ij from one backward pass: video j's column of scores is computed from its own copy of the anchors, so the
gradient that reaches copy j is exactly the part that flows through column j.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from tvr.losses import symmetric_infonce

#: ``score_column(anchors [B, D], j) -> [B]``: the scores of every anchor with video j, differentiable in the anchors
ScoreColumn = Callable[[Tensor, int], Tensor]


@dataclasses.dataclass
class PairGradients:
    """g_ij for one batch: ``per_pair`` [B, B, D] (anchor i, video j) and the loss value."""

    per_pair: Tensor
    loss: float

    @property
    def positive(self) -> Tensor:
        """g_ii: [B, D]."""
        return self.per_pair.diagonal(dim1=0, dim2=1).t()

    @property
    def total(self) -> Tensor:
        """Σ_j g_ij = ∂L/∂t_i: [B, D]."""
        return self.per_pair.sum(dim=1)

    @property
    def negative(self) -> Tensor:
        """Σ_{j≠i} g_ij: [B, D]."""
        return self.total - self.positive


def pair_gradients(
    score_column: ScoreColumn,
    anchors: Tensor,
    logit_scale: float | Tensor,
    loss_fn: Callable[[Tensor], Tensor] = symmetric_infonce,
) -> PairGradients:
    """Per-pair gradients g_ij of ``loss_fn(logit_scale · S)`` on the anchors [B, D], where column j of S is
    ``score_column(anchors, j)`` (B videos: the batch is square, video j is the positive of anchor j)."""
    if anchors.ndim != 2 or anchors.shape[0] < 2:
        raise ValueError(f"pair_gradients needs anchors [B >= 2, D], got shape {tuple(anchors.shape)}")
    n = anchors.shape[0]
    with torch.enable_grad():
        copies = [anchors.detach().clone().requires_grad_(True) for _ in range(n)]
        columns = [score_column(copy, j).reshape(-1) for j, copy in enumerate(copies)]
        scores = torch.stack(columns, dim=1)
        if scores.shape != (n, n):
            raise ValueError(f"score_column must return one score per anchor ({n}), got {columns[0].shape[0]}")
        loss = loss_fn(logit_scale * scores)
        grads = torch.autograd.grad(loss, copies, allow_unused=True)
    per_pair = torch.stack([torch.zeros_like(anchors) if g is None else g for g in grads], dim=1)
    return PairGradients(per_pair.detach(), float(loss.detach()))


def cosine_rows(a: Tensor, b: Tensor, eps: float = 1e-12) -> Tensor:
    """cos(a_k, b_k) of matching rows: [n]."""
    return (a * b).sum(dim=-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(eps)
