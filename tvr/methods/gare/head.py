"""GARE head (spec §3): gap-aware pair-specific increments Δ_ij added before the cosine; pairwise, not indexable.

ψ, the options and the per-pair block are in :mod:`tvr.methods.gare.psi`; the factorised test-time scorer is
:mod:`tvr.methods.gare.scoring`. This module wires them into the head contract: training and ``scorer: exact``
run ψ on every pair (:func:`gare_block`); in eval mode ``auto``/``fast`` score through the factorisation, and
two-stage scoring shortlists by cos(t_i, v̄_j) (mean frame) and reranks exactly.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.losses import symmetric_infonce
from tvr.methods.gare.losses import gare_direction_rows, gare_kl_moments, gare_radius_hinge, gare_radius_rows
from tvr.methods.gare.psi import GareOptions, Psi, gare_block, video_mean
from tvr.methods.gare.scoring import (
    GareRerankState,
    fast_path_support,
    gare_pair_scores,
    gare_pairwise_scores,
    gare_rerank_scores,
    gare_rerank_state,
)
from tvr.models.heads.base import RetrievalHead
from tvr.models.heads.registry import register_head
from tvr.types import TextFeatures, VideoFeatures
from tvr.utils.distributed import RowShard

__all__ = ["GareHead", "GareOptions", "Psi", "gare_block"]

log = logging.getLogger(__name__)


@register_head("gare")
class GareHead(RetrievalHead):
    """GARE (spec §3): ψ + text-conditioned pooling + the three Δ regularisers.

    Text state = ``TextFeatures`` (EOT, plus words when the context is words); video state = ``VideoFeatures``.
    """

    Options = GareOptions
    analysis_figures = ".figures"
    release_keys = ".release_keys"
    indexable = False
    # direct path: a block holds a handful of n_t × n_v × D float tensors (64·256·512·4 B = 32 MiB each)
    default_text_chunk = 64
    default_video_chunk = 256

    def build(self) -> None:
        self.psi = Psi(self.dim, dropout=self.options.psi_dropout, init=self.options.psi_init)

    # ------------------------------------------------------------------ states
    def encode_texts(self, text: TextFeatures) -> TextFeatures:
        """EOT features (float); word features and mask only when ψ attends over words."""
        eot = text.eot.float()
        if self.options.context != "words":
            return TextFeatures(eot)
        if text.words is None:
            raise ValueError("head.options.context = 'words' needs word features (TextFeatures.words), got None")
        mask = text.word_mask if text.word_mask is not None else torch.ones(text.words.shape[:2], device=eot.device)
        return TextFeatures(eot, text.words.float(), mask)

    def encode_videos(self, video: VideoFeatures) -> VideoFeatures:
        return VideoFeatures(video.frames.float(), video.frame_mask)

    # ------------------------------------------------------------------ scoring
    def _use_fast(self, text_state: TextFeatures | None = None, video_state: VideoFeatures | None = None) -> bool:
        """Whether test-time scoring goes through the factorised scorer (eval mode, scorer auto/fast, covered ψ).

        Under ``auto``, word context with text-conditioned pooling keeps the direct path when L·F > D: the
        factorisation then needs an L×F cross-Gram per pair, larger than the direct path's D-vector."""
        scorer = self.options.scorer
        if scorer == "exact":
            return False
        if self.training and self.psi.dropout.p > 0:
            # the factorisation needs ψ without dropout; a training-mode call keeps the direct path
            if scorer == "fast":
                raise RuntimeError("head.options.scorer = 'fast' is exact only in eval mode (ψ dropout active)")
            return False
        n_words = text_state.words.shape[1] if text_state is not None and text_state.words is not None else None
        n_frames = video_state.frames.shape[1] if video_state is not None else None
        covered, preferred, reason = fast_path_support(self.psi, self.options, n_words, n_frames)
        if scorer == "fast" and not covered:
            raise ValueError(f"head.options.scorer = 'fast' does not cover this ψ: {reason}")
        if scorer == "auto" and not preferred:
            log.debug("GARE scoring keeps the direct path: %s", reason)
        return preferred or (scorer == "fast" and covered)

    def score_block(self, text_state: TextFeatures, video_state: VideoFeatures) -> Tensor:
        if self._use_fast(text_state, video_state):
            return gare_pairwise_scores(self.psi, text_state, video_state, self.options)
        scores, _ = gare_block(self.psi, text_state, video_state, self.options)
        return scores

    @torch.no_grad()
    def score(
        self,
        text_state: TextFeatures,
        video_state: VideoFeatures,
        text_chunk: int | None = None,
        video_chunk: int | None = None,
    ) -> Tensor:
        """As :meth:`RetrievalHead.score`. The factorised scorer gets the whole gallery in one call (it tiles
        internally with O(F) memory per pair, and one call builds each video's ψ state only once); explicit chunks
        are passed on to it."""
        if self._use_fast(text_state, video_state):
            return gare_pairwise_scores(
                self.psi, text_state, video_state, self.options, text_chunk=text_chunk, video_chunk=video_chunk
            ).float()
        return super().score(text_state, video_state, text_chunk, video_chunk)

    @torch.no_grad()
    def score_pairs(
        self, text_state: TextFeatures, video_state: VideoFeatures, text_index: Tensor, video_index: Tensor
    ) -> Tensor:
        """Exact scores of given pairs. Frame context on the factorised path builds each named video's ψ state once
        and scores it against its own texts; otherwise the generic grid-per-text-group path applies."""
        if self.options.context == "frames" and self._use_fast(text_state, video_state):
            return gare_pair_scores(self.psi, text_state, video_state, self.options, text_index, video_index).float()
        return super().score_pairs(text_state, video_state, text_index, video_index)

    def rerank_state(self, video_state: VideoFeatures) -> VideoFeatures | GareRerankState:
        """Frame context on the factorised path: the per-video ψ state (built once, at index time); otherwise the
        video features themselves."""
        if self.options.context == "frames" and self._use_fast(None, video_state):
            return gare_rerank_state(self.psi, video_state, self.options)
        return video_state

    @torch.no_grad()
    def score_rerank(self, text_state: TextFeatures, rerank_state: VideoFeatures | GareRerankState) -> Tensor:
        if isinstance(rerank_state, GareRerankState):
            return gare_rerank_scores(self.psi, text_state, rerank_state, self.options)
        return super().score_rerank(text_state, rerank_state)

    def shortlist_texts(self, text_state: TextFeatures) -> Tensor:
        """The shortlist ranks by cos(t_i, v̄_j): normalised EOT features ..."""
        return F.normalize(text_state.eot.float(), dim=-1)

    def shortlist_videos(self, video_state: VideoFeatures) -> Tensor:
        """... against normalised mean frames (masked mean with ``mask_frames``)."""
        return F.normalize(video_mean(video_state, self.options.mask_frames).float(), dim=-1)

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """Spec §3.1 for each aligned pair, one at a time: ψ's Δ and the corrected cosine of the direct path
        (:func:`gare_block` on a 1 × 1 block), never the factorised scorer."""
        ts, vs = self.encode_texts(text), self.encode_videos(video)
        scores = [gare_block(self.psi, ts[p : p + 1], vs[p : p + 1], self.options)[0][0, 0] for p in range(len(ts))]
        return torch.stack(scores).float() if scores else torch.zeros(0)

    # ------------------------------------------------------------------ training
    def loss(self, text: TextFeatures, video: VideoFeatures, shard: RowShard | None = None) -> dict[str, Tensor]:
        """L = InfoNCE(exp(logit_scale)·S) + β·L_IB + λ_dir·L_dir + λ_ε·L_ε on the full B×B block (spec §3.4).

        A term whose weight is 0 is not computed and is absent from the returned dict.

        Under DDP (``shard``: this rank's rows of the gathered batch) ψ runs on this rank's texts × every video only;
        the B×B scores are all-gathered, and the regularisers' sums over texts (the per-video moments of L_IB, the
        per-text terms of L_ε and L_dir) are summed over ranks before their nonlinear ends, so every rank holds the
        loss of the whole batch (:mod:`tvr.train.distributed`).
        """
        opts = self.options
        text, video = self.encode_texts(text), self.encode_videos(video)
        if len(text) != len(video):
            raise ValueError(f"GARE loss needs aligned pairs, got {len(text)} texts and {len(video)} videos")
        shard = shard or RowShard.whole(len(text))
        n = shard.total
        scores, delta = gare_block(self.psi, shard.local(text), video, opts)  # own texts × all videos
        logit_scale = self.logit_scale.exp()
        infonce = symmetric_infonce(logit_scale * shard.gather(scores))
        total = infonce
        out: dict[str, Tensor] = {"infonce": infonce.detach()}
        if opts.kl_weight > 0:
            if n < 2:
                raise ValueError(f"gare_kl needs at least 2 texts (unbiased statistics), got a batch of {n}")
            # the moments in float32 (under bf16 autocast the texts' increments of a video can round to one value);
            # a variance of exactly 0 gets the zero subgradient, where sqrt's would be 0·∞ = NaN
            d32 = delta.float()
            mu = shard.sum(d32.sum(dim=0)) / n  # per video, over every rank's texts
            var = shard.sum((d32 - mu).square().sum(dim=0)) / (n - 1)
            positive = var > 0
            sigma = torch.where(positive, torch.where(positive, var, torch.ones_like(var)).sqrt(), var) + 1e-6
            kl = gare_kl_moments(mu, sigma, opts.kl_reduction)
            total = total + opts.kl_weight * kl
            out["kl"] = kl.detach()
        # the per-text terms of L_dir and L_ε (and the logged mean ‖Δ‖), summed over ranks in one collective
        partial, names = [], []
        if opts.direction_weight > 0:
            partial.append(gare_direction_rows(delta, opts.direction_alpha).sum())
            names.append("direction")
        if opts.radius_weight > 0:
            partial.append(gare_radius_rows(delta).sum())
            names.append("radius")
        partial.append(delta.detach().norm(dim=-1).sum() / delta.shape[1])
        sums = dict(zip([*names, "delta_norm"], shard.sum(torch.stack(partial)) / n, strict=True))
        if opts.direction_weight > 0:
            direction = sums["direction"]
            total = total + opts.direction_weight * direction
            out["direction"] = direction.detach()
        if opts.radius_weight > 0:
            radius = gare_radius_hinge(sums["radius"], opts.radius_lambda)
            total = total + opts.radius_weight * radius
            out["radius"] = radius.detach()
        out["delta_norm"] = sums["delta_norm"].detach()
        out["logit_scale"] = logit_scale.detach()
        out["loss"] = total
        return out
