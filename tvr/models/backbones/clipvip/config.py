"""CLIP-ViP's settings, ``model.clipvip`` (it reads the CLIP settings, ``model.clip`` / ``model.tiny``, too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvr.config import bounded
from tvr.models.backbones.clip.config import ClipSettings


@dataclass
class ClipVipConfig:
    """CLIP-ViP video backbone (spec §4.1, docs/methods/clipvip.md)."""

    #: M video proxy tokens: CLIP's class embedding + (M − 1) learned ones (CLIP-ViP: 4)
    num_proxies: int = bounded(4, ge=1, le=256)
    #: learned temporal-embedding slots, linearly interpolated to other frame counts (CLIP-ViP: 12)
    temporal_slots: int = bounded(12, ge=1, le=1024)
    #: CLIP-ViP post-pretrained checkpoint (``pretrain_clipvip_base_32.pt`` layout), applied over ``model.clip``;
    #: "" = start from plain CLIP with CLIP-ViP's initialisation of the new tokens
    checkpoint: str = ""
    #: TV-ProxyNet's bias-free ``visual_projection_patch``: return the M projected proxy tokens as
    #: ``VideoFeatures.proxies``; off = no such parameter (heads that ignore proxies must not carry it)
    proxy_projection: bool = False


@dataclass
class ClipVipSettings(ClipSettings):
    """The ``model.*`` settings the clipvip backbone reads: the CLIP weights it starts from and its own section."""

    #: CLIP-ViP's video tower (proxies, temporal slots, its post-pretrained checkpoint)
    clipvip: ClipVipConfig = field(default_factory=ClipVipConfig)
