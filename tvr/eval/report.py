"""Human- and machine-readable metric reports: ``metrics.json`` + ``metrics.md`` in a run folder."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from tvr.eval.metrics import METRIC_KEYS
from tvr.utils.io import atomic_write_json, atomic_write_text

#: preferred row order; any other direction entries follow in insertion order
ROW_ORDER = ("t2v", "v2t", "t2v_dsl", "v2t_dsl", "t2v_invsoftmax", "t2v_qbnorm")
COLUMN_TITLES = {"R1": "R@1", "R5": "R@5", "R10": "R@10", "MdR": "MdR", "MnR": "MnR"}


def _metric_rows(metrics: dict[str, Any]) -> list[str]:
    """Keys whose value is a metric dict (holds all five metric keys), in display order."""
    rows = [k for k, v in metrics.items() if isinstance(v, dict) and all(m in v for m in METRIC_KEYS)]
    if not rows:
        raise ValueError(
            f"no metric entries to tabulate: expected dicts with keys {METRIC_KEYS}, got keys {list(metrics)}"
        )
    preferred = [k for k in ROW_ORDER if k in rows]
    return preferred + [k for k in rows if k not in preferred]


def _fmt(value: Any) -> str:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "nan" if math.isnan(x) else f"{x:.1f}"


def metrics_table(metrics: dict[str, Any]) -> str:
    """Markdown table: one row per direction (t2v, v2t, then DSL rows), columns R@1 R@5 R@10 MdR MnR, one decimal.

    Entries of ``metrics`` that are not metric dicts (e.g. a ``"protocol"`` string) are ignored.
    """
    header = "| | " + " | ".join(COLUMN_TITLES[k] for k in METRIC_KEYS) + " |"
    rule = "|---|" + "---:|" * len(METRIC_KEYS)
    lines = [header, rule]
    for row in _metric_rows(metrics):
        lines.append(f"| {row} | " + " | ".join(_fmt(metrics[row][k]) for k in METRIC_KEYS) + " |")
    return "\n".join(lines) + "\n"


def _jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy / torch scalars become Python numbers, tuples become lists, paths strings."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    item = getattr(obj, "item", None)  # numpy scalar, 0-d torch tensor
    if callable(item):
        return item()
    raise TypeError(f"cannot write {type(obj).__name__} value {obj!r} to metrics.json")


def write_metrics(
    out_dir: str | os.PathLike, metrics: dict[str, Any], extra: dict[str, Any] | None = None
) -> tuple[Path, Path]:
    """Write ``metrics.json`` (``{"t2v": {...}, "v2t": {...}, ..., **extra}``) and ``metrics.md`` atomically.

    ``extra`` holds run facts (checkpoint, protocol, tie mode, number of queries, …); its keys must not collide
    with the metric entries. Returns the two paths.
    """
    out_dir = Path(out_dir)
    extra = dict(extra or {})
    clash = sorted(set(extra) & set(metrics))
    if clash:
        raise ValueError(f"write_metrics: extra keys {clash} collide with metric entries")
    payload = _jsonable({**metrics, **extra})
    json.dumps(payload, allow_nan=True)  # fail before writing anything if something is still not serialisable
    json_path = atomic_write_json(out_dir / "metrics.json", payload)

    text = "# Retrieval metrics\n\n" + metrics_table(metrics)
    if extra:
        text += "\n" + "\n".join(f"- **{k}**: {json.dumps(_jsonable(v))}" for k, v in extra.items()) + "\n"
    md_path = atomic_write_text(out_dir / "metrics.md", text)
    return json_path, md_path
