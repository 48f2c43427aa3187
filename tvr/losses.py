"""Training losses shared by the method heads.

Layout convention: a logits / delta tensor has texts on rows (dim 0) and videos on columns (dim 1).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from concurrent.futures import ThreadPoolExecutor

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
    return gare_kl_moments(delta.mean(dim=0), delta.std(dim=0, unbiased=True) + 1e-6, reduction)


def gare_kl_moments(mu: Tensor, sigma: Tensor, reduction: str = "sum") -> Tensor:
    """:func:`gare_kl` from the per-video moments μ_j, σ_j ([N_v, D], σ including its +1e-6), so the moments can
    be accumulated from several ranks' texts (each holding some rows of Δ) before the KL."""
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"gare_kl reduction {reduction!r}: expected one of {KL_REDUCTIONS}")
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
    return gare_radius_hinge(gare_radius_rows(delta).mean(), lam)


def gare_radius_rows(delta: Tensor) -> Tensor:
    """V_i = Var_j ‖Δ_ij‖₂ (unbiased) of every text row: [N_t] (the per-text part of :func:`gare_radius`)."""
    _check_delta(delta, "gare_radius", min_videos=2)
    return delta.norm(dim=-1).var(dim=1, unbiased=True)


def gare_radius_hinge(m: Tensor, lam: float = 0.5) -> Tensor:
    """L_ε from m = mean_i V_i: −m if m ≤ λ else 0 (:func:`gare_radius`)."""
    return torch.where(m <= lam, -m, torch.zeros_like(m))


def gare_direction(delta: Tensor, alpha: float = 2.0) -> Tensor:
    """Direction diversity L_dir (spec §3.4.4).

    z_ij = Δ_ij/‖Δ_ij‖,  G_i = Z_i Z_iᵀ ∈ R^{N_v×N_v} (j = k included),
    ℓ_i = log( mean_{j,k} exp(−α(1 − G_i,jk)) + 1e-8 ),  L_dir = mean_i ℓ_i.

    Cosines lie in [−1, 1], so the value lies in [−2α, 0] (up to the 1e-8). All anchors are handled by one
    batched matmul (N_t·N_v²·D work) instead of the reference's Python loop over texts.
    """
    return gare_direction_rows(delta, alpha).mean()


def gare_direction_rows(delta: Tensor, alpha: float = 2.0) -> Tensor:
    """ℓ_i of every text row: [N_t] (the per-text part of :func:`gare_direction`)."""
    _check_delta(delta, "gare_direction")
    z = F.normalize(delta, dim=-1)
    gram = torch.bmm(z, z.transpose(1, 2))  # [N_t, N_v, N_v]
    return torch.log(torch.exp(-alpha * (1.0 - gram)).mean(dim=(1, 2)) + 1e-8)


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


# --------------------------------------------------------------------------------------------- GraviAlign (spec §5)
# Every item is a diagonal Gaussian N(μ, diag(exp(logvar))); μ and logvar are [N, D] (or broadcastable [..., D]).
# For a video v and a text t, with s = σ_v² + σ_t², δ = μ_v − μ_t (spec §5.2):
#   q = Σ δ²/s,  d = √(q + ε),  H = ½ Σ log σ²,  m = exp(−λ·H̃/(1 + H̃))
#   A = (G/T)·m_v·m_t/d,  B = −½q,  C = −½ Σ log s,  S_align = A + B + C   (−D/2·log 2π dropped)
# ``per_dim_mean=True`` replaces every Σ over dimensions by a mean (q, Σ log s and H), so d = √(q/D + ε).

#: how the entropy proxy H enters the quality factor: softplus(H) and max(0, H) keep m in (0, 1]; literal uses H
#: itself, which has a pole at H = −1 and exceeds 1 whenever H < 0 (spec §5.2 item 1)
SGI_QUALITIES = ("softplus", "clamp", "literal")
#: the score terms that may be switched on (any non-empty subset, written as a string such as "BC")
SGI_TERMS = "ABC"
#: [texts, videos, D] elements of one scratch block of :func:`sgi_align_pairwise` (two such buffers live at once)
SGI_BLOCK_ELEMENTS = 1 << 20
SGI_TEXT_CHUNK = 8
#: largest group of dimensions whose variances are multiplied before one log (see :func:`sgi_product_group`)
SGI_MAX_GROUP = 64
#: |log| bound of a product of grouped variances: e^±80 stays inside float32's normal range (e^−87.3 to e^88.7)
_LOG_PRODUCT_LIMIT = 80.0
_LN2 = 0.6931471805599453


def _check_terms(terms: str) -> str:
    if not isinstance(terms, str) or not terms or any(c not in SGI_TERMS for c in terms) or len(set(terms)) != len(
        terms
    ):
        raise ValueError(f"terms = {terms!r}: expected a non-empty subset of 'ABC' such as 'ABC' or 'BC'")
    return terms


def _check_sgi_scalars(G: float, T: float, lam: float, eps: float, quality: str) -> None:
    if not T > 0:
        raise ValueError(f"T = {T}: the SGI temperature must be > 0")
    if not G >= 0 or not lam >= 0 or not eps >= 0:
        raise ValueError(f"G = {G}, lam = {lam}, eps = {eps}: expected numbers >= 0")
    if quality not in SGI_QUALITIES:
        raise ValueError(f"quality = {quality!r}: expected one of {SGI_QUALITIES}")


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


def _sgi_combine(q: Tensor, logdet: Tensor, m_v: Tensor, m_t: Tensor, *, G: float, T: float, eps: float,
                 terms: str) -> dict[str, Tensor]:
    """The enabled terms from the reduced q (Mahalanobis), logdet (Σ or mean of log s) and the qualities."""
    out: dict[str, Tensor] = {}
    if "A" in terms:
        out["A"] = (G / T) * m_v * m_t / torch.sqrt(q + eps)
    if "B" in terms:
        out["B"] = -0.5 * q
    if "C" in terms:
        out["C"] = -0.5 * logdet
    return out


def sgi_align_terms(
    mu_v: Tensor,
    logvar_v: Tensor,
    mu_t: Tensor,
    logvar_t: Tensor,
    *,
    G: float,
    T: float,
    lam: float,
    per_dim_mean: bool = True,
    eps: float = 1e-6,
    quality: str = "softplus",
    terms: str = SGI_TERMS,
) -> dict[str, Tensor]:
    """The terms of S_align for broadcastable [..., D] inputs: {"A", "B", "C"} (only those in ``terms``), each [...].

    Straight from the formulas, differentiable; :func:`sgi_align` sums them."""
    _check_sgi_scalars(G, T, lam, eps, quality)
    terms = _check_terms(terms)
    s = logvar_v.exp() + logvar_t.exp()
    delta = mu_v - mu_t
    ratio = delta.square() / s
    log_s = torch.log(s)
    q = ratio.mean(dim=-1) if per_dim_mean else ratio.sum(dim=-1)
    logdet = log_s.mean(dim=-1) if per_dim_mean else log_s.sum(dim=-1)
    m_v = sgi_quality(logvar_v, lam=lam, per_dim_mean=per_dim_mean, quality=quality) if "A" in terms else None
    m_t = sgi_quality(logvar_t, lam=lam, per_dim_mean=per_dim_mean, quality=quality) if "A" in terms else None
    return _sgi_combine(q, logdet, m_v, m_t, G=G, T=T, eps=eps, terms=terms)


def _check_gaussians(mu_v: Tensor, logvar_v: Tensor, mu_t: Tensor, logvar_t: Tensor, name: str) -> None:
    for what, mu, logvar in (("video", mu_v, logvar_v), ("text", mu_t, logvar_t)):
        if mu.ndim != 2 or mu.shape != logvar.shape:
            raise ValueError(
                f"{name}: {what} mu and logvar must both be [N, D], got {tuple(mu.shape)} and {tuple(logvar.shape)}"
            )
    if mu_v.shape[1] != mu_t.shape[1]:
        raise ValueError(f"{name}: video and text dimensions differ ({mu_v.shape[1]} vs {mu_t.shape[1]})")


def sgi_align(
    mu_v: Tensor,
    logvar_v: Tensor,
    mu_t: Tensor,
    logvar_t: Tensor,
    *,
    G: float,
    T: float,
    lam: float,
    per_dim_mean: bool = True,
    eps: float = 1e-6,
    quality: str = "softplus",
    terms: str = SGI_TERMS,
) -> Tensor:
    """S_align of aligned pairs (video k with text k): [N] for [N, D] inputs (spec §5.2, defaults §5.2 ★).

    ``eps`` is ε in d = √(q + ε); ``quality`` as in :func:`sgi_quality`; ``terms`` a subset of "ABC" (the ablations).
    The L_SGI loss is −mean of this over the positive pairs."""
    _check_gaussians(mu_v, logvar_v, mu_t, logvar_t, "sgi_align")
    if mu_v.shape != mu_t.shape:
        raise ValueError(f"sgi_align: aligned pairs need as many videos as texts, got {mu_v.shape[0]} and "
                         f"{mu_t.shape[0]}")
    parts = sgi_align_terms(mu_v, logvar_v, mu_t, logvar_t, G=G, T=T, lam=lam, per_dim_mean=per_dim_mean, eps=eps,
                            quality=quality, terms=terms)
    return torch.stack(list(parts.values())).sum(dim=0)


def sgi_product_group(logvar_v: Tensor, logvar_t: Tensor, max_group: int = SGI_MAX_GROUP) -> tuple[int, int]:
    """(g, k) for :func:`sgi_align_pairwise`: Σ_k log s_k may be computed as Σ over groups of g dimensions of
    log Π s̃_k with s̃ = s·2^−k, because every such product provably stays inside float32's normal range.

    Proof of the bound: s = σ_v² + σ_t² is increasing in both log variances, so every s_k of every pair lies in
    [e^lo, e^hi] with lo = logaddexp(min logvar_v, min logvar_t) and hi = logaddexp(max logvar_v, max logvar_t).
    Scaling by the power of two 2^−k nearest the centre (exact in floating point) puts every log s̃_k in [−h, h],
    h = max(hi − k·ln 2, k·ln 2 − lo), so a product of g of them has |log| ≤ g·h; g is the largest power of two
    ≤ ``max_group`` with g·h ≤ 80 (float32 normals span e^−87.3 to e^88.7; the product's own rounding is a relative
    g·2^−24). With the default clamp log σ² ∈ [−10, 5], h ≤ 7.8 and g ≥ 8 whatever the data. Without a clamp the
    range is the data's: a wide one (or a non-finite input, or a variance outside e^±80) gives g = 1, one log per
    dimension."""
    if logvar_v.numel() == 0 or logvar_t.numel() == 0 or max_group <= 1:
        return 1, 0
    lo_v, hi_v = (float(x) for x in torch.aminmax(logvar_v.detach()))
    lo_t, hi_t = (float(x) for x in torch.aminmax(logvar_t.detach()))
    lo, hi = _logaddexp(lo_v, lo_t), _logaddexp(hi_v, hi_t)
    # a variance that is subnormal or overflows in float32 is already rounded away: keep one log per dimension
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < -80.0 or hi > 80.0:
        return 1, 0
    k = round((lo + hi) / (2.0 * _LN2))
    h = max(hi - k * _LN2, k * _LN2 - lo)
    dim = logvar_v.shape[-1]
    g = 1
    while 2 * g <= max_group and 2 * g <= dim and 2 * g * h <= _LOG_PRODUCT_LIMIT:
        g *= 2
    return (g, k) if g > 1 else (1, 0)  # one log per dimension needs no rescaling


def _logaddexp(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return a if a == b else max(a, b)
    top = max(a, b)
    return top + math.log1p(math.exp(min(a, b) - top))


def sgi_align_pairwise(
    mu_v: Tensor,
    logvar_v: Tensor,
    mu_t: Tensor,
    logvar_t: Tensor,
    *,
    G: float,
    T: float,
    lam: float,
    per_dim_mean: bool = True,
    eps: float = 1e-6,
    quality: str = "softplus",
    terms: str = SGI_TERMS,
    text_chunk: int | None = None,
    video_chunk: int | None = None,
    max_group: int = SGI_MAX_GROUP,
) -> Tensor:
    """S_align of every (text, video) pair: [N_t, N_v] (note: video arguments first, texts on the output's rows),
    equal to :func:`sgi_align` of each pair up to float rounding.

    Nothing factorises Σ_k δ_k²/s_k or Σ_k log s_k into a matrix product, so the work is O(N_t·N_v·D) elementwise.
    The pairs are scored in blocks of ``text_chunk`` × ``video_chunk`` (default 8 texts × as many videos as fit
    ``SGI_BLOCK_ELEMENTS`` with D); working memory is two such blocks plus a row stripe per worker, whatever N_t and
    N_v. Per block: s and δ into two reused buffers, δ² /= s in place and summed (q), then the variances are
    multiplied in place over groups of g dimensions (a tree of halvings) and one log per group gives Σ log s
    (:func:`sgi_product_group` proves the product stays in range; it falls back to one log per dimension). The
    qualities and variances are computed once per item, not per pair. On a CPU the stripes of ``text_chunk`` texts
    are shared among ``torch.get_num_threads()`` single-threaded worker threads (each with its own buffers), which
    never wait on each other the way torch's per-op OpenMP threads do; the caller's thread setting is restored.

    With autograd recording and an input that requires grad, a plain differentiable broadcast over text chunks is
    used instead (same values)."""
    _check_gaussians(mu_v, logvar_v, mu_t, logvar_t, "sgi_align_pairwise")
    _check_sgi_scalars(G, T, lam, eps, quality)
    terms = _check_terms(terms)
    n_v, dim = mu_v.shape
    n_t = mu_t.shape[0]
    dtype = torch.promote_types(torch.promote_types(mu_v.dtype, mu_t.dtype), torch.float32)
    mu_v, logvar_v, mu_t, logvar_t = (x.to(dtype) for x in (mu_v, logvar_v, mu_t, logvar_t))
    if text_chunk is not None and text_chunk < 1 or video_chunk is not None and video_chunk < 1:
        raise ValueError(f"sgi_align_pairwise: chunks must be >= 1, got text_chunk={text_chunk}, "
                         f"video_chunk={video_chunk}")
    text_chunk = min(max(1, n_t), text_chunk or SGI_TEXT_CHUNK)
    # a GPU has no cache to fit and pays per kernel launch: 16× larger blocks there (not measured: no GPU here)
    budget = SGI_BLOCK_ELEMENTS * (16 if mu_v.is_cuda else 1)
    video_chunk = min(max(1, n_v), video_chunk or max(1, budget // (text_chunk * max(1, dim))))
    out = mu_v.new_empty(n_t, n_v)
    if n_t == 0 or n_v == 0:
        return out
    needs_a = "A" in terms
    m_v = sgi_quality(logvar_v, lam=lam, per_dim_mean=per_dim_mean, quality=quality) if needs_a else None
    m_t = sgi_quality(logvar_t, lam=lam, per_dim_mean=per_dim_mean, quality=quality) if needs_a else None
    combine = dict(G=G, T=T, eps=eps, terms=terms)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (mu_v, logvar_v, mu_t, logvar_t)):
        rows = []
        for a in range(0, n_t, text_chunk):
            ts = slice(a, a + text_chunk)
            s = logvar_v.exp()[None] + logvar_t[ts].exp()[:, None]
            ratio = (mu_v[None] - mu_t[ts, None]).square() / s
            q = ratio.mean(-1) if per_dim_mean else ratio.sum(-1)
            logdet = torch.log(s).mean(-1) if per_dim_mean else torch.log(s).sum(-1)
            parts = _sgi_combine(q, logdet, m_v[None] if needs_a else None, m_t[ts, None] if needs_a else None,
                                 **combine)
            rows.append(torch.stack(list(parts.values())).sum(dim=0))
        return torch.cat(rows, dim=0)

    with torch.no_grad():
        g, k = sgi_product_group(logvar_v, logvar_t, max_group)
        scale = 2.0 ** -k  # exact: a power of two
        # Σ log s = Σ log s̃ + D·k·ln 2 and Σ δ²/s = 2^−k·Σ δ²/s̃ (s̃ = 2^−k·s)
        # detached: worker threads do not inherit this thread's no_grad mode (grad mode is thread-local)
        job = _PairwiseJob(
            mu_v=mu_v.detach(), var_v=logvar_v.detach().exp().mul_(scale), mu_t=mu_t.detach(),
            var_t=logvar_t.detach().exp().mul_(scale), m_v=None if m_v is None else m_v.detach(),
            m_t=None if m_t is None else m_t.detach(), group=g, q_scale=scale / dim if per_dim_mean else scale,
            c_scale=1.0 / dim if per_dim_mean else 1.0, c_shift=k * _LN2 * (1.0 if per_dim_mean else dim),
            text_chunk=text_chunk, video_chunk=video_chunk, combine=combine, out=out,
        )
        starts = list(range(0, n_t, text_chunk))
        workers = 1 if mu_v.is_cuda else min(torch.get_num_threads(), len(starts))
        if workers <= 1:
            buffers = job.buffers()
            for a in starts:
                job.stripe(a, buffers)
            return out
        # One single-threaded worker per core, each on its own text stripes and cache-sized buffers: no OpenMP
        # barrier per small op (on a busy machine those barriers cost more than the arithmetic, see the docs).
        calling_threads = torch.get_num_threads()
        local = threading.local()

        def run(a: int) -> None:
            if not hasattr(local, "buffers"):
                torch.set_num_threads(1)  # this worker thread only
                local.buffers = job.buffers()
            with torch.no_grad():
                job.stripe(a, local.buffers)

        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sgi_align") as pool:
                for _ in pool.map(run, starts):
                    pass
        finally:
            # torch.set_num_threads in a worker also changes the default that new threads start with: restore it
            torch.set_num_threads(calling_threads)
    return out


@dataclasses.dataclass
class _PairwiseJob:
    """The no-grad all-pairs computation of :func:`sgi_align_pairwise`, one stripe of texts at a time (so stripes can
    run on worker threads, each writing its own rows of ``out``). Variances are pre-scaled by 2^−k."""

    mu_v: Tensor
    var_v: Tensor
    mu_t: Tensor
    var_t: Tensor
    m_v: Tensor | None
    m_t: Tensor | None
    group: int
    q_scale: float
    c_scale: float
    c_shift: float
    text_chunk: int
    video_chunk: int
    combine: dict
    out: Tensor

    def buffers(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Scratch of one worker: the s and δ blocks, and the stripe's q and Σ log s rows."""
        block = self.text_chunk * self.video_chunk * self.mu_v.shape[1]
        n_v = self.mu_v.shape[0]
        new = self.mu_v.new_empty
        return new(block), new(block), new(self.text_chunk, n_v), new(self.text_chunk, n_v)

    def stripe(self, a: int, buffers: tuple[Tensor, Tensor, Tensor, Tensor]) -> None:
        s_buf, d_buf, q_row, c_row = buffers
        n_v, dim = self.mu_v.shape
        g = self.group
        n_groups = dim // g
        grouped = n_groups * g  # the first g·⌊D/g⌋ dimensions go through products; the rest (< g) log directly
        nt = min(self.text_chunk, self.mu_t.shape[0] - a)
        vt, mt = self.var_t[a : a + nt, None], self.mu_t[a : a + nt, None]
        for b in range(0, n_v, self.video_chunk):
            nv = min(self.video_chunk, n_v - b)
            s = s_buf[: nt * nv * dim].view(nt, nv, dim)
            d = d_buf[: nt * nv * dim].view(nt, nv, dim)
            torch.add(vt, self.var_v[None, b : b + nv], out=s)
            torch.sub(mt, self.mu_v[None, b : b + nv], out=d)
            d.mul_(d).div_(s)
            torch.sum(d, dim=-1, out=q_row[:nt, b : b + nv])
            # Σ log s̃ as Σ over groups of log Π: halve the group axis in place until one factor is left
            groups = s[..., :grouped].view(nt, nv, g, n_groups)
            h = g
            while h > 1:
                h //= 2
                groups[:, :, :h].mul_(groups[:, :, h : 2 * h])
            logs = groups[:, :, 0].log_().sum(dim=-1)
            if grouped < dim:
                logs += s[..., grouped:].log().sum(dim=-1)
            c_row[:nt, b : b + nv] = logs
        q = q_row[:nt].mul_(self.q_scale)
        logdet = c_row[:nt].mul_(self.c_scale).add_(self.c_shift)
        m_v = self.m_v[None] if self.m_v is not None else None
        m_t = self.m_t[a : a + nt, None] if self.m_t is not None else None
        parts = _sgi_combine(q, logdet, m_v, m_t, **self.combine)
        self.out[a : a + nt] = torch.stack(list(parts.values())).sum(dim=0)
