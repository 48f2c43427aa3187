"""What tvr needs to know of the ``clipvip`` backbone (the package docstring describes it)."""

from __future__ import annotations

from torch import nn

from tvr.config import Config, ConfigError, ModelConfig
from tvr.models.backbones.base import register_backbone
from tvr.models.backbones.clip.backbone import Clip
from tvr.models.backbones.clipvip.config import ClipVipSettings

#: temporal modules allowed on top of a backbone that pools the video itself (both are the identity on one slot)
CLIPVIP_TEMPORAL = ("none", "meanP")


@register_backbone("clipvip")
class ClipVip(Clip):
    Settings = ClipVipSettings
    sampling = "clipvip"
    proxy_hint = "model.backbone=clipvip and model.clipvip.proxy_projection=true"

    def provides(self, model_cfg: ModelConfig) -> frozenset[str]:
        return super().provides(model_cfg) | ({"proxies"} if model_cfg.clipvip.proxy_projection else set())

    def randomly_initialised(self, model_cfg: ModelConfig) -> bool:
        # without a CLIP-ViP checkpoint its new tokens start from a random init
        return model_cfg.clip == "tiny" or not model_cfg.clipvip.checkpoint

    def check_head(self, cfg: Config, requires: frozenset[str]) -> None:
        if cfg.model.clipvip.proxy_projection and "proxies" not in requires:
            raise ConfigError(
                f"model.clipvip.proxy_projection=true but head {cfg.head.name!r} does not read video proxies: its "
                "parameters would never train; set it to false"
            )

    def build(self, model_cfg: ModelConfig) -> nn.Module:
        if model_cfg.temporal not in CLIPVIP_TEMPORAL:
            raise ConfigError(
                f"model.temporal={model_cfg.temporal!r} with model.backbone=clipvip: CLIP-ViP pools the video "
                f"itself into one slot, so there is no frame sequence to aggregate; set model.temporal=none"
            )
        from tvr.models.backbones.clipvip.modeling import ClipVipBackbone

        return ClipVipBackbone.from_config(model_cfg)
