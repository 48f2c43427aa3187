"""Metric paths: ``"t2v/R1"`` names ``metrics["t2v"]["R1"]``; which direction is better. Shared by training
(checkpoint selection) and evaluation (inference settings selected on validation)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: ``mean/<metric>``: the mean of ``t2v/<metric>`` and ``v2t/<metric>``, a criterion that sees both directions
BOTH_DIRECTIONS = "mean"


def lookup_metric(metrics: Mapping[str, Any], path: str) -> float:
    """``"t2v/R1"`` → ``float(metrics["t2v"]["R1"])``; ``"mean/R1"`` → the mean of t2v and v2t R1 (unless the
    metrics hold a ``mean`` entry of their own); a clear error lists the metrics that do exist."""
    first, _, rest = path.partition("/")
    if first == BOTH_DIRECTIONS and rest and first not in metrics:
        return (lookup_metric(metrics, f"t2v/{rest}") + lookup_metric(metrics, f"v2t/{rest}")) / 2.0
    node: Any = metrics
    for part in path.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(
                f"train.select_metric={path!r} is not in the validation metrics; available: {metric_paths(metrics)}"
            )
        node = node[part]
    try:
        value = float(node)
    except (TypeError, ValueError):
        raise ValueError(f"train.select_metric={path!r} is {node!r}, not a number") from None
    if math.isnan(value):
        raise ValueError(f"train.select_metric={path!r} is NaN")
    return value


def metric_paths(metrics: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.extend(metric_paths(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(name)
    return out


#: rank-style metrics where smaller is better (median / mean rank, losses)
_LOWER_IS_BETTER = ("mdr", "mnr", "medr", "meanr", "median_rank", "mean_rank", "loss")


def higher_is_better(path: str) -> bool:
    last = path.split("/")[-1].lower()
    return not any(last.startswith(m) for m in _LOWER_IS_BETTER)
