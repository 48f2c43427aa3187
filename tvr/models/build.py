"""Build a RetrievalModel (backbone + bridge + temporal module + head) from a Config (the tokenizer:
``tvr.data.tokenizer``; the pixels the backbone expects: ``tvr.models.preprocess``)."""

from __future__ import annotations

import logging

from torch import nn

from tvr.config import Config, ConfigError, ModelConfig
from tvr.models.heads.registry import build_head, head_class, head_options
from tvr.models.model import RetrievalModel
from tvr.models.temporal import build_temporal

log = logging.getLogger(__name__)

#: ``model.backbone`` values
BACKBONES = ("clip", "clipvip", "two_tower")
#: temporal modules allowed on top of a backbone that pools the video itself (both are the identity on one slot)
CLIPVIP_TEMPORAL = ("none", "meanP")


def check_data_fits_backbone(cfg: Config) -> None:
    """Frame size and caption length the data pipeline makes are ones the backbone takes (two_tower: the image
    architecture's resolution; checked before any weights load)."""
    if cfg.model.backbone != "two_tower":
        return
    from tvr.models.image_tower import native_image_size

    size = native_image_size(cfg.model.two_tower)
    if cfg.data.image_size is not None and cfg.data.image_size != size:  # unset: resolution gives it the native size
        raise ConfigError(
            f"data.image_size = {cfg.data.image_size}: the two-tower image tower "
            f"{cfg.model.two_tower.image_model!r} takes {size}-pixel frames; set data.image_size={size}"
        )


def proxies_to_derive(cfg: Config) -> int:
    """M proxies the two-tower bridge derives (``head.options.num_proxies`` for a head that reads proxies, else 0)."""
    if cfg.model.backbone != "two_tower" or "proxies" not in head_class(cfg.head.name).requires:
        return 0
    return int(head_options(cfg.head.name, cfg.head.options).num_proxies)


def build_backbone(model_cfg: ModelConfig) -> nn.Module:
    """The video/text backbone named by ``model.backbone``: a :class:`~tvr.models.clip_backbone.ClipBackbone`, a
    :class:`~tvr.models.clipvip.ClipVipBackbone` or a :class:`~tvr.models.two_tower.TwoTowerBackbone`."""
    kind = model_cfg.backbone
    # each backbone's module is imported when it is built: CLIP's pulls in transformers' CLIP modelling, which a
    # two-tower model never runs
    if kind == "clip":
        from tvr.models.clip_backbone import ClipBackbone

        return ClipBackbone.from_config(model_cfg)
    if kind == "clipvip":
        if model_cfg.temporal not in CLIPVIP_TEMPORAL:
            raise ConfigError(
                f"model.temporal={model_cfg.temporal!r} with model.backbone=clipvip: CLIP-ViP pools the video "
                f"itself into one slot, so there is no frame sequence to aggregate; set model.temporal=none"
            )
        from tvr.models.clipvip import ClipVipBackbone

        return ClipVipBackbone.from_config(model_cfg)
    if kind == "two_tower":
        from tvr.models.two_tower import TwoTowerBackbone

        return TwoTowerBackbone.from_config(model_cfg)
    raise ConfigError(f"model.backbone={kind!r}: expected one of {list(BACKBONES)}")


def check_backbone_provides(cfg: Config) -> None:
    """The head's required features exist with this backbone; a proxy projection nobody reads is refused (its
    parameters would get no gradient, which DDP treats as an error)."""
    needs_proxies = "proxies" in head_class(cfg.head.name).requires
    has_proxies = cfg.model.backbone == "clipvip" and cfg.model.clipvip.proxy_projection
    if needs_proxies and cfg.model.backbone == "two_tower":
        return  # the two-tower bridge derives them (temporal segment means, tvr.models.bridge)
    if needs_proxies and not has_proxies:
        raise ConfigError(
            f"head {cfg.head.name!r} reads per-video proxies: set model.backbone=clipvip and "
            "model.clipvip.proxy_projection=true, or model.backbone=two_tower (which derives them)"
        )
    if has_proxies and not needs_proxies:
        raise ConfigError(
            f"model.clipvip.proxy_projection=true but head {cfg.head.name!r} does not read video proxies: its "
            "parameters would never train; set it to false"
        )


def check_image_size(cfg: Config) -> None:
    """The backbone takes ``data.image_size`` images: CLIP's patch grid and position table are fixed at its input
    size, so another crop would fail at the first forward pass, after set-up. Raises ConfigError naming both
    settings (unknowable sizes, e.g. an OpenAI .pt file, are left to loading)."""
    if cfg.model.backbone not in ("clip", "clipvip"):  # the two-tower image tower: check_data_fits_backbone
        return
    if cfg.data.image_size is None:  # unset: resolving the config gives it the backbone's own size
        return
    from tvr.models.clip_backbone import backbone_image_size

    known = backbone_image_size(cfg.model)
    if known is not None and known[0] != cfg.data.image_size:
        size, source = known
        raise ConfigError(
            f"data.image_size = {cfg.data.image_size} but the backbone takes {size}×{size} images ({source}): set "
            f"data.image_size={size}, or use a backbone whose input size is {cfg.data.image_size}"
        )


def build_model(cfg: Config, cached: bool = False) -> RetrievalModel:
    """Build the model described by ``cfg``.

    ``cached=True`` (training/eval on a ``tvr features`` cache) keeps no backbone: the CLIP weights are still
    loaded once so that seqTransf is initialised from CLIP's text blocks and the head gets CLIP's logit scale,
    exactly as in end-to-end training. A two-tower model keeps its bridge (the cache holds tower features).
    """
    check_backbone_provides(cfg)
    check_data_fits_backbone(cfg)
    backbone = build_backbone(cfg.model)
    bridge = None
    if cfg.model.backbone == "two_tower":
        from tvr.models.text_tower import check_max_words
        from tvr.models.two_tower import build_two_tower_bridge

        check_max_words(backbone.text_tower, cfg.data.max_words)
        bridge = build_two_tower_bridge(backbone, cfg.model.two_tower, proxies_to_derive(cfg))
        dim = bridge.embed_dim
        # no CLIP text blocks to copy: seqTransf starts from its random init
        temporal = build_temporal(cfg.model.temporal, None, dim, cfg.model.temporal_layers)
    else:
        dim = backbone.embed_dim
        temporal = build_temporal(cfg.model.temporal, backbone, dim, cfg.model.temporal_layers)
    head = build_head(cfg.head, dim, backbone.logit_scale_value)
    if cached:
        backbone = None
    elif cfg.model.freeze_backbone:
        for param in backbone.parameters():
            param.requires_grad_(False)
    elif cfg.model.gradient_checkpointing:
        backbone.enable_gradient_checkpointing()
    return RetrievalModel(backbone, temporal, head, bridge)
