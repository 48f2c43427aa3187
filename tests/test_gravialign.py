"""GraviAlign (spec §5): every score term against its closed form, B + C against the overlap integral by quadrature,
the bounded quality, the clamps, pairwise == per pair, the head's training step, running statistics, every
inference mode through the evaluator, and the presets on a tiny CLIP-ViP model."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tvr.config import Config, ConfigError, load_config
from tvr.losses import symmetric_infonce
from tvr.methods.gravialign import MODES, GraviAlignHead, GraviAlignOptions, pooled_video, soft_clamp
from tvr.methods.gravialign.losses import (
    sgi_align,
    sgi_align_nce,
    sgi_align_pairwise,
    sgi_align_terms,
    sgi_quality,
)
from tvr.methods.gravialign.scoring import s_align_scores, scoring_pool, sgi_product_group
from tvr.models.heads.base import LN_100, top_k_by_dot
from tvr.models.heads.registry import head_options
from tvr.models.model import RetrievalModel
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config
from tvr.types import TextFeatures, VideoFeatures

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "tvr" / "methods" / "gravialign" / "presets").rglob("*.yaml"))
D = 16


def gaussians(n: int, dim: int, seed: int, spread: float = 1.0, centre: float = -2.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    mu = F.normalize(torch.randn(n, dim, generator=g, dtype=torch.float64), dim=-1)
    logvar = centre + spread * torch.randn(n, dim, generator=g, dtype=torch.float64)
    return mu, logvar


def features(n_t: int, n_v: int, seed: int = 0, frames: int = 3) -> tuple[TextFeatures, VideoFeatures]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(max(n_t, n_v), D, generator=g)
    text = TextFeatures(base[:n_t] + 0.3 * torch.randn(n_t, D, generator=g))
    mask = (torch.arange(frames)[None] < torch.randint(1, frames + 1, (n_v, 1), generator=g)).long()
    return text, VideoFeatures(base[:n_v, None] + 0.5 * torch.randn(n_v, frames, D, generator=g), mask)


def head(seed: int = 0, **options: object) -> GraviAlignHead:
    torch.manual_seed(seed)
    h = GraviAlignHead(D, GraviAlignOptions(**options), logit_scale_init=0.0)
    with torch.no_grad():  # spread the variances so every term of S_align varies across pairs
        h.gauss_text.logvar_fc.weight.normal_(0.0, 0.3)
        h.gauss_video.logvar_fc.weight.normal_(0.0, 0.3)
    return h


# --------------------------------------------------------------------------------------------- closed forms


def hand_terms(mu_v, lv_v, mu_t, lv_t, G, T, lam, per_dim_mean, eps, quality) -> tuple[float, float, float]:  # noqa: ANN001
    """A, B, C of one pair with plain Python floats, straight from spec §5.2."""
    dim = len(mu_v)
    div = dim if per_dim_mean else 1

    def mass(lv: list[float]) -> float:
        h = 0.5 * sum(lv) / div
        if quality == "softplus":
            h = math.log1p(math.exp(h))
        elif quality == "clamp":
            h = max(0.0, h)
        return math.exp(-lam * h / (1.0 + h))

    s = [math.exp(a) + math.exp(b) for a, b in zip(lv_v, lv_t, strict=True)]
    q = sum((a - b) ** 2 / sk for a, b, sk in zip(mu_v, mu_t, s, strict=True)) / div
    logdet = sum(math.log(sk) for sk in s) / div
    return G / T * mass(lv_v) * mass(lv_t) / math.sqrt(q + eps), -0.5 * q, -0.5 * logdet


@pytest.mark.parametrize("per_dim_mean", [True, False])
@pytest.mark.parametrize("quality", ["softplus", "clamp", "literal"])
def test_each_term_matches_its_closed_form(per_dim_mean: bool, quality: str) -> None:
    mu_v, lv_v = gaussians(5, 7, seed=1, spread=1.5, centre=0.5)
    mu_t, lv_t = gaussians(5, 7, seed=2, spread=1.5, centre=0.5)
    kw = {"G": 1.7, "T": 0.6, "lam": 0.8, "per_dim_mean": per_dim_mean, "eps": 1e-3, "quality": quality}
    terms = sgi_align_terms(mu_v, lv_v, mu_t, lv_t, **kw)
    total = sgi_align(mu_v, lv_v, mu_t, lv_t, **kw)
    for k in range(5):
        a, b, c = hand_terms(mu_v[k].tolist(), lv_v[k].tolist(), mu_t[k].tolist(), lv_t[k].tolist(), **kw)
        assert float(terms["A"][k]) == pytest.approx(a, rel=1e-12)
        assert float(terms["B"][k]) == pytest.approx(b, rel=1e-12)
        assert float(terms["C"][k]) == pytest.approx(c, rel=1e-12, abs=1e-12)
        assert float(total[k]) == pytest.approx(a + b + c, rel=1e-12, abs=1e-12)
    # a subset of the terms (the ablations) sums only those
    only_bc = sgi_align(mu_v, lv_v, mu_t, lv_t, terms="BC", **kw)
    torch.testing.assert_close(only_bc, terms["B"] + terms["C"])
    assert set(sgi_align_terms(mu_v, lv_v, mu_t, lv_t, terms="AC", **kw)) == {"A", "C"}


@pytest.mark.parametrize("dim", [1, 2])
def test_b_plus_c_is_the_log_overlap_integral(dim: int) -> None:
    """G = 0, sums over dimensions: B + C = log ∫ N(z; μ_v, Σ_v) N(z; μ_t, Σ_t) dz + D/2·log 2π, by quadrature."""
    mu_v = torch.tensor([[0.3, -0.2][:dim]], dtype=torch.float64)
    mu_t = torch.tensor([[-0.4, 0.5][:dim]], dtype=torch.float64)
    lv_v = torch.tensor([[math.log(0.20), math.log(0.5)][:dim]], dtype=torch.float64)
    lv_t = torch.tensor([[math.log(0.35), math.log(0.1)][:dim]], dtype=torch.float64)
    score = sgi_align(mu_v, lv_v, mu_t, lv_t, G=0.0, T=1.0, lam=1.0, per_dim_mean=False)

    axis = torch.linspace(-6.0, 6.0, 1201 if dim == 2 else 20001, dtype=torch.float64)
    grids = torch.meshgrid(*([axis] * dim), indexing="ij")
    z = torch.stack(grids, dim=-1)  # [..., dim]

    def density(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        var = logvar.exp()[0]
        return torch.exp(-0.5 * ((z - mu[0]) ** 2 / var).sum(-1)) / torch.sqrt((2 * math.pi * var).prod())

    integrand = density(mu_v, lv_v) * density(mu_t, lv_t)
    integral = integrand
    for _ in range(dim):
        integral = torch.trapezoid(integral, axis, dim=0)
    expected = math.log(float(integral)) + dim / 2 * math.log(2 * math.pi)
    assert float(score[0]) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("quality", ["softplus", "clamp"])
@pytest.mark.parametrize("per_dim_mean", [True, False])
def test_default_quality_stays_in_zero_one(quality: str, per_dim_mean: bool) -> None:
    levels = torch.tensor([-50.0, -10.0, -4.0, -1e-3, 0.0, 1e-3, 1.0, 5.0, 50.0], dtype=torch.float64)
    logvar = levels[:, None].expand(-1, 512)
    for lam in (0.0, 1.0, 10.0):
        m = sgi_quality(logvar, lam=lam, per_dim_mean=per_dim_mean, quality=quality)
        assert bool(((m > 0) & (m <= 1)).all()), (lam, m)
    # more uncertainty, less mass (non-increasing; softplus strictly)
    m = sgi_quality(logvar, lam=1.0, per_dim_mean=per_dim_mean, quality=quality)
    assert bool((m[1:] <= m[:-1]).all())


def test_the_literal_quality_is_unbounded() -> None:
    """Spec §5.2 item 1: H/(1 + H) has a pole at H = −1: the literal m exceeds 1 for −1 < H < 0, explodes towards
    the pole and drops below e^−λ past it (more certainty, less mass)."""

    def literal(h: float) -> float:
        return float(sgi_quality(torch.full((1, 4), 2.0 * h, dtype=torch.float64), lam=1.0, quality="literal")[0])

    assert literal(-0.5) == pytest.approx(math.e)  # H/(1 + H) = −1
    assert literal(-0.999) > 1e100
    assert literal(-4.0) == pytest.approx(math.exp(-4.0 / 3.0)) and literal(-4.0) < literal(0.0) == 1.0
    for h in (-0.5, -0.999, -4.0):
        fixed = float(sgi_quality(torch.full((1, 4), 2.0 * h), lam=1.0, quality="softplus")[0])
        assert 0.0 < fixed <= 1.0


def test_matched_pairs_collapse_to_the_clamp_and_b_resists() -> None:
    """Spec §5.2 item 3: with L = −(B + C), the per-dimension optimum is s_k = δ_k², so C shrinks Σ and only B
    resists; an exactly matched dimension (δ = 0) runs into the clamp."""
    delta = torch.tensor([[0.5, 0.2, 0.0, 0.1]], dtype=torch.float64)
    raw = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)  # video log σ²; the text's is negligible
    text_logvar = torch.full((1, 4), -40.0, dtype=torch.float64)
    opt = torch.optim.Adam([raw], lr=0.05)
    for _ in range(800):
        logvar = raw.clamp(-10.0, 5.0)
        loss = -sgi_align(delta, logvar, torch.zeros_like(delta), text_logvar, G=0.0, T=1.0, lam=1.0).sum()
        opt.zero_grad()
        loss.backward()
        assert torch.isfinite(raw.grad).all()
        opt.step()
    var = raw.detach().clamp(-10.0, 5.0).exp()[0]
    torch.testing.assert_close(var[[0, 1, 3]], delta[0, [0, 1, 3]] ** 2, rtol=1e-3, atol=0)
    assert float(raw.detach()[0, 2]) < -10.0 and float(var[2]) == pytest.approx(math.exp(-10.0))


def test_gradients_are_finite_at_the_clamps_and_at_zero_distance() -> None:
    h = head()
    with torch.no_grad():
        h.gauss_text.logvar_fc.bias.fill_(-40.0)  # every text log σ² below the clamp
        h.gauss_video.logvar_fc.bias.fill_(40.0)  # every video log σ² above it
    text, video = features(6, 6)
    out = h.loss(text, video)
    out["loss"].backward()
    for name, p in h.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert float(h.gauss_text.logvar_fc.bias.grad.abs().max()) == 0.0  # clamped: no gradient, but finite
    # identical means: d = √ε, A at its maximum, gradients finite
    mu, logvar = gaussians(3, 8, seed=4)
    mu_v = mu.clone().requires_grad_(True)
    lv = logvar.clone().requires_grad_(True)
    s = sgi_align(mu_v, lv, mu, logvar, G=1.0, T=1.0, lam=1.0)
    s.sum().backward()
    assert torch.isfinite(s).all() and torch.isfinite(mu_v.grad).all() and torch.isfinite(lv.grad).all()


def test_term_a_grows_with_the_variance() -> None:
    """docs: term A rewards uncertainty. At the defaults (per-dimension means, softplus quality, λ = G = T = 1,
    ε = 1e-6), for a pair at ‖δ‖² = 0.285 with both sides at one log σ², A goes 1.06 → 51.7 as log σ² goes
    −8 → +2: at fixed δ, A ∝ m_v·m_t·√s (up to ε), and √s grows faster than the quality falls."""
    dim = 512
    cos = 1.0 - 0.285 / 2.0
    mu_v = torch.zeros(1, dim, dtype=torch.float64)
    mu_v[0, 0] = 1.0
    mu_t = torch.zeros(1, dim, dtype=torch.float64)
    mu_t[0, 0], mu_t[0, 1] = cos, math.sqrt(1.0 - cos**2)
    a = []
    for level in (-8.0, -6.0, -4.0, -2.0, 0.0, 2.0):
        lv = torch.full((1, dim), level, dtype=torch.float64)
        a.append(float(sgi_align_terms(mu_v, lv, mu_t, lv, G=1.0, T=1.0, lam=1.0)["A"][0]))
    assert a[0] == pytest.approx(1.06, abs=0.005) and a[-1] == pytest.approx(51.7, abs=0.05)
    assert all(x < y for x, y in zip(a, a[1:], strict=False))

    def mass(level: float) -> float:
        h = math.log1p(math.exp(level / 2.0))
        return math.exp(-h / (1.0 + h))

    def q(level: float) -> float:  # per-dimension Mahalanobis term of this pair
        return 0.285 / (2.0 * math.exp(level)) / dim

    ratio = (mass(2.0) / mass(-8.0)) ** 2 * math.sqrt((q(-8.0) + 1e-6) / (q(2.0) + 1e-6))
    assert a[-1] / a[0] == pytest.approx(ratio, rel=1e-9)
    # the expected-distance form is bounded by G/T whatever the variances
    for level in (-8.0, 2.0, 5.0):
        lv = torch.full((1, dim), level, dtype=torch.float64)
        soft = sgi_align_terms(mu_v, lv, mu_t, lv, G=1.0, T=1.0, lam=1.0, a_distance="expected")["A"]
        assert 0.0 < float(soft[0]) < 1.0


def test_the_expected_whitened_sample_distance_is_q_plus_d() -> None:
    """x ~ N(μ_v, Σ_v), y ~ N(μ_t, Σ_t): E‖(Σ_v + Σ_t)^−½(x − y)‖² = q + D with q = Σ_k δ_k²/s_k (by sampling), the
    distance of ``a_distance: expected``; A = (G/T)·m_v·m_t/√(q/D + 1) per dimension, /√(q + D) with sums."""
    dim, n = 5, 400_000
    g = torch.Generator().manual_seed(21)
    mu_v, mu_t = torch.randn(dim, dtype=torch.float64, generator=g), torch.randn(dim, dtype=torch.float64, generator=g)
    lv_v, lv_t = torch.randn(dim, dtype=torch.float64, generator=g), torch.randn(dim, dtype=torch.float64, generator=g)
    s = lv_v.exp() + lv_t.exp()
    x = mu_v + lv_v.exp().sqrt() * torch.randn(n, dim, dtype=torch.float64, generator=g)
    y = mu_t + lv_t.exp().sqrt() * torch.randn(n, dim, dtype=torch.float64, generator=g)
    whitened = ((x - y).square() / s).sum(dim=-1)
    q = float(((mu_v - mu_t).square() / s).sum())
    standard_error = float(whitened.std()) / math.sqrt(n)
    assert abs(float(whitened.mean()) - (q + dim)) < 4.0 * standard_error
    kw = {"G": 1.7, "T": 0.6, "lam": 0.8}
    for per_dim_mean, d in ((True, math.sqrt(q / dim + 1.0)), (False, math.sqrt(q + dim))):
        terms = sgi_align_terms(
            mu_v[None], lv_v[None], mu_t[None], lv_t[None], per_dim_mean=per_dim_mean, a_distance="expected", **kw
        )
        m_v = float(sgi_quality(lv_v[None], lam=0.8, per_dim_mean=per_dim_mean))
        m_t = float(sgi_quality(lv_t[None], lam=0.8, per_dim_mean=per_dim_mean))
        assert float(terms["A"][0]) == pytest.approx(1.7 / 0.6 * m_v * m_t / d, rel=1e-12)
    # per dimension, δ = 0 gives the bound itself, (G/T)·m_v·m_t ≤ G/T
    at_zero = sgi_align_terms(mu_v[None], lv_v[None], mu_v[None], lv_t[None], a_distance="expected", **kw)["A"]
    m_v = float(sgi_quality(lv_v[None], lam=0.8))
    assert float(at_zero[0]) == pytest.approx(1.7 / 0.6 * m_v * float(sgi_quality(lv_t[None], lam=0.8)), rel=1e-12)


def contrastive_reference(mu_v, lv_v, mu_t, lv_t, tau: float, **kw) -> torch.Tensor:  # noqa: ANN001, ANN003
    """½[CE_rows + CE_cols] of κ·S/τ, S from ``sgi_align`` pair by pair, in float64, written out by hand."""
    n, dim = mu_v.shape
    kappa = dim if kw.get("per_dim_mean", True) else 1
    scores = (
        torch.stack(
            [
                sgi_align(mu_v, lv_v, mu_t[i : i + 1].expand(n, -1), lv_t[i : i + 1].expand(n, -1), **kw)
                for i in range(n)
            ]
        )
        * kappa
        / tau
    )
    rows = -(scores.diagonal() - scores.logsumexp(dim=1)).mean()
    cols = -(scores.diagonal() - scores.logsumexp(dim=0)).mean()
    return 0.5 * (rows + cols)


@pytest.mark.parametrize(
    "per_dim_mean,terms,a_distance", [(True, "ABC", "centre"), (False, "BC", "centre"), (True, "ABC", "expected")]
)
def test_the_contrastive_objective_is_an_infonce_over_every_pair(
    per_dim_mean: bool, terms: str, a_distance: str
) -> None:
    mu_v, lv_v = gaussians(6, 8, seed=12, centre=-1.0)
    mu_t, lv_t = gaussians(6, 8, seed=13, centre=-1.0)
    kw = {
        "G": 1.2,
        "T": 0.9,
        "lam": 0.7,
        "per_dim_mean": per_dim_mean,
        "eps": 1e-2,
        "terms": terms,
        "a_distance": a_distance,
    }
    ours = sgi_align_nce(mu_v, lv_v, mu_t, lv_t, tau=0.4, **kw)
    assert float(ours) == pytest.approx(float(contrastive_reference(mu_v, lv_v, mu_t, lv_t, 0.4, **kw)), rel=1e-12)
    # its gradient (through the chunked backward) is the reference's
    grads = []
    for fn in (lambda *x: sgi_align_nce(*x, tau=0.4, **kw), lambda *x: contrastive_reference(*x, 0.4, **kw)):
        inputs = [x.clone().requires_grad_(True) for x in (mu_v, lv_v, mu_t, lv_t)]
        fn(*inputs).backward()
        grads.append([x.grad for x in inputs])
    for ours_grad, reference in zip(*grads, strict=True):
        torch.testing.assert_close(ours_grad, reference, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="tau = 0"):
        sgi_align_nce(mu_v, lv_v, mu_t, lv_t, tau=0.0, **kw)


def test_the_contrastive_objective_is_clips_infonce_for_isotropic_variances() -> None:
    """With A off, S_ij is the log expected-likelihood kernel; for isotropic variances σ²I,
    S_ij = cos_ij/s_ij − 1/s_ij − (D/2)·log s_ij with s_ij = σ_vj² + σ_ti² (unit means): InfoNCE on cos with the
    per-pair inverse temperature 1/s_ij. With one shared variance the rest is a constant, so L_SGI-NCE is exactly
    CLIP's symmetric InfoNCE at logit scale 1/(2σ²τ) — in per-dimension units too (κ = D undoes the mean)."""
    n, dim = 7, 10
    mu_v, _ = gaussians(n, dim, seed=14)
    mu_t, _ = gaussians(n, dim, seed=15)
    cos = mu_t @ mu_v.T
    shared = torch.full((n, dim), math.log(0.03), dtype=torch.float64)
    kw = {"G": 1.0, "T": 1.0, "lam": 1.0, "terms": "BC"}
    clip = symmetric_infonce(cos / (2 * 0.03 * 0.5))
    for per_dim_mean in (False, True):
        loss = sgi_align_nce(mu_v, shared, mu_t, shared, tau=0.5, per_dim_mean=per_dim_mean, **kw)
        assert float(loss) == pytest.approx(float(clip), rel=1e-12)
    # one isotropic variance per item: a per-pair temperature (and a per-pair bias from the volume term)
    g = torch.Generator().manual_seed(16)
    var_v, var_t = (
        torch.rand(n, dtype=torch.float64, generator=g) * 0.1 + 0.01,
        torch.rand(n, dtype=torch.float64, generator=g) * 0.1 + 0.01,
    )
    lv_v, lv_t = var_v.log()[:, None].expand(n, dim), var_t.log()[:, None].expand(n, dim)
    s = var_t[:, None] + var_v[None, :]
    kernel = cos / s - 1.0 / s - dim / 2.0 * torch.log(s)
    scores = sgi_align_pairwise(mu_v, lv_v, mu_t, lv_t, per_dim_mean=False, **kw)
    torch.testing.assert_close(scores, kernel, rtol=1e-12, atol=1e-12)
    loss = sgi_align_nce(mu_v, lv_v, mu_t, lv_t, per_dim_mean=False, **kw)
    assert float(loss) == pytest.approx(float(symmetric_infonce(kernel)), rel=1e-12)


def test_the_contrastive_objective_prices_the_collapse_at_ln_b() -> None:
    """Every item at one mean and one variance: the paper's L_SGI reaches its best value (A at its ceiling, B = 0),
    the contrastive one sits at ln B, worse than at distinct, aligned pairs."""
    n, dim = 8, 12
    mu_v, lv = gaussians(n, dim, seed=17)
    mu_t = F.normalize(
        mu_v + 0.05 * torch.randn(n, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(18)), dim=-1
    )
    same_lv = torch.full((n, dim), -2.0, dtype=torch.float64)
    one = mu_v[:1].expand(n, -1)
    kw = {"G": 1.0, "T": 1.0, "lam": 1.0}
    positive_collapsed = -sgi_align(one, same_lv, one, same_lv, **kw).mean()
    positive_aligned = -sgi_align(mu_v, same_lv, mu_t, same_lv, **kw).mean()
    assert float(positive_collapsed) < float(positive_aligned)  # the positive-only objective prefers the collapse
    collapsed = sgi_align_nce(one, same_lv, one, same_lv, **kw)
    assert float(collapsed) == pytest.approx(math.log(n), rel=1e-12)
    assert float(sgi_align_nce(mu_v, same_lv, mu_t, same_lv, **kw)) < float(collapsed)


# --------------------------------------------------------------------------------------------- all pairs


@pytest.mark.parametrize("per_dim_mean", [True, False])
@pytest.mark.parametrize(
    "quality,terms,a_distance",
    [
        ("softplus", "ABC", "centre"),
        ("clamp", "BC", "centre"),
        ("literal", "A", "centre"),
        ("softplus", "AC", "centre"),
        ("softplus", "ABC", "expected"),
    ],
)
@pytest.mark.parametrize("n_t,n_v,dim", [(7, 9, 32), (13, 5, 33), (1, 1, 3), (11, 17, 96)])
def test_pairwise_equals_every_pair(
    per_dim_mean: bool, quality: str, terms: str, a_distance: str, n_t: int, n_v: int, dim: int
) -> None:
    """Both all-pairs paths (the pure ``sgi_align_pairwise`` and the head's fast ``s_align_scores``) equal
    ``sgi_align`` of every pair in float64, whatever the chunks, the product groups and the number of workers."""
    # centre −4 (the init): the literal quality's pole at H = −1 would be a per-dimension centre of −2
    mu_v, lv_v = gaussians(n_v, dim, seed=5, centre=-4.0)
    mu_t, lv_t = gaussians(n_t, dim, seed=6, centre=-4.0)
    mu_v, lv_v, mu_t, lv_t = (x.float() for x in (mu_v, lv_v.clamp(-10, 5), mu_t, lv_t.clamp(-10, 5)))
    kw = {
        "G": 1.3,
        "T": 0.7,
        "lam": 0.9,
        "per_dim_mean": per_dim_mean,
        "quality": quality,
        "terms": terms,
        "a_distance": a_distance,
    }
    expected = torch.stack(
        [
            sgi_align(
                mu_v.double(),
                lv_v.double(),
                mu_t[i : i + 1].double().expand(n_v, -1),
                lv_t[i : i + 1].double().expand(n_v, -1),
                **kw,
            )
            for i in range(n_t)
        ]
    )
    scale = float(expected.abs().max()) + 1.0
    for scorer in (sgi_align_pairwise, s_align_scores):
        full = scorer(mu_v, lv_v, mu_t, lv_t, **kw)
        assert full.shape == (n_t, n_v) and full.dtype == torch.float32
        torch.testing.assert_close(full.double(), expected, rtol=1e-5, atol=1e-5 * scale)
        for text_chunk, video_chunk in ((2, 3), (1, 1), (5, 4)):
            chunked = scorer(mu_v, lv_v, mu_t, lv_t, text_chunk=text_chunk, video_chunk=video_chunk, **kw)
            torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5 * scale)
    direct = s_align_scores(mu_v, lv_v, mu_t, lv_t, max_group=1, **kw)  # one log per dimension
    torch.testing.assert_close(direct.double(), expected, rtol=1e-5, atol=1e-5 * scale)
    one = s_align_scores(mu_v, lv_v, mu_t, lv_t, text_chunk=2, workers=1, **kw)
    two = s_align_scores(mu_v, lv_v, mu_t, lv_t, text_chunk=2, workers=2, **kw)
    torch.testing.assert_close(two, one, rtol=0, atol=0)  # the same stripes, whoever computes them


def test_pairwise_at_the_clamp_extremes_and_without_a_clamp() -> None:
    """The grouped products stay in range at both ends of the clamp; without a clamp the group falls back to 1."""
    dim = 512
    lows, highs = torch.full((3, dim), -10.0), torch.full((4, dim), 5.0)
    mu = F.normalize(torch.randn(4, dim), dim=-1)
    for lv_v, lv_t in ((lows, lows), (highs, highs), (lows, highs[:3])):
        mu_v, mu_t = mu[: len(lv_v)], mu[: len(lv_t)]
        g, _ = sgi_product_group(lv_v, lv_t)
        assert g >= 8
        full = s_align_scores(mu_v, lv_v, mu_t, lv_t, G=1.0, T=1.0, lam=1.0, per_dim_mean=False)
        reference = s_align_scores(mu_v, lv_v, mu_t, lv_t, G=1.0, T=1.0, lam=1.0, per_dim_mean=False, max_group=1)
        torch.testing.assert_close(full, reference, rtol=1e-5, atol=1e-3)
        pure = sgi_align_pairwise(mu_v, lv_v, mu_t, lv_t, G=1.0, T=1.0, lam=1.0, per_dim_mean=False)
        torch.testing.assert_close(full, pure, rtol=1e-5, atol=1e-3)
    wide = torch.tensor([[-79.0, 79.0]])  # log s spans 158: no product of two is provably in range
    assert sgi_product_group(wide, wide) == (1, 0)
    assert sgi_product_group(torch.full((2, 4), -90.0), torch.full((2, 4), -95.0)) == (1, 0)  # e^−90 is subnormal
    narrow = sgi_product_group(torch.full((2, dim), -60.0), torch.full((2, dim), 60.0))  # every s = e^60: any g
    assert narrow == (64, round(60.0 / math.log(2.0)))
    assert sgi_product_group(torch.tensor([[float("nan")] * 4]), torch.zeros(1, 4))[0] == 1
    # the default clamp's whole range still allows groups of 8, whatever the data
    assert sgi_product_group(torch.tensor([[-10.0, 5.0]]).expand(2, -1), torch.tensor([[5.0, -10.0]]))[0] >= 2
    assert sgi_product_group(torch.tensor([[-10.0] * 8 + [5.0] * 8]), torch.tensor([[5.0] * 8 + [-10.0] * 8]))[0] == 8


def broadcast_pairwise(mu_v, lv_v, mu_t, lv_t, **kw):  # noqa: ANN001, ANN003, ANN201
    """The all-pairs S_align straight from ``sgi_align_terms`` on [N_t, N_v, D] broadcasts (plain autograd)."""
    terms = sgi_align_terms(mu_v[None], lv_v[None], mu_t[:, None], lv_t[:, None], **kw)
    return torch.stack(list(terms.values())).sum(dim=0)


@pytest.mark.parametrize("per_dim_mean,a_distance", [(True, "centre"), (False, "centre"), (True, "expected")])
def test_pairwise_gradient_equals_the_broadcast_gradient(per_dim_mean: bool, a_distance: str) -> None:
    """``sgi_align_pairwise`` keeps float64 and its chunked backward (never [N_t, N_v, D] at once) gives the gradient
    of the plain broadcast formula, for every input, with chunks that split both sides."""
    mu_v, lv_v = gaussians(5, 6, seed=7)
    mu_t, lv_t = gaussians(4, 6, seed=8)
    kw = {"G": 1.3, "T": 0.8, "lam": 0.7, "per_dim_mean": per_dim_mean, "eps": 1e-3, "a_distance": a_distance}
    weights = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    grads = []
    for fn in (
        lambda *x: sgi_align_pairwise(*x, text_chunk=3, video_chunk=2, **kw),
        lambda *x: broadcast_pairwise(*x, **kw),
    ):
        inputs = [x.clone().requires_grad_(True) for x in (mu_v, lv_v, mu_t, lv_t)]
        out = fn(*inputs)
        assert out.dtype == torch.float64
        (out * weights).sum().backward()
        grads.append((out.detach(), [x.grad for x in inputs]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12)
    for ours, plain in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(ours, plain, rtol=1e-10, atol=1e-12)


def test_the_chunked_moments_pass_gradcheck() -> None:
    from tvr.methods.gravialign.losses import sgi_pair_moments

    g = torch.Generator().manual_seed(11)
    mu_v = torch.randn(5, 3, dtype=torch.float64, generator=g)
    mu_t = torch.randn(4, 3, dtype=torch.float64, generator=g)
    var_v = torch.rand(5, 3, dtype=torch.float64, generator=g) + 0.2
    var_t = torch.rand(4, 3, dtype=torch.float64, generator=g) + 0.2
    inputs = tuple(x.requires_grad_(True) for x in (mu_v, var_v, mu_t, var_t))
    assert torch.autograd.gradcheck(lambda *x: sgi_pair_moments(*x, text_chunk=3, video_chunk=2), inputs)


def fresh_thread_default() -> int:
    """torch's thread count as a new thread starts with it (the process-wide default)."""
    import threading

    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


def test_losses_and_training_never_touch_threads_and_the_scoring_pool_is_made_once() -> None:
    """The pure all-pairs loss path and a training step start no thread and leave torch's thread settings alone;
    test-time scoring on two workers reuses one pool, leaves the caller's setting and the process default as they
    were, and gives the single-threaded values (grad-requiring inputs are fine: grad mode is thread-local)."""
    import threading

    mu_v, lv_v = (x.float() for x in gaussians(9, 24, seed=9))
    mu_t, lv_t = (x.float() for x in gaussians(21, 24, seed=10))
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        threads, default = threading.active_count(), fresh_thread_default()
        graded = [x.clone().requires_grad_(True) for x in (mu_v, lv_v, mu_t, lv_t)]
        sgi_align_pairwise(*graded, G=1.0, T=1.0, lam=1.0).sum().backward()
        for objective in ("positive", "contrastive"):
            h = head(sgi_objective=objective).train()
            h.loss(*features(6, 6))["loss"].backward()
        assert threading.active_count() == threads and torch.get_num_threads() == 2 == fresh_thread_default()
        single = s_align_scores(mu_v, lv_v, mu_t, lv_t, G=1.0, T=1.0, lam=1.0, text_chunk=2, workers=1)
        assert threading.active_count() == threads  # one worker: the calling thread, no pool
        pool = scoring_pool(2)
        with torch.no_grad():
            pooled = s_align_scores(graded[0], graded[1], graded[2], graded[3], G=1.0, T=1.0, lam=1.0, text_chunk=2)
        again = s_align_scores(mu_v, lv_v, mu_t, lv_t, G=1.0, T=1.0, lam=1.0, text_chunk=2)
        assert scoring_pool(2) is pool and threading.active_count() <= threads + 2  # made once, two threads at most
        assert torch.get_num_threads() == 2 and fresh_thread_default() == default
    finally:
        torch.set_num_threads(previous)
    assert not pooled.requires_grad
    torch.testing.assert_close(pooled, single, rtol=0, atol=0)
    torch.testing.assert_close(again, single, rtol=0, atol=0)


def _score_in_child(queue) -> None:  # noqa: ANN001
    # as torch's DataLoader workers do: GNU OpenMP cannot run a parallel region in a child forked after the parent
    # ran one (any torch op would hang here, pool or not)
    torch.set_num_threads(1)
    mu_v, lv_v = (x.float() for x in gaussians(9, 24, seed=9))
    mu_t, lv_t = (x.float() for x in gaussians(21, 24, seed=10))
    queue.put(s_align_scores(mu_v, lv_v, mu_t, lv_t, G=1.0, T=1.0, lam=1.0, text_chunk=2, workers=2).tolist())


def test_a_forked_child_scores_with_a_pool_of_its_own() -> None:
    """Threads do not survive fork: a child forked after the parent's pool exists must not wait on it."""
    import multiprocessing

    mu_v, lv_v = (x.float() for x in gaussians(9, 24, seed=9))
    mu_t, lv_t = (x.float() for x in gaussians(21, 24, seed=10))
    parent = s_align_scores(mu_v, lv_v, mu_t, lv_t, G=1.0, T=1.0, lam=1.0, text_chunk=2, workers=2)  # pool exists
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_score_in_child, args=(queue,))
    child.start()
    try:
        result = queue.get(timeout=60)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    torch.testing.assert_close(torch.tensor(result), parent, rtol=0, atol=0)


def test_bad_arguments_are_named() -> None:
    mu, lv = gaussians(2, 4, seed=0)
    with pytest.raises(ValueError, match="terms = 'ABD'"):
        sgi_align(mu, lv, mu, lv, G=1.0, T=1.0, lam=1.0, terms="ABD")
    with pytest.raises(ValueError, match="T = 0"):
        sgi_align(mu, lv, mu, lv, G=1.0, T=0, lam=1.0)
    with pytest.raises(ValueError, match="quality = 'exp'"):
        sgi_align_pairwise(mu, lv, mu, lv, G=1.0, T=1.0, lam=1.0, quality="exp")
    with pytest.raises(ValueError, match="aligned pairs"):
        sgi_align(mu, lv, mu[:1], lv[:1], G=1.0, T=1.0, lam=1.0)
    with pytest.raises(ValueError, match=r"must both be \[N, D\]"):
        sgi_align_pairwise(mu, lv[:, :3], mu, lv, G=1.0, T=1.0, lam=1.0)


# --------------------------------------------------------------------------------------------- the head


def test_initialisation_follows_the_spec() -> None:
    torch.manual_seed(0)
    h = GraviAlignHead(64)
    for module in (h.gauss_text, h.gauss_video):
        assert torch.equal(module.mu_fc.weight, torch.eye(64)) and not module.mu_fc.bias.any()
        assert torch.equal(module.logvar_fc.bias, torch.full((64,), -4.0))
        assert float(module.logvar_fc.weight.detach().std()) == pytest.approx(0.02, rel=0.05)
    assert h.gauss_text.mu_fc.weight.data_ptr() != h.gauss_video.mu_fc.weight.data_ptr()  # separate parameters
    text, video = features(3, 3)
    state = GraviAlignHead(D).encode_texts(text)
    torch.testing.assert_close(state.mu, F.normalize(F.layer_norm(text.eot, (D,)), dim=-1))
    torch.testing.assert_close(state.f, F.normalize(text.eot, dim=-1))
    assert h.indexable and h.inference_setting() == {"mode": "cos_f"}


def test_video_feature_is_the_masked_mean_of_the_slots() -> None:
    _, video = features(2, 4, frames=5)
    pooled = pooled_video(video)
    for j in range(4):
        real = video.frames[j][video.frame_mask[j].bool()]
        torch.testing.assert_close(pooled[j], real.mean(0))
    one_slot = VideoFeatures(video.frames[:, :1], torch.ones(4, 1, dtype=torch.long))  # the CLIP-ViP tower
    torch.testing.assert_close(pooled_video(one_slot), video.frames[:, 0])


@pytest.mark.parametrize("infonce_on", ["f", "mu", "both"])
def test_loss_is_infonce_plus_alpha_sgi(infonce_on: str) -> None:
    h = head(alpha=0.3, infonce_on=infonce_on).eval()
    text, video = features(6, 6)
    out = h.loss(text, video)
    ts, vs = h.encode_texts(text), h.encode_videos(video)
    cos_f = symmetric_infonce(ts.f @ vs.f.T)  # logit scale 1
    cos_mu = symmetric_infonce(ts.mu @ vs.mu.T)
    infonce = {"f": cos_f, "mu": cos_mu, "both": 0.5 * (cos_f + cos_mu)}[infonce_on]
    sgi = -sgi_align(vs.mu, vs.logvar, ts.mu, ts.logvar, **h.sgi_kwargs()).mean()
    torch.testing.assert_close(out["loss"], infonce + 0.3 * sgi)
    torch.testing.assert_close(out["sgi"], sgi)
    torch.testing.assert_close(out["term_A"] + out["term_B"] + out["term_C"], -sgi)


def test_sgi_can_be_kept_from_the_backbone() -> None:
    """sgi_to_backbone: false: the features' gradient is the InfoNCE's alone; the heads still get L_SGI's."""
    grads = {}
    for name, opts in (
        ("detached", {"sgi_to_backbone": False, "alpha": 0.5}),
        ("infonce", {"alpha": 0.0}),
        ("shared", {"alpha": 0.5}),
    ):
        h = head(**opts).eval()
        text, video = features(5, 5)
        text.eot.requires_grad_(True)
        out = h.loss(text, video)
        out["loss"].backward()
        grads[name] = (text.eot.grad.clone(), h.gauss_text.logvar_fc.bias.grad.clone(), float(out["loss"].detach()))
    torch.testing.assert_close(grads["detached"][0], grads["infonce"][0])
    assert not torch.allclose(grads["shared"][0], grads["infonce"][0])
    torch.testing.assert_close(grads["detached"][1], grads["shared"][1])  # the heads learn the same either way
    assert grads["detached"][2] == pytest.approx(grads["shared"][2])  # same value, different gradient path


def test_the_mu_heads_alone_can_reach_the_collapse() -> None:
    """``sgi_to_backbone: false`` keeps L_SGI from the backbone, not from the μ heads: with the features untouched,
    W_μ = 0 (and W_σ = 0) puts every item at one Gaussian, where the paper's L_SGI beats its value at init — the
    trivial maximiser needs no backbone. The contrastive L_SGI-NCE prices that state at ln B."""
    text, video = features(8, 8)
    guarded = head(sgi_to_backbone=False, eps=1e-2, alpha=1.0).eval()
    contrastive = head(sgi_to_backbone=False, eps=1e-2, alpha=1.0, sgi_objective="contrastive").eval()
    contrastive.load_state_dict(guarded.state_dict())
    before = {
        name: float(h.loss(text, video)["sgi"]) for name, h in (("positive", guarded), ("contrastive", contrastive))
    }
    for h in (guarded, contrastive):
        with torch.no_grad():
            for module in (h.gauss_text, h.gauss_video):
                module.mu_fc.weight.zero_()
                module.mu_fc.bias.copy_(torch.linspace(-1.0, 1.0, D))
                module.logvar_fc.weight.zero_()
    after = {
        name: float(h.loss(text, video)["sgi"]) for name, h in (("positive", guarded), ("contrastive", contrastive))
    }
    ts = guarded.encode_texts(text)
    assert float(1.0 - ts.mu.detach().mean(dim=0).square().sum()) < 1e-6  # every μ the same
    assert after["positive"] < before["positive"]
    assert after["contrastive"] == pytest.approx(math.log(8), rel=1e-5) and before["contrastive"] < math.log(8)


@pytest.mark.parametrize("sgi_to_backbone", [True, False])
def test_the_contrastive_head_loss(sgi_to_backbone: bool) -> None:
    h = head(alpha=0.3, sgi_objective="contrastive", sgi_tau=50.0, sgi_to_backbone=sgi_to_backbone, stats_momentum=1.0)
    text, video = features(6, 6)
    text.eot.requires_grad_(True)
    h.train()
    out = h.loss(text, video)
    ts, vs = h.encode_texts(text), h.encode_videos(video)
    infonce = symmetric_infonce(h.logit_scale.exp() * (ts.f @ vs.f.T))
    sgi = sgi_align_nce(vs.mu, vs.logvar, ts.mu, ts.logvar, tau=50.0, **h.sgi_kwargs())
    assert 0.1 < float(sgi.detach()) < math.log(6)  # not saturated: its gradient matters
    torch.testing.assert_close(out["loss"], infonce + 0.3 * sgi)
    torch.testing.assert_close(out["sgi"], sgi.detach())
    positives = sgi_align(vs.mu, vs.logvar, ts.mu, ts.logvar, **h.sgi_kwargs())
    torch.testing.assert_close(out["term_A"] + out["term_B"] + out["term_C"], positives.mean().detach())
    pairs = sgi_align_pairwise(vs.mu, vs.logvar, ts.mu, ts.logvar, **h.sgi_kwargs()).detach()
    assert float(h.s_align_mean) == pytest.approx(float(pairs.mean()), rel=1e-5)  # momentum 1: this batch's
    out["loss"].backward()
    assert float(h.gauss_text.logvar_fc.weight.grad.abs().max()) > 0
    assert float(h.gauss_video.mu_fc.weight.grad.abs().max()) > 0
    infonce_only = head(alpha=0.0).eval()
    text2 = TextFeatures(text.eot.detach().clone().requires_grad_(True))
    infonce_only.loss(text2, video)["loss"].backward()
    same = torch.allclose(text.eot.grad, text2.eot.grad)
    assert same == (not sgi_to_backbone)  # the backbone sees L_SGI-NCE only with sgi_to_backbone


def test_the_soft_clamp_keeps_a_gradient_outside_the_range() -> None:
    x = torch.tensor([-60.0, -12.0, -10.0, -4.0, 0.0, 5.0, 8.0, 60.0], dtype=torch.float64, requires_grad=True)
    y = soft_clamp(x, -10.0, 5.0)
    assert bool(((y >= -10.0) & (y <= 5.0)).all()) and bool(((y[1:-1] > -10.0) & (y[1:-1] < 5.0)).all())
    assert bool((y[1:-1] > y[:-2]).all())  # increasing (until float64 rounds e^−50 away at ±60)
    assert abs(float(y[3].detach()) + 4.0) < math.log1p(math.exp(-6.0)) + math.log1p(math.exp(-9.0))  # ≈ x well inside
    y.sum().backward()
    assert bool((x.grad > 0).all()) and float(x.grad[3]) > 0.99
    # through the head: entries far outside the range still learn, unlike the hard clamp
    for mode, learns in (("soft", True), ("hard", False)):
        h = head(logvar_clamp_mode=mode)
        with torch.no_grad():
            h.gauss_text.logvar_fc.bias.fill_(-40.0)  # every entry far below the range
            h.gauss_video.logvar_fc.bias.fill_(40.0)  # and far above it
        h.loss(*features(6, 6))["loss"].backward()
        grads = [float(m.logvar_fc.bias.grad.abs().max()) for m in (h.gauss_text, h.gauss_video)]
        assert all(g > 0 for g in grads) if learns else all(g == 0 for g in grads)
        ts = h.encode_texts(features(6, 6)[0])
        assert bool(((ts.logvar >= -10.0) & (ts.logvar <= 5.0)).all())


def test_a_training_step_lowers_the_loss_and_tracks_statistics() -> None:
    h = head(stats_momentum=0.5)
    text, video = features(8, 8)
    opt = torch.optim.Adam(h.parameters(), lr=1e-2)

    def eval_loss() -> float:
        h.eval()
        with torch.no_grad():
            return float(h.loss(text, video)["loss"])

    before = eval_loss()
    assert int(h.s_align_batches) == 0  # eval mode never updates the statistics
    stats = []
    for _ in range(10):
        h.train()
        with torch.no_grad():
            ts, vs = h.encode_texts(text), h.encode_videos(video)
            batch = sgi_align_pairwise(vs.mu, vs.logvar, ts.mu, ts.logvar, **h.sgi_kwargs()).double()
        prev = (float(h.s_align_mean), float(h.s_align_var))
        loss = h.loss(text, video)["loss"]
        stats.append((prev, float(batch.mean()), float(batch.var()), float(h.s_align_mean), float(h.s_align_var)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert eval_loss() < before
    (_, mean0, var0, got_mean0, got_var0), *rest = stats
    assert got_mean0 == pytest.approx(mean0, rel=1e-5) and got_var0 == pytest.approx(var0, rel=1e-4)
    for (prev_mean, prev_var), mean, var, got_mean, got_var in rest:  # momentum 0.5: halfway to the batch value
        assert got_mean == pytest.approx(0.5 * (prev_mean + mean), rel=1e-5)
        assert got_var == pytest.approx(0.5 * (prev_var + var), rel=1e-4)
    assert int(h.s_align_batches) == 10


@pytest.mark.parametrize("momentum", [0.1, 0.8])
def test_running_statistics_move_by_the_momentum(momentum: float) -> None:
    """statistic ← (1 − m)·statistic + m·batch value: m is the weight of the new batch (checked at m ≠ 0.5, where
    m and 1 − m differ)."""
    h = head(stats_momentum=momentum)
    h.train()
    h.loss(*features(8, 8, seed=1))  # the first batch sets the statistics
    prev_mean, prev_var = float(h.s_align_mean), float(h.s_align_var)
    text, video = features(8, 8, seed=2)
    with torch.no_grad():
        ts, vs = h.encode_texts(text), h.encode_videos(video)
        batch = sgi_align_pairwise(vs.mu, vs.logvar, ts.mu, ts.logvar, **h.sgi_kwargs()).double()
    h.loss(text, video)
    assert abs(float(batch.mean()) - prev_mean) > 1e-3  # the batches differ, so the weight shows
    assert float(h.s_align_mean) == pytest.approx((1 - momentum) * prev_mean + momentum * float(batch.mean()), rel=1e-5)
    assert float(h.s_align_var) == pytest.approx((1 - momentum) * prev_var + momentum * float(batch.var()), rel=1e-4)


SETTINGS = [{"mode": "cos_f"}, {"mode": "cos_mu"}, {"mode": "s_align"}, {"mode": "mixed", "w": 0.7}]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s["mode"])
def test_every_mode_scores_exactly_chunked_by_pairs_and_two_stage(setting: dict) -> None:
    h = head()
    text, video = features(8, 8)
    h.train()
    h.loss(text, video)  # running statistics for the mixed mode
    h.eval()
    h.set_inference_setting(setting)
    assert h.inference_setting() == setting and h.indexable == (setting["mode"] in ("cos_f", "cos_mu"))
    text, video = features(7, 11, seed=3)
    ts, vs = h.encode_texts(text), h.encode_videos(video)
    full = h.score(ts, vs)
    s_align = sgi_align_pairwise(vs.mu, vs.logvar, ts.mu, ts.logvar, **h.sgi_kwargs())
    expected = {
        "cos_f": ts.f @ vs.f.T,
        "cos_mu": ts.mu @ vs.mu.T,
        "s_align": s_align,
        "mixed": ts.f @ vs.f.T + 0.7 * (s_align - h.s_align_mean) / h.s_align_var.sqrt(),
    }[setting["mode"]]
    torch.testing.assert_close(full, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.score(ts, vs, text_chunk=3, video_chunk=4), full, rtol=1e-5, atol=1e-5)
    components = h.score_components(ts, vs, text_chunk=2)
    torch.testing.assert_close(h.combine_scores(components, setting), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.score(ts, vs), full, rtol=1e-5, atol=1e-5)  # from the kept S_align matrix
    g = torch.Generator().manual_seed(2)
    ti, vi = torch.randint(0, 7, (50,), generator=g), torch.randint(0, 11, (50,), generator=g)
    torch.testing.assert_close(h.score_pairs(ts, vs, ti, vi), full[ti, vi], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.score_two_stage(ts, vs, 11), full, rtol=1e-5, atol=1e-5)
    idx, scores = h.rerank(ts, vs, 4)
    torch.testing.assert_close(scores, full.gather(1, idx), rtol=1e-5, atol=1e-5)
    shortlist = top_k_by_dot(h.shortlist_texts(ts), h.shortlist_videos(vs), 4)[0]
    assert torch.equal(idx.sort(1).values, shortlist.sort(1).values)
    if h.indexable:
        torch.testing.assert_close(h.shortlist_texts(ts) @ h.shortlist_videos(vs).T, full, rtol=1e-5, atol=1e-5)
    else:
        field = h.options.shortlist
        assert torch.equal(h.shortlist_texts(ts), getattr(ts, "f" if field == "f" else "mu"))


def test_inference_setting_and_statistics_travel_with_the_checkpoint(tmp_path: Path) -> None:
    from tvr.train.checkpoint import load_checkpoint, save_checkpoint

    h = head()
    text, video = features(6, 6)
    h.train()
    h.loss(text, video)
    h.set_inference_setting({"mode": "mixed", "w": 0.25})
    model = RetrievalModel(None, torch.nn.Identity(), h)
    save_checkpoint(tmp_path / "head.pt", model)
    other = RetrievalModel(None, torch.nn.Identity(), head(seed=1))
    assert other.head.inference_setting() == {"mode": "cos_f"} and other.head.indexable  # read before loading
    load_checkpoint(tmp_path / "head.pt", other)
    assert other.head.inference_setting() == {"mode": "mixed", "w": 0.25} and not other.head.indexable
    assert float(other.head.s_align_mean) == float(h.s_align_mean) and int(other.head.s_align_batches) == 1
    h.eval()
    other.head.eval()
    ts, vs = h.encode_texts(text), h.encode_videos(video)
    torch.testing.assert_close(
        other.head.score(other.head.encode_texts(text), other.head.encode_videos(video)),
        h.score(ts, vs),
        rtol=0,
        atol=0,
    )


def test_candidates_and_setting_errors() -> None:
    h = GraviAlignHead(D, GraviAlignOptions(mixed_weights=(0.1, 0.1, 0.5, 0.5)))
    assert h.inference_candidates() == [
        {"mode": "cos_f"},
        {"mode": "cos_mu"},
        {"mode": "s_align"},
        {"mode": "mixed", "w": 0.1},
        {"mode": "mixed", "w": 0.5},
    ]
    assert h.baseline_settings() == {"cos_f": {"mode": "cos_f"}}
    assert GraviAlignHead(D, GraviAlignOptions(select_modes="")).inference_candidates() == []
    fixed = GraviAlignHead(D, GraviAlignOptions(inference_mode="mixed", mixed_weight=0.4))
    assert fixed.inference_setting() == {"mode": "mixed", "w": 0.4} and not fixed.indexable
    with pytest.raises(ValueError, match="'mode' must be one of"):
        h.set_inference_setting({"mode": "cosine"})
    with pytest.raises(ValueError, match="'w' must be a number"):
        h.set_inference_setting({"mode": "mixed", "w": -1})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['gamma'\]"):
        h.set_inference_setting({"mode": "cos_f", "gamma": 1})


@pytest.mark.parametrize(
    "values,message",
    [
        ({"select_modes": "cos_f,dot"}, r"head.options.select_modes = 'cos_f,dot': expected distinct names"),
        ({"select_modes": "cos_f,cos_f"}, "expected distinct names"),
        ({"logvar_min": 1.0, "logvar_max": 0.0}, r"head.options.logvar_min = 1.0: must be below logvar_max"),
        ({"logvar_init": -20.0}, r"head.options.logvar_init = -20.0: must lie in"),
        ({"quality": "exp"}, r"head.options.quality = 'exp': expected one of \['softplus', 'clamp', 'literal'\]"),
        ({"terms": "ABD"}, r"head.options.terms = 'ABD': expected one of"),
        ({"T": 0.0}, r"head.options.T = 0.0: expected a number > 0.0"),
        ({"mixed_weights": []}, r"head.options.mixed_weights = \[\]: expected one or more numbers >= 0"),
        ({"mixed_weights": 0.5}, r"head.options.mixed_weights: expected a list of values, got 0.5"),
        ({"mixed_weights": [0.1, "x"]}, r"head.options.mixed_weights\[1\]: expected a number, got 'x'"),
        ({"mixed_weights": [0.1, 0.2, 0.3, -1.0]}, r"head.options.mixed_weights = \[0.1, 0.2, 0.3, -1.0\]"),
        ({"sgi_objective": "nce"}, r"head.options.sgi_objective = 'nce': expected one of \['positive', 'contr"),
        ({"sgi_tau": 0.0}, r"head.options.sgi_tau = 0.0: expected a number > 0.0"),
        ({"a_distance": "mean"}, r"head.options.a_distance = 'mean': expected one of \['centre', 'expected'\]"),
        ({"logvar_clamp_mode": "tanh"}, r"head.options.logvar_clamp_mode = 'tanh': expected one of \['hard', 'soft'\]"),
        ({"inference_mode": "dot"}, r"head.options.inference_mode = 'dot': expected one of \['cos_f'"),
    ],
)
def test_options_are_checked_by_name(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        head_options("gravialign", values)


def test_module_lr_gives_the_uncertainty_heads_their_own_group() -> None:
    h = GraviAlignHead(D, GraviAlignOptions(module_lr=3e-4))
    model = RetrievalModel(None, torch.nn.Identity(), h)
    groups = {g["group"]: g for g in model.parameter_groups(1e-6, 1.0, 0.2)}
    assert groups["gauss"]["lr"] == 3e-4 and groups["gauss-nodecay"]["lr"] == 3e-4
    assert all(n.startswith("head.gauss_") for n in groups["gauss"]["names"] + groups["gauss-nodecay"]["names"])
    assert groups["head-nodecay"]["names"] == ["head.logit_scale"]
    plain = RetrievalModel(None, torch.nn.Identity(), GraviAlignHead(D))
    assert "gauss" not in {g["group"] for g in plain.parameter_groups(1e-6, 1.0, 0.2)}


# --------------------------------------------------------------------------------------------- evaluation


def encoded_split(n: int = 12, seed: int = 5):  # noqa: ANN201
    from tvr.eval.runner import EncodedSplit

    text, video = features(n, n, seed=seed)
    return EncodedSplit(text, video, list(range(n)), [f"v{k}" for k in range(n)], "one_to_one")


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s["mode"])
@pytest.mark.parametrize("rerank_k", [0, 5])
def test_every_mode_evaluates_and_names_itself(setting: dict, rerank_k: int) -> None:
    from tvr.eval.protocol import evaluate
    from tvr.eval.runner import evaluate_encoded, shortlist_matrix

    h = head()
    h.train()
    h.loss(*features(8, 8))
    h.set_inference_setting(setting)
    model = RetrievalModel(None, torch.nn.Identity(), h.eval())
    encoded = encoded_split()
    cfg = Config()
    cfg.eval.rerank_k = rerank_k
    metrics = evaluate_encoded(model, encoded, cfg, torch.device("cpu"))
    assert metrics["info"]["inference_setting"] == setting
    ts, vs = h.encode_texts(encoded.text), h.encode_videos(encoded.video)
    if rerank_k and not h.indexable:  # each text's 5 videos; a match outside them ranks last
        sim = shortlist_matrix(*h.rerank(ts, vs, 5), len(vs), torch.arange(len(ts)), torch.tensor(encoded.text_video))
    else:
        sim = h.score(ts, vs)
    assert metrics["t2v"] == evaluate(sim, encoded.text_video, "one_to_one")["t2v"]
    assert metrics["t2v@cos_f"] == evaluate(ts.f @ vs.f.T, encoded.text_video, "one_to_one")["t2v"]
    assert metrics["info"]["indexable"] == (setting["mode"] in ("cos_f", "cos_mu"))
    assert metrics["info"]["scoring"].startswith("two-stage") == bool(rerank_k and not h.indexable)


def test_validation_chooses_the_mode() -> None:
    from tvr.eval.protocol import evaluate
    from tvr.eval.runner import _pick, evaluate_encoded

    h = head()
    h.train()
    h.loss(*features(8, 8))
    model = RetrievalModel(None, torch.nn.Identity(), h.eval())
    encoded = encoded_split()
    cfg = Config()
    cfg.train.select_metric = "t2v/MnR"
    ts, vs = h.encode_texts(encoded.text), h.encode_videos(encoded.video)
    components = h.score_components(ts, vs)
    results = [
        (c, evaluate(h.combine_scores(components, c), encoded.text_video, "one_to_one"))
        for c in h.inference_candidates()
    ]
    best = results[_pick(results, "t2v/MnR")][0]
    metrics = evaluate_encoded(model, encoded, cfg, torch.device("cpu"), select_inference=True)
    assert h.inference_setting() == best == metrics["info"]["inference_setting"]
    assert [row["setting"] for row in metrics["info"]["inference_selection"]] == h.inference_candidates()
    assert len(metrics["info"]["inference_selection"]) == 7  # cos_f, cos_mu, s_align, mixed × 4 weights


@pytest.mark.parametrize(
    "stored,passes",
    [({"mode": "cos_f"}, 0), ({"mode": "cos_mu"}, 0), ({"mode": "s_align"}, 1), ({"mode": "mixed", "w": 0.5}, 1)],
)
def test_test_time_computes_s_align_only_for_a_mode_that_uses_it(
    stored: dict, passes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At test time the evaluator names the settings it combines (the cos_f row): a stored cos_f / cos_mu mode
    spends no S_align pass, a pairwise mode exactly one; validation (choosing among every mode) one."""
    from tvr.eval.runner import evaluate_encoded

    h = head()
    h.train()
    h.loss(*features(8, 8))
    h.eval()
    calls = []
    original = GraviAlignHead.s_align_block
    monkeypatch.setattr(GraviAlignHead, "s_align_block", lambda self, t, v: calls.append(1) or original(self, t, v))
    model = RetrievalModel(None, torch.nn.Identity(), h)
    h.set_inference_setting(stored)
    metrics = evaluate_encoded(model, encoded_split(), Config(), torch.device("cpu"))
    assert len(calls) == passes and metrics["info"]["inference_setting"] == stored and "t2v@cos_f" in metrics
    calls.clear()
    evaluate_encoded(model, encoded_split(), Config(), torch.device("cpu"), select_inference=True)
    assert len(calls) == 1  # every candidate, and the chosen score, from one S_align matrix


def test_gravialign_trains_and_evaluates_through_the_cli(tmp_path: Path) -> None:
    import yaml
    from test_end_to_end import make_msrvtt
    from typer.testing import CliRunner

    from tvr.cli import app

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(make_msrvtt(tmp_path / "data")))
    run = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "train",
            "--config",
            str(config),
            "--out",
            str(run),
            "--set",
            "head.name=gravialign",
            "--set",
            "train.max_steps=2",
            "--set",
            "head.options.mixed_weights=[0.5,1,2,4]",
        ],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "test_best" / "metrics.json").read_text())
    setting = metrics["inference_setting"]  # metrics.json lifts "info" to the top level
    assert metrics["head"] == "gravialign" and setting["mode"] in MODES and "t2v@cos_f" in metrics
    val = [json.loads(line) for line in (run / "val_log.jsonl").read_text().splitlines()]
    assert val and any("inference_selection" in json.dumps(rec) for rec in val)
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert {"infonce", "sgi", "term_A", "term_B", "term_C"} <= {key for rec in log for key in rec}
    ev = tmp_path / "eval"
    result = runner.invoke(
        app, ["eval", "--config", str(run / "config.yaml"), "--checkpoint", str(run / "best.pt"), "--out", str(ev)]
    )
    assert result.exit_code == 0, result.output
    again = json.loads((ev / "metrics.json").read_text())
    assert again["t2v"] == metrics["t2v"] and again["inference_setting"] == setting


# --------------------------------------------------------------------------------------------- presets


def load(path: Path) -> Config:
    cfg = load_config(path)
    cfg = resolve_config(cfg)
    return cfg


def test_presets_exist_and_follow_the_clipvip_recipe() -> None:
    names = {p.relative_to(REPO / "tvr" / "methods" / "gravialign" / "presets").as_posix() for p in PRESETS}
    assert {
        "msrvtt.yaml",
        "msrvtt_b16.yaml",
        "didemo.yaml",
        "activitynet.yaml",
        "ablations/no_a.yaml",
        "ablations/no_b.yaml",
        "ablations/no_c.yaml",
        "ablations/literal.yaml",
        "ablations/guarded.yaml",
        "ablations/contrastive.yaml",
        "ablations/soft_a.yaml",
    } <= names
    for path in PRESETS:
        cfg = load(path)
        clipvip = load(REPO / "tvr" / "models" / "backbones" / "clipvip" / "presets" / f"{cfg.data.dataset}.yaml")
        assert cfg.head.name == "gravialign" and cfg.model.backbone == "clipvip"
        assert cfg.model.clipvip.proxy_projection is False
        assert (cfg.data, cfg.train) == (clipvip.data, clipvip.train)  # CLIP-ViP's data and recipe, unchanged
        assert cfg.head.logit_scale_max == pytest.approx(math.log(200))
    default = load(REPO / "tvr" / "methods" / "gravialign" / "presets" / "msrvtt.yaml").head.options
    assert default == GraviAlignOptions()
    for name, terms in (("no_a", "BC"), ("no_b", "AC"), ("no_c", "AB")):
        opts = load(REPO / "tvr" / "methods" / "gravialign" / "presets" / "ablations" / f"{name}.yaml").head.options
        assert opts == dataclasses.replace(default, terms=terms)
    guarded = load(REPO / "tvr" / "methods" / "gravialign" / "presets" / "ablations" / "guarded.yaml").head.options
    assert guarded == dataclasses.replace(default, eps=1e-2, sgi_to_backbone=False)
    contrastive = load(REPO / "tvr" / "methods" / "gravialign" / "presets" / "ablations" / "contrastive.yaml")
    assert contrastive.head.options == dataclasses.replace(default, sgi_objective="contrastive", sgi_tau=1.0)
    soft_a = load(REPO / "tvr" / "methods" / "gravialign" / "presets" / "ablations" / "soft_a.yaml")
    assert soft_a.head.options == dataclasses.replace(default, a_distance="expected")
    base = load(REPO / "tvr" / "methods" / "gravialign" / "presets" / "msrvtt.yaml")
    for variant in (contrastive, soft_a):  # the head's options are the only difference
        assert (variant.data, variant.model, variant.train, variant.eval) == (
            base.data,
            base.model,
            base.train,
            base.eval,
        )
    literal = load(REPO / "tvr" / "methods" / "gravialign" / "presets" / "ablations" / "literal.yaml").head.options
    assert literal == dataclasses.replace(default, per_dim_mean=False, quality="literal", logvar_clamp=False, eps=0.0)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.relative_to(REPO / "tvr").as_posix())
def test_preset_runs_a_training_step_on_a_tiny_clipvip(path: Path) -> None:
    from tvr.models.backbones.clip.config import TinyClipConfig
    from tvr.models.build import build_model

    cfg = load(path)
    cfg.model.clip = "tiny"
    cfg.model.tiny = TinyClipConfig(
        embed_dim=16,
        text_width=16,
        text_layers=1,
        text_heads=2,
        vision_width=16,
        vision_layers=1,
        vision_heads=2,
        image_size=16,
        patch_size=8,
        context_length=16,
        vocab_size=300,
    )
    cfg.model.clipvip.checkpoint = ""
    torch.manual_seed(0)
    model = build_model(resolve_run(cfg))
    assert isinstance(model.head, GraviAlignHead) and model.head.options == cfg.head.options
    b, frames = 3, 2
    g = torch.Generator().manual_seed(0)
    batch = {
        "text_ids": torch.randint(1, 300, (b, 8), generator=g),
        "text_mask": torch.ones(b, 8, dtype=torch.long),
        "video": torch.randn(b, frames, 3, 16, 16, generator=g),
        "video_mask": torch.ones(b, frames, dtype=torch.long),
    }
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    out = model(batch)
    out["loss"].backward()
    opt.step()
    assert torch.isfinite(out["loss"]) and int(model.head.s_align_batches) == 1
    assert model.head.gauss_video.logvar_fc.weight.grad is not None


@pytest.mark.parametrize(
    "name,options",
    [
        ("gravialign/msrvtt", {}),
        ("gravialign/ablations/guarded", {"eps": 1e-2, "sgi_to_backbone": False}),
        ("gravialign/ablations/contrastive", {"sgi_objective": "contrastive"}),
    ],
)
def test_the_method_comparison_presets_are_addressable_by_name(name: str, options: dict) -> None:
    """GraviAlign as specified, guarded and contrastive: the three rows of a method comparison, by preset name."""
    cfg = load_config(name, ["head.options.mixed_weights=[0.5]"])
    cfg = resolve_config(cfg)
    assert cfg.head.options == dataclasses.replace(GraviAlignOptions(), mixed_weights=(0.5,), **options)
    assert GraviAlignHead(D, cfg.head.options).inference_candidates()[-1] == {"mode": "mixed", "w": 0.5}


def test_builds_with_the_registry_defaults() -> None:
    from tvr.config import HeadConfig
    from tvr.models.heads.registry import build_head

    h = build_head(HeadConfig(name="gravialign"), D, LN_100)
    assert isinstance(h, GraviAlignHead) and h.options == GraviAlignOptions() and h.indexable


def test_the_demo_guards_gravialign_and_keeps_every_other_default(tmp_path: Path) -> None:
    # the demo trains from scratch at lr 1e-3, where the spec's α, ε collapse the features (docs/benchmarks.md)
    from tvr.bench.demo import demo_config

    cfg = demo_config(tmp_path, method="gravialign")
    cfg = resolve_config(cfg)
    assert (cfg.head.options.alpha, cfg.head.options.eps) == (0.01, 1e-2)
    assert cfg.head.options == dataclasses.replace(GraviAlignOptions(), alpha=0.01, eps=1e-2)
    assert GraviAlignOptions().alpha == 0.1 and GraviAlignOptions().eps == 1e-6  # presets keep the spec's ★ values
    clip4clip = demo_config(tmp_path, method="clip4clip")
    clip4clip = resolve_config(clip4clip)
    assert clip4clip.head.options == type(clip4clip.head.options)()


def test_a_collapse_of_the_features_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    # every text and video the same vector: all similarities equal (InfoNCE = ln B) and δ = 0 (A at its ceiling)
    batch = 8
    same = torch.randn(1, D).expand(batch, D).contiguous()
    collapsed = (
        TextFeatures(same),
        VideoFeatures(same[:, None].expand(batch, 3, D).contiguous(), torch.ones(batch, 3, dtype=torch.long)),
    )
    h = head()
    h.train()
    parts = h.loss(*collapsed)
    assert abs(float(parts["infonce"]) - math.log(batch)) < 1e-5 and float(parts["term_A"]) > 500.0
    with caplog.at_level("WARNING", logger="tvr.methods.gravialign"):
        for _ in range(80):
            h.loss(*collapsed)
    warnings = [r for r in caplog.records if "collapsed" in r.getMessage()]
    assert len(warnings) == 1 and "alpha=0.01, eps=1e-2" in warnings[0].getMessage() and h.collapse_warned
    # distinct pairs never trip it, nor does evaluation mode
    healthy = head()
    healthy.train()
    caplog.clear()
    with caplog.at_level("WARNING", logger="tvr.methods.gravialign"):
        for _ in range(80):
            healthy.loss(*features(batch, batch))
        h2 = head()
        h2.eval()
        for _ in range(80):
            h2.loss(*collapsed)
    assert not [r for r in caplog.records if "collapsed" in r.getMessage()]
    assert not healthy.collapse_warned and not h2.collapse_warned
