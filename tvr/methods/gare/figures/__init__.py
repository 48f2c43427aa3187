"""GARE's ``tvr analyze`` figures (analysis layer: imported by ``tvr.analysis.checkpoint`` through
``GareHead.analysis_figures``, never by the head): gradient tension (:mod:`.gradients`), Δ geometry and hard
negatives (:mod:`.geometry`)."""

from __future__ import annotations

from tvr.analysis.context import FigureContext
from tvr.analysis.figures import FigureFiles
from tvr.analysis.pairs import sample_captions, sample_negatives
from tvr.methods.gare.figures.geometry import (
    gare_pair_geometry,
    gare_scores_without_delta,
    hard_negative_alignment,
    plot_delta_geometry,
    plot_hard_negatives,
)
from tvr.methods.gare.figures.gradients import gare_gradient_tension, plot_gare_gradients


def write_figures(context: FigureContext) -> list[FigureFiles]:
    """Gradient tension, Δ geometry of positive and sampled negative pairs, and the hard negatives before and after
    Δ, for the checkpoint's GARE head."""
    head, options, tv = context.head, context.options, context.text_video
    text_state, video_state, out, split = context.text_state, context.video_state, context.out, context.split
    tension = gare_gradient_tension(
        head,
        context.encoded.text.to(context.device),
        context.encoded.video.to(context.device),
        tv,
        batch_size=context.cfg.train.batch_size,
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
    figures.append(
        plot_hard_negatives(out, hard_negative_alignment(before, after, tv, options.hard_negatives), split=split)
    )
    return figures
