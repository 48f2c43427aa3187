"""What a method's ``tvr analyze`` figures receive: the analysis settings and one checkpoint's encoded split.

A head names the module of its own figures (``RetrievalHead.analysis_figures``); :mod:`.checkpoint` imports it and
calls its ``write_figures(context: FigureContext) -> list[FigureFiles]``. The module sits in the analysis layer
(``tvr/methods/<method>/figures``, or anywhere for an out-of-tree head), so a head never imports plotting code.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from tvr.config import Config
from tvr.eval.runner import EncodedSplit


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
    """How much each analysis reads. ``negatives_per_text``: sampled negative pairs per caption (Δ geometry,
    proxy correlation, S_align terms); ``gradient_batches``: batches of the gradient analysis (each of
    ``train.batch_size`` pairs, fewer when the split has fewer videos); ``embedding``: tsne | pca;
    ``hard_negatives``: k of the hard-negative figure; ``max_captions``: the analyses of sampled pairs (Δ geometry,
    query-proxy correlation, S_align terms) read at most this many captions (a seeded sample on larger splits);
    ``seed``: every sample drawn."""

    negatives_per_text: int = 10
    max_captions: int = 2000
    gradient_batches: int = 8
    embedding: str = "tsne"
    hard_negatives: int = 10
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class FigureContext:
    """One checkpoint's head on one encoded split, as a method's figures read it.

    ``text_state`` / ``video_state``: the head's states of the split; ``sim``: the [N_t, N_v] score matrix ``tvr
    eval`` ranks (two-stage when ``eval.rerank_k`` is set); ``text_video``: the ground-truth video of every caption;
    ``out``: the folder the figures go to; ``split``: the split's name printed on every figure."""

    head: Any
    encoded: EncodedSplit
    text_state: Any
    video_state: Any
    sim: torch.Tensor
    cfg: Config
    out: Path
    split: str
    device: torch.device
    options: AnalysisOptions

    @property
    def text_video(self) -> torch.Tensor:
        return torch.as_tensor(self.encoded.text_video).long()
