"""GARE's regularisers (spec §3.4): pure tensor functions (tensors in, tensor out).

Every GARE regulariser reads Δ laid out [N_t, N_v, D]: Δ[i, j] is the increment of the pair (text i, video j).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

KL_REDUCTIONS = ("sum", "mean")


def _check_delta(delta: Tensor, name: str, min_texts: int = 1, min_videos: int = 1) -> None:
    if delta.ndim != 3:
        raise ValueError(f"{name} expects delta [N_t, N_v, D], got shape {tuple(delta.shape)}")
    if delta.shape[0] < min_texts or delta.shape[1] < min_videos:
        raise ValueError(
            f"{name} needs at least {min_texts} text(s) and {min_videos} video(s) (unbiased statistics), "
            f"got delta of shape {tuple(delta.shape)}"
        )


def gare_kl(delta: Tensor, reduction: str = "sum") -> Tensor:
    """Relaxed VIB compression term L_IB, anchored on videos (spec §3.4.2).

    For every video j the increments of all texts are summarised by a diagonal Gaussian:
    μ_j = mean_i Δ_ij,  σ_j = std_i Δ_ij (unbiased, N_t − 1) + 1e-6, per dimension d. Then

        KL_jd = −log σ_jd + (σ_jd² + μ_jd²)/2 − ½          (= KL(N(μ_jd, σ_jd²) ‖ N(0, 1)))

    ``reduction="sum"`` (released code, pair with β = 1e-4): mean_j Σ_d KL_jd.
    ``reduction="mean"`` (paper, pair with β = 0.07):       mean_j mean_d KL_jd  (= "sum" / D).
    """
    _check_delta(delta, "gare_kl", min_texts=2)
    return gare_kl_moments(delta.mean(dim=0), delta.std(dim=0, unbiased=True) + 1e-6, reduction)


def gare_kl_moments(mu: Tensor, sigma: Tensor, reduction: str = "sum") -> Tensor:
    """:func:`gare_kl` from the per-video moments μ_j, σ_j ([N_v, D], σ including its +1e-6), so the moments can
    be accumulated from several ranks' texts (each holding some rows of Δ) before the KL."""
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"gare_kl reduction {reduction!r}: expected one of {KL_REDUCTIONS}")
    kl = -torch.log(sigma) + 0.5 * (sigma.square() + mu.square()) - 0.5
    if reduction == "sum":
        return kl.sum(dim=-1).mean()
    return kl.mean()


def gare_radius(delta: Tensor, lam: float = 0.5) -> Tensor:
    """Trust-region radius spread L_ε (spec §3.4.3), a hard hinge on the *batch mean* of the per-text variance.

    ε_ij = ‖Δ_ij‖₂,  V_i = Var_j(ε_ij) (unbiased),  m = mean_i V_i,  L_ε = −m if m ≤ λ else 0.

    Minimising −m pushes the radii of each text's increments apart until their mean variance reaches λ; past
    λ the term and its gradient are exactly zero (same gradient as the paper's max(−E_i Var, −λ)).
    """
    _check_delta(delta, "gare_radius", min_videos=2)
    return gare_radius_hinge(gare_radius_rows(delta).mean(), lam)


def gare_radius_rows(delta: Tensor) -> Tensor:
    """V_i = Var_j ‖Δ_ij‖₂ (unbiased) of every text row: [N_t] (the per-text part of :func:`gare_radius`)."""
    _check_delta(delta, "gare_radius", min_videos=2)
    return delta.norm(dim=-1).var(dim=1, unbiased=True)


def gare_radius_hinge(m: Tensor, lam: float = 0.5) -> Tensor:
    """L_ε from m = mean_i V_i: −m if m ≤ λ else 0 (:func:`gare_radius`)."""
    return torch.where(m <= lam, -m, torch.zeros_like(m))


def gare_direction(delta: Tensor, alpha: float = 2.0) -> Tensor:
    """Direction diversity L_dir (spec §3.4.4).

    z_ij = Δ_ij/‖Δ_ij‖,  G_i = Z_i Z_iᵀ ∈ R^{N_v×N_v} (j = k included),
    ℓ_i = log( mean_{j,k} exp(−α(1 − G_i,jk)) + 1e-8 ),  L_dir = mean_i ℓ_i.

    Cosines lie in [−1, 1], so the value lies in [−2α, 0] (up to the 1e-8). All anchors are handled by one
    batched matmul (N_t·N_v²·D work) instead of the reference's Python loop over texts.
    """
    return gare_direction_rows(delta, alpha).mean()


def gare_direction_rows(delta: Tensor, alpha: float = 2.0) -> Tensor:
    """ℓ_i of every text row: [N_t] (the per-text part of :func:`gare_direction`)."""
    _check_delta(delta, "gare_direction")
    z = F.normalize(delta, dim=-1)
    gram = torch.bmm(z, z.transpose(1, 2))  # [N_t, N_v, N_v]
    return torch.log(torch.exp(-alpha * (1.0 - gram)).mean(dim=(1, 2)) + 1e-8)
