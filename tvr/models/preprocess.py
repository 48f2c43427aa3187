"""What a backbone expects of its pixels, as open_clip's model configs carry it: the input size of its image tower,
its frame sampling (and with it the resize: CLIP4Clip's short side + centre crop, CLIP-ViP's square) and its pixel
normalisation. The data pipeline takes these from the backbone unless the config sets them.

:func:`backbone_preprocess` reads them from the model config alone, without building the backbone or loading
weights (a HF folder's ``config.json``, the tiny config, an OpenAI checkpoint's tensor shapes, the EfficientNet
variant), so a run config can be resolved before anything heavy runs; :func:`resolve_preprocess` fills
``data.image_size`` / ``data.sampling`` / ``data.pixel_mean`` / ``data.pixel_std`` where the config leaves them
unset (every job resolves its config first, ``tvr.pipeline.resolve_config``), so a run's config.yaml and its
checkpoints record the preprocessing used.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from tvr.config import Config, ConfigError, ModelConfig
from tvr.data.transforms import CLIP_NORM, PixelNorm

__all__ = [
    "HUB_IMAGE_SIZES",
    "Preprocess",
    "backbone_norm",
    "backbone_preprocess",
    "clip_image_size",
    "resolve_preprocess",
]


@dataclass(frozen=True)
class Preprocess:
    """A backbone's preprocessing defaults: ``image_size`` (frame side in pixels; None when the backbone cannot tell
    without a download), ``sampling`` (``clip4clip`` or ``clipvip``, which also picks the resize) and ``norm``
    (the per-channel normalisation its image tower was trained with)."""

    image_size: int | None
    sampling: str
    norm: PixelNorm = CLIP_NORM


def backbone_preprocess(model_cfg: ModelConfig) -> Preprocess:
    """The preprocessing ``model.backbone`` expects: CLIP's normalisation and its vision tower's image size for both
    CLIP backbones, CLIP4Clip's 1-fps sampling for ``clip`` and CLIP-ViP's linspace sampling and square resize for
    ``clipvip`` (spec §2.1, §2.2); for ``two_tower`` the EfficientNet-Lite variant's resolution and normalisation
    with CLIP4Clip's sampling."""
    kind = model_cfg.backbone
    if kind == "clip":
        return Preprocess(clip_image_size(model_cfg), "clip4clip", CLIP_NORM)
    if kind == "clipvip":
        return Preprocess(clip_image_size(model_cfg), "clipvip", CLIP_NORM)
    if kind == "two_tower":
        from tvr.models.image_tower import native_image_size

        return Preprocess(native_image_size(model_cfg.two_tower), "clip4clip", backbone_norm(model_cfg))
    raise ConfigError(f"model.backbone = {kind!r}: no preprocessing defaults known for it")


def backbone_norm(model_cfg: ModelConfig) -> PixelNorm:
    """The pixel normalisation ``model.backbone``'s image tower was trained with (no I/O)."""
    if model_cfg.backbone == "two_tower":
        from tvr.models.image_tower import EFFICIENTNET_LITE_NORM

        return EFFICIENTNET_LITE_NORM
    return CLIP_NORM


def resolve_preprocess(cfg: Config) -> Preprocess:
    """Fill ``data.image_size``, ``data.sampling``, ``data.pixel_mean`` and ``data.pixel_std`` left unset with the
    backbone's (in place) and return what the data pipeline will use. Values the config sets win. Idempotent."""
    data = cfg.data
    if data.pixel_mean is None or data.pixel_std is None:
        norm = backbone_norm(cfg.model)
        data.pixel_mean = data.pixel_mean if data.pixel_mean is not None else tuple(norm.mean)
        data.pixel_std = data.pixel_std if data.pixel_std is not None else tuple(norm.std)
    if data.image_size is None or data.sampling is None:
        defaults = backbone_preprocess(cfg.model)
        if data.image_size is None:
            data.image_size = defaults.image_size  # None still when the backbone cannot tell without a download
        if data.sampling is None:
            data.sampling = defaults.sampling
    return Preprocess(data.image_size, data.sampling, PixelNorm(tuple(data.pixel_mean), tuple(data.pixel_std)))


#: input sizes of the hub's OpenAI CLIP checkpoints (their config.json's vision_config.image_size), so a preset naming
#: one resolves offline, without the model in the cache, as open_clip's bundled model configs do
HUB_IMAGE_SIZES = {
    "openai/clip-vit-base-patch32": 224,
    "openai/clip-vit-base-patch16": 224,
    "openai/clip-vit-large-patch14": 224,
    "openai/clip-vit-large-patch14-336": 336,
}


def clip_image_size(model_cfg: ModelConfig) -> int | None:
    """The input size of ``model.clip``'s vision tower, read from its description only: ``model.tiny.image_size``,
    a HF folder's or the hub cache's ``config.json`` (:func:`tvr.models.clip_backbone.backbone_image_size`), an
    OpenAI checkpoint's positional embedding (patch × grid), or a known hub id. None when nothing describes it
    without a download (a path that does not exist yet, a hub model that is not cached, a damaged config.json that
    loading will report): the data pipeline then asks for ``data.image_size``."""
    spec = str(model_cfg.clip).strip()
    path = Path(os.path.expanduser(spec))
    if spec.endswith((".pt", ".pth")):
        if not path.is_file():
            return None
        stat = path.stat()
        return _openai_image_size(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    from tvr.models.clip_backbone import backbone_image_size  # CLIP's module: only for a CLIP backbone

    known = backbone_image_size(model_cfg)
    if known is not None:
        return known[0]
    return HUB_IMAGE_SIZES.get(spec)


@functools.lru_cache(maxsize=8)
def _openai_image_size(path: str, mtime_ns: int, size: int) -> int:
    from tvr.models.convert_openai import infer_config, load_openai_state_dict

    return int(infer_config(load_openai_state_dict(path)).vision_config.image_size)
