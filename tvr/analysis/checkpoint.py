"""The analyses of one checkpoint on one encoded split (``tvr analyze``): the figures every head gets, then its
method's own, with ``analysis.json`` listing what was written.

Every head: the score distributions of positive and negative pairs and the rank histogram (:mod:`.similarity`).
A method's own figures come from the module its head class names in ``analysis_figures`` (the built-in methods':
``tvr/methods/<method>/figures``), called with a :class:`~tvr.analysis.context.FigureContext`; this module never
asks which head it holds.

Scores use the head's stored inference setting (the γ or mode chosen on validation and saved with the checkpoint)
and ``eval.*`` of the config (two-stage scoring with ``eval.rerank_k``, the tie mode), as ``tvr eval`` does.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

import torch

from tvr.analysis.context import AnalysisOptions, FigureContext
from tvr.analysis.figures import FigureFiles, split_label
from tvr.analysis.similarity import plot_rank_histogram, plot_score_distributions
from tvr.config import Config
from tvr.eval.protocol import evaluate
from tvr.eval.runner import EncodedSplit, score_matrices
from tvr.models.model import RetrievalModel
from tvr.utils.io import atomic_write_json

__all__ = ["MANIFEST", "AnalysisOptions", "analyze_encoded", "method_figures"]

MANIFEST = "analysis.json"


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
    context = FigureContext(head, encoded, text_state, video_state, sim, cfg, out, split, device, options)
    figures += method_figures(context)
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


def method_figures(context: FigureContext) -> list[FigureFiles]:
    """The figures of the head's own method: the ``write_figures(context)`` of the module its class names in
    ``analysis_figures`` (relative to the head's package when it starts with a dot); none when it names none."""
    cls = type(context.head)
    name = cls.analysis_figures
    if not name:
        return []
    package = cls.__module__.rpartition(".")[0]
    if name.startswith(".") and not package:
        raise ValueError(
            f"{cls.__name__}.analysis_figures = {name!r} is relative, but its module {cls.__module__!r} is in no "
            "package: name the figures module in full"
        )
    module = importlib.import_module(name, package or None)
    write = getattr(module, "write_figures", None)
    if not callable(write):
        raise TypeError(
            f"{cls.__name__}.analysis_figures = {name!r}: module {module.__name__} has no write_figures(context)"
        )
    return list(write(context))
