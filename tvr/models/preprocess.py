"""What a backbone expects of its pixels, as open_clip's model configs carry it: the input size of its image tower,
its frame sampling (and with it the resize: CLIP4Clip's short side + centre crop, CLIP-ViP's square) and its pixel
normalisation. The data pipeline takes these from the backbone unless the config sets them.

Each backbone declares them in its folder (:mod:`tvr.models.backbones`), read from the model config alone, without
building the backbone or loading weights, so a run config can be resolved before anything heavy runs;
resolving a run (:func:`tvr.models.run_spec.resolve_run`, which every job does first) fills ``data.image_size`` /
``data.sampling`` / ``data.pixel_mean`` / ``data.pixel_std`` where the config leaves them unset, so a run's
config.yaml and its checkpoints record the preprocessing used.
"""

from __future__ import annotations

from tvr.config import ModelConfig
from tvr.data.transforms import PixelNorm
from tvr.models.backbones.clip.image_size import HUB_IMAGE_SIZES, clip_image_size
from tvr.models.backbones.registry import Preprocess, backbone_spec, typed_model_config

__all__ = [
    "HUB_IMAGE_SIZES",
    "Preprocess",
    "backbone_norm",
    "backbone_preprocess",
    "clip_image_size",
]


def backbone_preprocess(model_cfg: ModelConfig) -> Preprocess:
    """The preprocessing ``model.backbone`` expects (its folder declares it): CLIP's normalisation and its vision
    tower's image size for both CLIP backbones, CLIP4Clip's 1-fps sampling for ``clip`` and CLIP-ViP's linspace
    sampling and square resize for ``clipvip`` (spec §2.1, §2.2); for ``two_tower`` the EfficientNet-Lite variant's
    resolution and normalisation with CLIP4Clip's sampling."""
    typed = typed_model_config(model_cfg)
    return backbone_spec(typed.backbone).preprocess(typed)


def backbone_norm(model_cfg: ModelConfig) -> PixelNorm:
    """The pixel normalisation ``model.backbone``'s image tower was trained with (no I/O)."""
    typed = typed_model_config(model_cfg)
    return backbone_spec(typed.backbone).pixel_norm(typed)
