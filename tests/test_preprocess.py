"""A backbone owns its preprocessing defaults (input size, frame sampling, pixel normalisation), as open_clip's model
configs do: the data pipeline takes them from the backbone unless the config sets them, and resolving a config reads
them without building the backbone or downloading anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tvr.config import ConfigError, config_from_dict, load_config
from tvr.data.datasets import VideoDataset, VideoResolver, check_pixel_settings
from tvr.data.transforms import CLIP_NORM, PixelNorm
from tvr.models.preprocess import HUB_IMAGE_SIZES, Preprocess, backbone_preprocess, clip_image_size
from tvr.pipeline import resolve_config

TINY = {
    "embed_dim": 16,
    "text_width": 16,
    "text_layers": 1,
    "text_heads": 2,
    "vision_width": 16,
    "vision_layers": 1,
    "vision_heads": 2,
    "image_size": 48,
    "patch_size": 8,
}


def config(**sections: dict) -> object:
    values = {"model": {"clip": "tiny", "tiny": TINY, "temporal": "meanP"}}
    for name, entries in sections.items():
        values[name] = {**values.get(name, {}), **entries}
    return config_from_dict(values)


def test_the_backbone_fills_what_the_config_leaves_unset() -> None:
    cfg = config()
    assert (cfg.data.image_size, cfg.data.sampling, cfg.data.pixel_mean) == (None, None, None)
    cfg = resolve_config(cfg)
    assert (cfg.data.image_size, cfg.data.sampling) == (48, "clip4clip")  # the tiny CLIP's input size
    assert PixelNorm(cfg.data.pixel_mean, cfg.data.pixel_std) == CLIP_NORM

    vip = resolve_config(config(model={"backbone": "clipvip", "temporal": "none"}))
    assert (vip.data.image_size, vip.data.sampling) == (48, "clipvip")
    assert backbone_preprocess(vip.model) == Preprocess(48, "clipvip", CLIP_NORM)

    from tvr.models.backbones.two_tower.image_tower import EFFICIENTNET_LITE_NORM

    towers = resolve_config(
        config(
            model={
                "backbone": "two_tower",
                "two_tower": {
                    "text_model": "tiny",
                    "image_model": "tiny",
                    "image_weights": "random",
                    "bridge": "projection",
                    "tiny": {"image_size": 40},
                },
            }
        )
    )
    assert (towers.data.image_size, towers.data.sampling) == (40, "clip4clip")
    assert PixelNorm(towers.data.pixel_mean, towers.data.pixel_std) == EFFICIENTNET_LITE_NORM


def test_the_config_overrides_the_backbone() -> None:
    cfg = resolve_config(config(data={"image_size": 64, "sampling": "clipvip", "pixel_mean": [0.5, 0.5, 0.5]}))
    assert (cfg.data.image_size, cfg.data.sampling) == (64, "clipvip")
    assert cfg.data.pixel_mean == (0.5, 0.5, 0.5) and cfg.data.pixel_std == CLIP_NORM.std  # std still the backbone's
    again = resolve_config(cfg)  # idempotent
    assert (again.data.image_size, again.data.sampling, again.data.pixel_mean) == (64, "clipvip", (0.5, 0.5, 0.5))


def test_input_sizes_are_read_without_building_or_downloading(tmp_path: Path) -> None:
    from test_convert_openai import IMAGE, openai_state_dict

    from tvr.config import ModelConfig

    folder = tmp_path / "clip-l14-336"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vision_config": {"image_size": 336, "patch_size": 14}}))
    assert clip_image_size(ModelConfig(clip=str(folder))) == 336
    pt = tmp_path / "ViT-tiny.pt"
    torch.save(openai_state_dict(), pt)
    assert clip_image_size(ModelConfig(clip=str(pt))) == IMAGE  # patch × grid of the positional embedding
    for hub_id, size in HUB_IMAGE_SIZES.items():
        assert clip_image_size(ModelConfig(clip=hub_id)) == size
    # nothing describes these without a download: the size stays unset and the data pipeline asks for it
    assert clip_image_size(ModelConfig(clip=str(tmp_path / "not_yet.pt"))) is None
    assert clip_image_size(ModelConfig(clip="someone/unknown-clip-xyz")) is None
    (folder / "config.json").write_text("{not json")
    assert clip_image_size(ModelConfig(clip=str(folder))) is None  # loading the model reports the damage


def test_an_unknown_size_is_named_when_pixels_are_needed(tmp_path: Path) -> None:
    cfg = resolve_config(config(model={"clip": "someone/unknown-clip-xyz"}))
    assert (cfg.data.image_size, cfg.data.sampling) == (None, "clip4clip")
    check_pixel_settings(cfg.data, image_size=False)  # tvr check-data needs only the sampling
    with pytest.raises(ConfigError, match=r"data.image_size is unset .* set data.image_size \(224"):
        check_pixel_settings(cfg.data)
    raw = config()
    with pytest.raises(ConfigError, match=r"not resolved: .*resolve_config"):
        check_pixel_settings(raw.data)


def test_the_data_pipeline_makes_the_backbones_frames(tmp_path: Path) -> None:
    """A tiny CLIP of 48 px with no data.image_size: the clips come out 48 × 48 (before backbones owned their
    preprocessing, the data default of 224 met the tiny tower's 32 px)."""
    from videos import write_test_video

    videos = tmp_path / "videos"
    videos.mkdir()
    write_test_video(videos / "a.mp4", 6, 2.0, size=(40, 30))
    cfg = resolve_config(config(data={"video_dir": str(videos), "max_frames": 2}))
    dataset = VideoDataset(["a"], None, VideoResolver.from_config(cfg.data), cfg.data)
    assert dataset[0]["video"].shape == (2, 3, 48, 48)
    # a normalisation the config sets is the one the frames get: (x − 0) / 1 keeps the [0, 1] pixels
    plain = resolve_config(
        config(data={"video_dir": str(videos), "max_frames": 2, "pixel_mean": [0, 0, 0], "pixel_std": [1, 1, 1]})
    )
    pixels = VideoDataset(["a"], None, VideoResolver.from_config(plain.data), plain.data)[0]["video"]
    assert 0.0 <= float(pixels.min()) and float(pixels.max()) <= 1.0
    mean, std = torch.tensor(CLIP_NORM.mean).view(3, 1, 1), torch.tensor(CLIP_NORM.std).view(3, 1, 1)
    torch.testing.assert_close(dataset[0]["video"] * std + mean, pixels, rtol=1e-5, atol=1e-5)


def test_presets_leave_the_pixels_to_the_backbone() -> None:
    for name in ("clip4clip/msrvtt", "gare/msrvtt", "clipvip/msrvtt", "proxy/didemo", "gravialign/activitynet"):
        cfg = load_config(name)
        assert cfg.data.image_size is None and cfg.data.sampling is None, name
        cfg = resolve_config(cfg)
        expected = "clipvip" if cfg.model.backbone == "clipvip" else "clip4clip"
        assert (cfg.data.image_size, cfg.data.sampling) == (224, expected), name
