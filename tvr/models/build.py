"""Build a RetrievalModel (backbone + temporal module + head) from a Config (the tokenizer: ``tvr.data.tokenizer``)."""

from __future__ import annotations

import logging

from tvr.config import Config, ConfigError, ModelConfig
from tvr.models.clip_backbone import ClipBackbone
from tvr.models.clipvip import ClipVipBackbone
from tvr.models.heads.registry import build_head, head_class
from tvr.models.model import RetrievalModel
from tvr.models.temporal import build_temporal

log = logging.getLogger(__name__)

#: ``model.backbone`` values
BACKBONES = ("clip", "clipvip")
#: temporal modules allowed on top of a backbone that pools the video itself (both are the identity on one slot)
CLIPVIP_TEMPORAL = ("none", "meanP")


def build_backbone(model_cfg: ModelConfig) -> ClipBackbone:
    """The video/text backbone named by ``model.backbone`` (a :class:`~tvr.models.clip_backbone.ClipBackbone`)."""
    kind = model_cfg.backbone
    if kind == "clip":
        return ClipBackbone.from_config(model_cfg)
    if kind == "clipvip":
        if model_cfg.temporal not in CLIPVIP_TEMPORAL:
            raise ConfigError(
                f"model.temporal={model_cfg.temporal!r} with model.backbone=clipvip: CLIP-ViP pools the video "
                f"itself into one slot, so there is no frame sequence to aggregate; set model.temporal=none"
            )
        return ClipVipBackbone.from_config(model_cfg)
    raise ConfigError(f"model.backbone={kind!r}: expected one of {list(BACKBONES)}")


def check_backbone_provides(cfg: Config) -> None:
    """The head's required features exist with this backbone; a proxy projection nobody reads is refused (its
    parameters would get no gradient, which DDP treats as an error)."""
    needs_proxies = "proxies" in head_class(cfg.head.name).requires
    has_proxies = cfg.model.backbone == "clipvip" and cfg.model.clipvip.proxy_projection
    if needs_proxies and not has_proxies:
        raise ConfigError(
            f"head {cfg.head.name!r} reads per-video proxies: set model.backbone=clipvip and "
            "model.clipvip.proxy_projection=true"
        )
    if has_proxies and not needs_proxies:
        raise ConfigError(
            f"model.clipvip.proxy_projection=true but head {cfg.head.name!r} does not read video proxies: its "
            "parameters would never train; set it to false"
        )


def build_model(cfg: Config, cached: bool = False) -> RetrievalModel:
    """Build the model described by ``cfg``.

    ``cached=True`` (training/eval on a ``tvr features`` cache) keeps no backbone: the CLIP weights are still
    loaded once so that seqTransf is initialised from CLIP's text blocks and the head gets CLIP's logit scale,
    exactly as in end-to-end training.
    """
    check_backbone_provides(cfg)
    backbone = build_backbone(cfg.model)
    dim = backbone.embed_dim
    temporal = build_temporal(cfg.model.temporal, backbone, dim, cfg.model.temporal_layers)
    head = build_head(cfg.head, dim, backbone.logit_scale_value)
    if cached:
        backbone = None
    elif cfg.model.freeze_backbone:
        for param in backbone.parameters():
            param.requires_grad_(False)
    return RetrievalModel(backbone, temporal, head)
