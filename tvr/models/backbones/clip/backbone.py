"""What tvr needs to know of the ``clip`` backbone (the package docstring describes it)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tvr.config import Config, ConfigError, ModelConfig
from tvr.data.tokenizer import CLIP_BPE, TINY_CLIP_BPE, TokenizerSpec
from tvr.models.backbones.base import Backbone, register_backbone
from tvr.models.backbones.clip.config import ClipSettings
from tvr.models.backbones.clip.image_size import clip_image_size

#: the model settings a CLIP-family feature cache records (every built-in backbone's, as caches always have)
CLIP_FEATURE_SETTINGS = ("clip", "tiny", "backbone", "clipvip", "two_tower", "tokenizer", "clip_fp16_on_cuda")


@register_backbone("clip")
class Clip(Backbone):
    Settings = ClipSettings
    feature_settings = CLIP_FEATURE_SETTINGS

    def matched_settings(self, model_cfg: ModelConfig) -> tuple[str, ...]:
        return ("clip", "backbone")

    def image_size(self, model_cfg: ModelConfig) -> int | None:
        return clip_image_size(model_cfg)

    def tokenizer(self, model_cfg: ModelConfig) -> TokenizerSpec:
        """``model.tokenizer`` if set, else a CLIP folder's own files, else the tiny model's BPE for ``tiny``."""
        clip = str(model_cfg.clip)
        if model_cfg.tokenizer:
            return TokenizerSpec(CLIP_BPE, str(model_cfg.tokenizer), model_cfg.backbone)
        if clip != "tiny" and Path(clip).is_dir():
            return TokenizerSpec(CLIP_BPE, clip, model_cfg.backbone)
        if clip == "tiny":
            return TokenizerSpec(TINY_CLIP_BPE, "", model_cfg.backbone)
        return TokenizerSpec(
            CLIP_BPE,
            "",
            model_cfg.backbone,
            missing=f"no tokenizer for model.clip={clip!r}: set model.tokenizer to a folder with vocab.json + "
            "merges.txt or to CLIP's bpe_simple_vocab_16e6.txt.gz",
        )

    def randomly_initialised(self, model_cfg: ModelConfig) -> bool:
        return model_cfg.clip == "tiny"

    def describe(self, model_cfg: ModelConfig) -> str:
        return f"{self.name} backbone ({model_cfg.clip})"

    def check_image_size(self, cfg: Config) -> None:
        """CLIP's patch grid and position table are fixed at its input size, so another crop would fail at the first
        forward pass, after set-up (unknowable sizes, e.g. an OpenAI .pt file, are left to loading)."""
        if cfg.data.image_size is None:  # unset: resolving the config gives it the backbone's own size
            return
        from tvr.models.backbones.clip.modeling import backbone_image_size

        known = backbone_image_size(cfg.model)
        if known is not None and known[0] != cfg.data.image_size:
            size, source = known
            raise ConfigError(
                f"data.image_size = {cfg.data.image_size} but the backbone takes {size}×{size} images ({source}): "
                f"set data.image_size={size}, or use a backbone whose input size is {cfg.data.image_size}"
            )

    def build(self, model_cfg: ModelConfig) -> nn.Module:
        # the module is imported when it is built: it pulls in transformers' CLIP modelling
        from tvr.models.backbones.clip.modeling import ClipBackbone

        return ClipBackbone.from_config(model_cfg)

    def temporal_init(self, module: nn.Module) -> nn.Module | None:
        return module  # seqTransf starts from CLIP's text blocks
