"""Human- and machine-readable metric reports: ``metrics.json`` + ``metrics.md`` in a run folder."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from tvr.eval.metrics import METRIC_KEYS, chance_metrics
from tvr.utils.io import atomic_write_json, atomic_write_text
from tvr.utils.json_values import plain_json

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


def _setting_text(setting: dict[str, Any]) -> str:
    return ", ".join(f"{key} = {value}" for key, value in setting.items())


def metrics_notes(metrics: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """Lines read with the table: the inference setting the head scored with (TV-ProxyNet's γ, GraviAlign's mode)
    and where it was chosen, and the chance level of each direction (a random ranking of the same gallery).
    ``info`` is the evaluation's ``info`` (num_texts, num_videos, protocol, inference_setting, ...)."""
    lines = []
    setting = info.get("inference_setting")
    if setting:
        where = (
            "chosen on this split among " + str(len(info["inference_selection"])) + " candidates"
            if info.get("inference_selection")
            else "as stored in the checkpoint (chosen on the validation split)"
        )
        baselines = sorted({k.split("@", 1)[1] for k in metrics if "@" in k})
        also = f"; rows `…@{'`, `…@'.join(baselines)}`: the same model with that setting" if baselines else ""
        lines.append(f"Inference setting: {_setting_text(setting)}, {where}{also}.")
    n_texts, n_videos = info.get("num_texts"), info.get("num_videos")
    if isinstance(n_texts, int) and isinstance(n_videos, int) and n_texts > 0 and n_videos > 0:
        # v2t ranks the captions (one per video) or, multi-caption, each video's caption group
        v2t_gallery = n_videos if info.get("protocol") == "multi_caption" else n_texts
        v2t_items = "caption groups" if info.get("protocol") == "multi_caption" else "captions"

        def chance(n: int) -> str:
            row = chance_metrics(n)
            # recalls to 3 significant digits (0.0037 % for a 27k-caption gallery), ranks to one decimal
            return ", ".join(
                f"{COLUMN_TITLES[k]} " + (f"{row[k]:.3g}" if k.startswith("R") else f"{row[k]:.1f}")
                for k in METRIC_KEYS
            )

        lines.append(
            f"Chance level (a random ranking): t2v {chance(n_videos)} ({n_videos} videos); "
            f"v2t {chance(v2t_gallery)} ({v2t_gallery} {v2t_items})."
        )
    return lines


def _jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy / torch scalars become Python numbers, tuples become lists, paths strings."""
    return plain_json(obj, _metric_value)


def _metric_value(obj: Any) -> Any:
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
    notes = metrics_notes(metrics, extra)
    if notes:
        text += "\n" + "\n".join(notes) + "\n"
    if extra:
        text += "\n" + "\n".join(f"- **{k}**: {json.dumps(_jsonable(v))}" for k, v in extra.items()) + "\n"
    md_path = atomic_write_text(out_dir / "metrics.md", text)
    return json_path, md_path
