"""The CLIP backbone's settings: ``model.clip`` names its weights, ``model.tiny`` sizes a randomly initialised one."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvr.config import MAX_TINY_HEADS, MAX_TINY_LAYERS, MAX_TINY_WIDTH, bounded


@dataclass
class TinyClipConfig:
    """A small randomly initialised CLIP of the real architecture (tests, demo, CPU experiments).

    Every size has a ceiling (ViT-B/16's sizes fit under it): a config is data, and one carried by a checkpoint or an
    index must not be able to make the model it describes allocate without bound (a vocabulary of 40,000,000 at
    width 64 asked for 10 GB before the checkpoint's tensors were compared with it).
    """

    #: width of the joint text-video space (both projections' output)
    embed_dim: int = bounded(64, ge=1, le=MAX_TINY_WIDTH)
    #: width of the text transformer
    text_width: int = bounded(64, ge=1, le=MAX_TINY_WIDTH)
    #: text transformer layers (seqTransf copies its first ones)
    text_layers: int = bounded(4, ge=1, le=MAX_TINY_LAYERS)
    #: attention heads per text layer
    text_heads: int = bounded(4, ge=1, le=MAX_TINY_HEADS)
    #: width of the vision transformer
    vision_width: int = bounded(64, ge=1, le=MAX_TINY_WIDTH)
    #: vision transformer layers
    vision_layers: int = bounded(2, ge=1, le=MAX_TINY_LAYERS)
    #: attention heads per vision layer
    vision_heads: int = bounded(4, ge=1, le=MAX_TINY_HEADS)
    #: input frame side in pixels (a multiple of patch_size; data.image_size defaults to it)
    image_size: int = bounded(32, ge=1, le=1024)
    #: side of a vision patch in pixels
    patch_size: int = bounded(8, ge=1, le=256)
    #: text positions (CLIP: 77); data.max_words may not exceed it
    context_length: int = bounded(77, ge=3, le=1024)
    #: token ids the text embedding table holds (CLIP's BPE: 49408)
    vocab_size: int = bounded(49408, ge=3, le=262_144)


@dataclass
class ClipSettings:
    """The ``model.*`` settings the CLIP backbones (clip, clipvip) read."""

    #: "tiny" (random init from ``model.tiny``), a local HF CLIP directory, a hub id, or an OpenAI ``ViT-B-32.pt``
    #: file
    clip: str = "tiny"
    #: the tiny random CLIP's sizes (used when ``clip`` is "tiny")
    tiny: TinyClipConfig = field(default_factory=TinyClipConfig)
