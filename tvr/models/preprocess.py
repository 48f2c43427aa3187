"""What a backbone expects of its pixels, as open_clip's model configs carry it: the input size of its image tower,
its frame sampling (and with it the resize: CLIP4Clip's short side + centre crop, CLIP-ViP's square) and its pixel
normalisation. The data pipeline takes these from the backbone unless the config sets them.

Each backbone declares them in its folder (:mod:`tvr.models.backbones`), read from the model config alone, without
building the backbone or loading weights, so a run config can be resolved before anything heavy runs;
:func:`resolve_preprocess` fills ``data.image_size`` / ``data.sampling`` / ``data.pixel_mean`` /
``data.pixel_std`` where the config leaves them unset (every job resolves its config first,
``tvr.pipeline.resolve_config``), so a run's config.yaml and its checkpoints record the preprocessing used.
"""

from __future__ import annotations

from tvr.config import Config, ModelConfig
from tvr.data.transforms import PixelNorm
from tvr.models.backbones.clip.image_size import HUB_IMAGE_SIZES, clip_image_size
from tvr.models.backbones.registry import Preprocess, resolve_backbone_config, resolve_backbone_sections

__all__ = [
    "HUB_IMAGE_SIZES",
    "Preprocess",
    "backbone_norm",
    "backbone_preprocess",
    "clip_image_size",
    "resolve_preprocess",
]


def backbone_preprocess(model_cfg: ModelConfig) -> Preprocess:
    """The preprocessing ``model.backbone`` expects (its folder declares it): CLIP's normalisation and its vision
    tower's image size for both CLIP backbones, CLIP4Clip's 1-fps sampling for ``clip`` and CLIP-ViP's linspace
    sampling and square resize for ``clipvip`` (spec §2.1, §2.2); for ``two_tower`` the EfficientNet-Lite variant's
    resolution and normalisation with CLIP4Clip's sampling."""
    return resolve_backbone_sections(model_cfg).preprocess(model_cfg)


def backbone_norm(model_cfg: ModelConfig) -> PixelNorm:
    """The pixel normalisation ``model.backbone``'s image tower was trained with (no I/O)."""
    return resolve_backbone_sections(model_cfg).pixel_norm(model_cfg)


def resolve_preprocess(cfg: Config) -> Preprocess:
    """Fill ``data.image_size``, ``data.sampling``, ``data.pixel_mean`` and ``data.pixel_std`` left unset with the
    backbone's (in place; :func:`tvr.models.backbones.registry.resolve_backbone_config`, which builds the backbone's
    settings sections too) and return what the data pipeline will use. Values the config sets win. Idempotent."""
    return resolve_backbone_config(cfg)
