"""Build a RetrievalModel (backbone + bridge + temporal module + head) from a resolved run
(:class:`~tvr.models.run_spec.RunSpec`, made once by :func:`~tvr.models.run_spec.resolve_run` at a job's start).
What each backbone is, provides and checks is declared in its folder (:mod:`tvr.models.backbones`); the tokenizer it
names is built by ``tvr.data.tokenizer``, the pixels it expects are in the resolved ``data.*``."""

from __future__ import annotations

import logging

from torch import nn

from tvr.config import ConfigError
from tvr.models.backbones.registry import available_backbones, backbone_spec
from tvr.models.heads.registry import build_head
from tvr.models.model import RetrievalModel
from tvr.models.run_spec import RunSpec
from tvr.models.temporal import build_temporal

log = logging.getLogger(__name__)


def check_data_fits_backbone(run: RunSpec) -> None:
    """Frame size and caption length the data pipeline makes are ones the backbone takes (two_tower: the image
    architecture's resolution; checked before any weights load)."""
    run.backbone.check_data(run.config)


def build_backbone(run: RunSpec) -> nn.Module:
    """The video/text backbone named by ``model.backbone`` (a registered one: ``tvr.models.backbones``), with the
    pretrained weights its settings name."""
    return run.backbone.build(run.config.model)


def check_backbone_provides(run: RunSpec) -> None:
    """The head's required features exist with this backbone, and the backbone makes nothing the head leaves
    untrained (its parameters would get no gradient, which DDP treats as an error)."""
    cfg = run.config
    requires = run.head.requires
    run.backbone.check_head(cfg, requires)
    if "proxies" in requires and "proxies" not in run.backbone.provides(cfg.model):
        hints = [hint for hint in (backbone_spec(name).proxy_hint for name in available_backbones()) if hint]
        raise ConfigError(f"head {cfg.head.name!r} reads per-video proxies: set {', or '.join(hints)}")


def check_image_size(run: RunSpec) -> None:
    """The backbone takes ``data.image_size`` images (e.g. CLIP's patch grid and position table are fixed at its
    input size, so another crop would fail at the first forward pass, after set-up). Raises ConfigError naming both
    settings."""
    run.backbone.check_image_size(run.config)


def build_model(run: RunSpec, cached: bool = False) -> RetrievalModel:
    """Build the model ``run`` describes.

    ``cached=True`` (training/eval on a ``tvr features`` cache) keeps no backbone: its weights are still loaded
    once so that seqTransf is initialised from CLIP's text blocks and the head gets the backbone's logit scale,
    exactly as in end-to-end training. A backbone's bridge (the two-tower one) is kept: it runs on cached features.
    """
    if not isinstance(run, RunSpec):
        raise TypeError(
            f"build_model takes a resolved run (tvr.models.run_spec.resolve_run(cfg)), got {type(run).__name__}"
        )
    cfg = run.config
    check_backbone_provides(run)
    run.backbone.check_data(cfg)
    backbone = build_backbone(run)
    num_proxies = int(getattr(cfg.head.options, "num_proxies", 0)) if "proxies" in run.head.requires else 0
    bridge = run.backbone.build_bridge(backbone, cfg, num_proxies)
    dim = bridge.embed_dim if bridge is not None else backbone.embed_dim
    temporal = build_temporal(cfg.model.temporal, run.backbone.temporal_init(backbone), dim, cfg.model.temporal_layers)
    head = build_head(cfg.head, dim, backbone.logit_scale_value)
    if cached:
        backbone = None
    elif cfg.model.freeze_backbone:
        for param in backbone.parameters():
            param.requires_grad_(False)
    elif cfg.model.gradient_checkpointing:
        backbone.enable_gradient_checkpointing()
    return RetrievalModel(backbone, temporal, head, bridge)
