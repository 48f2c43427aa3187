"""GARE's gradient tension (Fig. 2, 4 and 7 of the GARE paper), measured on a checkpoint.

On batches of B aligned pairs drawn from a split (distinct videos per batch, one caption each; seeded), with the
head in eval mode (ψ without dropout), for the InfoNCE term of the loss (the paper's argument is about it; the Δ
regularisers are left out):

* **anchor gradients** (Fig. 2, 7): ∂L/∂t_i split into the positive pair's part g_ii, the summed negatives'
  Σ_j≠i g_ij and their sum (:mod:`tvr.analysis.gradients`), for the GARE loss and for the baseline loss on the same
  features — the same model without Δ, s_ij = cos(t_i, v^pool_ij);
* **increment gradients** (Fig. 4): ∂L/∂Δ_ij (= ∂L/∂t^Δ_ij on the text side): the positive Δ_ii's and the sum over the
  negatives' Δ_ij. Each Δ_ij is its own variable, so nothing cancels between them: Σ_j ‖∂L/∂Δ_ij‖ is the optimisation
  strength the increments keep, against ‖∂L/∂t_i‖ on the anchor.

Per dimension the mean and variance run over every anchor of every batch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tvr.analysis.figures import COLORS, FigureFiles, new_figure, note, split_label, write_figure
from tvr.analysis.gradients import PairGradients, cosine_rows, pair_gradients
from tvr.analysis.pairs import sample_pair_batches
from tvr.analysis.papers import GARE_PAPER, as_in
from tvr.analysis.summaries import describe, per_dimension
from tvr.losses import symmetric_infonce
from tvr.methods.gare.head import GareHead
from tvr.methods.gare.psi import gare_block, pooled_video
from tvr.types import TextFeatures, VideoFeatures


@dataclasses.dataclass
class GareBatchGradients:
    """One batch: per-pair anchor gradients under the GARE and the baseline loss, and ∂L/∂Δ [B, B, D]."""

    gare: PairGradients
    baseline: PairGradients
    delta: Tensor


def gare_batch_gradients(head: GareHead, text: TextFeatures, video: VideoFeatures) -> GareBatchGradients:
    """Gradients of one batch of aligned pairs (text k with video k), features as the head receives them."""
    opts = head.options
    text, video = head.encode_texts(text), head.encode_videos(video)
    scale = head.logit_scale.exp().detach()
    anchors = text.eot.detach()

    def gare_column(t: Tensor, j: int) -> Tensor:
        scores, _ = gare_block(head.psi, dataclasses.replace(text, eot=t), video[j : j + 1], opts)
        return scores[:, 0]

    def baseline_column(t: Tensor, j: int) -> Tensor:
        return cosine_rows(t.unsqueeze(1), pooled_video(t, video[j : j + 1], opts))[:, 0]

    gare = pair_gradients(gare_column, anchors, scale)
    baseline = pair_gradients(baseline_column, anchors, scale)
    with torch.enable_grad():
        leaf = anchors.clone().requires_grad_(True)
        scores, delta = gare_block(head.psi, dataclasses.replace(text, eot=leaf), video, opts)
        (delta_grad,) = torch.autograd.grad(symmetric_infonce(scale * scores), delta)
    return GareBatchGradients(gare, baseline, delta_grad.detach())


def _anchor_summary(parts: list[PairGradients]) -> dict[str, Any]:
    positive = torch.cat([p.positive for p in parts])
    negative = torch.cat([p.negative for p in parts])
    total = torch.cat([p.total for p in parts])
    cos = cosine_rows(positive, negative)
    ratio = total.norm(dim=-1) / positive.norm(dim=-1).clamp_min(1e-30)
    return {
        "positive": per_dimension(positive),
        "negative": per_dimension(negative),
        "total": per_dimension(total),
        "norms": {
            k: describe(v.norm(dim=-1)) for k, v in (("positive", positive), ("negative", negative), ("total", total))
        },
        "cos_positive_negative": {**describe(cos), "values": cos.tolist()},
        "total_over_positive": {**describe(ratio), "values": ratio.tolist()},
        "loss": float(np.mean([p.loss for p in parts])),
    }


def gare_gradient_tension(
    head: GareHead,
    text: TextFeatures,
    video: VideoFeatures,
    text_video: list[int] | Tensor,
    *,
    batch_size: int,
    num_batches: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """The statistics behind Fig. 2/4/7 over ``num_batches`` batches of a split's captions (``text``) and videos
    (``video``, after the temporal module; ``text_video`` maps captions to videos)."""
    was_training = head.training
    head.eval()
    try:
        batches = sample_pair_batches(text_video, batch_size, num_batches, seed)
        tv = torch.as_tensor(text_video).long()
        results = [gare_batch_gradients(head, text[idx], video[tv[idx]]) for idx in batches]
    finally:
        head.train(was_training)
    delta = [r.delta for r in results]
    delta_pos = torch.cat([d.diagonal(dim1=0, dim2=1).t() for d in delta])
    delta_neg = torch.cat([d.sum(dim=1) - d.diagonal(dim1=0, dim2=1).t() for d in delta])
    delta_strength = torch.cat([d.norm(dim=-1).sum(dim=1) for d in delta])
    return {
        "batch_size": int(batches[0].numel()),
        "num_batches": len(batches),
        "seed": seed,
        "logit_scale": float(head.logit_scale.detach().exp()),
        "corrected_side": head.options.corrected_side,
        "anchor": {
            "gare": _anchor_summary([r.gare for r in results]),
            "baseline": _anchor_summary([r.baseline for r in results]),
        },
        "delta": {
            "positive": per_dimension(delta_pos),
            "negative": per_dimension(delta_neg),
            "norms": {
                "positive": describe(delta_pos.norm(dim=-1)),
                "negative": describe(delta_neg.norm(dim=-1)),
                "sum_over_pairs": describe(delta_strength),
            },
        },
    }


# --------------------------------------------------------------------------------------------- figures


def _per_dim(ax: Any, stats: dict[str, list[float]], color: str, label: str) -> None:
    mean = np.asarray(stats["mean"])
    std = np.sqrt(np.asarray(stats["var"]))
    dims = np.arange(mean.size)
    ax.fill_between(dims, mean - std, mean + std, color=color, alpha=0.18, linewidth=0)
    ax.plot(dims, mean, color=color, linewidth=1.0, label=f"{label}: mean ± std")


def plot_gare_gradients(out_dir: Path, data: dict[str, Any], *, split: str) -> list[FigureFiles]:
    """Three figures from :func:`gare_gradient_tension`: the anchor's positive / negative / total gradient per
    dimension (GARE against the baseline loss), the increments' gradients, and how much the anchor's parts cancel."""
    where = split_label(split)
    common = {"split": split, **{k: data[k] for k in ("batch_size", "num_batches", "seed", "logit_scale")}}
    return [
        _plot_tension(out_dir, data, common, where),
        _plot_delta_gradients(out_dir, data, common, where),
        _plot_cancellation(out_dir, data, common, where),
    ]


def _plot_tension(out_dir: Path, data: dict[str, Any], common: dict[str, Any], where: str) -> FigureFiles:
    """The anchor's positive / negative / total gradient per dimension, GARE against the baseline loss."""
    fig, axes = new_figure(12, 6.5, 2, 2, sharex=True)
    for col, (key, name) in enumerate((("baseline", "baseline loss (same model, no Δ)"), ("gare", "GARE loss"))):
        anchor = data["anchor"][key]
        _per_dim(axes[0, col], anchor["positive"], COLORS["positive"], "positive g_ii")
        _per_dim(axes[0, col], anchor["negative"], COLORS["negative"], "summed negatives Σ_j≠i g_ij")
        _per_dim(axes[1, col], anchor["total"], COLORS["total"], "total ∂L/∂t_i")
        axes[0, col].set_title(name, fontsize=10)
        n = anchor["norms"]
        note(
            axes[1, col],
            f"mean ‖g_ii‖ {n['positive']['mean']:.3g}   mean ‖Σ neg‖ {n['negative']['mean']:.3g}   "
            f"mean ‖total‖ {n['total']['mean']:.3g}",
        )
        axes[1, col].set_xlabel("feature dimension")
    for row in range(2):
        lo = min(axes[row, c].get_ylim()[0] for c in range(2))
        hi = max(axes[row, c].get_ylim()[1] for c in range(2))
        for c in range(2):
            axes[row, c].set_ylim(lo, hi)
            axes[row, c].axhline(0.0, color="#999999", linewidth=0.6)
            axes[row, c].legend(loc="lower right", fontsize=7)
    axes[0, 0].set_ylabel("gradient on t_i (parts)")
    axes[1, 0].set_ylabel("gradient on t_i (sum)")
    title = (
        f"GARE gradient tension on the text anchors ({as_in('Fig. 2 and 7', GARE_PAPER)}) — "
        f"{data['num_batches']} batches of {data['batch_size']} — {where}"
    )
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(
        out_dir,
        "gare_gradient_tension",
        fig,
        {
            **common,
            "anchor": {
                k: {p: data["anchor"][k][p] for p in ("positive", "negative", "total", "norms", "loss")}
                for k in ("baseline", "gare")
            },
        },
        title=title,
    )


def _plot_delta_gradients(out_dir: Path, data: dict[str, Any], common: dict[str, Any], where: str) -> FigureFiles:
    """The gradients on the increments Δ and what reaches the anchor against them."""
    fig, axes = new_figure(12, 4.2, 1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    ax = axes[0, 0]
    _per_dim(ax, data["delta"]["positive"], COLORS["positive"], "positive ∂L/∂Δ_ii")
    _per_dim(ax, data["delta"]["negative"], COLORS["negative"], "summed negatives Σ_j≠i ∂L/∂Δ_ij")
    ax.axhline(0.0, color="#999999", linewidth=0.6)
    ax.set_xlabel("feature dimension")
    ax.set_ylabel("gradient on Δ")
    ax.legend(loc="lower right", fontsize=7)
    ax = axes[0, 1]
    bars = {
        "‖∂L/∂t_i‖\nbaseline": data["anchor"]["baseline"]["norms"]["total"]["mean"],
        "‖∂L/∂t_i‖\nGARE": data["anchor"]["gare"]["norms"]["total"]["mean"],
        "‖∂L/∂Δ_ii‖": data["delta"]["norms"]["positive"]["mean"],
        "Σ_j ‖∂L/∂Δ_ij‖": data["delta"]["norms"]["sum_over_pairs"]["mean"],
    }
    ax.bar(
        range(len(bars)),
        list(bars.values()),
        color=[COLORS["baseline"], COLORS["method"], COLORS["positive"], COLORS["total"]],
    )
    ax.set_xticks(range(len(bars)), list(bars), fontsize=8)
    ax.set_ylabel("mean over anchors")
    ax.set_title("what reaches the anchor vs the increments", fontsize=9)
    title = f"GARE: gradients on the increments Δ_ij ({as_in('Fig. 4', GARE_PAPER)}) — {where}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(
        out_dir, "gare_delta_gradients", fig, {**common, "delta": data["delta"], "bars": bars}, title=title
    )


def _plot_cancellation(out_dir: Path, data: dict[str, Any], common: dict[str, Any], where: str) -> FigureFiles:
    """How far the positive pull and the negatives' push cancel on each anchor."""
    fig, axes = new_figure(11, 4.0, 1, 2)
    edges_cos = np.linspace(-1.0, 1.0, 41)
    for key, color in (("baseline", COLORS["baseline"]), ("gare", COLORS["method"])):
        values = np.asarray(data["anchor"][key]["cos_positive_negative"]["values"])
        axes[0, 0].hist(
            values,
            bins=edges_cos,
            histtype="step",
            linewidth=1.5,
            color=color,
            label=f"{key} (mean {values.mean():.2f})",
        )
        ratio = np.asarray(data["anchor"][key]["total_over_positive"]["values"])
        axes[0, 1].hist(
            ratio, bins=40, histtype="step", linewidth=1.5, color=color, label=f"{key} (median {np.median(ratio):.2f})"
        )
    axes[0, 0].set_xlabel("cos(positive g_ii, summed negatives Σ_j≠i g_ij)")
    axes[0, 1].set_xlabel("‖∂L/∂t_i‖ / ‖g_ii‖  (small: the negatives cancel the pull)")
    for ax in axes[0]:
        ax.set_ylabel("anchors")
        ax.legend(fontsize=8)
    title = f"GARE: how far the positive pull and the negatives' push cancel on t_i — {where}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return write_figure(
        out_dir,
        "gare_gradient_cancellation",
        fig,
        {
            **common,
            **{
                key: {
                    "cos_positive_negative": data["anchor"][key]["cos_positive_negative"],
                    "total_over_positive": data["anchor"][key]["total_over_positive"],
                }
                for key in ("baseline", "gare")
            },
        },
        title=title,
    )
