"""The toy method's own loss: a pure tensor function, like a built-in method's ``losses`` module."""

from __future__ import annotations

from torch import Tensor


def alignment(text_emb: Tensor, video_emb: Tensor) -> Tensor:
    """‖t_i − v_i‖² of every aligned pair of unit vectors ([B]): 2 − 2·cos(t_i, v_i), in [0, 4]."""
    if text_emb.shape != video_emb.shape:
        raise ValueError(
            f"alignment: aligned pairs need equal shapes, got {tuple(text_emb.shape)} and {tuple(video_emb.shape)}"
        )
    return (text_emb - video_emb).square().sum(dim=-1)
