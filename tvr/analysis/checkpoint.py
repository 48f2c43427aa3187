"""The analyses of one checkpoint on one encoded split (``tvr analyze``): the figures every head gets, then its
method's own, with ``analysis.json`` listing what was written.

Every head: the score distributions of positive and negative pairs and the rank histogram (:mod:`.similarity`).
GARE: gradient tension (:mod:`.gare_gradients`), Δ geometry and hard negatives (:mod:`.gare_geometry`).
TV-ProxyNet: the γ sweep, the feature space of q_ij and the query–proxy correlation (:mod:`.proxy`).
GraviAlign: uncertainty against length and rank, the score terms, the inference modes (:mod:`.gravialign`).

Scores use the head's stored inference setting (the γ or mode chosen on validation and saved with the checkpoint)
and ``eval.*`` of the config (two-stage scoring with ``eval.rerank_k``, the tie mode), as ``tvr eval`` does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from tvr.analysis.figures import FigureFiles, split_label
from tvr.analysis.gare_geometry import (
    gare_pair_geometry,
    gare_scores_without_delta,
    hard_negative_alignment,
    plot_delta_geometry,
    plot_hard_negatives,
)
from tvr.analysis.gare_gradients import gare_gradient_tension, plot_gare_gradients
from tvr.analysis.gravialign import (
    caption_lengths,
    mode_comparison,
    plot_modes,
    plot_terms,
    plot_uncertainty,
    sgi_term_distributions,
    uncertainty_vs_ambiguity,
)
from tvr.analysis.pairs import sample_captions, sample_negatives
from tvr.analysis.proxy import (
    display_gamma,
    embed_2d,
    gamma_sweep,
    plot_feature_space,
    plot_gamma_sweep,
    plot_query_correlation,
    proxy_queries,
    proxy_query_correlation,
    select_subset,
)
from tvr.analysis.similarity import plot_rank_histogram, plot_score_distributions
from tvr.config import Config
from tvr.eval.protocol import evaluate
from tvr.eval.runner import EncodedSplit, score_matrices
from tvr.models.heads.gare import GareHead
from tvr.models.heads.gravialign import GraviAlignHead
from tvr.models.heads.proxy import ProxyHead
from tvr.models.model import RetrievalModel
from tvr.utils.io import atomic_write_json

MANIFEST = "analysis.json"


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
    """How much each analysis reads. ``negatives_per_text``: sampled negative pairs per caption (Δ geometry,
    proxy correlation, S_align terms); ``gradient_batches``: batches of the gradient analysis (each of
    ``train.batch_size`` pairs, fewer when the split has fewer videos); ``embedding``: tsne | pca;
    ``hard_negatives``: k of the hard-negative figure; ``max_captions``: the analyses of sampled pairs (Δ geometry,
    query-proxy correlation, S_align terms) read at most this many captions (a seeded sample on larger splits);
    ``seed``: every sample drawn."""

    negatives_per_text: int = 10
    max_captions: int = 2000
    gradient_batches: int = 8
    embedding: str = "tsne"
    hard_negatives: int = 10
    seed: int = 0


@torch.no_grad()
def analyze_encoded(
    model: RetrievalModel,
    encoded: EncodedSplit,
    cfg: Config,
    out_dir: str | Path,
    *,
    split: str,
    device: torch.device | None = None,
    checkpoint: str | None = None,
    options: AnalysisOptions | None = None,
) -> dict[str, Any]:
    """Write every figure that applies to ``model``'s head into ``out_dir`` and return the manifest (also written
    as ``analysis.json``). ``encoded`` is the split through ``model`` (``SplitEvaluator.encode``); ``split`` names it
    on every figure."""
    options = options or AnalysisOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = device or torch.device("cpu")
    head = model.head
    head.eval()
    sim, v2t_sim = score_matrices(model, encoded, cfg, device)  # v2t_sim: two-stage scoring's own shortlists
    text_state = head.encode_texts(encoded.text.to(device))
    video_state = head.encode_videos(encoded.video.to(device))
    setting = head.inference_setting() or None
    name = cfg.head.name
    tv = torch.as_tensor(encoded.text_video).long()
    figures: list[FigureFiles] = [
        plot_score_distributions(out, sim, tv, split=split, head=name, setting=setting),
        plot_rank_histogram(out, sim, tv, encoded.protocol, split=split, head=name, setting=setting, v2t_sim=v2t_sim),
    ]
    if isinstance(head, GareHead):
        figures += _gare(head, encoded, text_state, video_state, cfg, out, split, device, options)
    elif isinstance(head, ProxyHead):
        figures += _proxy(head, encoded, text_state, video_state, cfg, out, split, options)
    elif isinstance(head, GraviAlignHead):
        figures += _gravialign(head, encoded, text_state, video_state, sim, cfg, out, split, options)
    metrics = evaluate(sim, tv, encoded.protocol, tie_mode=cfg.eval.tie_mode, v2t_sim=v2t_sim)
    manifest = {
        "checkpoint": checkpoint,
        "split": split,
        "split_label": split_label(split),
        "head": name,
        "inference_setting": setting,
        "protocol": encoded.protocol,
        "num_texts": len(encoded.text),
        "num_videos": len(encoded.video),
        "skipped_videos": encoded.skipped,
        "metrics": metrics,
        "options": dataclasses.asdict(options),
        "figures": [f.to_dict() for f in figures],
    }
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


def _gare(
    head: GareHead,
    encoded: EncodedSplit,
    text_state: Any,
    video_state: Any,
    cfg: Config,
    out: Path,
    split: str,
    device: torch.device,
    options: AnalysisOptions,
) -> list[FigureFiles]:
    tv = torch.as_tensor(encoded.text_video).long()
    tension = gare_gradient_tension(
        head,
        encoded.text.to(device),
        encoded.video.to(device),
        tv,
        batch_size=cfg.train.batch_size,
        num_batches=options.gradient_batches,
        seed=options.seed,
    )
    figures = plot_gare_gradients(out, tension, split=split)
    rows = sample_captions(tv.numel(), options.max_captions, options.seed)
    positive = gare_pair_geometry(head, text_state, video_state, rows, tv[rows])
    neg_t, neg_v = sample_negatives(tv[rows], len(video_state), options.negatives_per_text, options.seed)
    negative = gare_pair_geometry(head, text_state, video_state, rows[neg_t], neg_v)
    figures.append(
        plot_delta_geometry(
            out,
            positive,
            negative,
            split=split,
            side=head.options.corrected_side,
            negatives_per_text=options.negatives_per_text,
        )
    )
    before = gare_scores_without_delta(head, text_state, video_state)
    # every pair exactly (no shortlist): a hard negative by the score before Δ must have a score after it
    after = head.score(text_state, video_state).cpu()
    hard = hard_negative_alignment(before, after, tv, options.hard_negatives)
    figures.append(plot_hard_negatives(out, hard, split=split))
    return figures


def _proxy(
    head: ProxyHead,
    encoded: EncodedSplit,
    text_state: Any,
    video_state: Any,
    cfg: Config,
    out: Path,
    split: str,
    options: AnalysisOptions,
) -> list[FigureFiles]:
    tv = torch.as_tensor(encoded.text_video).long()
    figures = [
        plot_gamma_sweep(
            out,
            gamma_sweep(head, text_state, video_state, tv, encoded.protocol, tie_mode=cfg.eval.tie_mode),
            split=split,
        )
    ]
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


def _gravialign(
    head: GraviAlignHead,
    encoded: EncodedSplit,
    text_state: Any,
    video_state: Any,
    sim: torch.Tensor,
    cfg: Config,
    out: Path,
    split: str,
    options: AnalysisOptions,
) -> list[FigureFiles]:
    tv = torch.as_tensor(encoded.text_video).long()
    sample = sample_captions(tv.numel(), options.max_captions, options.seed)
    uncertainty = uncertainty_vs_ambiguity(
        text_state, video_state, sim, tv, encoded.protocol, caption_lengths(encoded.text)
    )
    return [
        plot_uncertainty(out, uncertainty, split=split, mode=head.inference_setting()),
        plot_terms(
            out,
            sgi_term_distributions(
                head, text_state[sample], video_state, tv[sample], options.negatives_per_text, options.seed
            ),
            split=split,
        ),
        plot_modes(
            out,
            mode_comparison(head, text_state, video_state, tv, encoded.protocol, tie_mode=cfg.eval.tie_mode),
            split=split,
        ),
    ]
