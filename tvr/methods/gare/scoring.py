"""Exact GARE test-time scoring at the floor of its cost (spec §3.3, §3.3a, §3.7, §3.8).

GARE scores every (text i, video j) pair with its own increment Δ_ij = ψ(q_ij, C), so a gallery cannot be indexed
and the reference runs the whole ψ (≈ 5·D² multiply-adds) for every pair. With ψ's weights folded
(``algebra``), Δ_ij lies in an (F+2)-dimensional subspace fixed per context owner, and the score's numerator and
norms expand into three text × (video·frame) products of inner dimension D ((t_i M_q)·ℓ_jf, t_i·w_jf, t_i·x_jf),
per-video F×F Gram matrices and per-video F-vectors: ≈ 3·F·D multiply-adds and O(F) memory per pair, against
≈ 5·D² and a D-vector per pair for the direct computation (:func:`tvr.methods.gare.psi.gare_block`). Every
intermediate is an exact identity — no approximation.

Entry points (all take the head's :class:`~tvr.methods.gare.psi.GareOptions`):

* :func:`gare_pairwise_scores` — the [N_t, N_v] score matrix of ``TextFeatures`` × ``VideoFeatures``.
* :func:`gare_pair_scores` — exact scores of given (text, video) pairs (two-stage rerank), frame context.
* :func:`fast_path_support` — whether the factorisation covers a ψ / variant, and whether it is the cheaper path.

Variants (spec §3.8), all covered: ``corrected_side`` text/video; ``context`` frames (the Δ subspace is per video)
or words (per *text*, the roles of the two sides swap); η = ±1; ``gap_query=False`` (query t_i, Δ_ij =
η·(v̄_j − ψ(t_i, C))); ``video_pool`` mean or text_softmax (mask applied after the softmax without
renormalisation); ``mask_frames`` (masked mean, key masking in ψ; an item with no valid key attends over all).
With word context and text_softmax pooling, Δ (per-text subspace) meets v^p (per-video subspace) in the score,
which needs an L × F cross-Gram per pair: exact, but larger than the direct path's D-vector when L·F > D, which
:func:`fast_path_support` reports so the head can keep the direct path there. A ψ whose structure differs from
:class:`~tvr.methods.gare.psi.Psi` (a subclass with its own ``forward``) is not covered.

ψ is always evaluated without dropout here (test-time scoring), whatever its ``training`` flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from tvr.methods.gare.algebra import Algebra, Workspace, buffer, covered_psi, owner_state, psi_algebra, psi_pair
from tvr.methods.gare.psi import GareOptions
from tvr.types import Sliceable, TextFeatures, VideoFeatures

__all__ = [
    "GareRerankState",
    "fast_path_support",
    "gare_pair_scores",
    "gare_pairwise_scores",
    "gare_rerank_scores",
    "gare_rerank_state",
]

#: frame context: texts × videos per chunk. Per-pair state is O(F), so a chunk of 1024 texts × 64 videos holds
#: ~40 MB of intermediates while every matrix product stays large enough for BLAS (measured best of 128-1024 texts
#: × 32-128 videos on the 2-core benchmark machine, within noise of each other)
FAST_TEXT_CHUNK = 1024
FAST_VIDEO_CHUNK = 64
#: word context: the per-text ψ state (L words × 3D) makes texts the expensive side of a chunk
FAST_WORDS_TEXT_CHUNK = 128
FAST_WORDS_VIDEO_CHUNK = 256
#: given pairs: videos per chunk, and a cap on the (padded) pairs a chunk scores at once
PAIR_VIDEO_CHUNK = 256
PAIR_BLOCK = 1 << 16
#: word context with text_softmax pooling: cap on floats of the per-chunk L × F cross-Gram
_CROSS_BUDGET = 1 << 22
_COS_EPS = 1e-12


# ============================================================================================ inputs


@dataclass
class _Inputs:
    """Validated inputs in the compute dtype (float64 stays float64, everything else becomes float32)."""

    text: Tensor  # [N_t, D]
    frames: Tensor  # [N_v, F, D]
    frame_mask: Tensor  # [N_v, F] bool
    words: Tensor | None  # [N_t, L, D]
    word_mask: Tensor | None  # [N_t, L] bool


def _check_inputs(psi: nn.Module, text: TextFeatures, video: VideoFeatures, options: GareOptions) -> _Inputs:
    if not isinstance(options, GareOptions):
        raise TypeError(f"options: expected GareOptions, got {type(options).__name__}")
    eot, frames, frame_mask = (
        getattr(text, "eot", None),
        getattr(video, "frames", None),
        getattr(video, "frame_mask", None),
    )
    if not isinstance(eot, Tensor) or eot.ndim != 2:
        raise ValueError(f"text: expected TextFeatures with eot [N_t, D], got {_shape(eot)}")
    if not isinstance(frames, Tensor) or frames.ndim != 3:
        raise ValueError(f"video: expected VideoFeatures with frames [N_v, F, D], got {_shape(frames)}")
    dim = eot.shape[1]
    if frames.shape[2] != dim:
        raise ValueError(f"video.frames: feature size {frames.shape[2]} differs from the text's {dim}")
    psi_dim = getattr(psi, "dim", None)
    if psi_dim is not None and psi_dim != dim:
        raise ValueError(f"features have D = {dim} but psi was built for dim = {psi_dim}")
    if not isinstance(frame_mask, Tensor) or tuple(frame_mask.shape) != tuple(frames.shape[:2]):
        raise ValueError(f"video.frame_mask: expected shape {tuple(frames.shape[:2])}, got {_shape(frame_mask)}")
    dtype = torch.float64 if eot.dtype == torch.float64 else torch.float32
    words = word_mask = None
    if options.context == "words":
        words, word_mask = getattr(text, "words", None), getattr(text, "word_mask", None)
        if not isinstance(words, Tensor):
            raise ValueError("context = 'words' needs TextFeatures.words [N_t, L, D] (projected word features)")
        if words.ndim != 3 or words.shape[0] != eot.shape[0] or words.shape[2] != dim:
            raise ValueError(f"text.words: expected shape [{eot.shape[0]}, L, {dim}], got {tuple(words.shape)}")
        if word_mask is not None:
            if tuple(word_mask.shape) != tuple(words.shape[:2]):
                raise ValueError(
                    f"text.word_mask: expected shape {tuple(words.shape[:2])}, got {tuple(word_mask.shape)}"
                )
            word_mask = word_mask.to(words.device).bool()
        words = words.to(dtype)
    return _Inputs(eot.to(dtype), frames.to(dtype), frame_mask.to(frames.device).bool(), words, word_mask)


def _shape(x: object) -> str:
    return str(tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__


def _attend_mask(mask: Tensor) -> Tensor:
    """Key mask for ψ; an item without any valid key attends over all of them (no NaN), as the head does."""
    return mask | ~mask.any(dim=-1, keepdim=True)


def _mean_weights(frame_mask: Tensor | None, n: int, f: int, masked: bool, like: Tensor) -> Tensor:
    """μ_jf with v̄_j = Σ_f μ_jf V_jf: 1/F (reference), or m_jf / max(Σ_f m_jf, 1) with ``mask_frames``."""
    if masked and frame_mask is not None:
        m = frame_mask.to(like.dtype)
        return m / m.sum(dim=1, keepdim=True).clamp_min(1.0)
    return torch.full((n, f), 1.0 / f, dtype=like.dtype, device=like.device)


def _check_chunk(value: int | None, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} = {value!r}: expected a positive integer or None")


# ============================================================================================ the cosine


def _finish(
    v: GareOptions,
    tt: Tensor,
    t_vp: Tensor,
    n_vp: Tensor,
    t_d: Tensor,
    n_d: Tensor,
    d_vp: Tensor,
) -> Tensor:
    """cos of the corrected pair from its inner products: t·v^p, ‖v^p‖², t·Δ, ‖Δ‖², Δ·v^p and ‖t‖²."""
    if v.corrected_side == "text":
        num = t_vp + d_vp
        na = tt + 2.0 * t_d + n_d
        nb = n_vp
    else:
        num = t_vp + t_d
        na = tt
        nb = n_vp + 2.0 * d_vp + n_d
    den = (na.clamp_min(0.0) * nb.clamp_min(0.0)).sqrt_().clamp_min_(_COS_EPS)
    return num / den


# ============================================================================================ frame context


@dataclass
class _VideoState:
    """Per-video state of the frame-context scorer for one chunk of videos."""

    n: int
    f: int
    # the per-frame keys, None in a state restored from a GareRerankState (whose dots come from its z)
    ell: Tensor | None  # [n, F, D] LN1(V_jf)
    w: Tensor | None  # [n, F, D] (rows strided inside the projection buffer)
    x: Tensor | None  # [n, F, D] raw frames
    vbar: Tensor  # [n, D]
    kappa: Tensor | None  # [n·F, 1] (η/√D)(v̄_j M_q)·ℓ_jf, the video's part of the gap query
    beta: Tensor  # [n, F, 1]
    grams: Tensor  # [n, 3F + 3 (+1), F] owner Grams (+ (w·v̄)ᵀ when needed)
    pgrams: Tensor | None  # [n, 2F + 3, F] rows W Xᵀ, X Xᵀ, (x·e)ᵀ, (x·d)ᵀ, (x·v̄)ᵀ (softmax pool)
    pool_mask: Tensor | None  # [n, F, 1] (softmax pool with a frame mask that masks something)
    ncv: Tensor  # [n, 1] η²‖C v̄‖²
    mv: Tensor  # [n, 1] mean(v̄)
    ev: Tensor  # [n, 1] v̄·e
    dv: Tensor  # [n, 1] v̄·d
    vv: Tensor  # [n, 1] ‖v̄‖²


def _video_state(
    alg: Algebra, x: Tensor, xm: Tensor | None, v: GareOptions, ws: Workspace | None = None
) -> _VideoState:
    n, f, dim = x.shape
    softmax = v.video_pool == "text_softmax"
    mu = _mean_weights(xm, n, f, v.mask_frames, x)
    vbar = (x * mu.unsqueeze(2)).sum(1)  # (a batched product with one row per video is far slower)
    key_mask = _attend_mask(xm) if (v.mask_frames and xm is not None) else None
    owner = owner_state(alg, x, key_mask, ws)
    kappa = None
    if v.gap_query:
        ubar = (vbar @ alg.mq).mul_(v.eta / math.sqrt(dim))
        kappa = torch.linalg.vecdot(owner.ell, ubar.unsqueeze(1)).view(n * f, 1)
    grams = owner.grams
    if v.video_pool == "mean" or not v.gap_query:
        grams = torch.cat([grams, torch.linalg.vecdot(owner.w, vbar.unsqueeze(1)).unsqueeze(1)], dim=1)
    pgrams = pool_mask = None
    if softmax:
        xed = (x.view(n * f, dim) @ torch.stack([alg.e, alg.d], dim=1)).view(n, f, 2).transpose(1, 2)
        xv = torch.linalg.vecdot(x, vbar.unsqueeze(1)).unsqueeze(1)
        pgrams = torch.cat([torch.bmm(owner.w, x.transpose(1, 2)), torch.bmm(x, x.transpose(1, 2)), xed, xv], dim=1)
        if xm is not None and not bool(xm.all()):
            pool_mask = xm.to(x.dtype).unsqueeze(2)
    cv = vbar - vbar.mean(dim=1, keepdim=True)
    return _VideoState(
        n=n,
        f=f,
        ell=owner.ell,
        w=owner.w,
        x=x,
        vbar=vbar,
        kappa=kappa,
        beta=owner.beta.unsqueeze(2),
        grams=grams,
        pgrams=pgrams,
        pool_mask=pool_mask,
        ncv=(v.eta * v.eta) * (cv * cv).sum(1, keepdim=True),
        mv=vbar.mean(dim=1, keepdim=True),
        ev=(vbar @ alg.e).unsqueeze(1),
        dv=(vbar @ alg.d).unsqueeze(1),
        vv=(vbar * vbar).sum(1, keepdim=True),
    )


@dataclass
class _Dots:
    """Per-(pair, frame) inner products: s1 (gap-query logit numerators, κ included), sw = t·w_f, sx = t·x_f / τ
    (text_softmax pooling only), each [n_v, F, n_t], and sv = t·v̄ [n_v, n_t]."""

    s1: Tensor
    sw: Tensor
    sx: Tensor | None
    sv: Tensor


@dataclass
class _TextState:
    """Per-text operands. ``t``/``uk``/``ts`` are [n, D] (a grid: every text against every video of the chunk)
    or [n_v, n, D] (ragged: each video against its own texts); the scalars broadcast against [n_v, n]."""

    t: Tensor
    uk: Tensor | None  # t M_q times the query's coefficient of t_i, over √D (None: scoring a stored state)
    ts: Tensor  # t / temp
    tt: Tensor  # ‖t‖²
    st: Tensor  # Σ_d t_d
    ct: Tensor  # ‖C t‖²
    te: Tensor  # t·e
    td: Tensor  # t·d

    def rows(self, sl: slice) -> _TextState:
        """A chunk of a grid state."""
        return _TextState(self.t[sl], self.uk[sl], self.ts[sl], *(x[:, sl] for x in self._scalars()))

    def take(self, index: Tensor) -> _TextState:
        """Ragged operands for ``index`` [n_v, slots] of text rows (``self`` must be a grid state)."""
        return _TextState(self.t[index], self.uk[index], self.ts[index], *(x[0][index] for x in self._scalars()))

    def _scalars(self) -> tuple[Tensor, ...]:
        return self.tt, self.st, self.ct, self.te, self.td


def _query_coefficient(v: GareOptions, dim: int) -> float:
    return (-v.eta if v.gap_query else 1.0) / math.sqrt(dim)


def _text_operands(t: Tensor, v: GareOptions, uk: Tensor | None, te: Tensor, td: Tensor) -> _TextState:
    """The grid operands of texts ``t`` [N_t, D] given their query rows ``uk`` and t·e, t·d [N_t]."""
    dim = t.shape[1]
    tt = (t * t).sum(1)
    st = t.sum(1)
    return _TextState(
        t=t,
        uk=uk,
        ts=t / v.pool_temperature,
        tt=tt.unsqueeze(0),
        st=st.unsqueeze(0),
        ct=(tt - st * st / dim).unsqueeze(0),
        te=te.unsqueeze(0),
        td=td.unsqueeze(0),
    )


def _text_state(alg: Algebra, t: Tensor, v: GareOptions) -> _TextState:
    uk = (t @ alg.mq).mul_(_query_coefficient(v, t.shape[1]))
    return _text_operands(t, v, uk, t @ alg.e, t @ alg.d)


def _frames_pairs(alg: Algebra, vs: _VideoState, ts: _TextState, v: GareOptions, ws: Workspace | None = None) -> Tensor:
    """Scores [n_v, n_t] of a video chunk against a text chunk (grid) or against per-video text slots (ragged).

    Layout [video, frame, text]: the softmaxes run over the middle axis with the texts contiguous, and the
    per-video Grams act on [F, n_t] blocks through one batched matrix product per chunk."""
    return _frames_from_dots(alg, vs, ts, v, _frame_dots(alg, vs, ts, v, ws), ws)


def _frame_dots(alg: Algebra, vs: _VideoState, ts: _TextState, v: GareOptions, ws: Workspace | None) -> _Dots:
    """The per-(pair, frame) inner products of inner dimension D, from the per-frame ψ keys ℓ, w and frames x."""
    n, f, dim = vs.n, vs.f, alg.dim
    nf = n * f
    softmax = v.video_pool == "text_softmax"
    if ts.t.ndim == 2:  # grid: three GEMMs of inner dimension D give every per-pair dot product
        nt = ts.t.shape[0]
        ell2, w2 = vs.ell.view(nf, dim), vs.w.reshape(nf, dim)
        out1 = buffer(ws, "s1", (nf, nt), ts.t)
        s1 = (
            torch.addmm(vs.kappa, ell2, ts.uk.T, out=out1)
            if vs.kappa is not None
            else torch.mm(ell2, ts.uk.T, out=out1)
        ).view(n, f, nt)
        sw = torch.mm(w2, ts.t.T, out=buffer(ws, "sw", (nf, nt), ts.t)).view(n, f, nt)
        sx = (
            torch.mm(vs.x.view(nf, dim), ts.ts.T, out=buffer(ws, "sx", (nf, nt), ts.t)).view(n, f, nt)
            if softmax
            else None
        )
        sv = vs.vbar @ ts.t.T
    else:  # ragged: ts.t is [n, slots, D]
        nt = ts.t.shape[1]
        if vs.kappa is not None:
            s1 = torch.baddbmm(vs.kappa.view(n, f, 1), vs.ell, ts.uk.transpose(1, 2))
        else:
            s1 = torch.bmm(vs.ell, ts.uk.transpose(1, 2))
        t_t = ts.t.transpose(1, 2)
        sw = torch.bmm(vs.w, t_t)
        sx = torch.bmm(vs.x, ts.ts.transpose(1, 2)) if softmax else None
        sv = torch.bmm(vs.vbar.unsqueeze(1), t_t).squeeze(1)
    return _Dots(s1, sw, sx, sv)


def _frames_from_dots(
    alg: Algebra, vs: _VideoState, ts: _TextState, v: GareOptions, dots: _Dots, ws: Workspace | None = None
) -> Tensor:
    """Scores [n_v, n_t] from the per-frame inner products: ψ's attention and Δ's scalars on O(F) per pair."""
    n, f, dim = vs.n, vs.f, alg.dim
    softmax = v.video_pool == "text_softmax"
    s1, sw, sx, sv = dots.s1, dots.sw, dots.sx, dots.sv
    nt = sw.shape[2]
    eta2 = v.eta * v.eta
    if v.gap_query:
        # σ1² = η²(‖Cv̄‖² − 2 t·Cv̄ + ‖Ct‖²)/D + eps1, with t·Cv̄ = t·v̄ − mean(v̄) Σ_d t_d
        s1sq = (vs.ncv + eta2 * ts.ct - 2.0 * eta2 * (sv - vs.mv * ts.st)) / dim + alg.eps1
    else:
        s1sq = ts.ct / dim + alg.eps1
    logits = torch.addcmul(vs.beta, s1, s1sq.rsqrt().unsqueeze(1), out=s1 if ws is not None else None)
    pp = psi_pair(alg, logits, vs.grams, ws)
    a, rho, eps = pp.a, pp.rho, pp.eps
    t_dpsi = rho * (sw.mul_(a) if ws is not None else sw * a).sum(1) + eps * ts.te + ts.td
    if v.video_pool == "mean" or not v.gap_query:
        dpsi_vbar = rho * pp.rows[:, 3 * f + 3] + eps * vs.ev + vs.dv
    if softmax:
        pi = torch.softmax(sx, dim=1, out=buffer(ws, "pi", sx.shape, sx))
        if vs.pool_mask is not None:
            pi.mul_(vs.pool_mask)
        prow = torch.bmm(vs.pgrams, pi, out=buffer(ws, "prow", (n, vs.pgrams.shape[1], nt), sx))
        if ws is not None:
            a_wx_pi = prow[:, :f].mul_(a).sum(1)
            n_vp = prow[:, f : 2 * f].mul_(pi).sum(1)
        else:
            a_wx_pi = (prow[:, :f] * a).sum(1)
            n_vp = (prow[:, f : 2 * f] * pi).sum(1)
        t_vp = (sx.mul_(pi) if ws is not None else sx * pi).sum(1).mul_(v.pool_temperature)
        dpsi_vp = rho * a_wx_pi + eps * prow[:, 2 * f] + prow[:, 2 * f + 1]
        vbar_vp = prow[:, 2 * f + 2]
    else:
        t_vp, n_vp, dpsi_vp, vbar_vp = sv, vs.vv, dpsi_vbar, vs.vv
    if v.gap_query:
        t_d, n_d, d_vp = t_dpsi, pp.n_dpsi, dpsi_vp
    else:  # Δ = η(v̄ − Δψ)
        g = v.eta
        t_d = g * (sv - t_dpsi)
        n_d = eta2 * (pp.n_dpsi - 2.0 * dpsi_vbar + vs.vv)
        d_vp = g * (vbar_vp - dpsi_vp)
    return _finish(v, ts.tt, t_vp, n_vp, t_d, n_d, d_vp)


def _fast_frames(alg: Algebra, inp: _Inputs, v: GareOptions, text_chunk: int, video_chunk: int) -> Tensor:
    t, x, xm = inp.text, inp.frames, inp.frame_mask
    n_t, n_v = t.shape[0], x.shape[0]
    out = torch.empty(n_t, n_v, dtype=t.dtype, device=t.device)
    ts_all = _text_state(alg, t, v)
    ws = Workspace()
    for b in range(0, n_v, video_chunk):
        sl_v = slice(b, b + video_chunk)
        vs = _video_state(alg, x[sl_v], xm[sl_v] if xm is not None else None, v, ws)
        for a in range(0, n_t, text_chunk):
            sl_t = slice(a, a + text_chunk)
            out[sl_t, sl_v] = _frames_pairs(alg, vs, ts_all.rows(sl_t), v, ws).T
    return out


# ============================================================================================ word context


def _fast_words(alg: Algebra, inp: _Inputs, v: GareOptions, text_chunk: int, video_chunk: int) -> Tensor:
    """Word context: ψ's subspace is per *text* (owner = text i, the other side = video j): roles swap."""
    t, x, xm, words, wm = inp.text, inp.frames, inp.frame_mask, inp.words, inp.word_mask
    assert words is not None
    n_t, n_v, f = t.shape[0], x.shape[0], x.shape[1]
    ell_len = words.shape[1]
    dim = alg.dim
    softmax = v.video_pool == "text_softmax"
    eta2 = v.eta * v.eta
    out = torch.empty(n_t, n_v, dtype=t.dtype, device=t.device)
    # per video (the "other" side)
    mu = _mean_weights(xm, n_v, f, v.mask_frames, x)
    vbar = torch.bmm(mu.unsqueeze(1), x).squeeze(1)
    ubar = (vbar @ alg.mq).mul_(v.eta / math.sqrt(dim))  # r_j = η v̄_j
    cv = vbar - vbar.mean(dim=1, keepdim=True)
    ncv = eta2 * (cv * cv).sum(1)
    mv = vbar.mean(1)
    ev, dv, vv = vbar @ alg.e, vbar @ alg.d, (vbar * vbar).sum(1)
    pool_mask = xm.to(x.dtype) if (softmax and xm is not None and not bool(xm.all())) else None
    if softmax:
        xs = x / v.pool_temperature
    if softmax and video_chunk * min(text_chunk, n_t) * ell_len * f > _CROSS_BUDGET:
        video_chunk = max(1, _CROSS_BUDGET // (min(text_chunk, n_t) * ell_len * f))
    key_mask = _attend_mask(wm) if (v.mask_frames and wm is not None) else None
    for a in range(0, n_t, text_chunk):
        sl_t = slice(a, a + text_chunk)
        tc = t[sl_t]
        nt = tc.shape[0]
        owner = owner_state(alg, words[sl_t], key_mask[sl_t] if key_mask is not None else None)
        tt = (tc * tc).sum(1)
        st = tc.sum(1)
        ct = tt - st * st / dim
        te, td = tc @ alg.e, tc @ alg.d
        # κ_il: the owner's part of the query, (p_i M_q)·ℓ_il/√D with p_i = −η t_i (gap) or t_i (no gap)
        coef = (-v.eta if v.gap_query else 1.0) / math.sqrt(dim)
        kappa = torch.linalg.vecdot(owner.ell, (tc @ alg.mq).mul_(coef).unsqueeze(1)).unsqueeze(2)  # [nt, L, 1]
        tw = torch.linalg.vecdot(owner.w, tc.unsqueeze(1)).unsqueeze(1)  # [nt, 1, L]
        grams = torch.cat([owner.grams, tw], dim=1)  # row 3L+3: a·(t·w)
        ell2 = owner.ell.reshape(nt * ell_len, dim)
        w2 = owner.w.reshape(nt * ell_len, dim)
        if not v.gap_query:
            # the query t_i does not involve the video: ψ's weights are per text, computed once
            s1sq = (ct / dim + alg.eps1).view(nt, 1, 1)
            pp_text = psi_pair(alg, torch.addcmul(owner.beta.unsqueeze(2), kappa, s1sq.rsqrt()), grams)
        for b in range(0, n_v, video_chunk):
            sl_v = slice(b, b + video_chunk)
            nv = vbar[sl_v].shape[0]
            sv = tc @ vbar[sl_v].T  # [nt, nv]
            if v.gap_query:
                s1 = torch.addmm(kappa.view(-1, 1), ell2, ubar[sl_v].T).view(nt, ell_len, nv)
                s1sq = (ncv[sl_v] + eta2 * ct.unsqueeze(1) - 2.0 * eta2 * (sv - st.unsqueeze(1) * mv[sl_v])) / dim
                s1sq = s1sq + alg.eps1
                pp = psi_pair(alg, torch.addcmul(owner.beta.unsqueeze(2), s1, s1sq.rsqrt().unsqueeze(1)), grams)
            else:
                pp = pp_text
            a_w = pp.a  # [nt, L, nv or 1]
            rho, eps = pp.rho, pp.eps
            t_dpsi = rho * pp.rows[:, 3 * ell_len + 3] + eps * te.unsqueeze(1) + td.unsqueeze(1)
            swv = (w2 @ vbar[sl_v].T).view(nt, ell_len, nv)
            dpsi_vbar = rho * (swv * a_w).sum(1) + eps * ev[sl_v] + dv[sl_v]
            if softmax:
                xc = x[sl_v]
                sx = (tc @ xs[sl_v].reshape(nv * f, dim).T).view(nt, nv, f)
                pi = torch.softmax(sx, dim=2)
                if pool_mask is not None:
                    pi = pi * pool_mask[sl_v]
                t_vp = (sx * pi).sum(2) * v.pool_temperature
                n_vp = torch.bmm(pi.transpose(0, 1), torch.bmm(xc, xc.transpose(1, 2))) * pi.transpose(0, 1)
                n_vp = n_vp.sum(2).T
                x2 = xc.reshape(nv * f, dim)
                e_vp = (pi * x2.mv(alg.e).view(1, nv, f)).sum(2)
                d_vp0 = (pi * x2.mv(alg.d).view(1, nv, f)).sum(2)
                vbar_vp = (pi * torch.bmm(xc, vbar[sl_v].unsqueeze(2)).view(1, nv, f)).sum(2)
                cross = (w2 @ x2.T).view(nt, ell_len, nv, f)  # the L × F cross-Gram w_il·x_jg
                a_wx_pi = ((cross * pi.unsqueeze(1)).sum(3) * a_w).sum(1)
                dpsi_vp = rho * a_wx_pi + eps * e_vp + d_vp0
            else:
                t_vp, n_vp, dpsi_vp, vbar_vp = sv, vv[sl_v], dpsi_vbar, vv[sl_v]
            if v.gap_query:
                t_d, n_d, d_vp = t_dpsi, pp.n_dpsi, dpsi_vp
            else:
                t_d = v.eta * (sv - t_dpsi)
                n_d = eta2 * (pp.n_dpsi - 2.0 * dpsi_vbar + vv[sl_v])
                d_vp = v.eta * (vbar_vp - dpsi_vp)
            res = _finish(v, tt.unsqueeze(1), t_vp, n_vp, t_d, n_d, d_vp)
            out[sl_t, sl_v] = res.expand(nt, nv)
    return out


def _pairs_frames(
    alg: Algebra, inp: _Inputs, v: GareOptions, flat_t: Tensor, flat_v: Tensor, video_chunk: int
) -> Tensor:
    """Exact scores of the pairs (flat_t[p], flat_v[p]), frame context: each named video's ψ state is built once
    and scored against just the texts paired with it (a ragged grid, padded per chunk of similar counts)."""
    n_pairs = flat_t.shape[0]
    order = torch.argsort(flat_v, stable=True)
    sv, st = flat_v[order], flat_t[order]
    uniq, counts = torch.unique_consecutive(sv, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    by_count = torch.argsort(counts, stable=True)
    ts_all = _text_state(alg, inp.text, v)
    flat_scores = torch.empty(n_pairs, dtype=inp.text.dtype, device=inp.text.device)
    pos = 0
    n_u = uniq.shape[0]
    while pos < n_u:
        # videos with similar numbers of texts share a chunk, so the padding stays small; cap the pairs per chunk
        end = min(n_u, pos + video_chunk)
        while end - pos > 1 and int(counts[by_count[end - 1]]) * (end - pos) > PAIR_BLOCK:
            end = pos + max(1, (end - pos) // 2)
        sel = by_count[pos:end]
        cnt = counts[sel]
        slots = int(cnt.max())
        ar = torch.arange(slots, device=flat_t.device)
        valid = ar.unsqueeze(0) < cnt.unsqueeze(1)  # [nv, slots]
        src = starts[sel].unsqueeze(1) + ar.unsqueeze(0).clamp_max(cnt.unsqueeze(1) - 1)  # pad with the last text
        text_idx = st[src]
        vids = uniq[sel]
        vs = _video_state(alg, inp.frames[vids], inp.frame_mask[vids] if inp.frame_mask is not None else None, v)
        res = _frames_pairs(alg, vs, ts_all.take(text_idx), v)  # [nv, slots]
        flat_scores[order[src[valid]]] = res[valid]
        pos = end
    return flat_scores


# ============================================================================================ entry points


def fast_path_support(
    psi: nn.Module, options: GareOptions, n_words: int | None = None, n_frames: int | None = None
) -> tuple[bool, bool, str]:
    """(covered, preferred, reason): whether the factorised scorer computes this ψ / variant exactly, whether it is
    the cheaper path, and why not when it is not."""
    why = covered_psi(psi)
    if why is not None:
        return False, False, why
    if options.context == "words" and options.video_pool == "text_softmax" and n_words and n_frames:
        dim = psi.dim
        if n_words * n_frames > dim:
            return (
                True,
                False,
                (
                    f"word context with text_softmax pooling needs an L×F = {n_words}×{n_frames} cross-Gram per pair, "
                    f"more than the D = {dim} floats of the direct path's per-pair vector"
                ),
            )
    return True, True, ""


def _require_covered(psi: nn.Module, options: GareOptions) -> None:
    covered, _, reason = fast_path_support(psi, options)
    if not covered:
        raise NotImplementedError(f"the factorised GARE scorer does not cover this ψ: {reason}")


@torch.no_grad()
def gare_pairwise_scores(
    psi: nn.Module,
    text: TextFeatures,
    video: VideoFeatures,
    options: GareOptions,
    *,
    text_chunk: int | None = None,
    video_chunk: int | None = None,
) -> Tensor:
    """GARE scores s_ij for every text × video pair by the factorisation: [N_t, N_v] (float32, or float64 for
    float64 input). ``text_chunk`` × ``video_chunk`` bound the working memory (never N_t·N_v·D). Raises
    NotImplementedError for a ψ the factorisation does not cover (see :func:`fast_path_support`)."""
    inp = _check_inputs(psi, text, video, options)
    _check_chunk(text_chunk, "text_chunk")
    _check_chunk(video_chunk, "video_chunk")
    _require_covered(psi, options)
    alg = psi_algebra(psi, inp.text.dtype, inp.text.device)  # type: ignore[arg-type]
    if options.context == "frames":
        return _fast_frames(alg, inp, options, text_chunk or FAST_TEXT_CHUNK, video_chunk or FAST_VIDEO_CHUNK)
    return _fast_words(alg, inp, options, text_chunk or FAST_WORDS_TEXT_CHUNK, video_chunk or FAST_WORDS_VIDEO_CHUNK)


@torch.no_grad()
def gare_pair_scores(
    psi: nn.Module,
    text: TextFeatures,
    video: VideoFeatures,
    options: GareOptions,
    text_index: Tensor,
    video_index: Tensor,
    *,
    video_chunk: int | None = None,
) -> Tensor:
    """Exact GARE scores of the pairs (text_index[p], video_index[p]): [P], frame context only (with word context
    the ψ state belongs to the text; the head scores such pairs as small grids instead)."""
    if options.context != "frames":
        raise ValueError("gare_pair_scores covers frame context only (head.options.context = 'frames')")
    inp = _check_inputs(psi, text, video, options)
    _check_chunk(video_chunk, "video_chunk")
    _require_covered(psi, options)
    flat_t = torch.as_tensor(text_index, device=inp.text.device).reshape(-1).long()
    flat_v = torch.as_tensor(video_index, device=inp.text.device).reshape(-1).long()
    if flat_t.shape != flat_v.shape:
        raise ValueError(f"{flat_t.numel()} text indices but {flat_v.numel()} video indices")
    if flat_t.numel() == 0:
        return inp.text.new_zeros(0)
    if int(flat_t.min()) < 0 or int(flat_t.max()) >= inp.text.shape[0]:
        raise ValueError(f"text indices must lie in [0, {inp.text.shape[0]})")
    if int(flat_v.min()) < 0 or int(flat_v.max()) >= inp.frames.shape[0]:
        raise ValueError(f"video indices must lie in [0, {inp.frames.shape[0]})")
    alg = psi_algebra(psi, inp.text.dtype, inp.text.device)  # type: ignore[arg-type]
    return _pairs_frames(alg, inp, options, flat_t, flat_v, video_chunk or PAIR_VIDEO_CHUNK)


# ============================================================================================ stored per-video state


@dataclass
class GareRerankState(Sliceable):
    """The frame-context scorer's per-video ψ state (:class:`_VideoState`) with every field indexed by video, so a
    search index can store it (any float dtype; scored in float32) and score texts against stored rows without
    rebuilding it: the per-video work (LN, the ψ projections, the Grams: ≈ F·D² multiply-adds) is done once at
    index time, a query pays only the ≈ 3·F·D per pair.

    Of the per-frame D-vectors only the standardised frames z are kept: ψ's keys are affine in them
    (ℓ = g₁ ⊙ z + b₁, w = ℓ A_w + c_w) and so are the frames (x = σ z + μ), so a query folds those maps into its
    own three D-vectors and takes all three inner products from z, exactly — a third of the per-frame bytes a
    query reads with ℓ, w and x stored. z is LN₁ before its affine map, of unit scale whatever the features'
    offset, which keeps a float16 copy as precise as one of ℓ; the fields that carry the features' own scale (means,
    spreads, v̄, the pooling Grams X Xᵀ, squared norms) stay float32 in a float16 index (:attr:`full_precision`)."""

    full_precision: ClassVar[tuple[str, ...]] = (
        "mu",
        "sigma",
        "vbar",
        "ncv",
        "mv",
        "ev",
        "dv",
        "vv",
        "kappa",
        "pgrams",
    )

    z: Tensor  # [n, F, D] (x − μ)/σ per frame
    mu: Tensor  # [n, F] frame means μ
    sigma: Tensor  # [n, F] √(var + ε₁) of each frame (LN₁'s)
    vbar: Tensor  # [n, D]
    beta: Tensor  # [n, F]
    grams: Tensor  # [n, K, F]
    ncv: Tensor  # [n]
    mv: Tensor  # [n]
    ev: Tensor  # [n]
    dv: Tensor  # [n]
    vv: Tensor  # [n]
    kappa: Tensor | None = None  # [n, F] (gap query)
    pgrams: Tensor | None = None  # [n, 2F + 3, F] (text_softmax pooling)
    pool_mask: Tensor | None = None  # [n, F] (text_softmax pooling; ones where every frame is real)


def _stored(alg: Algebra, vs: _VideoState, softmax: bool, frame_mask: Tensor) -> GareRerankState:
    n, f = vs.n, vs.f
    pool_mask = None
    if softmax:
        pool_mask = vs.pool_mask.view(n, f) if vs.pool_mask is not None else frame_mask.to(vs.x.dtype)
    var, mu = torch.var_mean(vs.x, dim=-1, correction=0)
    sigma = (var + alg.eps1).sqrt_()
    return GareRerankState(
        z=(vs.x - mu.unsqueeze(2)).div_(sigma.unsqueeze(2)),
        mu=mu,
        sigma=sigma,
        vbar=vs.vbar,
        beta=vs.beta.view(n, f),
        grams=vs.grams.contiguous(),
        ncv=vs.ncv.view(n),
        mv=vs.mv.view(n),
        ev=vs.ev.view(n),
        dv=vs.dv.view(n),
        vv=vs.vv.view(n),
        kappa=vs.kappa.view(n, f) if vs.kappa is not None else None,
        pgrams=vs.pgrams.contiguous() if vs.pgrams is not None else None,
        pool_mask=pool_mask,
    )


def _restored(state: GareRerankState, dtype: torch.dtype) -> _VideoState:
    """The scalar and Gram fields of a stored state (the per-frame keys stay in ``state.z``)."""

    def cast(x: Tensor | None) -> Tensor | None:
        return x.to(dtype) if x is not None else None

    n, f = state.z.shape[:2]
    return _VideoState(
        n=n,
        f=f,
        ell=None,
        w=None,
        x=None,
        vbar=cast(state.vbar),
        kappa=None,
        beta=cast(state.beta).unsqueeze(2),
        grams=cast(state.grams),
        pgrams=cast(state.pgrams),
        pool_mask=cast(state.pool_mask).unsqueeze(2) if state.pool_mask is not None else None,
        ncv=cast(state.ncv).unsqueeze(1),
        mv=cast(state.mv).unsqueeze(1),
        ev=cast(state.ev).unsqueeze(1),
        dv=cast(state.dv).unsqueeze(1),
        vv=cast(state.vv).unsqueeze(1),
    )


def _stored_query_fold(alg: Algebra, coef: float) -> Tensor:
    """[D, 2D + 4]: what a text needs against stored states, in one product t ↦ [g₁ ⊙ u | g₁ ⊙ (t A_wᵀ) | u·b₁ |
    (t A_wᵀ)·b₁ + t·c_w | t·e | t·d] with u = coef · t M_q (cached on the fold)."""
    key = f"stored_query:{coef!r}"
    fold = alg.derived.get(key)
    if fold is None:
        dim = alg.dim
        mq = alg.mq * coef
        a_wt, c_w = alg.proj[:, 2 * dim : 3 * dim].T, alg.proj_bias[2 * dim : 3 * dim]
        columns = [mq * alg.g1, a_wt * alg.g1, (mq @ alg.b1)[:, None], (a_wt @ alg.b1 + c_w)[:, None]]
        fold = torch.cat([*columns, alg.e[:, None], alg.d[:, None]], dim=1).contiguous()
        alg.derived[key] = fold
    return fold


def _stored_text(alg: Algebra, t: Tensor, v: GareOptions) -> tuple[_TextState, Tensor]:
    """The text operands for :func:`_frames_from_dots` and the folded query rows [N_t, 2D + 4] for
    :func:`_stored_dots` (no ``uk``: the stored path never forms it)."""
    dim = t.shape[1]
    folded = t @ _stored_query_fold(alg, _query_coefficient(v, dim))
    return _text_operands(t, v, None, folded[:, 2 * dim + 2], folded[:, 2 * dim + 3]), folded


def _stored_dots(alg: Algebra, state: GareRerankState, ts: _TextState, folded: Tensor, v: GareOptions) -> _Dots:
    """:func:`_frame_dots` from the standardised frames: ℓ·u = z·(g₁ ⊙ u) + b₁·u, w·t = ℓ·(t A_wᵀ) + c_w·t and
    x·u = σ z·u + μ Σ_d u_d, so one product of z with the text's stacked folded rows gives every term."""
    z = state.z.to(ts.t.dtype)
    n, f, dim = z.shape
    nt = ts.t.shape[0]
    softmax = v.video_pool == "text_softmax"
    queries = [folded[:, :dim], folded[:, dim : 2 * dim]] + ([ts.ts] if softmax else [])
    # [queries, n·F] then viewed [n, F, queries]: this orientation of the product is ~2× faster than z @ queriesᵀ
    # for a handful of query rows (one query's search), and the same sums
    dots = (torch.cat(queries) @ z.reshape(n * f, dim).T).T.view(n, f, len(queries) * nt)
    s1 = dots[..., :nt] + folded[:, 2 * dim]
    if state.kappa is not None:
        s1 = s1 + state.kappa.to(z.dtype).unsqueeze(2)
    sw = dots[..., nt : 2 * nt] + folded[:, 2 * dim + 1]
    sx = None
    if softmax:
        sigma, mu = state.sigma.to(z.dtype).unsqueeze(2), state.mu.to(z.dtype).unsqueeze(2)
        sx = torch.addcmul(mu * (ts.st[0] / v.pool_temperature), dots[..., 2 * nt :], sigma)
    return _Dots(s1, sw, sx, state.vbar.to(z.dtype) @ ts.t.T)


@torch.no_grad()
def gare_rerank_state(
    psi: nn.Module, video: VideoFeatures, options: GareOptions, *, chunk: int = FAST_VIDEO_CHUNK
) -> GareRerankState:
    """The per-video ψ state of ``video`` (frame context), ``chunk`` videos at a time; see :class:`GareRerankState`."""
    if options.context != "frames":
        raise ValueError("gare_rerank_state covers frame context only (head.options.context = 'frames')")
    _require_covered(psi, options)
    probe = TextFeatures(video.frames.new_zeros(1, video.frames.shape[-1]))
    inp = _check_inputs(psi, probe, video, options)
    alg = psi_algebra(psi, inp.frames.dtype, inp.frames.device)  # type: ignore[arg-type]
    softmax = options.video_pool == "text_softmax"
    parts = []
    for b in range(0, inp.frames.shape[0], chunk):
        sl = slice(b, b + chunk)
        vs = _video_state(alg, inp.frames[sl], inp.frame_mask[sl], options)
        parts.append(_stored(alg, vs, softmax, inp.frame_mask[sl]))
    if not parts:
        raise ValueError("gare_rerank_state: no videos")
    return GareRerankState.cat(parts) if len(parts) > 1 else parts[0]


@torch.no_grad()
def gare_rerank_scores(psi: nn.Module, text: TextFeatures, state: GareRerankState, options: GareOptions) -> Tensor:
    """Exact GARE scores [N_t, N_v] of ``text`` against stored :func:`gare_rerank_state` rows (float32, whatever
    the stored dtype): equal to :func:`gare_pairwise_scores` on the videos the state was made from."""
    if options.context != "frames":
        raise ValueError("gare_rerank_scores covers frame context only (head.options.context = 'frames')")
    _require_covered(psi, options)
    t = text.eot.float()
    if t.ndim != 2 or t.shape[1] != state.z.shape[-1]:
        raise ValueError(f"text: expected eot [N_t, {state.z.shape[-1]}], got {tuple(t.shape)}")
    alg = psi_algebra(psi, t.dtype, t.device)  # type: ignore[arg-type]
    state = state.to(t.device)
    ts, folded = _stored_text(alg, t, options)
    dots = _stored_dots(alg, state, ts, folded, options)
    return _frames_from_dots(alg, _restored(state, t.dtype), ts, options, dots).T.contiguous()
