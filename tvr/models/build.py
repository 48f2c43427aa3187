"""Build a RetrievalModel (backbone + bridge + temporal module + head) from a resolved Config. What each backbone
is, provides and checks is declared in its folder (:mod:`tvr.models.backbones`); the tokenizer it names is built by
``tvr.data.tokenizer``, the pixels it expects are resolved into ``data.*`` (:mod:`tvr.models.preprocess`)."""

from __future__ import annotations

import logging

from torch import nn

from tvr.config import Config, ConfigError, ModelConfig
from tvr.models.backbones.registry import available_backbones, backbone_spec, resolve_backbone_sections
from tvr.models.heads.registry import build_head, head_class, resolve_head_config
from tvr.models.model import RetrievalModel
from tvr.models.temporal import build_temporal

log = logging.getLogger(__name__)


def check_data_fits_backbone(cfg: Config) -> None:
    """Frame size and caption length the data pipeline makes are ones the backbone takes (two_tower: the image
    architecture's resolution; checked before any weights load)."""
    resolve_backbone_sections(cfg.model).check_data(cfg)


def build_backbone(model_cfg: ModelConfig) -> nn.Module:
    """The video/text backbone named by ``model.backbone`` (a registered one: ``tvr.models.backbones``), with the
    pretrained weights its settings name."""
    return resolve_backbone_sections(model_cfg).build(model_cfg)


def check_backbone_provides(cfg: Config) -> None:
    """The head's required features exist with this backbone, and the backbone makes nothing the head leaves
    untrained (its parameters would get no gradient, which DDP treats as an error). Resolves ``cfg.head`` (its
    options become the head's dataclass) first."""
    resolve_head_config(cfg.head)
    requires = head_class(cfg.head.name).requires
    backbone = resolve_backbone_sections(cfg.model)
    backbone.check_head(cfg, requires)
    if "proxies" in requires and "proxies" not in backbone.provides(cfg.model):
        hints = [hint for hint in (backbone_spec(name).proxy_hint for name in available_backbones()) if hint]
        raise ConfigError(f"head {cfg.head.name!r} reads per-video proxies: set {', or '.join(hints)}")


def check_image_size(cfg: Config) -> None:
    """The backbone takes ``data.image_size`` images (e.g. CLIP's patch grid and position table are fixed at its
    input size, so another crop would fail at the first forward pass, after set-up). Raises ConfigError naming both
    settings."""
    resolve_backbone_sections(cfg.model).check_image_size(cfg)


def build_model(cfg: Config, cached: bool = False) -> RetrievalModel:
    """Build the model described by ``cfg``.

    ``cached=True`` (training/eval on a ``tvr features`` cache) keeps no backbone: its weights are still loaded
    once so that seqTransf is initialised from CLIP's text blocks and the head gets the backbone's logit scale,
    exactly as in end-to-end training. A backbone's bridge (the two-tower one) is kept: it runs on cached features.
    """
    spec = resolve_backbone_sections(cfg.model)
    check_backbone_provides(cfg)
    spec.check_data(cfg)
    backbone = spec.build(cfg.model)
    requires = head_class(cfg.head.name).requires
    num_proxies = int(getattr(cfg.head.options, "num_proxies", 0)) if "proxies" in requires else 0
    bridge = spec.build_bridge(backbone, cfg, num_proxies)
    dim = bridge.embed_dim if bridge is not None else backbone.embed_dim
    temporal = build_temporal(cfg.model.temporal, spec.temporal_init(backbone), dim, cfg.model.temporal_layers)
    head = build_head(cfg.head, dim, backbone.logit_scale_value)
    if cached:
        backbone = None
    elif cfg.model.freeze_backbone:
        for param in backbone.parameters():
            param.requires_grad_(False)
    elif cfg.model.gradient_checkpointing:
        backbone.enable_gradient_checkpointing()
    return RetrievalModel(backbone, temporal, head, bridge)
