"""GraviAlign's uncertainty, measured on a checkpoint (the GraviAlign summary: "uncertainty that tracks ambiguity").

* σ̄² = mean_k σ_k², the per-sample mean variance of a caption's (or a video's) Gaussian, against the caption's
  length in BPE tokens (SOT/EOT excluded, after truncation to ``data.max_words``) and against the ground truth's
  retrieval rank under the checkpoint's inference mode (Spearman correlations beside each panel);
* the three score terms A (gravitation), B (Mahalanobis) and C (volume) of S_align on positive pairs and on a seeded
  sample of negatives;
* every inference mode (cos_f, cos_mu, s_align, mixed at each configured w) on the same states, the checkpoint's
  chosen mode marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tvr.analysis import figures as plots
from tvr.analysis.context import FigureContext
from tvr.analysis.figures import FigureFiles, split_label
from tvr.analysis.pairs import sample_captions, sample_negatives
from tvr.analysis.similarity import protocol_ranks
from tvr.analysis.summaries import describe, spearman
from tvr.eval.protocol import evaluate
from tvr.methods.gravialign.head import MODES, GraviAlignHead, GraviState
from tvr.methods.gravialign.losses import sgi_align_terms
from tvr.types import TextFeatures

#: texts scored at once when building the full S_align matrix
TEXT_CHUNK = 256


def mean_variance(state: GraviState) -> Tensor:
    """σ̄² = mean_k exp(log σ_k²) of every item: [N]."""
    return state.logvar.detach().float().exp().mean(dim=-1).cpu()


def caption_lengths(text: TextFeatures) -> Tensor | None:
    """BPE tokens of each caption without SOT and EOT (from the word mask; ``None`` when the features carry none)."""
    if text.word_mask is None:
        return None
    return (text.word_mask.float().sum(dim=1) - 2).clamp_min(0).cpu()


def uncertainty_vs_ambiguity(
    text: GraviState, video: GraviState, sim: Tensor, text_video: Any, protocol: str, lengths: Tensor | None
) -> dict[str, Any]:
    """σ̄² of captions and videos beside caption length and GT rank (``sim``: the evaluated score matrix)."""
    ranks = protocol_ranks(sim, text_video, protocol)
    sigma_t, sigma_v = mean_variance(text), mean_variance(video)
    out: dict[str, Any] = {
        "text_mean_variance": sigma_t.tolist(),
        "video_mean_variance": sigma_v.tolist(),
        "t2v_rank": ranks["t2v"].tolist(),
        "spearman_text_variance_vs_t2v_rank": spearman(sigma_t, ranks["t2v"]),
        "text_variance": describe(sigma_t),
        "video_variance": describe(sigma_v),
    }
    # v2t queries are the videos (one-to-one / paragraph: ranking every caption; multi-caption: every caption group)
    out["v2t_rank"] = ranks["v2t"].tolist()
    out["spearman_video_variance_vs_v2t_rank"] = spearman(sigma_v, ranks["v2t"])
    if lengths is not None:
        out["caption_length"] = lengths.tolist()
        out["spearman_text_variance_vs_length"] = spearman(sigma_t, lengths)
    return out


@torch.no_grad()
def sgi_term_distributions(
    head: GraviAlignHead,
    text: GraviState,
    video: GraviState,
    text_video: Any,
    negatives_per_text: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """Values of each enabled term (A, B, C) of S_align on every positive pair and sampled negative pairs."""
    tv = torch.as_tensor(text_video).long()
    neg_t, neg_v = sample_negatives(tv, len(video), negatives_per_text, seed)
    out: dict[str, Any] = {"terms": head.options.terms, "negatives_per_text": negatives_per_text}
    for kind, ti, vi in (("positive", torch.arange(tv.numel()), tv), ("negative", neg_t, neg_v)):
        t, v = text[ti.to(text.mu.device)], video[vi.to(video.mu.device)]
        parts = sgi_align_terms(v.mu, v.logvar, t.mu, t.logvar, params=head.sgi)
        out[kind] = {name: values.float().cpu().tolist() for name, values in parts.items()}
    return out


@torch.no_grad()
def mode_comparison(
    head: GraviAlignHead,
    text: GraviState,
    video: GraviState,
    text_video: Any,
    protocol: str,
    tie_mode: str = "optimistic",
) -> dict[str, Any]:
    """Metrics of every inference mode (mixed at each configured w) from one set of score components, whatever
    ``select_modes`` the checkpoint was trained with."""
    s_align = torch.cat(
        [head.s_align_block(text[a : a + TEXT_CHUNK], video).float() for a in range(0, len(text), TEXT_CHUNK)]
    ).cpu()
    components = {
        "cos_f": (text.f @ video.f.T).float().cpu(),
        "cos_mu": (text.mu @ video.mu.T).float().cpu(),
        "s_align": s_align,
    }
    settings: list[dict[str, Any]] = [{"mode": m} for m in MODES if m != "mixed"]
    settings += [{"mode": "mixed", "w": float(w)} for w in dict.fromkeys(head.options.mixed_weights)]
    chosen = head.inference_setting()
    if chosen not in settings:
        settings.append(chosen)
    rows = []
    for setting in settings:
        metrics = evaluate(head.combine_scores(components, setting), text_video, protocol, tie_mode=tie_mode)
        rows.append({"setting": setting, "chosen": setting == chosen, "t2v": metrics["t2v"], "v2t": metrics["v2t"]})
    return {"chosen": chosen, "rows": rows}


# --------------------------------------------------------------------------------------------- figures


def _binned_median(ax: Any, x: np.ndarray, y: np.ndarray, edges: np.ndarray, color: str) -> None:
    centres, medians = [], []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (x >= lo) & (x < hi)
        if inside.sum() >= 3:
            centres.append(np.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2)
            medians.append(np.median(y[inside]))
    if centres:
        ax.plot(centres, medians, color=color, linewidth=2, marker="o", markersize=4, label="binned median")


def _rho(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def plot_uncertainty(out_dir: Path, data: dict[str, Any], *, split: str, mode: dict) -> FigureFiles:
    has_length = "caption_length" in data
    fig, axes = plots.new_figure(15 if has_length else 10.5, 4.3, 1, 3 if has_length else 2)
    panels = list(axes[0])
    sigma_t = np.asarray(data["text_mean_variance"])
    if has_length:
        ax = panels.pop(0)
        length = np.asarray(data["caption_length"])
        jitter = np.random.default_rng(0).uniform(-0.2, 0.2, length.size)
        ax.scatter(length + jitter, sigma_t, s=8, alpha=0.45, color=plots.COLORS["text"], label="captions")
        _binned_median(ax, length, sigma_t, np.arange(length.min() - 0.5, length.max() + 1.5, 1.0), "#1b4332")
        ax.set_xlabel("caption length (BPE tokens, after truncation)")
        ax.set_ylabel("caption σ̄² (mean variance)")
        plots.note(ax, f"Spearman ρ = {_rho(data.get('spearman_text_variance_vs_length'))}")
        ax.legend(fontsize=7, loc="lower right")
    for ax, (who, rank_key, rho_key, color) in zip(
        panels,
        (
            ("caption", "t2v_rank", "spearman_text_variance_vs_t2v_rank", plots.COLORS["text"]),
            ("video", "v2t_rank", "spearman_video_variance_vs_v2t_rank", plots.COLORS["video"]),
        ),
        strict=True,
    ):
        sigma = sigma_t if who == "caption" else np.asarray(data["video_mean_variance"])
        rank = np.asarray(data[rank_key], dtype=np.float64)
        ax.scatter(rank, sigma, s=8, alpha=0.45, color=color, label=f"{who}s")
        edges = np.unique(np.geomspace(1, max(rank.max(), 2) + 1, 12).round())
        _binned_median(ax, rank, sigma, edges, "#222222")
        ax.set_xscale("log")
        ax.set_xlabel(f"rank of the ground truth ({'t2v' if who == 'caption' else 'v2t'})")
        ax.set_ylabel(f"{who} σ̄²")
        plots.note(ax, f"Spearman ρ = {_rho(data.get(rho_key))}")
        ax.legend(fontsize=7, loc="lower right")
    mode_text = ", ".join(f"{k}={v}" for k, v in mode.items())
    title = f"GraviAlign: uncertainty against caption length and retrieval rank ({mode_text}) — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return plots.write_figure(
        out_dir, "gravialign_uncertainty", fig, {"split": split, "inference_setting": mode, **data}, title=title
    )


def plot_terms(out_dir: Path, data: dict[str, Any], *, split: str) -> FigureFiles:
    names = [n for n in "ABC" if n in data["positive"]]
    fig, axes = plots.new_figure(4.6 * len(names), 4.0, 1, len(names))
    labels = {
        "A": "A = (G/T)·m_v·m_t / d  (gravitation)",
        "B": "B = −½ q  (Mahalanobis)",
        "C": "C = −½ log|Σ_v + Σ_t|  (volume)",
    }
    summary = {}
    for ax, name in zip(axes[0], names, strict=True):
        series = {"positive": np.asarray(data["positive"][name]), "negative": np.asarray(data["negative"][name])}
        plots.hist_overlay(ax, series, plots.shared_edges(*series.values()), plots.COLORS)
        ax.set_xlabel(labels[name])
        ax.set_ylabel("density")
        ax.legend(fontsize=7)
        summary[name] = {k: describe(v) for k, v in series.items()}
    title = f"GraviAlign: the terms of S_align on positive and negative pairs — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return plots.write_figure(
        out_dir, "gravialign_terms", fig, {"split": split, "summary": summary, **data}, title=title
    )


def plot_modes(out_dir: Path, data: dict[str, Any], *, split: str) -> FigureFiles:
    rows = data["rows"]
    labels = [r["setting"]["mode"] + (f"\nw={r['setting']['w']:g}" if "w" in r["setting"] else "") for r in rows]
    fig, axes = plots.new_figure(max(7.5, 1.1 * len(rows) + 2), 4.4, 1, 2, sharey=True)
    x = np.arange(len(rows))
    for ax, direction in zip(axes[0], ("t2v", "v2t"), strict=True):
        for offset, key, alpha in ((-0.27, "R1", 1.0), (0.0, "R5", 0.65), (0.27, "R10", 0.35)):
            colors = [plots.COLORS["after"] if r["chosen"] else plots.COLORS["method"] for r in rows]
            ax.bar(
                x + offset,
                [r[direction][key] for r in rows],
                width=0.26,
                color=colors,
                alpha=alpha,
                label=key.replace("R", "R@"),
            )
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_title(direction, fontsize=10)
        ax.set_ylim(0, 118)  # room for the legend above the bars
        ax.legend(fontsize=7, loc="upper center", ncols=3)
    axes[0, 0].set_ylabel("recall (%)")
    chosen = ", ".join(f"{k}={v}" for k, v in data["chosen"].items())
    title = (
        f"GraviAlign: inference modes on the same checkpoint (red: the stored choice, {chosen}) — {split_label(split)}"
    )
    fig.suptitle(title, fontsize=10, wrap=True)
    csv_rows = [
        {"split": split, "setting": label.replace("\n", " "), "chosen": r["chosen"], "direction": d, **r[d]}
        for label, r in zip(labels, rows, strict=True)
        for d in ("t2v", "v2t")
    ]
    return plots.write_figure(out_dir, "gravialign_modes", fig, {"split": split, **data}, title=title, rows=csv_rows)


def write_figures(context: FigureContext) -> list[FigureFiles]:
    """Uncertainty against caption length and rank, the S_align terms and the inference modes, for the checkpoint's
    GraviAlign head (``GraviAlignHead.analysis_figures``)."""
    head, options, tv, encoded = context.head, context.options, context.text_video, context.encoded
    text_state, video_state, out, split = context.text_state, context.video_state, context.out, context.split
    sample = sample_captions(tv.numel(), options.max_captions, options.seed)
    uncertainty = uncertainty_vs_ambiguity(
        text_state, video_state, context.sim, tv, encoded.protocol, caption_lengths(encoded.text)
    )
    terms = sgi_term_distributions(
        head, text_state[sample], video_state, tv[sample], options.negatives_per_text, options.seed
    )
    modes = mode_comparison(head, text_state, video_state, tv, encoded.protocol, tie_mode=context.cfg.eval.tie_mode)
    return [
        plot_uncertainty(out, uncertainty, split=split, mode=head.inference_setting()),
        plot_terms(out, terms, split=split),
        plot_modes(out, modes, split=split),
    ]
