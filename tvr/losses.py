"""Training losses shared by the method heads.

Layout convention: a logits / delta tensor has texts on rows (dim 0) and videos on columns (dim 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def symmetric_infonce(logits: Tensor) -> Tensor:
    """½·[CE over rows + CE over columns] with the diagonal as the positives (CLIP4Clip's CrossEn, spec §1.3).

    ``logits`` is [B, B] and already multiplied by the logit scale. Duplicate videos inside a batch count as
    negatives, as in the reference implementations.
    """
    if logits.ndim != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(f"symmetric_infonce expects square [B, B] logits, got {tuple(logits.shape)}")
    targets = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets))


# --------------------------------------------------------------------------------------------- GARE (spec §3.4)
# Every GARE regulariser reads Δ laid out [N_t, N_v, D]: Δ[i, j] is the increment of the pair (text i, video j).

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
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"gare_kl reduction {reduction!r}: expected one of {KL_REDUCTIONS}")
    mu = delta.mean(dim=0)  # [N_v, D]
    sigma = delta.std(dim=0, unbiased=True) + 1e-6
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
    radii = delta.norm(dim=-1)  # [N_t, N_v]
    m = radii.var(dim=1, unbiased=True).mean()
    return torch.where(m <= lam, -m, torch.zeros_like(m))


def gare_direction(delta: Tensor, alpha: float = 2.0) -> Tensor:
    """Direction diversity L_dir (spec §3.4.4).

    z_ij = Δ_ij/‖Δ_ij‖,  G_i = Z_i Z_iᵀ ∈ R^{N_v×N_v} (j = k included),
    ℓ_i = log( mean_{j,k} exp(−α(1 − G_i,jk)) + 1e-8 ),  L_dir = mean_i ℓ_i.

    Cosines lie in [−1, 1], so the value lies in [−2α, 0] (up to the 1e-8). All anchors are handled by one
    batched matmul (N_t·N_v²·D work) instead of the reference's Python loop over texts.
    """
    _check_delta(delta, "gare_direction")
    z = F.normalize(delta, dim=-1)
    gram = torch.bmm(z, z.transpose(1, 2))  # [N_t, N_v, N_v]
    per_text = torch.log(torch.exp(-alpha * (1.0 - gram)).mean(dim=(1, 2)) + 1e-8)
    return per_text.mean()


# --------------------------------------------------------------------------------------------- TV-ProxyNet (spec §4.3)


def text_proxy_loss(
    sim_r: Tensor, sim_p: Tensor, sim_pos: Tensor, logit_scale: Tensor | float, *, alpha: float, beta: float
) -> Tensor:
    """TV-ProxyNet's training loss on three [B, B] cosine matrices (texts on rows, diagonal positives):

        L = ½[CE(s·S^r) + CE(s·S^rᵀ)] + α·½[CE(s·S^p) + CE(s·S^pᵀ)] + β·½[CE(s·S^pos) + CE(s·S^posᵀ)]

    with s = exp(``logit_scale``): ``logit_scale`` is the *log* of the scale (the head's learnable parameter, as in
    spec §4.3 "s = exp(logit_scale)"), exponentiated here. S^r_ij = cos(t_i, v_j); S^p_ij = cos(t^p_ij, v_j), each
    candidate video scored with its own proxy; S^pos_ik = cos(t^p_ii, v_k), the positive proxy against every video.
    CE(X) = mean_i −log softmax(X_i·)_i. Each direction pair is averaged (the paper's ½); the released code sums
    the two directions, i.e. its loss is exactly twice this one.
    """
    for name, sim in (("sim_r", sim_r), ("sim_p", sim_p), ("sim_pos", sim_pos)):
        if sim.ndim != 2 or sim.shape[0] != sim.shape[1] or sim.shape != sim_r.shape:
            raise ValueError(
                f"text_proxy_loss: {name} must be a square [B, B] matrix like sim_r {tuple(sim_r.shape)}, "
                f"got {tuple(sim.shape)}"
            )
    scale = torch.as_tensor(logit_scale, dtype=sim_r.dtype, device=sim_r.device).exp()
    return (
        symmetric_infonce(scale * sim_r)
        + alpha * symmetric_infonce(scale * sim_p)
        + beta * symmetric_infonce(scale * sim_pos)
    )
