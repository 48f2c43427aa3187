"""Confidence intervals over seeds: the arithmetic behind ``tvr bench``'s tables (pure functions).

A run's test metric is one draw from the distribution over training seeds; with n seeds the 95 % interval of the
mean is ``mean ± t(0.975, n − 1) · s / √n`` (Student t, s the sample standard deviation with n − 1 in the
denominator). Methods are compared *paired by seed*: every seed trains each method on the same data split, so the
interval of the per-seed differences (method − baseline) removes the variation the seeds share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

#: the confidence level of every interval tvr reports
LEVEL = 0.95


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


__all__ = ["LEVEL", "Interval", "paired_difference", "t_interval", "t_quantile"]
