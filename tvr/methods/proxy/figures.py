"""TV-ProxyNet's test-time proxies, measured on a checkpoint (the Text Proxy paper's appendix).

* **γ sweep**: R@1 of s_ij = cos(t_i, v_j) + γ·cos(t^p_ij, v_j) against γ on the analysed split, from one scoring
  pass (the head's score components). γ = 0 is the CLIP-ViP baseline score. A sweep on the test split is for reading
  only: choosing γ there is exactly the reference code's test-set selection the spec warns about (§0.2).
* **feature space** (appendix Fig. 5): q_ij = t_i/‖t_i‖ + γ·t^p_ij/‖t^p_ij‖, the video feature v_j and t_i in two
  dimensions (t-SNE or PCA, scikit-learn). With unit v_j the score is exactly q_ij·v_j, so q_ij is the text side of
  the pair's score.
* **query–proxy correlation** (appendix, the claim s(t_i, t^p_ii) ≤ s(t_i, t^p_ij)): the cosine between a caption and
  its positive proxy against its cosines with the proxies built for negative videos (a seeded sample).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.analysis import figures as plots
from tvr.analysis.context import FigureContext
from tvr.analysis.figures import FigureFiles, split_label
from tvr.analysis.pairs import sample_captions, sample_negatives
from tvr.analysis.papers import TEXT_PROXY_PAPER, as_in
from tvr.analysis.summaries import describe
from tvr.eval.protocol import evaluate
from tvr.methods.proxy.head import ProxyHead, ProxyTextState, ProxyVideoState

_EPS = 1e-12
EMBEDDINGS = ("tsne", "pca")


@torch.no_grad()
def gamma_sweep(
    head: ProxyHead,
    text: ProxyTextState,
    video: ProxyVideoState,
    text_video: Any,
    protocol: str,
    gammas: list[float] | None = None,
    tie_mode: str = "optimistic",
) -> dict[str, Any]:
    """t2v / v2t metrics for every γ (default: the head's γ grid, plus its stored γ), from one set of score
    components."""
    stored = head.gamma_value
    grid = sorted(set(gammas if gammas is not None else head.options.gamma_grid()) | {stored})
    components = head.score_components(text, video)
    rows = []
    for gamma in grid:
        metrics = evaluate(head.combine_scores(components, {"gamma": gamma}), text_video, protocol, tie_mode=tie_mode)
        rows.append({"gamma": gamma, "t2v": metrics["t2v"], "v2t": metrics["v2t"]})
    return {"stored_gamma": stored, "rows": rows}


@torch.no_grad()
def proxy_queries(head: ProxyHead, text: ProxyTextState, video: ProxyVideoState, gamma: float) -> dict[str, Tensor]:
    """q_ij = t̂_i + γ·t̂^p_ij for every text × video of the given (small) states: ``q`` [n_t, n_v, D], with ``t``
    [n_t, D] and ``v`` [n_v, D] the unit text and video features (head in eval mode)."""
    was_training = head.training
    head.eval()
    try:
        proxies = head.generator(text.emb, video.proxies)
    finally:
        head.train(was_training)
    q = F.normalize(text.emb, dim=-1, eps=_EPS)[:, None, :] + gamma * F.normalize(proxies, dim=-1, eps=_EPS)
    return {"q": q, "t": text.emb, "v": video.emb}


def embed_2d(points: Tensor, method: str = "tsne", seed: int = 0) -> np.ndarray:
    """[n, 2] coordinates of [n, D] points: t-SNE (perplexity min(30, (n − 1)/3), PCA initialisation) or PCA."""
    if method not in EMBEDDINGS:
        raise ValueError(f"embedding method {method!r}: expected one of {EMBEDDINGS}")
    x = points.detach().cpu().double().numpy()
    if x.shape[0] < 3:
        raise ValueError(f"a 2-D embedding needs at least 3 points, got {x.shape[0]}")
    if method == "pca":
        from sklearn.decomposition import PCA

        return PCA(n_components=2, random_state=seed).fit_transform(x)
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    perplexity = float(min(30.0, max(1.0, (x.shape[0] - 1) / 3.0)))
    # one OpenMP thread: for the few hundred points of a figure, a thread team only spins (measured on a busy
    # 2-core machine: 30 points 0.24 s single-threaded, 40 s with 2 threads; 800 points 17 s against 123 s)
    with threadpool_limits(limits=1, user_api="openmp"):
        return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x)


@torch.no_grad()
def proxy_query_correlation(
    head: ProxyHead,
    text: ProxyTextState,
    video: ProxyVideoState,
    text_video: Any,
    negatives_per_text: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """cos(t_i, t^p_{i,gt(i)}) for every caption and cos(t_i, t^p_ij) for ``negatives_per_text`` sampled negative
    videos j (head in eval mode, one generator call per caption)."""
    tv = torch.as_tensor(text_video).long()
    _, neg_videos = sample_negatives(tv, len(video), negatives_per_text, seed)
    per_text = neg_videos.numel() // max(tv.numel(), 1)
    neg_videos = neg_videos.view(tv.numel(), per_text)
    was_training = head.training
    head.eval()
    positive, negative = [], []
    try:
        for i in range(tv.numel()):
            columns = torch.cat([tv[i : i + 1], neg_videos[i]])
            t = text.emb[i : i + 1]
            tp = head.generator(t, video.proxies[columns.to(video.proxies.device)])[0]
            cos = F.normalize(tp, dim=-1, eps=_EPS) @ F.normalize(t[0], dim=-1, eps=_EPS)
            positive.append(float(cos[0]))
            negative.append(cos[1:].float().cpu())
    finally:
        head.train(was_training)
    pos = np.asarray(positive)
    neg = torch.stack(negative).numpy() if negative else np.zeros((0, 0))
    neg_mean = neg.mean(axis=1) if neg.size else np.full(pos.shape, np.nan)
    return {
        "negatives_per_text": per_text,
        "positive": pos.tolist(),
        "negative_mean": neg_mean.tolist(),
        "negative": neg.reshape(-1).tolist(),
        "fraction_positive_below_negative_mean": float(np.mean(pos <= neg_mean)) if neg.size else None,
    }


def display_gamma(head: ProxyHead) -> tuple[float, str]:
    """The γ to show q_ij at, and why: the checkpoint's, unless it is 0 (then q_ij = t_i for every video and the
    figure would show nothing of the proxies): the preset's ``gamma``, or 0.5."""
    stored = head.gamma_value
    if stored > 0:
        return stored, ""
    shown = head.options.gamma if head.options.gamma > 0 else 0.5
    return shown, f"the checkpoint's γ is 0, so its scores ignore the proxies; q shown at γ = {shown:g}"


def select_subset(
    text_video: Any, n_videos: int, max_videos: int = 16, captions_per_video: int = 3, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """(caption indices, video indices) of up to ``max_videos`` random videos and up to ``captions_per_video`` of
    each one's captions (seeded), for figures that show every pair of a small set."""
    tv = torch.as_tensor(text_video).long()
    generator = torch.Generator().manual_seed(seed)
    videos = torch.randperm(n_videos, generator=generator)[: min(max_videos, n_videos)].sort().values
    texts = [torch.nonzero(tv == v).flatten()[:captions_per_video] for v in videos]
    return torch.cat(texts) if texts else torch.zeros(0, dtype=torch.long), videos


# --------------------------------------------------------------------------------------------- figures


def plot_gamma_sweep(out_dir: Path, data: dict[str, Any], *, split: str) -> FigureFiles:
    gammas = [r["gamma"] for r in data["rows"]]
    fig, axes = plots.new_figure(11, 4.2, 1, 2, sharey=True)
    for ax, direction in zip(axes[0], ("t2v", "v2t"), strict=True):
        for key, style, width in (("R1", "-", 2.0), ("R5", "--", 1.0), ("R10", ":", 1.0)):
            ax.plot(
                gammas,
                [r[direction][key] for r in data["rows"]],
                linestyle=style,
                linewidth=width,
                marker="o",
                markersize=3 if key == "R1" else 2,
                color=plots.COLORS["method"],
                label=key.replace("R", "R@"),
            )
        ax.axvline(
            data["stored_gamma"],
            color=plots.COLORS["after"],
            linestyle="--",
            linewidth=1,
            label=f"γ in the checkpoint = {data['stored_gamma']:g}",
        )
        ax.set_title(direction, fontsize=10)
        ax.set_xlabel("γ   (score = cos(t, v) + γ·cos(t^p, v); γ = 0: CLIP-ViP baseline)")
        ax.legend(fontsize=7, loc="center right")
    axes[0, 0].set_ylabel("recall (%)")
    if split != "val":
        plots.note(axes[0, 0], f"measured on the {split} split: do not pick γ from this curve")
    title = f"TV-ProxyNet: recall against γ — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    rows = [{"split": split, "gamma": r["gamma"], "direction": d, **r[d]} for r in data["rows"] for d in ("t2v", "v2t")]
    return plots.write_figure(
        out_dir,
        "proxy_gamma_sweep",
        fig,
        {"split": split, "for_model_selection": split == "val", **data},
        title=title,
        rows=rows,
    )


def plot_feature_space(
    out_dir: Path,
    queries: dict[str, Tensor],
    coords: np.ndarray,
    *,
    gamma: float,
    method: str,
    split: str,
    video_ids: list[str],
    text_rows: list[int],
    text_video: list[int],
    gamma_note: str = "",
) -> FigureFiles:
    n_t, n_v = queries["q"].shape[:2]
    q_xy, v_xy, t_xy = coords[: n_t * n_v], coords[n_t * n_v : n_t * n_v + n_v], coords[n_t * n_v + n_v :]
    positive = np.asarray([[text_video[i] == j for j in range(n_v)] for i in range(n_t)]).reshape(-1)
    fig, axes = plots.new_figure(9, 7)
    ax = axes[0, 0]
    ax.scatter(q_xy[~positive, 0], q_xy[~positive, 1], s=8, alpha=0.45, color=plots.COLORS["q"], label="q_ij (j ≠ gt)")
    ax.scatter(q_xy[positive, 0], q_xy[positive, 1], s=22, marker="^", color="#7f1d1d", label="q_ij (j = gt)")
    ax.scatter(
        v_xy[:, 0], v_xy[:, 1], s=60, marker="s", color=plots.COLORS["video"], edgecolor="white", label="video v_j"
    )
    ax.scatter(
        t_xy[:, 0], t_xy[:, 1], s=40, marker="D", color=plots.COLORS["text"], edgecolor="white", label="text t_i"
    )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=8, loc="best")
    plots.note(ax, f"{n_t} captions × {n_v} videos, γ = {gamma:g}" + (f"\n{gamma_note}" if gamma_note else ""))
    title = (
        f"TV-ProxyNet feature space ({method.upper()}; {as_in('appendix Fig. 5', TEXT_PROXY_PAPER)}) — "
        f"{split_label(split)}"
    )
    fig.suptitle(title, fontsize=10, wrap=True)
    data = {
        "split": split,
        "method": method,
        "gamma": gamma,
        "gamma_note": gamma_note,
        "video_ids": video_ids,
        "text_rows": text_rows,
        "q": {
            "xy": q_xy.tolist(),
            "text": np.repeat(np.arange(n_t), n_v).tolist(),
            "video": np.tile(np.arange(n_v), n_t).tolist(),
            "positive": positive.tolist(),
        },
        "video": {"xy": v_xy.tolist()},
        "text": {"xy": t_xy.tolist(), "gt_video": list(text_video)},
    }
    return plots.write_figure(out_dir, "proxy_feature_space", fig, data, title=title)


def plot_query_correlation(out_dir: Path, data: dict[str, Any], *, split: str) -> FigureFiles:
    fig, axes = plots.new_figure(11, 4.4, 1, 2)
    pos, neg_mean = np.asarray(data["positive"]), np.asarray(data["negative_mean"])
    ax = axes[0, 0]
    ax.scatter(pos, neg_mean, s=10, alpha=0.6, color=plots.COLORS["method"])
    lo = float(np.nanmin(np.concatenate([pos, neg_mean]))) if pos.size else 0.0
    hi = float(np.nanmax(np.concatenate([pos, neg_mean]))) if pos.size else 1.0
    ax.plot([lo, hi], [lo, hi], color="#666666", linestyle="--", linewidth=0.8, label="y = x")
    ax.set_xlabel("s(t_i, t^p_ii)   (positive proxy)")
    ax.set_ylabel(f"mean_j s(t_i, t^p_ij)   ({data['negatives_per_text']} negative proxies)")
    frac = data["fraction_positive_below_negative_mean"]
    plots.note(
        ax, f"above the line (paper's claim): {100 * frac:.0f}% of captions" if frac is not None else "no negatives"
    )
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[0, 1]
    series = {"positive": pos, "negative": np.asarray(data["negative"])}
    plots.hist_overlay(ax, series, plots.shared_edges(*series.values()), plots.COLORS)
    ax.set_xlabel("cosine between a caption and a proxy built from it")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    title = f"TV-ProxyNet: is the positive proxy less correlated with its query? — {split_label(split)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    return plots.write_figure(
        out_dir,
        "proxy_query_correlation",
        fig,
        {
            "split": split,
            **data,
            "positive_summary": describe(pos),
            "negative_summary": describe(np.asarray(data["negative"])),
        },
        title=title,
    )


def write_figures(context: FigureContext) -> list[FigureFiles]:
    """The γ sweep, the feature space of q_ij and the query–proxy correlation, for the checkpoint's TV-ProxyNet
    head (``ProxyHead.analysis_figures``)."""
    head, options, tv, encoded = context.head, context.options, context.text_video, context.encoded
    text_state, video_state, out, split = context.text_state, context.video_state, context.out, context.split
    sweep = gamma_sweep(head, text_state, video_state, tv, encoded.protocol, tie_mode=context.cfg.eval.tie_mode)
    figures = [plot_gamma_sweep(out, sweep, split=split)]
    rows, cols = select_subset(tv, len(video_state), seed=options.seed)
    gamma, gamma_note = display_gamma(head)
    queries = proxy_queries(head, text_state[rows], video_state[cols], gamma)
    dim = queries["q"].shape[-1]
    points = torch.cat([queries["q"].reshape(-1, dim), queries["v"], queries["t"]]).float().cpu()
    coords = embed_2d(points, options.embedding, options.seed)
    position = {int(v): k for k, v in enumerate(cols)}
    figures.append(
        plot_feature_space(
            out,
            queries,
            coords,
            gamma=gamma,
            method=options.embedding,
            split=split,
            video_ids=[encoded.video_ids[int(v)] for v in cols],
            text_rows=rows.tolist(),
            text_video=[position[int(tv[r])] for r in rows],
            gamma_note=gamma_note,
        )
    )
    sample = sample_captions(tv.numel(), options.max_captions, options.seed)
    correlation = proxy_query_correlation(
        head, text_state[sample], video_state, tv[sample], options.negatives_per_text, options.seed
    )
    figures.append(plot_query_correlation(out, correlation, split=split))
    return figures
