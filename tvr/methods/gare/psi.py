"""GARE's core (spec §3.1-3.2, §3.8): ψ, the head's options, and the per-pair block — one implementation.

For text i and video j (all features unnormalised until the final cosine):

    v̄_j     = mean_f V'_jf                          (plain mean over all F slots, or masked with ``mask_frames``)
    q_ij    = η·(v̄_j − t_i)                         (``gap_query=False``: q_ij = t_i, Table-5 variant)
    Δ_ij    = ψ(q_ij, C)     C = V'_j (frames) or T_word_i (words)
              (``gap_query=False``: Δ_ij = η·(v̄_j − ψ(t_i, C)))
    v^p_ij  = Σ_f softmax_f(⟨t_i, V'_jf⟩/temp)·m_jf·V'_jf   (``text_softmax``, no renormalisation) or v̄_j (``mean``)
    s_ij    = cos(t_i + Δ_ij, v^p_ij)   (text side)   or   cos(t_i, v^p_ij + Δ_ij)   (video side)

:func:`gare_block` is the single place where Δ and the scores are computed from ψ itself; training and the exact
test-time path call it. The factorised scorer (``scoring``) re-derives the same numbers algebraically from
ψ's weights and the same :class:`GareOptions`. This module imports nothing else of GARE.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

from tvr.config import bounded, choice
from tvr.methods.gare.losses import KL_REDUCTIONS
from tvr.models.heads.common import masked_mean
from tvr.types import TextFeatures, VideoFeatures

GARE_SIDES = ("text", "video")
GARE_CONTEXTS = ("frames", "words")
GARE_POOLS = ("mean", "text_softmax")
#: exact = ψ run on every pair (gare_block); fast = the factorised scorer (eval only); auto = fast where it applies
GARE_SCORERS = ("auto", "fast", "exact")
PSI_INITS = ("normal0.02", "identity")


@dataclasses.dataclass
class GareOptions:
    """``head.options`` of ``head.name: gare`` (spec §3). Defaults = the released MSR-VTT configuration."""

    #: text | video: which side receives Δ_ij
    corrected_side: str = choice("text", *GARE_SIDES)
    #: frames (V_frame of video j) | words (T_word of text i)
    context: str = choice("frames", *GARE_CONTEXTS)
    #: sign η of the gap η·(v̄_j − t_i): +1 or -1
    eta: float = 1.0
    #: True: query = η·(v̄_j − t_i); False: Table-5 variant, query = t_i and Δ_ij = η·(v̄_j − ψ(t_i, C))
    gap_query: bool = True
    #: video pooling in the score: mean | text_softmax
    video_pool: str = choice("text_softmax", *GARE_POOLS)
    #: temperature of the text_softmax pooling over frames (released code: 3)
    pool_temperature: float = bounded(3.0, gt=0.0)
    #: masked frame mean for v̄_j and key masking in ψ (reference: off)
    mask_frames: bool = False
    #: normal0.02 (reference behaviour) | identity
    psi_init: str = choice("normal0.02", *PSI_INITS)
    #: dropout inside ψ (released code: 0.3; off at test time)
    psi_dropout: float = bounded(0.3, ge=0.0, lt=1.0)
    #: sum (released code, β=1e-4) | mean (paper, β=0.07): reduction of the information-bottleneck KL of Δ
    kl_reduction: str = choice("sum", *KL_REDUCTIONS)
    #: weight β of the KL term L_IB (0 = off)
    kl_weight: float = bounded(1e-4, ge=0.0)
    #: weight λ_ε of the radius term L_ε (0 = off)
    radius_weight: float = bounded(0.01, ge=0.0)
    #: bound λ of L_ε's hinge on the mean variance of the radii ‖Δ_ij‖ (released code: 0.5)
    radius_lambda: float = bounded(0.5, ge=0.0)
    #: weight λ_dir of the direction term L_dir (0 = off)
    direction_weight: float = bounded(0.01, ge=0.0)
    #: sharpness α of L_dir (the paper's σ; released code: 2)
    direction_alpha: float = bounded(2.0, ge=0.0)
    #: auto | fast | exact: test-time pairwise scorer (auto = the factorised scorer where it applies)
    scorer: str = choice("auto", *GARE_SCORERS)

    def validate(self) -> None:
        if self.eta not in (1.0, -1.0):
            raise ValueError(f"eta = {self.eta!r}: expected +1 or -1 (the sign of the gap)")


class Psi(nn.Module):
    """Δ_ij = W_μ · LN3(h + Dropout(W_1 h)),  h = LN2(W_o · Attn(W_q LN1(q_ij), W_k LN1(C_j), W_v LN1(C_j))).

    The same LayerNorm ``ln_in`` normalises query and context; there is no residual from the query and no
    FFN, exactly as in the released code. ``forward`` takes the per-pair queries [N_t, N_v, D] and the
    per-video (or per-text, for word context) context [N_v, F, D].
    """

    def __init__(self, dim: int, dropout: float = 0.3, init: str = "normal0.02") -> None:
        super().__init__()
        if init not in PSI_INITS:
            raise ValueError(f"psi init {init!r}: expected one of {PSI_INITS}")
        self.dim = dim
        self.ln_in = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.ln_attn = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.ln_out = nn.LayerNorm(dim)
        self.delta_proj = nn.Linear(dim, dim)
        self.reset_parameters(init)

    def reset_parameters(self, init: str = "normal0.02") -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if init == "identity":
                    nn.init.eye_(module.weight)
                else:
                    # the reference's GARE.apply(init_weights) overrides ψ's own identity init
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def attention_weights(self, query: Tensor, context: Tensor, context_mask: Tensor | None = None) -> Tensor:
        """a_ijf = softmax_f(W_q LN(q_ij) · W_k LN(C_jf) / sqrt(D)): [N_t, N_v, F]."""
        q = self.q_proj(self.ln_in(query))  # [N_t, N_v, D]
        k = self.k_proj(self.ln_in(context))  # [N_v, F, D]
        logits = torch.einsum("tvd,vfd->tvf", q, k) / math.sqrt(self.dim)
        if context_mask is not None:
            logits = logits.masked_fill(~context_mask.bool().unsqueeze(0), float("-inf"))
        return logits.softmax(dim=-1)

    def forward(self, query: Tensor, context: Tensor, context_mask: Tensor | None = None) -> Tensor:
        """query [N_t, N_v, D], context [N_v, F, D], context_mask [N_v, F] (1 = attend) → Δ [N_t, N_v, D]."""
        if query.ndim != 3 or context.ndim != 3 or query.shape[1] != context.shape[0]:
            raise ValueError(
                f"Psi expects query [N_t, N_v, D] and context [N_v, F, D], got {tuple(query.shape)} "
                f"and {tuple(context.shape)}"
            )
        attn = self.attention_weights(query, context, context_mask)
        values = self.v_proj(self.ln_in(context))  # [N_v, F, D]
        o = self.out_proj(torch.einsum("tvf,vfd->tvd", attn, values))
        h = self.ln_attn(o)
        h = self.ln_out(h + self.dropout(self.linear(h)))
        return self.delta_proj(h)


# --------------------------------------------------------------------------------------------- the block


def _attend_mask(mask: Tensor) -> Tensor:
    """Boolean key mask for ψ; an item with no valid key attends over all of them instead of producing NaN."""
    mask = mask.bool()
    empty = ~mask.any(dim=-1, keepdim=True)
    return mask | empty


def video_mean(video: VideoFeatures, masked: bool = False) -> Tensor:
    """v̄_j [n_v, D]: plain mean over all F slots (reference), or the mean over real frames (denominator ≥ 1)."""
    if not masked:
        return video.frames.mean(dim=1)
    return masked_mean(video.frames, video.frame_mask)


def pooled_video(text_eot: Tensor, video: VideoFeatures, options: GareOptions) -> Tensor:
    """v^pool_ij used in the score: [n_t, n_v, D] for ``text_softmax``, [1, n_v, D] (broadcast) for ``mean``.

    ``text_softmax`` follows the released code: softmax over *all* F slots of ⟨t_i, V'_jf⟩/temp, then multiplied
    by the frame mask without renormalising (spec §3.1 step 4).
    """
    if options.video_pool == "mean":
        return video_mean(video, options.mask_frames).unsqueeze(0)
    logits = torch.einsum("td,vfd->tvf", text_eot, video.frames) / options.pool_temperature
    weights = logits.softmax(dim=-1) * video.frame_mask.to(logits.dtype).unsqueeze(0)
    return torch.einsum("tvf,vfd->tvd", weights, video.frames)


def gare_delta(
    psi: Psi, text: TextFeatures, video: VideoFeatures, options: GareOptions, vbar: Tensor | None = None
) -> Tensor:
    """Δ_ij for every text × video pair of the block: [n_t, n_v, D] (spec §3.1-3.2, §3.8).

    Frame context: ψ attends, for pair (i, j), over the frames of video j. Word context: over the words of text
    i; ψ batches its context along its second query axis, so the query is transposed to [n_v, n_t, D] with the
    per-text words as context, and the result transposed back. ``mask_frames`` masks padded keys in either
    case (off = the reference, which attends over padding too).
    """
    t = text.eot
    if vbar is None:
        vbar = video_mean(video, options.mask_frames)
    n_t, n_v = t.shape[0], vbar.shape[0]
    if options.gap_query:
        query = options.eta * (vbar.unsqueeze(0) - t.unsqueeze(1))
    else:
        query = t.unsqueeze(1).expand(n_t, n_v, t.shape[-1])
    if options.context == "frames":
        mask = _attend_mask(video.frame_mask) if options.mask_frames else None
        out = psi(query, video.frames, mask)
    else:
        if text.words is None:
            raise ValueError("head.options.context = 'words' needs TextFeatures.words (projected word features)")
        mask = None
        if options.mask_frames and text.word_mask is not None:
            mask = _attend_mask(text.word_mask)
        out = psi(query.transpose(0, 1), text.words, mask).transpose(0, 1)
    if not options.gap_query:
        # Table 5: ψ(t_i, C) predicts a corrected text t'_ij and the increment is the remaining gap to v_j
        out = options.eta * (vbar.unsqueeze(0) - out)
    return out


def _cosine(a: Tensor, b: Tensor, eps: float = 1e-12) -> Tensor:
    """Row-wise cosine of broadcastable [..., D] tensors without materialising normalised copies."""
    return (a * b).sum(dim=-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(eps)


def gare_block(psi: Psi, text: TextFeatures, video: VideoFeatures, options: GareOptions) -> tuple[Tensor, Tensor]:
    """Scores s_ij [n_t, n_v] and increments Δ_ij [n_t, n_v, D] for one block of texts × videos."""
    vbar = video_mean(video, options.mask_frames)
    delta = gare_delta(psi, text, video, options, vbar=vbar)
    t = text.eot.unsqueeze(1)  # [n_t, 1, D]
    vpool = pooled_video(text.eot, video, options)
    if options.corrected_side == "text":
        scores = _cosine(t + delta, vpool)
    else:
        scores = _cosine(t, vpool + delta)
    return scores, delta


def gare_pair_features(
    psi: Psi, text: TextFeatures, video: VideoFeatures, options: GareOptions
) -> tuple[Tensor, Tensor]:
    """Δ_k and the score's video vector v^pool_k of the aligned pairs (text k, video k): ([P, D], [P, D]).

    The diagonal of :func:`gare_delta` and :func:`pooled_video` on a P × P block, at the cost of P pairs: ψ batches
    its context along the query's second axis, so the P pair queries go in as one row [1, P, D] against the P
    contexts (frames of video k, or words of text k)."""
    if len(text) != len(video):
        raise ValueError(f"gare_pair_features needs aligned pairs, got {len(text)} texts and {len(video)} videos")
    t = text.eot
    vbar = video_mean(video, options.mask_frames)
    query = options.eta * (vbar - t) if options.gap_query else t
    if options.context == "frames":
        mask = _attend_mask(video.frame_mask) if options.mask_frames else None
        delta = psi(query.unsqueeze(0), video.frames, mask)[0]
    else:
        if text.words is None:
            raise ValueError("head.options.context = 'words' needs TextFeatures.words (projected word features)")
        mask = _attend_mask(text.word_mask) if options.mask_frames and text.word_mask is not None else None
        delta = psi(query.unsqueeze(0), text.words, mask)[0]
    if not options.gap_query:
        delta = options.eta * (vbar - delta)
    if options.video_pool == "mean":
        return delta, vbar
    logits = torch.einsum("pd,pfd->pf", t, video.frames) / options.pool_temperature
    weights = logits.softmax(dim=-1) * video.frame_mask.to(logits.dtype)
    return delta, torch.einsum("pf,pfd->pd", weights, video.frames)
