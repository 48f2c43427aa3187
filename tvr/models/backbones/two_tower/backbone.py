"""What tvr needs to know of the ``two_tower`` backbone (the package docstring describes it)."""

from __future__ import annotations

from torch import nn

from tvr.config import Config, ConfigError, ModelConfig
from tvr.data.tokenizer import SENTENCE_MODEL, TokenizerSpec
from tvr.data.transforms import PixelNorm
from tvr.models.backbones.base import Backbone, register_backbone
from tvr.models.backbones.clip.backbone import CLIP_FEATURE_SETTINGS
from tvr.models.backbones.two_tower.config import TwoTowerSettings

#: the tower settings a run on a cache must share with it (the bridge may differ: it runs on the cached features)
TOWER_SETTINGS = ("text_model", "image_model", "image_weights")


@register_backbone("two_tower")
class TwoTower(Backbone):
    Settings = TwoTowerSettings
    feature_settings = CLIP_FEATURE_SETTINGS
    proxy_hint = "model.backbone=two_tower (which derives them)"

    def provides(self, model_cfg: ModelConfig) -> frozenset[str]:
        return frozenset({"frame_tokens", "word_tokens", "proxies"})  # proxies: the bridge derives them

    def matched_settings(self, model_cfg: ModelConfig) -> tuple[str, ...]:
        towers = model_cfg.two_tower
        tiny = "tiny" in (str(towers.text_model).strip(), str(towers.image_model).strip())
        return ("clip", "backbone", *(f"two_tower.{key}" for key in (*TOWER_SETTINGS, *(("tiny",) if tiny else ()))))

    def image_size(self, model_cfg: ModelConfig) -> int | None:
        from tvr.models.backbones.two_tower.image_tower import native_image_size

        return native_image_size(model_cfg.two_tower)

    def pixel_norm(self, model_cfg: ModelConfig) -> PixelNorm:
        from tvr.models.backbones.two_tower.image_tower import EFFICIENTNET_LITE_NORM

        return EFFICIENTNET_LITE_NORM

    def tokenizer(self, model_cfg: ModelConfig) -> TokenizerSpec:
        return TokenizerSpec(SENTENCE_MODEL, str(model_cfg.two_tower.text_model), model_cfg.backbone)

    def describe(self, model_cfg: ModelConfig) -> str:
        towers = model_cfg.two_tower
        return f"{self.name} backbone ({towers.text_model} + {towers.image_model}, {towers.bridge})"

    def check_data(self, cfg: Config) -> None:
        """The frame size is the image architecture's resolution (checked before any weights load)."""
        from tvr.models.backbones.two_tower.image_tower import native_image_size

        size = native_image_size(cfg.model.two_tower)
        if cfg.data.image_size is not None and cfg.data.image_size != size:  # unset: resolution gives it the size
            raise ConfigError(
                f"data.image_size = {cfg.data.image_size}: the two-tower image tower "
                f"{cfg.model.two_tower.image_model!r} takes {size}-pixel frames; set data.image_size={size}"
            )

    def check_head(self, cfg: Config, requires: frozenset[str]) -> None:
        towers = cfg.model.two_tower
        context = getattr(cfg.head.options, "context", None)  # resolved: the head's options dataclass
        if towers.bridge == "conse" and towers.conse_fusion and context == "words":
            raise ConfigError(
                "head.options.context = 'words' reads per-token text features, which the fused ConSE bridge does "
                "not make (a token is not a query): use context: frames, or set model.two_tower.conse_class_weight "
                "and conse_bank_weight to 0"
            )

    def build(self, model_cfg: ModelConfig) -> nn.Module:
        from tvr.models.backbones.two_tower.modeling import TwoTowerBackbone

        return TwoTowerBackbone.from_config(model_cfg)

    def build_bridge(self, module: nn.Module, cfg: Config, num_proxies: int) -> nn.Module | None:
        from tvr.models.backbones.two_tower.modeling import build_two_tower_bridge
        from tvr.models.backbones.two_tower.text_tower import check_max_words

        check_max_words(module.text_tower, cfg.data.max_words)
        return build_two_tower_bridge(module, cfg.model.two_tower, num_proxies)
