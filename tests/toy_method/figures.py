"""The toy method's ``tvr analyze`` figure: the alignment ‖t_i − v_i‖² of every caption with its video."""

from __future__ import annotations

from toy_method.losses import alignment
from tvr.analysis.context import FigureContext
from tvr.analysis.figures import FigureFiles, new_figure, split_label, write_figure

NAME = "toy_alignment"


def write_figures(context: FigureContext) -> list[FigureFiles]:
    values = alignment(context.text_state.emb, context.video_state.emb[context.text_video]).cpu()
    fig, axes = new_figure(6.0, 4.0)
    axes[0, 0].hist(values.numpy(), bins=20, range=(0.0, 4.0))
    axes[0, 0].set_xlabel("‖t − v‖² of the positive pair")
    title = f"Toy alignment of the positive pairs — {split_label(context.split)}"
    fig.suptitle(title, fontsize=10)
    return [write_figure(context.out, NAME, fig, {"alignment": values.tolist()}, title=title)]
