"""What a backbone expects of its pixels, as open_clip's model configs carry it: the input size of its image tower,
its frame sampling (and with it the resize: CLIP4Clip's short side + centre crop, CLIP-ViP's square) and its pixel
normalisation. The data pipeline takes these from the backbone unless the config sets them.

:func:`backbone_preprocess` reads them from the model config alone, without building the backbone or loading
weights (a HF folder's ``config.json``, the tiny config, an OpenAI checkpoint's tensor shapes), so a run config can
be resolved before anything heavy runs; :func:`resolve_preprocess` fills ``data.image_size`` / ``data.sampling``
where the config leaves them unset (every job resolves its config first, ``tvr.pipeline.resolve_config``).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tvr.config import Config, ConfigError, ModelConfig

__all__ = ["HUB_IMAGE_SIZES", "Preprocess", "backbone_preprocess", "clip_image_size", "resolve_preprocess"]


@dataclass(frozen=True)
class Preprocess:
    """A backbone's preprocessing defaults: ``image_size`` (frame side in pixels; None when the backbone cannot tell
    without a download) and ``sampling`` (``clip4clip`` or ``clipvip``, which also picks the resize). Both CLIP
    backbones normalise with CLIP's mean and std (``tvr.data.transforms.CLIP_MEAN`` / ``CLIP_STD``)."""

    image_size: int | None
    sampling: str


def backbone_preprocess(model_cfg: ModelConfig) -> Preprocess:
    """The preprocessing ``model.backbone`` expects: CLIP's normalisation and its vision tower's image size for both
    CLIP backbones; CLIP4Clip's 1-fps sampling for ``clip``, CLIP-ViP's linspace sampling and square resize for
    ``clipvip`` (spec §2.1, §2.2)."""
    kind = model_cfg.backbone
    if kind == "clip":
        return Preprocess(clip_image_size(model_cfg), "clip4clip")
    if kind == "clipvip":
        return Preprocess(clip_image_size(model_cfg), "clipvip")
    raise ConfigError(f"model.backbone = {kind!r}: no preprocessing defaults known for it")


def resolve_preprocess(cfg: Config) -> Preprocess:
    """Fill ``data.image_size`` and ``data.sampling`` left unset with the backbone's (in place) and return what the
    data pipeline will use. Values the config sets win. Idempotent."""
    data = cfg.data
    if data.image_size is not None and data.sampling is not None:
        return Preprocess(data.image_size, data.sampling)
    defaults = backbone_preprocess(cfg.model)
    if data.image_size is None:
        data.image_size = defaults.image_size  # None still when the backbone cannot tell without a download
    if data.sampling is None:
        data.sampling = defaults.sampling
    return Preprocess(data.image_size, data.sampling)


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
    a HF folder's ``config.json``, an OpenAI checkpoint's positional embedding (patch × grid), a known hub id, or a
    hub id's cached config. None when nothing describes it without a download (a path that does not exist yet, a
    hub model that is not cached): the data pipeline then asks for ``data.image_size``."""
    spec = str(model_cfg.clip).strip()
    if spec == "tiny":
        return int(model_cfg.tiny.image_size)
    path = Path(os.path.expanduser(spec))
    if spec.endswith((".pt", ".pth")):
        if not path.is_file():
            return None
        stat = path.stat()
        return _openai_image_size(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if path.is_dir():
        return _hf_folder_image_size(path)
    if spec in HUB_IMAGE_SIZES:
        return HUB_IMAGE_SIZES[spec]
    return _cached_hub_image_size(spec)


def _hf_folder_image_size(path: Path) -> int:
    config = path / "config.json"
    try:
        values = json.loads(config.read_text())
        size = (values.get("vision_config") or {}).get("image_size", 224)
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"model.clip = {str(path)!r}: cannot read the vision tower's image size from {config} "
                          f"({exc}); set data.image_size") from None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"{config}: vision_config.image_size = {size!r} is not a positive integer")
    return size


def _cached_hub_image_size(spec: str) -> int | None:
    from transformers import CLIPConfig

    try:  # the local cache only: resolving a config must not wait on the network
        return int(CLIPConfig.from_pretrained(spec, local_files_only=True).vision_config.image_size)
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=8)
def _openai_image_size(path: str, mtime_ns: int, size: int) -> int:
    from tvr.models.convert_openai import infer_config, load_openai_state_dict

    return int(infer_config(load_openai_state_dict(path)).vision_config.image_size)
