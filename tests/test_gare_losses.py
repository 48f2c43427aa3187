"""GARE losses (spec §3.4) against direct, loop-based implementations of their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from tvr.losses import symmetric_infonce
from tvr.methods.gare.losses import gare_direction, gare_kl, gare_radius

# ----------------------------------------------------------------------------- independent references (loops)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _var_unbiased(xs: list[float]) -> float:
    mu = _mean(xs)
    return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)


def kl_reference(delta: torch.Tensor, reduction: str) -> float:
    n_t, n_v, dim = delta.shape
    d = delta.tolist()
    per_video = []
    for j in range(n_v):
        kls = []
        for k in range(dim):
            xs = [d[i][j][k] for i in range(n_t)]
            mu = _mean(xs)
            sigma = math.sqrt(_var_unbiased(xs)) + 1e-6
            kls.append(-math.log(sigma) + (sigma**2 + mu**2) / 2 - 0.5)
        per_video.append(sum(kls) if reduction == "sum" else _mean(kls))
    return _mean(per_video)


def radius_reference(delta: torch.Tensor, lam: float) -> float:
    d = delta.tolist()
    variances = []
    for row in d:
        radii = [math.sqrt(sum(x * x for x in vec)) for vec in row]
        variances.append(_var_unbiased(radii))
    m = _mean(variances)
    return -m if m <= lam else 0.0


def direction_reference(delta: torch.Tensor, alpha: float) -> float:
    d = delta.tolist()
    per_text = []
    for row in d:
        units = []
        for vec in row:
            norm = math.sqrt(sum(x * x for x in vec))
            units.append([x / norm for x in vec])
        terms = []
        for zj in units:
            for zk in units:
                cos = sum(a * b for a, b in zip(zj, zk, strict=True))
                terms.append(math.exp(-alpha * (1.0 - cos)))
        per_text.append(math.log(_mean(terms) + 1e-8))
    return _mean(per_text)


def infonce_reference(logits: torch.Tensor) -> float:
    x = logits.tolist()
    n = len(x)

    def ce_rows(m: list[list[float]]) -> float:
        total = 0.0
        for i in range(n):
            lse = math.log(sum(math.exp(v) for v in m[i]))
            total += lse - m[i][i]
        return total / n

    xt = [[x[j][i] for j in range(n)] for i in range(n)]
    return 0.5 * (ce_rows(x) + ce_rows(xt))


# ----------------------------------------------------------------------------- tests


def test_symmetric_infonce_matches_formula() -> None:
    logits = torch.randn(6, 6, dtype=torch.float64) * 3
    assert symmetric_infonce(logits).item() == pytest.approx(infonce_reference(logits), rel=1e-10)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("shape", [(5, 4, 6), (2, 3, 1), (7, 1, 3)])
def test_gare_kl_matches_formula(reduction: str, shape: tuple[int, int, int]) -> None:
    delta = torch.randn(*shape, dtype=torch.float64) * 1.7 + 0.3
    assert gare_kl(delta, reduction).item() == pytest.approx(kl_reference(delta, reduction), rel=1e-9)


def test_gare_kl_sum_is_dim_times_mean() -> None:
    delta = torch.randn(9, 5, 16, dtype=torch.float64)
    assert gare_kl(delta, "sum").item() == pytest.approx(16 * gare_kl(delta, "mean").item(), rel=1e-12)


def test_gare_kl_is_anchored_on_videos() -> None:
    # statistics run over texts (dim 0) for each video: transposing the layout must change the value
    delta = torch.randn(6, 4, 3, dtype=torch.float64)
    delta[:, 0] += 5.0  # video 0 gets a large mean over texts
    assert gare_kl(delta).item() != pytest.approx(gare_kl(delta.transpose(0, 1).contiguous()).item(), rel=1e-3)
    # a standard-normal-like spread with zero mean is close to the prior: KL per dim ≈ 0 for huge N_t
    big = torch.randn(20000, 2, 3, dtype=torch.float64)
    assert abs(gare_kl(big, "mean").item()) < 1e-3


def test_gare_kl_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least 2 text"):
        gare_kl(torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match="reduction"):
        gare_kl(torch.randn(3, 3, 4), reduction="median")
    with pytest.raises(ValueError, match=r"\[N_t, N_v, D\]"):
        gare_kl(torch.randn(3, 4))


@pytest.mark.parametrize("lam", [0.5, 100.0, 1e-6])
def test_gare_radius_matches_formula(lam: float) -> None:
    delta = torch.randn(6, 5, 7, dtype=torch.float64) * torch.rand(6, 5, 1, dtype=torch.float64) * 2
    assert gare_radius(delta, lam).item() == pytest.approx(radius_reference(delta, lam), rel=1e-10, abs=1e-15)


def _delta_with_radii(radii: torch.Tensor, dim: int = 4) -> torch.Tensor:
    """Δ_ij = r_ij · u_ij with random unit directions, so ‖Δ_ij‖ = r_ij exactly (up to rounding)."""
    u = torch.nn.functional.normalize(torch.randn(*radii.shape, dim, dtype=torch.float64), dim=-1)
    return radii.unsqueeze(-1) * u


def test_gare_radius_hinge_boundary_value_and_gradient() -> None:
    radii = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.5, 2.0]], dtype=torch.float64)
    m = _mean([_var_unbiased(r) for r in radii.tolist()])  # mean over texts of the unbiased radius variance
    base = _delta_with_radii(radii)

    below = base.clone().requires_grad_(True)  # m ≤ λ: the term is −m and pushes the variance up
    value = gare_radius(below, lam=m + 1e-6)
    assert value.item() == pytest.approx(-m, rel=1e-9)
    value.backward()
    assert below.grad is not None and below.grad.abs().sum() > 0
    # d(−m)/dΔ_ij = −(2/(N_v−1))·(ε_ij − mean_j ε_ij)/N_t · Δ_ij/ε_ij : check one entry against that formula
    i, j, n_t, n_v = 0, 2, 2, 3
    eps_row = radii[i]
    expected = -(2.0 / (n_v - 1)) * (eps_row[j] - eps_row.mean()) / n_t * base[i, j] / eps_row[j]
    torch.testing.assert_close(below.grad[i, j], expected)

    above = base.clone().requires_grad_(True)  # m > λ: exactly zero, zero gradient
    value = gare_radius(above, lam=m - 1e-6)
    assert value.item() == 0.0
    value.backward()
    assert above.grad is not None and torch.count_nonzero(above.grad) == 0

    # at the boundary the code's `loss >= -λ` keeps the term
    assert gare_radius(base, lam=m).item() == pytest.approx(-m, rel=1e-9)


def test_gare_radius_uses_batch_mean_not_per_anchor() -> None:
    # text 0 has a large spread, text 1 none; per-anchor hinging would differ from the batch-mean hinge
    radii = torch.tensor([[0.0 + 1e-3, 2.0, 4.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    delta = _delta_with_radii(radii)
    m = _mean([_var_unbiased(r) for r in radii.tolist()])
    assert m > 1.0
    assert gare_radius(delta, lam=1.0).item() == 0.0
    assert gare_radius(delta, lam=m + 0.1).item() == pytest.approx(-m, rel=1e-9)


@pytest.mark.parametrize("alpha", [0.5, 2.0, 5.0])
def test_gare_direction_matches_formula(alpha: float) -> None:
    delta = torch.randn(4, 6, 5, dtype=torch.float64)
    assert gare_direction(delta, alpha).item() == pytest.approx(direction_reference(delta, alpha), rel=1e-10)


def test_gare_direction_bounds_and_extremes() -> None:
    alpha = 2.0
    for _ in range(5):
        value = gare_direction(torch.randn(8, 8, 16), alpha).item()
        assert -2 * alpha <= value <= 1e-7
    # every increment of a text points the same way: G ≡ 1, ℓ_i = log(1 + 1e-8) ≈ 0 (the upper bound)
    same = torch.randn(3, 1, 5).expand(3, 4, 5) * torch.rand(3, 4, 1).add(0.5)
    assert gare_direction(same, alpha).item() == pytest.approx(math.log(1 + 1e-8), abs=1e-6)
    # two antipodal increments: mean over (j,k) of [1, e^{-2α}, e^{-2α}, 1]
    e = torch.randn(1, 1, 5, dtype=torch.float64)
    anti = torch.cat([e, -2 * e], dim=1)
    expected = math.log((1 + math.exp(-2 * alpha)) / 2 + 1e-8)
    assert gare_direction(anti, alpha).item() == pytest.approx(expected, rel=1e-10)


def test_gare_direction_is_vectorised_over_anchors() -> None:
    # same value whether the anchors are scored together or one by one (no cross-anchor mixing)
    delta = torch.randn(5, 4, 3, dtype=torch.float64)
    together = gare_direction(delta).item()
    separately = _mean([gare_direction(delta[i : i + 1]).item() for i in range(5)])
    assert together == pytest.approx(separately, rel=1e-12)
