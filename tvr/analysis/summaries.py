"""Numeric summaries that every analysis reports beside its figure: a sample's statistics and histograms."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


def as_numpy(values: Any) -> np.ndarray:
    """A float64 numpy copy of a tensor / array / sequence."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64)


def describe(values: Any) -> dict[str, float | int | None]:
    """count, mean, std (population), min, quartiles and max of the finite values (``None`` when there are none);
    ``non_finite`` counts the values left out."""
    array = as_numpy(values).reshape(-1)
    finite = array[np.isfinite(array)]
    out: dict[str, float | int | None] = {"count": int(finite.size), "non_finite": int(array.size - finite.size)}
    if finite.size == 0:
        out.update(dict.fromkeys(("mean", "std", "min", "q25", "median", "q75", "max")))
        return out
    q25, median, q75 = np.quantile(finite, [0.25, 0.5, 0.75])
    out.update(
        {
            "mean": float(finite.mean()),
            "std": float(finite.std()),
            "min": float(finite.min()),
            "q25": float(q25),
            "median": float(median),
            "q75": float(q75),
            "max": float(finite.max()),
        }
    )
    return out


def histogram(values: Any, edges: np.ndarray) -> dict[str, list]:
    """Counts of the finite values in the bins ``edges`` (numpy's convention: the last bin includes its right edge)."""
    array = as_numpy(values).reshape(-1)
    counts, _ = np.histogram(array[np.isfinite(array)], bins=edges)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def per_dimension(samples: Tensor) -> dict[str, list[float]]:
    """Per-dimension mean and variance (unbiased; 0 for a single sample) of ``samples`` [n, D] over its n rows."""
    samples = samples.detach().double()
    if samples.ndim != 2 or samples.shape[0] == 0:
        raise ValueError(f"per_dimension expects samples [n >= 1, D], got shape {tuple(samples.shape)}")
    mean = samples.mean(dim=0)
    var = samples.var(dim=0, unbiased=True) if samples.shape[0] > 1 else torch.zeros_like(mean)
    return {"mean": mean.tolist(), "var": var.tolist()}


def spearman(x: Any, y: Any) -> float | None:
    """Spearman's rank correlation of the pairs where both values are finite (``None`` with fewer than 3 pairs or
    a constant side)."""
    from scipy.stats import spearmanr

    a, b = as_numpy(x).reshape(-1), as_numpy(y).reshape(-1)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
        return None
    return float(spearmanr(a[keep], b[keep]).statistic)
