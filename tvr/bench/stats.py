"""Confidence intervals over seeds: the arithmetic behind ``tvr bench``'s tables (pure functions).

A run's test metric is one draw from the distribution over training seeds; with n seeds the 95 % interval of the
mean is ``mean ± t(0.975, n − 1) · s / √n`` (Student t, s the sample standard deviation with n − 1 in the
denominator). Methods are compared *paired by seed*: every seed trains each method on the same data split, so the
interval of the per-seed differences (method − baseline) removes the variation the seeds share.

A table of many such comparisons is read with Holm's step-down correction (:func:`holm`): the adjusted p-values keep
the chance of any false "differs" in the whole table at 5 %. What a comparison *could* have seen is its minimum
detectable difference (:func:`minimum_detectable_difference`): the true paired difference a two-sided test at 95 %
would find with 80 % power, given the spread of the per-seed differences. A dial sweep's question, "does the gain
grow with the dial?", is a test of the per-seed slopes of gain on dial value (:func:`slope_test`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

#: the confidence level of every interval tvr reports
LEVEL = 0.95
#: the power a minimum detectable difference is computed for
POWER = 0.80


@dataclass(frozen=True)
class Interval:
    """Mean and the half-width of its two-sided confidence interval (NaN when n < 2: no interval exists)."""

    mean: float
    half_width: float
    n: int
    sd: float
    level: float = LEVEL

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def excludes_zero(self) -> bool:
        """True when the interval lies entirely above or below 0 (NaN intervals never do)."""
        return not math.isnan(self.half_width) and (self.low > 0 or self.high < 0)

    def to_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "low": self.low, "high": self.high}


def t_quantile(level: float, dof: int) -> float:
    """The two-sided Student t critical value: P(|T| <= q) = ``level`` for T with ``dof`` degrees of freedom."""
    from scipy.stats import t

    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    return float(t.ppf(0.5 + level / 2.0, dof))


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean of ``values`` with its Student-t confidence interval."""
    data = [float(v) for v in values]
    n = len(data)
    if n == 0:
        raise ValueError("t_interval of no values")
    mean = math.fsum(data) / n
    if n < 2:
        return Interval(mean, math.nan, n, math.nan, level)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / (n - 1))
    return Interval(mean, t_quantile(level, n - 1) * sd / math.sqrt(n), n, sd, level)


def paired_difference(values: Sequence[float], baseline: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean of the per-seed differences ``values[k] − baseline[k]`` and its interval (the paired t interval)."""
    if len(values) != len(baseline):
        raise ValueError(
            f"paired difference needs one value per seed on both sides, got {len(values)} and {len(baseline)}"
        )
    return t_interval([a - b for a, b in zip(values, baseline, strict=True)], level)


def t_test_p(values: Sequence[float], alternative: str = "two-sided") -> float:
    """p-value of the one-sample t test of mean 0 (``two-sided``, or ``greater``: H1 mean > 0). With no spread the
    statistic is infinite: p = 0 for a non-zero mean, 1 for a zero one; NaN below two values."""
    from scipy.stats import t

    if alternative not in ("two-sided", "greater"):
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    data = [float(v) for v in values]
    n = len(data)
    if n < 2:
        return math.nan
    mean = math.fsum(data) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / (n - 1))
    if sd == 0.0:
        if mean == 0.0:
            return 1.0  # every difference is exactly 0: no evidence either way
        statistic = math.copysign(math.inf, mean)
    else:
        statistic = mean / (sd / math.sqrt(n))
    if alternative == "greater":
        return float(t.sf(statistic, n - 1))
    return float(2.0 * t.sf(abs(statistic), n - 1))


def paired_t_test(values: Sequence[float], baseline: Sequence[float]) -> float:
    """Two-sided p-value of the paired t test (per-seed differences ``values[k] − baseline[k]``, mean 0)."""
    if len(values) != len(baseline):
        raise ValueError(f"paired t test needs one value per seed on both sides, got {len(values)} and {len(baseline)}")
    return t_test_p([a - b for a, b in zip(values, baseline, strict=True)])


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the k-th smallest of m p-values becomes
    ``max over j <= k of min(1, (m − j + 1) · p_(j))``. A NaN (no test possible) stays NaN and does not count in m."""
    indexed = sorted((p, k) for k, p in enumerate(p_values) if not math.isnan(p))
    m = len(indexed)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, k) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[k] = running
    return adjusted


def minimum_detectable_difference(sd: float, n: int, level: float = LEVEL, power: float = POWER) -> float:
    """The smallest true mean difference a two-sided one-sample (paired) t test at ``level`` detects with ``power``,
    given the spread ``sd`` of n per-seed differences: ``(t(1 − α/2, n − 1) + t(power, n − 1)) · sd / √n`` (the
    textbook normal-shift approximation with t quantiles; NaN below two values)."""
    if n < 2 or math.isnan(sd):
        return math.nan
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    one_sided = 2.0 * power - 1.0  # t_quantile is two-sided: P(|T| <= q) = 2·power − 1 gives the power quantile
    return (t_quantile(level, n - 1) + t_quantile(one_sided, n - 1)) * sd / math.sqrt(n)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"a slope needs two or more (x, y) pairs of equal count, got {len(xs)} and {len(ys)}")
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0.0:
        raise ValueError("a slope needs at least two distinct x values")
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def slope_test(xs: Sequence[float], per_seed: Sequence[Sequence[float]], level: float = LEVEL) -> dict[str, float]:
    """Does y grow with x? ``per_seed[k]`` holds seed k's y at each x. Each seed's least-squares slope is one
    replicate; returns their mean with its two-sided interval and the one-sided p-value of H1 "mean slope > 0"."""
    slopes = [slope(xs, ys) for ys in per_seed]
    interval = t_interval(slopes, level)
    return {**interval.to_dict(), "slopes": slopes, "p_greater": t_test_p(slopes, "greater")}


__all__ = [
    "LEVEL",
    "POWER",
    "Interval",
    "holm",
    "minimum_detectable_difference",
    "paired_difference",
    "paired_t_test",
    "slope",
    "slope_test",
    "t_interval",
    "t_quantile",
    "t_test_p",
]
