"""The input size of a CLIP's vision tower, read from its description only (no weights loaded), so a run config
can be resolved before anything heavy runs, as open_clip's bundled model configs carry their preprocessing."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from tvr.config import ModelConfig

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
    a HF folder's or the hub cache's ``config.json`` (:func:`tvr.models.backbones.clip.modeling.backbone_image_size`),
    an
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
    from tvr.models.backbones.clip.modeling import backbone_image_size  # CLIP's module: only for a CLIP backbone

    known = backbone_image_size(model_cfg)
    if known is not None:
        return known[0]
    return HUB_IMAGE_SIZES.get(spec)


@functools.lru_cache(maxsize=8)
def _openai_image_size(path: str, mtime_ns: int, size: int) -> int:
    from tvr.models.backbones.clip.convert_openai import infer_config, load_openai_state_dict

    return int(infer_config(load_openai_state_dict(path)).vision_config.image_size)
