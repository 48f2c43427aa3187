"""Checkpoints carry their resolved config: the model is rebuilt from the file alone (``tvr.models.checkpoint``),
an explicit config still overrides it, and a checkpoint without one says what to pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tvr.config import config_from_dict, config_to_dict
from tvr.models.build import build_model
from tvr.models.checkpoint import CheckpointError, checkpoint_config, load_model
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config
from tvr.train.checkpoint import save_checkpoint
from tvr.types import TextFeatures, VideoFeatures

VALUES = {
    "model": {
        "clip": "tiny",
        "temporal": "meanP",
        "tiny": {
            "embed_dim": 16,
            "text_width": 16,
            "vision_width": 16,
            "text_layers": 1,
            "vision_layers": 1,
            "text_heads": 2,
            "vision_heads": 2,
            "image_size": 16,
            "patch_size": 8,
        },
    },
    "head": {"name": "gare", "options": {"context": "words", "kl_weight": 0.05}},
    "data": {"max_frames": 3, "image_size": 16},
    "train": {"seed": 7},
}


def _config():
    """The run config as a run resolves it (head options checked, preprocessing filled in from the backbone)."""
    return resolve_config(config_from_dict(VALUES))


def _scores(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    text = TextFeatures(torch.randn(4, 16, generator=g), torch.randn(4, 5, 16, generator=g), torch.ones(4, 5))
    video = VideoFeatures(torch.randn(3, 3, 16, generator=g), torch.ones(3, 3))
    with torch.no_grad():
        return model.head.score(model.head.encode_texts(text), model.head.encode_videos(video))


def test_the_model_is_rebuilt_from_the_checkpoint_alone(tmp_path: Path) -> None:
    cfg = _config()
    torch.manual_seed(3)  # weights that differ from what the config's seed would build
    model = build_model(resolve_run(cfg))
    with torch.no_grad():
        model.head.psi.q_proj.weight.add_(0.5)
    save_checkpoint(tmp_path / "best.pt", model, config=cfg)

    loaded, loaded_cfg = load_model(tmp_path / "best.pt")
    assert config_to_dict(loaded_cfg) == config_to_dict(cfg)
    assert loaded_cfg.head.options.context == "words" and loaded_cfg.head.options.kl_weight == 0.05
    assert not loaded.training
    torch.testing.assert_close(_scores(loaded), _scores(model.eval()), rtol=0, atol=0)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_an_explicit_config_overrides_the_one_it_carries(tmp_path: Path) -> None:
    cfg = _config()
    save_checkpoint(tmp_path / "best.pt", build_model(resolve_run(cfg)), config=cfg)
    other = config_from_dict({**VALUES, "head": {"name": "gare", "options": {"context": "words", "kl_weight": 0.5}}})
    _, used = load_model(tmp_path / "best.pt", other)
    assert used.head.options.kl_weight == 0.5


def test_a_checkpoint_without_config_names_what_to_pass(tmp_path: Path) -> None:
    cfg = _config()
    model = build_model(resolve_run(cfg))
    save_checkpoint(tmp_path / "old.pt", model)  # as checkpoints were written before they carried their config
    with pytest.raises(CheckpointError, match=r"old.pt: this checkpoint carries no config.*--config"):
        checkpoint_config(tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="carries no config"):
        load_model(tmp_path / "old.pt")
    loaded, _ = load_model(tmp_path / "old.pt", cfg)  # with the config given, it loads as before
    torch.testing.assert_close(_scores(loaded), _scores(model.eval()), rtol=0, atol=0)
