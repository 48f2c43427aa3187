"""Any head: how its scores separate positive from negative pairs, and where the ground truth ranks.

Both read the [N_t, N_v] score matrix the evaluation ranks (the first of ``tvr.eval.runner.score_matrices``) and
the split's ground truth (``text_video``: the gallery index of each caption's video) under its protocol, so the ranks
here are the ones behind the reported R@K (:func:`protocol_ranks` reuses the evaluator's rank counting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tvr.analysis.figures import COLORS, FigureFiles, new_figure, note, split_label, write_figure
from tvr.analysis.summaries import describe
from tvr.eval.metrics import gt_ranks
from tvr.eval.protocol import group_max, inverse_permutation

#: rows of the score matrix read at once when counting negatives (bounds scratch memory)
ROW_ELEMENTS = 1 << 22
#: rank bins of the rank histogram: [1], [2], …, [5], [6, 10], [11, 20], … (upper edges, inclusive)
RANK_BIN_TOPS = (1, 2, 3, 4, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


def protocol_ranks(sim: Tensor, text_video: Any, protocol: str, v2t_sim: Tensor | None = None) -> dict[str, np.ndarray]:
    """1-based GT ranks of every t2v query (each caption) and every v2t query (each video), ties optimistic, as the
    evaluator ranks them: one-to-one / paragraph: the transposed matrix for v2t; multi-caption: v2t ranks caption
    groups scored by their best caption (spec §6.4). ``v2t_sim`` ([N_t, N_v], default ``sim``): the matrix video
    queries rank when it differs (two-stage scoring's per-video shortlists)."""
    sim = torch.as_tensor(sim).float()
    other = sim if v2t_sim is None else torch.as_tensor(v2t_sim).float()
    tv = torch.as_tensor(text_video).long().cpu()
    n_v = sim.shape[1]
    t2v = gt_ranks(sim, tv)
    if protocol == "multi_caption":
        v2t = gt_ranks(group_max(other, tv, n_v).t(), None)
    else:
        v2t = gt_ranks(other.t(), inverse_permutation(tv, n_v))
    return {"t2v": t2v, "v2t": v2t}


def recall_at(ranks: np.ndarray, ks: tuple[int, ...] = (1, 5, 10)) -> dict[str, float]:
    """R@K in percent and the median / mean rank of a rank vector (the evaluator's optimistic-tie metrics)."""
    ranks = np.asarray(ranks)
    out = {f"R{k}": float(100.0 * np.mean(ranks <= k)) for k in ks}
    out["MdR"] = float(np.median(ranks))
    out["MnR"] = float(np.mean(ranks))
    return out


def score_distributions(sim: Tensor, text_video: Any, bins: int = 60) -> dict[str, Any]:
    """Scores of the positive pairs (each caption with its video) and of all negative pairs, on shared bins.

    Negatives are counted row block by row block (a histogram plus running moments), never gathered. Non-finite
    scores (−inf outside a two-stage shortlist) are left out and counted. ``separation`` is
    (mean_pos − mean_neg) / √((var_pos + var_neg)/2)."""
    sim = torch.as_tensor(sim).float()
    n_t, n_v = sim.shape
    tv = torch.as_tensor(text_video).long().cpu()
    rows = torch.arange(n_t)
    positives = sim[rows, tv]
    finite = sim[torch.isfinite(sim)]
    if finite.numel() == 0:
        raise ValueError("score_distributions: every score is non-finite")
    lo, hi = float(finite.min()), float(finite.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    neg_counts = np.zeros(bins, dtype=np.int64)
    count, total, total_sq, non_finite = 0, 0.0, 0.0, 0
    step = max(1, ROW_ELEMENTS // max(n_v, 1))
    for a in range(0, n_t, step):
        block = sim[a : a + step].double()
        keep = torch.ones_like(block, dtype=torch.bool)
        keep[torch.arange(block.shape[0]), tv[a : a + step]] = False
        values = block[keep]
        ok = torch.isfinite(values)
        non_finite += int((~ok).sum())
        values = values[ok]
        count += values.numel()
        total += float(values.sum())
        total_sq += float(values.square().sum())
        neg_counts += np.histogram(values.numpy(), bins=edges)[0]
    neg_mean = total / count if count else float("nan")
    neg_var = max(total_sq / count - neg_mean**2, 0.0) if count else float("nan")
    pos = describe(positives)
    separation = None
    if count and pos["count"]:
        spread = np.sqrt((pos["std"] ** 2 + neg_var) / 2.0)
        separation = float((pos["mean"] - neg_mean) / spread) if spread > 0 else None
    return {
        "positive": {
            **pos,
            "counts": np.histogram(positives[torch.isfinite(positives)].numpy(), bins=edges)[0].tolist(),
        },
        "negative": {
            "count": count,
            "non_finite": non_finite,
            "mean": neg_mean,
            "std": float(np.sqrt(neg_var)),
            "counts": neg_counts.tolist(),
        },
        "edges": edges.tolist(),
        "separation": separation,
    }


def rank_histogram(ranks: np.ndarray, n_gallery: int) -> dict[str, Any]:
    """Counts of GT ranks in the bins 1, 2, 3, 4, 5, 6-10, 11-20, 21-50, … up to the gallery size."""
    ranks = np.asarray(ranks)
    tops = [t for t in RANK_BIN_TOPS if t < n_gallery] + [n_gallery]
    labels, counts, low = [], [], 1
    for top in tops:
        labels.append(str(low) if low == top else f"{low}-{top}")
        counts.append(int(((ranks >= low) & (ranks <= top)).sum()))
        low = top + 1
    return {"bins": labels, "counts": counts}


# --------------------------------------------------------------------------------------------- figures


def plot_score_distributions(
    out_dir: Path, sim: Tensor, text_video: Any, *, split: str, head: str, setting: dict | None = None
) -> FigureFiles:
    data = score_distributions(sim, text_video)
    edges = np.asarray(data["edges"])
    widths = np.diff(edges)
    fig, axes = new_figure(7.5, 4.2)
    ax = axes[0, 0]
    for kind in ("negative", "positive"):
        counts = np.asarray(data[kind]["counts"], dtype=np.float64)
        density = counts / max(counts.sum(), 1) / widths
        ax.stairs(density, edges, fill=True, alpha=0.35, color=COLORS[kind])
        ax.stairs(
            density,
            edges,
            color=COLORS[kind],
            linewidth=1.2,
            label=f"{kind} pairs (n={data[kind]['count']}, mean {data[kind]['mean']:.3f})",
        )
        ax.axvline(data[kind]["mean"], color=COLORS[kind], linestyle="--", linewidth=1)
    ax.set_xlabel("score s(text, video)")
    ax.set_ylabel("density")
    ax.legend(loc="upper right", fontsize=8)
    sep = data["separation"]
    note(ax, f"separation (mean gap / pooled std): {sep:.2f}" if sep is not None else "separation: n/a")
    suffix = f", {_setting_text(setting)}" if setting else ""
    title = f"Scores of positive vs negative pairs — {head}{suffix} — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(
        out_dir,
        "similarity_distributions",
        fig,
        {"split": split, "head": head, "inference_setting": setting, **data},
        title=title,
    )


def plot_rank_histogram(
    out_dir: Path,
    sim: Tensor,
    text_video: Any,
    protocol: str,
    *,
    split: str,
    head: str,
    setting: dict | None = None,
    v2t_sim: Tensor | None = None,
) -> FigureFiles:
    ranks = protocol_ranks(sim, text_video, protocol, v2t_sim)
    # v2t ranks texts (one-to-one, paragraph) or caption groups, one per video (multi-caption)
    n_gallery = {"t2v": sim.shape[1], "v2t": sim.shape[1] if protocol == "multi_caption" else sim.shape[0]}
    data: dict[str, Any] = {"split": split, "head": head, "protocol": protocol, "inference_setting": setting}
    fig, axes = new_figure(10, 4.0, 1, 2)
    for ax, direction in zip(axes[0], ("t2v", "v2t"), strict=True):
        hist = rank_histogram(ranks[direction], n_gallery[direction])
        metrics = recall_at(ranks[direction])
        data[direction] = {
            **hist,
            "metrics": metrics,
            "ranks": ranks[direction].tolist(),
            "gallery_size": n_gallery[direction],
        }
        ax.bar(range(len(hist["counts"])), hist["counts"], color=COLORS["method"])
        ax.set_ylim(0, 1.3 * max(max(hist["counts"]), 1))  # room for the metrics box
        ax.set_xticks(range(len(hist["bins"])), hist["bins"], rotation=45, fontsize=8)
        target = "caption groups" if protocol == "multi_caption" else "texts"
        ax.set_xlabel(f"rank of the ground truth ({'caption → videos' if direction == 't2v' else f'video → {target}'})")
        ax.set_ylabel("queries")
        ax.set_title(direction, fontsize=10)
        note(
            ax,
            f"R@1 {metrics['R1']:.1f}  R@5 {metrics['R5']:.1f}  R@10 {metrics['R10']:.1f}\n"
            f"MdR {metrics['MdR']:.1f}  MnR {metrics['MnR']:.1f}  ({len(ranks[direction])} queries, "
            f"gallery {n_gallery[direction]})",
        )
    suffix = f", {_setting_text(setting)}" if setting else ""
    title = f"Rank of the ground truth — {head}{suffix} — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(out_dir, "rank_histogram", fig, data, title=title)


def _setting_text(setting: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())
