"""Reference-style GARE scoring: ψ run on every (text, video) pair, block by block, as the released code does
(16 × 16 blocks, spec §3.7). The oracle the factorised scorer is tested and benchmarked against
(``benchmarks/pairwise_scoring.py`` imports it from here); it is built on the library's one per-pair block,
:func:`tvr.methods.gare.psi.gare_block`, run in the input's dtype with ψ in eval mode."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from tvr.methods.gare.psi import GareOptions, gare_block
from tvr.types import TextFeatures, VideoFeatures


@torch.no_grad()
def gare_reference_scores(
    psi: nn.Module,
    text: TextFeatures,
    video: VideoFeatures,
    options: GareOptions,
    text_chunk: int = 16,
    video_chunk: int = 16,
) -> Tensor:
    """[N_t, N_v] scores: ψ on blocks of ``text_chunk`` × ``video_chunk`` pairs, float64 kept for float64 input."""
    dtype = torch.float64 if text.eot.dtype == torch.float64 else torch.float32
    param = next(psi.parameters(), None)
    if param is not None and param.dtype != dtype:
        psi = copy.deepcopy(psi).to(dtype)
    was_training = psi.training
    psi.eval()
    text = text.to(text.eot.device, dtype)
    video = video.to(video.frames.device, dtype)
    n_t, n_v = len(text), len(video)
    out = torch.empty(n_t, n_v, dtype=dtype)
    try:
        for a in range(0, n_t, text_chunk):
            for b in range(0, n_v, video_chunk):
                scores, _ = gare_block(psi, text[a : a + text_chunk], video[b : b + video_chunk], options)
                out[a : a + text_chunk, b : b + video_chunk] = scores
    finally:
        psi.train(was_training)
    return out
