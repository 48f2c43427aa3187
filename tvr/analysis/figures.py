"""Writing one figure: the PNG (matplotlib's Agg canvas, no pyplot state) and the numbers behind it as JSON, plus a
long-format CSV for curves; every file written atomically.

A figure is a fixed size in inches at :data:`DPI`, so its PNG is ``width·DPI × height·DPI`` pixels whatever is drawn
on it (``constrained`` layout places the panels inside that canvas; nothing is cropped).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tvr.utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text

#: pixels per inch of every PNG
DPI = 100
#: colours used for the same meaning in every figure
COLORS = {
    "positive": "#2a9d8f",
    "negative": "#e76f51",
    "total": "#264653",
    "before": "#8d99ae",
    "after": "#e63946",
    "baseline": "#8d99ae",
    "method": "#1d3557",
    "q": "#d62828",
    "video": "#1d4ed8",
    "text": "#2a9d8f",
}


@dataclasses.dataclass(frozen=True)
class FigureFiles:
    """What :func:`write_figure` wrote: ``png``, ``json`` and (curves) ``csv`` file names inside the output folder."""

    name: str
    title: str
    png: str
    json: str
    csv: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def new_figure(
    width: float, height: float, nrows: int = 1, ncols: int = 1, **subplot_kw: Any
) -> tuple[Figure, np.ndarray]:
    """A ``width × height``-inch figure on an Agg canvas with an ``nrows × ncols`` array of axes."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    return fig, axes


def png_size(fig: Figure) -> tuple[int, int]:
    """(width, height) in pixels of the PNG :func:`write_figure` makes of ``fig``."""
    width, height = fig.get_size_inches()
    return round(width * DPI), round(height * DPI)


def jsonable(value: Any) -> Any:
    """Plain JSON values: arrays and tensors become lists, numpy scalars numbers, NaN and ±inf ``None``."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def write_rows_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as CSV with the union of their keys as columns (first-seen order), atomically."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in jsonable(dict(row)).items()})
    atomic_write_text(path, buffer.getvalue())


def render_png(fig: Figure) -> bytes:
    """The figure as PNG bytes: drawn on its Agg canvas at :data:`DPI`, reduced to a 256-colour palette (plots use
    a few flat colours; this keeps a page of panels around 100 KB without visible loss)."""
    from PIL import Image

    fig.set_dpi(DPI)
    fig.canvas.draw()
    image = Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).convert("RGB").quantize(colors=256)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def write_figure(
    out_dir: str | Path,
    name: str,
    fig: Figure,
    data: dict[str, Any],
    *,
    title: str,
    rows: Sequence[dict[str, Any]] | None = None,
) -> FigureFiles:
    """Write ``<name>.png`` and ``<name>.json`` (``data`` plus the title) into ``out_dir``, and ``<name>.csv`` when
    ``rows`` are given (one row per plotted point). The figure is closed afterwards (its memory released)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / f"{name}.png", render_png(fig))
    fig.clear()
    atomic_write_json(out / f"{name}.json", jsonable({"figure": name, "title": title, **data}))
    csv_name = None
    if rows is not None:
        csv_name = f"{name}.csv"
        write_rows_csv(out / csv_name, rows)
    return FigureFiles(name, title, f"{name}.png", f"{name}.json", csv_name)


def split_label(split: str) -> str:
    """How figures name the split they were measured on; a test split says it is not for choosing anything."""
    if split.startswith("test"):
        return f"{split} split — for reading only, not for model selection"
    if split == "train":
        return "train split — the data the model was fitted on"
    return f"{split} split"


def hist_overlay(
    ax: Axes, series: dict[str, np.ndarray], edges: np.ndarray, colors: dict[str, str], density: bool = True
) -> None:
    """Step histograms of several samples on shared bin edges (densities, so sizes may differ)."""
    for label, values in series.items():
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            continue
        ax.hist(
            values,
            bins=edges,
            density=density,
            histtype="stepfilled",
            alpha=0.35,
            color=colors.get(label),
            label=f"{label} (n={values.size})",
        )
        ax.hist(values, bins=edges, density=density, histtype="step", color=colors.get(label), linewidth=1.2)


def shared_edges(*samples: np.ndarray, bins: int = 50) -> np.ndarray:
    """``bins`` equal-width bin edges spanning every finite value of every sample (a unit range if all are equal)."""
    finite = [np.asarray(s, dtype=np.float64)[np.isfinite(np.asarray(s, dtype=np.float64))] for s in samples]
    finite = [f for f in finite if f.size]
    if not finite:
        return np.linspace(0.0, 1.0, bins + 1)
    lo = min(float(f.min()) for f in finite)
    hi = max(float(f.max()) for f in finite)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, bins + 1)


def note(ax: Axes, text: str) -> None:
    """A short annotation in the top-left corner of a panel."""
    ax.text(
        0.02,
        0.98,
        text,
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=8,
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8, "edgecolor": "#cccccc"},
    )
