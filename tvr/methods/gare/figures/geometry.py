"""GARE's increments at inference: the geometry of Δ (Fig. 3 of the GARE paper) and hard negatives before and after
it (Fig. 6).

"Before Δ" is the same checkpoint scored without its increments, s_ij = cos(t_i, v^pool_ij) (the spec's reading of
the paper's baseline, §3.1) — not a separately trained baseline; analyse a CLIP4Clip checkpoint for that.

Notation follows the corrected side: the anchor a is the item Δ is added to (t_i on the text side, v^pool_ij on the
video side) and b the other one, so the score is cos(a + Δ_ij, b). Per pair: the cosine before / after, ‖a‖ against
‖a + Δ‖, the distance ‖a − b‖ against ‖a + Δ − b‖ and the angle between Δ_ij and b − a (the direction that would
close the pair's gap). Positive pairs are every caption with its video; negatives a seeded sample per caption.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.analysis import figures as plots
from tvr.analysis.figures import FigureFiles, split_label
from tvr.analysis.papers import GARE_PAPER, as_in
from tvr.analysis.summaries import describe
from tvr.methods.clip4clip.head import text_softmax_scores
from tvr.methods.gare.head import GareHead
from tvr.methods.gare.psi import gare_pair_features, video_mean
from tvr.types import TextFeatures, VideoFeatures

#: pairs whose Δ is computed at once (each holds a few D-vectors and ψ's per-pair attention)
PAIR_CHUNK = 2048
#: texts per block when scoring every pair without Δ
TEXT_CHUNK = 256
_EPS = 1e-12


def delta_geometry(anchor: Tensor, delta: Tensor, target: Tensor) -> dict[str, Tensor]:
    """Per pair (rows of [P, D] inputs): ``cos_before`` cos(a, b), ``cos_after`` cos(a + Δ, b), ``norm_before`` ‖a‖,
    ``norm_after`` ‖a + Δ‖, ``dist_before`` ‖a − b‖, ``dist_after`` ‖a + Δ − b‖ and ``angle`` ∠(Δ, b − a) in
    degrees; each [P]."""
    corrected = anchor + delta
    gap = target - anchor

    def cos(x: Tensor, y: Tensor) -> Tensor:
        return ((x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1)).clamp_min(_EPS)).clamp(-1.0, 1.0)

    return {
        "cos_before": cos(anchor, target),
        "cos_after": cos(corrected, target),
        "norm_before": anchor.norm(dim=-1),
        "norm_after": corrected.norm(dim=-1),
        "dist_before": gap.norm(dim=-1),
        "dist_after": (corrected - target).norm(dim=-1),
        "angle": torch.rad2deg(torch.arccos(cos(delta, gap))),
    }


@torch.no_grad()
def gare_pair_geometry(
    head: GareHead, text: TextFeatures, video: VideoFeatures, text_index: Tensor, video_index: Tensor
) -> dict[str, Tensor]:
    """:func:`delta_geometry` of the pairs (text_index[p], video_index[p]) with the head's own Δ and v^pool
    (eval mode: ψ without dropout). ``text`` / ``video`` are the head's states (``encode_texts`` /
    ``encode_videos``)."""
    was_training = head.training
    head.eval()
    parts: list[dict[str, Tensor]] = []
    try:
        for a in range(0, int(text_index.numel()), PAIR_CHUNK):
            ti, vi = text_index[a : a + PAIR_CHUNK], video_index[a : a + PAIR_CHUNK]
            t, v = text[ti], video[vi]
            delta, pooled = gare_pair_features(head.psi, t, v, head.options)
            anchor, target = (t.eot, pooled) if head.options.corrected_side == "text" else (pooled, t.eot)
            parts.append(delta_geometry(anchor.float(), delta.float(), target.float()))
    finally:
        head.train(was_training)
    return {k: torch.cat([p[k] for p in parts]).cpu() for k in parts[0]} if parts else {}


@torch.no_grad()
def gare_scores_without_delta(head: GareHead, text: TextFeatures, video: VideoFeatures) -> Tensor:
    """cos(t_i, v^pool_ij) for every pair, [N_t, N_v]: the checkpoint's score with Δ left out. The text-conditioned
    pooling is scored through the per-video Gram (no per-pair D-vector), a block of texts at a time."""
    opts = head.options
    t = text.eot.float()
    if opts.video_pool == "mean":
        return (
            F.normalize(t, dim=-1, eps=_EPS)
            @ F.normalize(video_mean(video, opts.mask_frames).float(), dim=-1, eps=_EPS).t()
        ).cpu()
    frames = video.frames.float()
    gram = torch.einsum("nfd,ngd->nfg", frames, frames)
    mask = video.frame_mask.float()
    return torch.cat(
        [
            text_softmax_scores(t[a : a + TEXT_CHUNK], frames, mask, gram, opts.pool_temperature)
            for a in range(0, t.shape[0], TEXT_CHUNK)
        ]
    ).cpu()


def hard_negative_alignment(before: Tensor, after: Tensor, text_video: Any, k: int = 10) -> dict[str, Any]:
    """For every caption, its ``k`` hardest negatives by the score *before* Δ; their scores before and after Δ.

    Returns per hard-negative rank r = 1..k the mean and std over captions of s(i, hard_r) before and after, the
    positive's mean before and after, the gap s(i, gt) − s(i, hard_1) per caption, and the spread (std over the k)
    of each caption's hard-negative scores."""
    before, after = torch.as_tensor(before).float(), torch.as_tensor(after).float()
    tv = torch.as_tensor(text_video).long()
    n_t, n_v = before.shape
    k = min(k, n_v - 1)
    if k < 1:
        raise ValueError("hard_negative_alignment needs at least 2 videos")
    rows = torch.arange(n_t)
    masked = before.clone()
    masked[rows, tv] = float("-inf")
    hard = masked.topk(k, dim=1).indices  # [N_t, k], by the score before Δ
    hb, ha = before.gather(1, hard), after.gather(1, hard)
    pb, pa = before[rows, tv], after[rows, tv]
    return {
        "k": k,
        "rank": list(range(1, k + 1)),
        "before": {
            "mean": hb.mean(0).tolist(),
            "std": hb.std(0, unbiased=False).tolist(),
            "positive_mean": float(pb.mean()),
            "gap_to_hardest": (pb - hb[:, 0]).tolist(),
            "spread": hb.std(1, unbiased=False).tolist() if k > 1 else [0.0] * n_t,
        },
        "after": {
            "mean": ha.mean(0).tolist(),
            "std": ha.std(0, unbiased=False).tolist(),
            "positive_mean": float(pa.mean()),
            "gap_to_hardest": (pa - ha[:, 0]).tolist(),
            "spread": ha.std(1, unbiased=False).tolist() if k > 1 else [0.0] * n_t,
        },
    }


# --------------------------------------------------------------------------------------------- figures


def plot_delta_geometry(
    out_dir: Path,
    positive: dict[str, Tensor],
    negative: dict[str, Tensor],
    *,
    split: str,
    side: str,
    negatives_per_text: int,
) -> FigureFiles:
    a, b = ("t", "v") if side == "text" else ("v", "t")
    fig, axes = plots.new_figure(14, 7.5, 2, 3)
    before_after = {"before Δ": plots.COLORS["before"], "after Δ": plots.COLORS["after"]}

    def pair(ax: Any, key: str, sample: dict[str, Tensor], xlabel: str) -> None:
        series = {"before Δ": sample[f"{key}_before"].numpy(), "after Δ": sample[f"{key}_after"].numpy()}
        plots.hist_overlay(ax, series, plots.shared_edges(*series.values()), before_after)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("density")
        ax.legend(fontsize=7)

    pair(axes[0, 0], "cos", positive, f"cos({a}, {b}) vs cos({a} + Δ, {b}), positive pairs")
    axes[0, 0].set_title("(a) cosine of positive pairs", fontsize=9)
    pair(axes[0, 1], "norm", negative, f"‖{a}‖ vs ‖{a} + Δ‖, negative pairs")
    axes[0, 1].set_title("(b) norms on negative pairs", fontsize=9)
    pair(axes[0, 2], "norm", positive, f"‖{a}‖ vs ‖{a} + Δ‖, positive pairs")
    axes[0, 2].set_title("(c) norms on positive pairs", fontsize=9)
    ax = axes[1, 0]
    for label, sample, kind in (("negative", negative, "negative"), ("positive", positive, "positive")):
        ax.scatter(
            sample["dist_before"].numpy(),
            sample["dist_after"].numpy(),
            s=4,
            alpha=0.35,
            color=plots.COLORS[kind],
            label=f"{label} pairs",
            rasterized=True,
        )
    lims = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
    ax.plot(lims, lims, color="#666666", linewidth=0.8, linestyle="--", label="y = x")
    ax.set_xlabel(f"‖{a} − {b}‖")
    ax.set_ylabel(f"‖{a} + Δ − {b}‖")
    ax.set_title("(d) distance shift", fontsize=9)
    ax.legend(fontsize=7, markerscale=3)
    ax = axes[1, 1]
    series = {"positive": positive["angle"].numpy(), "negative": negative["angle"].numpy()}
    plots.hist_overlay(ax, series, np.linspace(0, 180, 37), plots.COLORS)
    ax.axvline(90, color="#666666", linewidth=0.8, linestyle="--")
    ax.set_xlabel(f"angle between Δ_ij and {b} − {a} (degrees)")
    ax.set_ylabel("density")
    ax.set_title("(e) direction of Δ against the pair's gap", fontsize=9)
    ax.legend(fontsize=7)
    pair(axes[1, 2], "cos", negative, f"cos({a}, {b}) vs cos({a} + Δ, {b}), negative pairs")
    axes[1, 2].set_title("(f) cosine of negative pairs", fontsize=9)
    title = f"GARE: geometry of the increments Δ ({as_in('Fig. 3', GARE_PAPER)}) — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    data = {
        "split": split,
        "corrected_side": side,
        "anchor": a,
        "other": b,
        "negatives_per_text": negatives_per_text,
        "positive": {k: describe(v) for k, v in positive.items()},
        "negative": {k: describe(v) for k, v in negative.items()},
        "values": {
            "positive": {k: v.tolist() for k, v in positive.items()},
            "negative": {k: v.tolist() for k, v in negative.items()},
        },
    }
    return plots.write_figure(out_dir, "gare_delta_geometry", fig, data, title=title)


def plot_hard_negatives(out_dir: Path, data: dict[str, Any], *, split: str) -> FigureFiles:
    fig, axes = plots.new_figure(12, 4.2, 1, 2)
    ax = axes[0, 0]
    ranks = np.asarray(data["rank"])
    for key, label in (("before", "before Δ"), ("after", "after Δ")):
        mean, std = np.asarray(data[key]["mean"]), np.asarray(data[key]["std"])
        color = plots.COLORS[key]
        ax.plot(ranks, mean, marker="o", markersize=3, color=color, label=f"hard negatives, {label}")
        ax.fill_between(ranks, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
        ax.axhline(data[key]["positive_mean"], color=color, linestyle="--", linewidth=1, label=f"positive, {label}")
    ax.set_xlabel("hard-negative rank (by the score before Δ)")
    ax.set_ylabel("score (mean ± std over captions)")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    series = {
        "before Δ": np.asarray(data["before"]["gap_to_hardest"]),
        "after Δ": np.asarray(data["after"]["gap_to_hardest"]),
    }
    plots.hist_overlay(
        ax,
        series,
        plots.shared_edges(*series.values()),
        {"before Δ": plots.COLORS["before"], "after Δ": plots.COLORS["after"]},
    )
    ax.axvline(0.0, color="#666666", linewidth=0.8, linestyle="--")
    ax.set_xlabel("s(i, gt) − s(i, hardest negative)   (> 0: the positive wins)")
    ax.set_ylabel("density")
    ax.legend(fontsize=7)
    spread_b, spread_a = np.mean(data["before"]["spread"]), np.mean(data["after"]["spread"])
    plots.note(
        ax, f"mean spread of the {data['k']} hard negatives' scores:\nbefore {spread_b:.4f}, after {spread_a:.4f}"
    )
    title = f"GARE: hard negatives before and after Δ ({as_in('Fig. 6', GARE_PAPER)}) — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return plots.write_figure(out_dir, "gare_hard_negatives", fig, {"split": split, **data}, title=title)
