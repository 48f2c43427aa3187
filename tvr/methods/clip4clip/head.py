"""CLIP4Clip baseline head (spec §1.3), with an optional text-conditioned frame pooling (spec §3.1 step 4).

``video_pool="mean"`` (CLIP4Clip "meanP/seqTransf loose" similarity):
    v̂_j = norm( Σ_f m_jf · norm(V_jf) / max(1, Σ_f m_jf) ),  t̂_i = norm(t_i),  s_ij = t̂_i · v̂_j.
    The score is a plain dot product of per-item embeddings, so the head is *indexable*: both states carry an
    ``emb`` field and a search index may use them directly.

``video_pool="text_softmax"`` (the pooling GARE's released code uses in its score; ≡ GARE without Δ):
    w_ijf = softmax_f(⟨t_i, V_jf⟩ / temp) · m_jf   (softmax over all F slots, mask applied afterwards, no
    renormalisation — exactly as the reference), v^pool_ij = Σ_f w_ijf V_jf, s_ij = cos(t_i, v^pool_ij),
    with unnormalised t_i and V_jf. The pooled video depends on the text, so this head is pairwise (not indexable).
    Because the cosine ignores the length of v^pool, masking after the softmax only rescales it: in exact
    arithmetic padded slots do not change the score (they could only matter if they took so much softmax mass that
    the real weights underflow; the reference then returns NaN, we return 0).
    We never build the [n_t, n_v, D] pooled vectors: with ℓ_ijf = ⟨t_i, V_jf⟩ and the per-video Gram
    G_j = V_j V_jᵀ, t_i · v^pool_ij = Σ_f w_ijf ℓ_ijf and ‖v^pool_ij‖² = w_ijᵀ G_j w_ij, so per-pair memory is O(F).

Scores carry no logit scale; the loss multiplies by exp(logit_scale) (≈ 100 for pretrained CLIP).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.config import bounded, choice
from tvr.losses import symmetric_infonce
from tvr.models.heads.base import RetrievalHead
from tvr.models.heads.common import check_frames, mean_pooled_video
from tvr.models.heads.registry import register_head
from tvr.types import Sliceable, TextFeatures, VideoFeatures
from tvr.utils.distributed import RowShard

VIDEO_POOLS = ("mean", "text_softmax")
#: elements of one [n_t, n_v, F] scratch tensor in text_softmax scoring (several live at once)
POOL_CHUNK_ELEMENTS = 1 << 22
_EPS = 1e-12


@dataclasses.dataclass
class Clip4ClipOptions:
    """CLIP4Clip similarity (spec §1.3), ``head.options`` of ``head.name: clip4clip``."""

    #: mean (masked mean of normalised frames; indexable) | text_softmax (text-conditioned frame pooling)
    video_pool: str = choice("mean", *VIDEO_POOLS)
    #: temperature of the text_softmax pooling's softmax over frames (GARE's released code: 3)
    pool_temperature: float = bounded(3.0, gt=0.0)


@dataclasses.dataclass
class Clip4ClipTextState(Sliceable):
    """emb: [N, D] L2-normalised EOT features. raw: [N, D] unnormalised EOT (text_softmax pooling only, else None)."""

    emb: Tensor
    raw: Tensor | None = None


@dataclasses.dataclass
class Clip4ClipVideoState(Sliceable):
    """emb: [N, D] normalised masked mean of normalised frames (the indexable embedding; in text_softmax mode it is
    still filled, usable as a cheap prefilter, but ``score_block`` does not use it).
    frames [N, F, D], frame_mask [N, F] (float) and gram [N, F, F] = frames·framesᵀ: text_softmax mode only."""

    emb: Tensor
    frames: Tensor | None = None
    frame_mask: Tensor | None = None
    gram: Tensor | None = None


def text_softmax_scores(text: Tensor, frames: Tensor, frame_mask: Tensor, gram: Tensor, temperature: float) -> Tensor:
    """cos(t_i, Σ_f w_ijf V_jf) for every text i and video j: [n_t, n_v] (differentiable; no per-pair D vectors).

    text [n_t, D] unnormalised; frames [n_v, F, D]; frame_mask [n_v, F]; gram [n_v, F, F] = frames · framesᵀ.
    """
    logits = torch.einsum("id,jfd->ijf", text, frames)  # ℓ_ijf = ⟨t_i, V_jf⟩
    weights = torch.softmax(logits / temperature, dim=-1) * frame_mask.to(logits.dtype).unsqueeze(0)
    dot = (weights * logits).sum(dim=-1)  # t_i · v^pool_ij
    gram_w = torch.einsum("jfg,ijg->ijf", gram.to(weights.dtype), weights)
    pooled_sq = (weights * gram_w).sum(dim=-1)  # ‖v^pool_ij‖² = wᵀ G_j w (≥ 0 up to rounding)
    pooled_norm = pooled_sq.clamp_min(_EPS * _EPS).sqrt()
    text_norm = text.norm(dim=-1).clamp_min(_EPS)
    return dot / (text_norm[:, None] * pooled_norm)


@register_head("clip4clip")
class Clip4ClipHead(RetrievalHead):
    """CLIP4Clip baseline. ``indexable`` is set per instance (True only for ``video_pool="mean"``); the instance
    attribute shadows the class default of :class:`RetrievalHead`."""

    Options = Clip4ClipOptions

    def build(self) -> None:
        self.video_pool = self.options.video_pool
        self.pool_temperature = float(self.options.pool_temperature)
        self.indexable = self.video_pool == "mean"

    def extra_repr(self) -> str:
        return f"video_pool={self.video_pool!r}, pool_temperature={self.pool_temperature}, indexable={self.indexable}"

    # ------------------------------------------------------------------ states
    def encode_texts(self, text: TextFeatures) -> Clip4ClipTextState:
        eot = text.eot.float()
        raw = eot if self.video_pool == "text_softmax" else None
        return Clip4ClipTextState(emb=F.normalize(eot, dim=-1, eps=_EPS), raw=raw)

    def encode_videos(self, video: VideoFeatures) -> Clip4ClipVideoState:
        frames = video.frames.float()
        mask = video.frame_mask.float()
        check_frames(frames, mask)
        emb = mean_pooled_video(frames, mask)
        if self.video_pool == "mean":
            return Clip4ClipVideoState(emb=emb)
        gram = torch.einsum("nfd,ngd->nfg", frames, frames)
        return Clip4ClipVideoState(emb=emb, frames=frames, frame_mask=mask, gram=gram)

    # ------------------------------------------------------------------ scoring
    def score_block(self, text_state: Clip4ClipTextState, video_state: Clip4ClipVideoState) -> Tensor:
        if self.video_pool == "mean":
            return text_state.emb @ video_state.emb.t()
        if text_state.raw is None or video_state.frames is None:
            raise ValueError("text_softmax scoring needs states from this head's encode_texts/encode_videos")
        n_t = len(text_state)
        n_v, n_f = video_state.frames.shape[:2]
        # bound the [n_t, n_v, F] scratch tensors: split the videos further when the block is large
        step = max(1, POOL_CHUNK_ELEMENTS // max(1, n_t * n_f))
        parts = [
            text_softmax_scores(
                text_state.raw,
                video_state.frames[b : b + step],
                video_state.frame_mask[b : b + step],
                video_state.gram[b : b + step],
                self.pool_temperature,
            )
            for b in range(0, n_v, step)
        ]
        if not parts:
            return text_state.raw.new_zeros(n_t, 0)
        return torch.cat(parts, dim=1)

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """Spec §1.3 for each aligned pair, one at a time: cos(t, mean of the normalised real frames), or with
        ``text_softmax`` cos(t, Σ_f w_f V_f), w = softmax_f(⟨t, V_f⟩ / temp) · m_f."""
        out = []
        for t, frames, mask in zip(text.eot.double(), video.frames.double(), video.frame_mask.double(), strict=True):
            if self.video_pool == "mean":
                real = F.normalize(frames, dim=-1)[mask > 0]
                pooled = real.mean(dim=0) if len(real) else torch.zeros_like(t)
            else:
                weights = torch.softmax(frames @ t / self.pool_temperature, dim=0) * mask
                pooled = weights @ frames
            out.append(F.cosine_similarity(t, pooled, dim=0, eps=_EPS))
        return torch.stack(out).float() if out else torch.zeros(0)

    # ------------------------------------------------------------------ training
    def loss(self, text: TextFeatures, video: VideoFeatures, shard: RowShard | None = None) -> dict[str, Tensor]:
        """Symmetric InfoNCE on exp(logit_scale) · s over the B×B batch (diagonal positives). ``logit_scale`` in the
        returned dict is the multiplier exp(logit_scale), detached.

        Under DDP (``shard``: this rank's rows of the gathered batch) each rank scores its own texts against every
        video (text_softmax pooling is per pair) and the B×B scores are all-gathered (:mod:`tvr.train.distributed`).
        """
        shard = shard or RowShard.whole(len(text))
        sims = shard.gather(self.score_block(self.encode_texts(shard.local(text)), self.encode_videos(video)))
        scale = self.logit_scale.exp()
        loss = symmetric_infonce(scale * sims)
        return {"loss": loss, "infonce": loss.detach(), "logit_scale": scale.detach()}
