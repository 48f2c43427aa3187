"""A backbone defined outside the ``tvr`` package (registered with ``register_backbone`` when this module is
imported): the proof that a new backbone is one folder of its own and no edit in ``tvr/``. Its preset is
``tests/toy_backbone.yaml``; ``tests/test_backbone_registry.py`` trains, evaluates, indexes and searches with it.

The model is as small as a model can be and still learn: the text side is a bag of token embeddings (the tiny
CLIP's BPE, so no tokenizer of its own), the image side a linear map of each frame's pixels."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

from tvr.config import ModelConfig, bounded
from tvr.data.tokenizer import TINY_CLIP_BPE, TokenizerSpec
from tvr.models.backbones.registry import Backbone, register_backbone
from tvr.types import TextFeatures, VideoFeatures

NAME = "toy_bag"


@dataclasses.dataclass
class ToyBagOptions:
    #: width of both towers' features
    embed_dim: int = bounded(16, ge=1, le=256)
    #: token ids the text embedding table holds (the tiny BPE has 770)
    vocab_size: int = bounded(1024, ge=3, le=65536)
    #: frame side the image tower takes
    image_size: int = bounded(16, ge=4, le=64)


class ToyBagModule(nn.Module):
    """encode_text: mean of the caption's token embeddings (per-token features as ``words``); encode_video: a linear
    map of every frame's pixels (one slot per frame)."""

    def __init__(self, options: ToyBagOptions) -> None:
        super().__init__()
        self.embed_dim = options.embed_dim
        self.tokens = nn.Embedding(options.vocab_size, options.embed_dim)
        self.frames = nn.Linear(3 * options.image_size**2, options.embed_dim)

    @property
    def logit_scale_value(self) -> float:
        return math.log(100.0)

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> TextFeatures:
        words = self.tokens(input_ids)
        mask = attention_mask.float().unsqueeze(-1)
        eot = (words * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        return TextFeatures(eot, words, attention_mask)

    def encode_video(self, pixels: Tensor, frame_mask: Tensor) -> VideoFeatures:
        return VideoFeatures(self.frames(pixels.flatten(2)), frame_mask)

    def maybe_half(self, device: torch.device | str) -> bool:
        return False

    def enable_gradient_checkpointing(self) -> None:
        pass


@register_backbone(NAME)
class ToyBag(Backbone):
    Options = ToyBagOptions

    def image_size(self, model_cfg: ModelConfig) -> int | None:
        return model_cfg.options.image_size

    def tokenizer(self, model_cfg: ModelConfig) -> TokenizerSpec:
        return TokenizerSpec(TINY_CLIP_BPE, "", model_cfg.backbone)

    def build(self, model_cfg: ModelConfig) -> nn.Module:
        return ToyBagModule(model_cfg.options)
