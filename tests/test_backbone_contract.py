"""The backbone contract, checked for every registered backbone (the package's folders and the out-of-tree toy), as
tests/test_head_contract.py checks every head: its declarations read from the settings alone, the module it builds
(the methods ``RetrievalModel`` calls), encoding through the model (shapes, finite values, the features it says it
provides, the same vectors for a text or a video alone and in a batch, the same vectors twice), and a checkpoint round
trip that rebuilds the model from the file alone and encodes exactly as before.

Each backbone is built from a tiny, randomly initialised configuration of its real architecture (no download); a
backbone registered without one here fails :func:`test_every_registered_backbone_has_a_tiny_config`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import toy_backbones
import yaml

from tvr.config import Config, config_from_dict
from tvr.data.tokenizer import build_tokenizer
from tvr.models.backbones import registry
from tvr.models.build import build_model
from tvr.models.checkpoint import load_model
from tvr.models.heads.registry import head_class
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config
from tvr.train.checkpoint import save_checkpoint

FRAMES = 3
TEXTS = ["a red square turns", "two dogs run on the grass near a river", "hello"]

#: a tiny configuration of each registered backbone (its ``model`` section; ``data.image_size`` where it must be set;
#: a head that reads what it provides, clip4clip by default)
TINY: dict[str, dict[str, Any]] = {
    "clip": {"model": {"backbone": "clip", "clip": "tiny", "temporal": "meanP"}},
    "clipvip": {  # its proxies, read by TV-ProxyNet's head
        "model": {"backbone": "clipvip", "clip": "tiny", "temporal": "meanP", "clipvip": {"proxy_projection": True}},
        "head": {"name": "proxy"},
    },
    "two_tower": {
        "data": {"image_size": 32},
        "model": {
            "backbone": "two_tower",
            "temporal": "meanP",
            "two_tower": {"text_model": "tiny", "image_model": "tiny", "embed_dim": 32, "bridge": "projection"},
        },
    },
    toy_backbones.NAME: {
        "model": yaml.safe_load((Path(__file__).resolve().parent / "toy_backbone.yaml").read_text())["model"]
    },
}
BACKBONES = registry.available_backbones()


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TVR_CACHE_DIR", str(tmp_path / "cache"))


def tiny_config(name: str) -> Config:
    values = TINY[name]
    data = {"max_words": 12, "max_frames": FRAMES, **values.get("data", {})}
    head = values.get("head", {"name": "clip4clip"})
    return resolve_config(config_from_dict({**values, "data": data, "head": head}))


def batch(cfg: Config, tmp_path: Path, texts: list[str], videos: int) -> dict[str, torch.Tensor]:
    ids, mask = build_tokenizer(resolve_run(cfg).tokenizer, tmp_path / "work")(texts, cfg.data.max_words)
    size = cfg.data.image_size
    g = torch.Generator().manual_seed(0)
    mean = torch.tensor(cfg.data.pixel_mean).view(1, 1, 3, 1, 1)
    std = torch.tensor(cfg.data.pixel_std).view(1, 1, 3, 1, 1)
    pixels = (torch.rand(videos, FRAMES, 3, size, size, generator=g) - mean) / std
    video_mask = torch.ones(videos, FRAMES, dtype=torch.long)
    video_mask[-1, 1:] = 0  # a short clip: one frame and padding
    return {"text_ids": ids, "text_mask": mask, "video": pixels, "video_mask": video_mask}


def encode(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    with torch.no_grad():
        text = model.text_features(inputs)
        video = model.video_features(inputs)
    return {"eot": text.eot, "words": text.words, "frames": video.frames, "proxies": video.proxies}


def rows(inputs: dict[str, torch.Tensor], text: slice, video: slice) -> dict[str, torch.Tensor]:
    return {
        "text_ids": inputs["text_ids"][text],
        "text_mask": inputs["text_mask"][text],
        "video": inputs["video"][video],
        "video_mask": inputs["video_mask"][video],
    }


def test_every_registered_backbone_has_a_tiny_config() -> None:
    assert {"clip", "clipvip", "two_tower", toy_backbones.NAME} <= set(BACKBONES)
    assert set(BACKBONES) <= set(TINY), f"give {sorted(set(BACKBONES) - set(TINY))} a tiny config in TINY"


@pytest.fixture(params=BACKBONES)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_contract_declarations_come_from_the_settings(name: str) -> None:
    cfg = tiny_config(name)
    spec = registry.backbone_spec(name)
    assert spec.name == name == cfg.model.backbone
    assert isinstance(spec.image_size(cfg.model), int) and spec.image_size(cfg.model) > 0
    assert cfg.data.image_size == TINY[name].get("data", {}).get("image_size", spec.image_size(cfg.model))
    assert spec.sampling in ("clip4clip", "clipvip") and cfg.data.sampling == spec.sampling
    norm = spec.pixel_norm(cfg.model)
    assert len(norm.mean) == len(norm.std) == 3 and min(norm.std) > 0
    assert spec.provides(cfg.model) <= set(registry.FEATURES)
    assert resolve_run(cfg).tokenizer.kind  # a registered tokenizer kind: build_tokenizer below loads it
    identity = spec.feature_identity(cfg)
    assert identity is not None


def test_contract_build_and_encode(name: str, tmp_path: Path) -> None:
    cfg = tiny_config(name)
    spec = registry.backbone_spec(name)
    torch.manual_seed(0)
    model = build_model(resolve_run(cfg)).eval()
    backbone = model.backbone
    for method in ("encode_text", "encode_video", "maybe_half", "enable_gradient_checkpointing"):
        assert callable(getattr(backbone, method, None)), f"{name}: the module has no {method}()"
    assert isinstance(backbone.embed_dim, int) and backbone.embed_dim > 0
    assert math.isfinite(float(backbone.logit_scale_value))

    inputs = batch(cfg, tmp_path, TEXTS, 2)
    out = encode(model, inputs)
    width = out["eot"].shape[-1]
    assert out["eot"].shape == (len(TEXTS), width) and torch.isfinite(out["eot"]).all()
    assert out["frames"].shape[0] == 2 and out["frames"].shape[-1] == width and torch.isfinite(out["frames"]).all()
    if "proxies" in spec.provides(cfg.model) and "proxies" in head_class(cfg.head.name).requires:
        assert out["proxies"] is not None and out["proxies"].shape[0] == 2 and out["proxies"].shape[-1] == width
    if "word_tokens" in spec.provides(cfg.model):
        assert out["words"] is not None and out["words"].shape[:1] == (len(TEXTS),)

    # the same vectors twice, and for one text / one video alone as in the batch (a query is encoded alone)
    again = encode(model, inputs)
    for key, value in out.items():
        assert (value is None) == (again[key] is None) and (value is None or torch.equal(value, again[key])), key
    alone = encode(model, rows(inputs, slice(1, 2), slice(1, 2)))
    torch.testing.assert_close(alone["eot"], out["eot"][1:2], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(alone["frames"], out["frames"][1:2], rtol=1e-4, atol=1e-5)


def test_contract_checkpoint_round_trip(name: str, tmp_path: Path) -> None:
    cfg = tiny_config(name)
    torch.manual_seed(1)
    model = build_model(resolve_run(cfg)).eval()
    with torch.no_grad():  # weights no seed builds: the file alone must carry them
        for param in model.backbone.parameters():
            param.add_(0.01 * torch.randn_like(param))
    save_checkpoint(tmp_path / "best.pt", model, config=cfg)

    loaded, loaded_cfg = load_model(tmp_path / "best.pt")
    assert loaded_cfg.model.backbone == name and not loaded.training
    for (key, a), (_, b) in zip(loaded.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), key
    inputs = batch(cfg, tmp_path, TEXTS, 2)
    before, after = encode(model, inputs), encode(loaded, inputs)
    for key, value in before.items():
        assert (value is None) == (after[key] is None) and (value is None or torch.equal(value, after[key])), key
