"""``tvr analyze``: build the model of a config, load a checkpoint, encode one split and write its analyses
(:func:`tvr.analysis.analyze_encoded`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tvr.analysis.checkpoint import AnalysisOptions, analyze_encoded
from tvr.config import Config, ConfigError
from tvr.data.annotations import evaluation_splits
from tvr.models.run_spec import resolve_run
from tvr.pipeline import SplitEvaluator, load_model_for_eval, torch_threads
from tvr.utils.device import resolve_device


def run_analyze(
    cfg: Config, checkpoint: str | Path, out_dir: str | Path, split: str = "val", options: AnalysisOptions | None = None
) -> dict[str, Any]:
    """Analyse ``checkpoint`` (a model of ``cfg``) on ``split`` (val by default: the held-out validation split; a
    test-split analysis is labelled as such on every figure). Returns the manifest written to
    ``out_dir/analysis.json``."""
    if split not in evaluation_splits():
        raise ConfigError(f"--split {split!r}: expected one of {list(evaluation_splits())}")
    run = resolve_run(cfg)
    cfg = run.config
    with torch_threads(cfg):
        from tvr.data.tokenizer import build_tokenizer

        device = resolve_device(cfg.train.device)
        checkpoint = Path(checkpoint)
        out = Path(out_dir)
        tokenizer = None if cfg.data.features_dir else build_tokenizer(run.tokenizer, checkpoint.parent)
        model = load_model_for_eval(run, checkpoint)
        model.to(device)
        if model.backbone is not None:
            model.backbone.maybe_half(device)
        model.eval()
        encoded = SplitEvaluator(cfg, split, tokenizer).encode(model, device)
        out.mkdir(parents=True, exist_ok=True)
        return analyze_encoded(
            model, encoded, cfg, out, split=split, device=device, checkpoint=str(checkpoint), options=options
        )
