"""GraviAlign's S_align and losses (spec §5): pure tensor functions (tensors in, tensors out).

Every item is a diagonal Gaussian N(μ, diag(exp(logvar))); μ and logvar are [N, D] (or broadcastable [..., D]).
For a video v and a text t, with s = σ_v² + σ_t², δ = μ_v − μ_t (spec §5.2):
  q = Σ δ²/s,  d = √(q + c),  H = ½ Σ log σ²,  m = exp(−λ·H̃/(1 + H̃))
  A = (G/T)·m_v·m_t/d,  B = −½q,  C = −½ Σ log s,  S_align = A + B + C   (−D/2·log 2π dropped)
``per_dim_mean=True`` replaces every Σ over dimensions by a mean (q, Σ log s and H), so d = √(q/D + c).
The softening c of d is ε for the summary's potential at the centres (``a_distance="centre"``) and, for the
potential at the expected whitened distance of two samples (``a_distance="expected"``), E‖Σ^−½(x − y)‖² = q + D:
c = D with sums, c = 1 in per-dimension units (see :func:`sgi_softening`).
The fast test-time kernel for all pairs lives with the head (tvr.methods.gravialign.scoring); these stay small
pure tensor functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.losses import symmetric_infonce

#: how the entropy proxy H enters the quality factor: softplus(H) and max(0, H) keep m in (0, 1]; literal uses H
#: itself, which has a pole at H = −1 and exceeds 1 whenever H < 0 (spec §5.2 item 1)
SGI_QUALITIES = ("softplus", "clamp", "literal")
#: the score terms that may be switched on (any non-empty subset, written as a string such as "BC")
SGI_TERMS = "ABC"
#: where term A takes its distance: at the centres, d = √(q + ε) (the summary) | at the expected whitened distance
#: of two samples x ~ N(μ_v, Σ_v), y ~ N(μ_t, Σ_t), d = √(q + D) (bounded: A ≤ G/T in per-dimension units)
SGI_A_DISTANCES = ("centre", "expected")
#: [texts, videos, D] elements of one chunk of :func:`sgi_pair_moments` (forward and backward)
SGI_CHUNK_ELEMENTS = 1 << 20


def _check_terms(terms: str) -> str:
    if (
        not isinstance(terms, str)
        or not terms
        or any(c not in SGI_TERMS for c in terms)
        or len(set(terms)) != len(terms)
    ):
        raise ValueError(f"terms = {terms!r}: expected a non-empty subset of 'ABC' such as 'ABC' or 'BC'")
    return terms


def _check_sgi_scalars(G: float, T: float, lam: float, eps: float, quality: str, a_distance: str = "centre") -> None:
    if not T > 0:
        raise ValueError(f"T = {T}: the SGI temperature must be > 0")
    if not G >= 0 or not lam >= 0 or not eps >= 0:
        raise ValueError(f"G = {G}, lam = {lam}, eps = {eps}: expected numbers >= 0")
    if quality not in SGI_QUALITIES:
        raise ValueError(f"quality = {quality!r}: expected one of {SGI_QUALITIES}")
    if a_distance not in SGI_A_DISTANCES:
        raise ValueError(f"a_distance = {a_distance!r}: expected one of {SGI_A_DISTANCES}")


def sgi_quality(logvar: Tensor, *, lam: float, per_dim_mean: bool = True, quality: str = "softplus") -> Tensor:
    """Semantic quality ("mass") m = exp(−λ·H̃/(1 + H̃)) of each item from its entropy proxy H = ½ Σ_k log σ_k²
    (½ mean_k with ``per_dim_mean``): [...] for logvar [..., D].

    ``quality``: ``softplus`` H̃ = softplus(H) (default), ``clamp`` H̃ = max(0, H), ``literal`` H̃ = H (the summary's
    formula). With H̃ ≥ 0 and λ ≥ 0, m lies in (e^−λ, 1]; the literal one is unbounded near H = −1.
    """
    if quality not in SGI_QUALITIES:
        raise ValueError(f"quality = {quality!r}: expected one of {SGI_QUALITIES}")
    h = 0.5 * (logvar.mean(dim=-1) if per_dim_mean else logvar.sum(dim=-1))
    if quality == "softplus":
        h = F.softplus(h)
    elif quality == "clamp":
        h = h.clamp_min(0.0)
    return torch.exp(-lam * h / (1.0 + h))


def sgi_softening(*, eps: float, a_distance: str, per_dim_mean: bool, dim: int) -> float:
    """c in term A's distance d = √(q + c), q reduced as ``per_dim_mean`` says.

    ``centre`` (the summary): c = ε, the potential at the two means. ``expected``: the potential at the expected
    whitened distance of two samples, x ~ N(μ_v, Σ_v), y ~ N(μ_t, Σ_t): x − y ~ N(δ, Σ_v + Σ_t), so
    E‖(Σ_v + Σ_t)^−½(x − y)‖² = δᵀ(Σ_v + Σ_t)⁻¹δ + tr I = q + D with q the summed Mahalanobis term. In per-dimension
    units (q/D) that is c = 1, so d ≥ 1 and A ≤ (G/T)·m_v·m_t ≤ G/T with nothing to tune; with sums c = D."""
    if a_distance not in SGI_A_DISTANCES:
        raise ValueError(f"a_distance = {a_distance!r}: expected one of {SGI_A_DISTANCES}")
    if a_distance == "centre":
        return float(eps)
    return 1.0 if per_dim_mean else float(dim)


@dataclasses.dataclass(frozen=True)
class SgiParams:
    """The settings of S_align (spec §5.2, defaults §5.2 ★), checked once when made: every S_align function takes
    them as one object (``params=``) or as these keyword arguments.

    ``G``, ``T``: term A scales with G/T; ``lam``: λ of the quality (:func:`sgi_quality`); ``per_dim_mean``: q,
    Σ log s and the entropy proxy as per-dimension means; ``eps``: ε in d = √(q + ε); ``quality``: H̃ of
    :func:`sgi_quality`; ``terms``: a subset of "ABC" (the ablations); ``a_distance``: as in :func:`sgi_softening`."""

    G: float
    T: float
    lam: float
    per_dim_mean: bool = True
    eps: float = 1e-6
    quality: str = "softplus"
    terms: str = SGI_TERMS
    a_distance: str = "centre"

    def __post_init__(self) -> None:
        _check_sgi_scalars(self.G, self.T, self.lam, self.eps, self.quality, self.a_distance)
        _check_terms(self.terms)

    def qualities(self, logvar_v: Tensor, logvar_t: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """(m_v, m_t) of :func:`sgi_quality`, or (None, None) when term A is off (nothing else reads them)."""
        if "A" not in self.terms:
            return None, None
        return tuple(
            sgi_quality(logvar, lam=self.lam, per_dim_mean=self.per_dim_mean, quality=self.quality)
            for logvar in (logvar_v, logvar_t)
        )

    def softening(self, dim: int) -> float:
        """c of d = √(q + c) for ``dim``-dimensional Gaussians (:func:`sgi_softening`)."""
        return sgi_softening(eps=self.eps, a_distance=self.a_distance, per_dim_mean=self.per_dim_mean, dim=dim)


def sgi_params(params: SgiParams | None, fields: dict[str, Any]) -> SgiParams:
    """``params``, or the :class:`SgiParams` of keyword arguments ``fields`` (a caller passes one or the other)."""
    if params is None:
        return SgiParams(**fields)
    if fields:
        raise TypeError(f"S_align settings given twice: params and keyword arguments {sorted(fields)}")
    return params


def sgi_terms_from_moments(
    q: Tensor, logdet: Tensor, m_v: Tensor | None, m_t: Tensor | None, params: SgiParams, softening: float
) -> dict[str, Tensor]:
    """The enabled terms from the reduced q (Mahalanobis), logdet (Σ or mean of log s), the qualities (None when
    "A" is off) and the softening c of d = √(q + c) (:meth:`SgiParams.softening`)."""
    out: dict[str, Tensor] = {}
    if "A" in params.terms:
        out["A"] = (params.G / params.T) * m_v * m_t / torch.sqrt(q + softening)
    if "B" in params.terms:
        out["B"] = -0.5 * q
    if "C" in params.terms:
        out["C"] = -0.5 * logdet
    return out


def sum_terms(parts: dict[str, Tensor]) -> Tensor:
    """S_align = the sum of its enabled terms, added in the order A, B, C (the same rounding on every path)."""
    values = list(parts.values())
    total = values[0]
    for rest in values[1:]:
        total = total + rest
    return total


def sgi_align_terms(
    mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, params: SgiParams | None = None, **fields: Any
) -> dict[str, Tensor]:
    """The terms of S_align for broadcastable [..., D] inputs: {"A", "B", "C"} (only those in ``params.terms``), each
    [...]. ``params``: an :class:`SgiParams`, or its fields as keyword arguments.

    Straight from the formulas, differentiable; :func:`sgi_align` sums them."""
    params = sgi_params(params, fields)
    s = logvar_v.exp() + logvar_t.exp()
    delta = mu_v - mu_t
    ratio = delta.square() / s
    log_s = torch.log(s)
    q = ratio.mean(dim=-1) if params.per_dim_mean else ratio.sum(dim=-1)
    logdet = log_s.mean(dim=-1) if params.per_dim_mean else log_s.sum(dim=-1)
    m_v, m_t = params.qualities(logvar_v, logvar_t)
    return sgi_terms_from_moments(q, logdet, m_v, m_t, params, params.softening(mu_v.shape[-1]))


def check_gaussians(mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, name: str) -> None:
    for what, mu, logvar in (("video", mu_v, logvar_v), ("text", mu_t, logvar_t)):
        if mu.ndim != 2 or mu.shape != logvar.shape:
            raise ValueError(
                f"{name}: {what} mu and logvar must both be [N, D], got {tuple(mu.shape)} and {tuple(logvar.shape)}"
            )
    if mu_v.shape[1] != mu_t.shape[1]:
        raise ValueError(f"{name}: video and text dimensions differ ({mu_v.shape[1]} vs {mu_t.shape[1]})")


def sgi_align(
    mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, params: SgiParams | None = None, **fields: Any
) -> Tensor:
    """S_align of aligned pairs (video k with text k): [N] for [N, D] inputs (spec §5.2, defaults §5.2 ★).

    ``params``: an :class:`SgiParams` (or its fields as keyword arguments: ``eps`` is ε in d = √(q + ε); ``quality``
    as in :func:`sgi_quality`; ``terms`` a subset of "ABC", the ablations; ``a_distance`` as in
    :func:`sgi_softening`). The paper's L_SGI is −mean of this over the positive pairs."""
    params = sgi_params(params, fields)
    _check_aligned(mu_v, logvar_v, mu_t, logvar_t, "sgi_align")
    return torch.stack(list(sgi_align_terms(mu_v, logvar_v, mu_t, logvar_t, params).values())).sum(dim=0)


def _check_aligned(mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, name: str) -> None:
    check_gaussians(mu_v, logvar_v, mu_t, logvar_t, name)
    if mu_v.shape != mu_t.shape:
        raise ValueError(f"{name}: aligned pairs need as many videos as texts, got {mu_v.shape[0]} and {mu_t.shape[0]}")


def _pair_chunks(n_t: int, n_v: int, dim: int, text_chunk: int | None, video_chunk: int | None) -> tuple[int, int]:
    if text_chunk is not None and text_chunk < 1 or video_chunk is not None and video_chunk < 1:
        raise ValueError(f"chunks must be >= 1, got text_chunk={text_chunk}, video_chunk={video_chunk}")
    video_chunk = min(max(1, n_v), video_chunk or max(1, SGI_CHUNK_ELEMENTS // max(1, dim)))
    text_chunk = min(max(1, n_t), text_chunk or max(1, SGI_CHUNK_ELEMENTS // (video_chunk * max(1, dim))))
    return text_chunk, video_chunk


class _PairMoments(torch.autograd.Function):
    """(Σ_k δ_k²/s_k, Σ_k log s_k) of every (text i, video j) pair, s = var_v[j] + var_t[i], δ = μ_v[j] − μ_t[i],
    in chunks, with the analytic gradient computed chunk by chunk as well: only the [N, D] inputs are saved, so
    neither direction ever holds more than one [text_chunk, video_chunk, D] block (never N_t × N_v × D)."""

    @staticmethod
    def forward(
        ctx,
        mu_v: Tensor,
        var_v: Tensor,
        mu_t: Tensor,
        var_t: Tensor,
        text_chunk: int,  # noqa: ANN001
        video_chunk: int,
    ) -> tuple[Tensor, Tensor]:
        n_t, n_v = mu_t.shape[0], mu_v.shape[0]
        q = mu_v.new_empty(n_t, n_v)
        logs = mu_v.new_empty(n_t, n_v)
        for a in range(0, n_t, text_chunk):
            for b in range(0, n_v, video_chunk):
                s = var_t[a : a + text_chunk, None] + var_v[None, b : b + video_chunk]
                delta = mu_v[None, b : b + video_chunk] - mu_t[a : a + text_chunk, None]
                q[a : a + text_chunk, b : b + video_chunk] = (delta.square_() / s).sum(dim=-1)
                logs[a : a + text_chunk, b : b + video_chunk] = s.log_().sum(dim=-1)
        ctx.save_for_backward(mu_v, var_v, mu_t, var_t)
        ctx.chunks = (text_chunk, video_chunk)
        return q, logs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_q: Tensor, grad_logs: Tensor):  # noqa: ANN001, ANN205
        # ∂q/∂μ_v = 2δ/s = −∂q/∂μ_t;  ∂q/∂var = −δ²/s² (either side);  ∂Σlog s/∂var = 1/s (either side)
        mu_v, var_v, mu_t, var_t = ctx.saved_tensors
        text_chunk, video_chunk = ctx.chunks
        n_t, n_v = mu_t.shape[0], mu_v.shape[0]
        g_mu_v, g_var_v = torch.zeros_like(mu_v), torch.zeros_like(var_v)
        g_mu_t, g_var_t = torch.zeros_like(mu_t), torch.zeros_like(var_t)
        for a in range(0, n_t, text_chunk):
            for b in range(0, n_v, video_chunk):
                ts, vs = slice(a, a + text_chunk), slice(b, b + video_chunk)
                s = var_t[ts, None] + var_v[None, vs]
                ratio = (mu_v[None, vs] - mu_t[ts, None]).div_(s)  # δ/s
                gq = grad_q[ts, vs, None]
                weighted = ratio * gq  # gq·δ/s
                g_mu_v[vs] += 2.0 * weighted.sum(dim=0)
                g_mu_t[ts] -= 2.0 * weighted.sum(dim=1)
                # ∂/∂var: gL/s − gq·δ²/s²
                g_var = s.reciprocal_().mul_(grad_logs[ts, vs, None]).sub_(weighted.mul_(ratio))
                g_var_v[vs] += g_var.sum(dim=0)
                g_var_t[ts] += g_var.sum(dim=1)
        return g_mu_v, g_var_v, g_mu_t, g_var_t, None, None


def sgi_pair_moments(
    mu_v: Tensor,
    var_v: Tensor,
    mu_t: Tensor,
    var_t: Tensor,
    *,
    text_chunk: int | None = None,
    video_chunk: int | None = None,
) -> tuple[Tensor, Tensor]:
    """(q, L), each [N_t, N_v]: q_ij = Σ_k (μ_vjk − μ_tik)²/s_ijk and L_ij = Σ_k log s_ijk with s = var_v[j] + var_t[i]
    (variances, not log variances). Chunked in both directions; differentiable (chunked analytic backward)."""
    n_t, n_v, dim = mu_t.shape[0], mu_v.shape[0], mu_v.shape[1]
    text_chunk, video_chunk = _pair_chunks(n_t, n_v, dim, text_chunk, video_chunk)
    return _PairMoments.apply(mu_v, var_v, mu_t, var_t, text_chunk, video_chunk)


def all_pairs_inputs(
    name: str, mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, params: SgiParams | None, fields: dict
) -> tuple[SgiParams, Tensor, Tensor, Tensor, Tensor]:
    """What an all-pairs S_align function starts from: its settings (:func:`sgi_params`), the shapes checked (a
    ValueError naming ``name``) and the four inputs in the compute dtype (float64 stays float64, else float32)."""
    params = sgi_params(params, fields)
    check_gaussians(mu_v, logvar_v, mu_t, logvar_t, name)
    dtype = torch.promote_types(torch.promote_types(mu_v.dtype, mu_t.dtype), torch.float32)
    return (params, *(x.to(dtype) for x in (mu_v, logvar_v, mu_t, logvar_t)))


def sgi_align_pairwise(
    mu_v: Tensor,
    logvar_v: Tensor,
    mu_t: Tensor,
    logvar_t: Tensor,
    params: SgiParams | None = None,
    *,
    text_chunk: int | None = None,
    video_chunk: int | None = None,
    **fields: Any,
) -> Tensor:
    """S_align of every (text, video) pair: [N_t, N_v] (note: video arguments first, texts on the output's rows),
    equal to :func:`sgi_align` of each pair up to float rounding. ``params``: an :class:`SgiParams`, or its fields
    as keyword arguments.

    Nothing factorises Σ_k δ_k²/s_k or Σ_k log s_k into a matrix product, so the work is O(N_t·N_v·D) elementwise,
    done in chunks of ``text_chunk`` × ``video_chunk`` pairs (default: up to 1 M elements of [.., .., D]); the
    qualities and variances are computed once per item. Differentiable with bounded memory (the chunked moments
    carry their own backward): the contrastive L_SGI-NCE runs on it. A pure function: no threads, no global state.
    Test-time scoring of large galleries uses the head's faster kernel
    (``tvr.methods.gravialign.scoring.s_align_scores``), which gives the same values."""
    params, mu_v, logvar_v, mu_t, logvar_t = all_pairs_inputs(
        "sgi_align_pairwise", mu_v, logvar_v, mu_t, logvar_t, params, fields
    )
    dim = mu_v.shape[1]
    try:
        q, logdet = sgi_pair_moments(
            mu_v, logvar_v.exp(), mu_t, logvar_t.exp(), text_chunk=text_chunk, video_chunk=video_chunk
        )
    except ValueError as exc:
        raise ValueError(f"sgi_align_pairwise: {exc}") from None
    if params.per_dim_mean:
        q, logdet = q / dim, logdet / dim
    m_v, m_t = params.qualities(logvar_v, logvar_t)
    m_v, m_t = (m_v[None], m_t[:, None]) if m_v is not None else (None, None)
    return sum_terms(sgi_terms_from_moments(q, logdet, m_v, m_t, params, params.softening(dim)))


def sgi_nce_scale(*, tau: float, per_dim_mean: bool, dim: int) -> float:
    """The factor κ/τ that turns S_align into the logits of :func:`sgi_align_nce`: κ = D with ``per_dim_mean`` (it
    undoes the mean, so B + C is the log expected-likelihood kernel in its own units whatever D), 1 with sums."""
    if not tau > 0:
        raise ValueError(f"tau = {tau}: the temperature of the contrastive L_SGI must be > 0")
    return (float(dim) if per_dim_mean else 1.0) / tau


def sgi_align_nce(
    mu_v: Tensor,
    logvar_v: Tensor,
    mu_t: Tensor,
    logvar_t: Tensor,
    params: SgiParams | None = None,
    *,
    tau: float = 1.0,
    **fields: Any,
) -> Tensor:
    """Contrastive L_SGI-NCE on B aligned pairs (video k with text k): ½[CE_rows(Z) + CE_cols(Z)] with
    Z = κ·S/τ, S_ij = S_align(v_j, t_i) over every pair of the batch (:func:`sgi_align_pairwise`, chunked) and κ as in
    :func:`sgi_nce_scale`. ``params``: an :class:`SgiParams`, or its fields as keyword arguments.

    The paper's L_SGI = −S_ii is the numerator of each row's cross-entropy; the log-partition logsumexp_j Z_ij prices
    the collapsed state (every pair alike) at ln B, so the positive-only objective's trivial maximiser is gone. With
    A off and sums over D, S_ij is the log expected-likelihood kernel log ∫N(z; μ_v, Σ_v)N(z; μ_t, Σ_t)dz (+ const);
    for isotropic variances σ²I it is CLIP's InfoNCE on cos(μ_t, μ_v) with a per-pair temperature 1/(s_v + s_t)."""
    params = sgi_params(params, fields)
    _check_aligned(mu_v, logvar_v, mu_t, logvar_t, "sgi_align_nce")
    scale = sgi_nce_scale(tau=tau, per_dim_mean=params.per_dim_mean, dim=mu_v.shape[1])
    return symmetric_infonce(scale * sgi_align_pairwise(mu_v, logvar_v, mu_t, logvar_t, params))
