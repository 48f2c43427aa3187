"""Feature containers passed between the backbone, the temporal module and the method heads.

Every container is a dataclass whose tensor fields share their first dimension (the item axis), so a head
can slice any of them into chunks with ``x[a:b]`` without knowing what is inside.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

T = TypeVar("T", bound="Sliceable")


@dataclasses.dataclass
class Sliceable:
    """Mixin: index every tensor field along dim 0; ``None`` fields stay ``None``.

    ``full_precision`` names fields a store keeps in float32 even when it stores the rest in float16: values whose
    range float16 cannot hold (squared norms, raw feature sums), where its 65504 ceiling would turn a large but
    valid feature into inf."""

    full_precision: ClassVar[tuple[str, ...]] = ()

    def __getitem__(self: T, index: Any) -> T:
        values = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            values[field.name] = value[index] if isinstance(value, Tensor) else value
        return dataclasses.replace(self, **values)

    def __len__(self) -> int:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Tensor):
                return int(value.shape[0])
        raise ValueError(f"{type(self).__name__} holds no tensor")

    def to(self: T, device: torch.device | str, dtype: torch.dtype | None = None) -> T:
        values = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Tensor):
                # masks stay integer/bool; only floating tensors follow ``dtype``
                cast = dtype if (dtype is not None and value.is_floating_point()) else None
                value = value.to(device=device, dtype=cast)
            values[field.name] = value
        return dataclasses.replace(self, **values)

    @classmethod
    def cat(cls: type[T], parts: list[T]) -> T:
        """Concatenate along the item axis (all parts must share which fields are ``None``)."""
        if not parts:
            raise ValueError(f"cannot concatenate an empty list of {cls.__name__}")
        values = {}
        for field in dataclasses.fields(parts[0]):
            first = getattr(parts[0], field.name)
            if isinstance(first, Tensor):
                values[field.name] = torch.cat([getattr(p, field.name) for p in parts], dim=0)
            else:
                values[field.name] = first
        return dataclasses.replace(parts[0], **values)


@dataclasses.dataclass
class TextFeatures(Sliceable):
    """Backbone output for N captions (spec §1.1).

    eot:       [N, D] projected EOT token feature, not normalised.
    words:     [N, L, D] projected features of every token (after ln_final + text_projection), or None.
    word_mask: [N, L] 1 on real tokens (SOT..EOT), 0 on padding, or None.
    """

    eot: Tensor
    words: Tensor | None = None
    word_mask: Tensor | None = None


@dataclasses.dataclass
class VideoFeatures(Sliceable):
    """Per-frame features for N videos (after the temporal module when a model produced them).

    frames:     [N, F, D] projected CLS feature of every sampled frame slot (padding slots included). A backbone that
                pools the video itself (CLIP-ViP: the projected first video proxy) gives one slot, [N, 1, D].
    frame_mask: [N, F] 1 on real frames, 0 on zero-padding slots.
    proxies:    [N, M, D] per-video proxy embeddings (CLIP-ViP-style backbones, spec §4.1), or None.
    """

    frames: Tensor
    frame_mask: Tensor
    proxies: Tensor | None = None
