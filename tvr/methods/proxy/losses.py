"""TV-ProxyNet's training loss (spec §4.3): a pure tensor function."""

from __future__ import annotations

import torch
from torch import Tensor

from tvr.losses import symmetric_infonce


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
