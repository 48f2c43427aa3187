"""CLIP image preprocessing on frame tensors, without torchvision (spec §2.1, §2.2).

Geometry follows torchvision's ``Resize(int)`` / ``Resize((S, S))`` / ``CenterCrop`` so crops land on the same pixels
as the reference pipelines; interpolation is torch's bicubic with antialiasing, which approximates (not bit-matches)
PIL's bicubic filter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESIZE_MODES = ("short_side", "square")
#: the resize each frame-sampling scheme (``data.sampling``) is defined with: CLIP4Clip's short side + centre crop,
#: CLIP-ViP's square resize
SAMPLING_RESIZE = {"clip4clip": "short_side", "clipvip": "square"}


@dataclass(frozen=True)
class PixelNorm:
    """Per-channel (x − mean) / std of RGB values in [0, 1]. A backbone declares the one its image tower was trained
    with (``tvr.models.preprocess.backbone_norm``); a resolved config carries it as ``data.pixel_mean`` /
    ``data.pixel_std`` and the data pipeline applies it."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __post_init__(self) -> None:
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"PixelNorm: expected 3 means and 3 positive stds, got {self.mean} and {self.std}")


#: CLIP's normalisation (the default everywhere: CLIP and CLIP-ViP backbones)
CLIP_NORM = PixelNorm(CLIP_MEAN, CLIP_STD)


def _check_frames(x: Tensor, name: str = "frames") -> None:
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"{name} must be [n, 3, H, W], got shape {tuple(x.shape)}")


def _resize(x: Tensor, height: int, width: int, mode: str) -> Tensor:
    if (x.shape[-2], x.shape[-1]) == (height, width):
        return x.clone()  # torchvision returns the image untouched when the size already matches
    out = F.interpolate(
        x.float(),
        size=(height, width),
        mode=mode,
        antialias=mode in ("bilinear", "bicubic"),
        align_corners=False if mode in ("bilinear", "bicubic") else None,
    )
    out = out.clamp_(0.0, 255.0)
    if x.dtype == torch.uint8:
        return out.round_().to(torch.uint8)
    return out.to(x.dtype)


def short_side_size(height: int, width: int, size: int) -> tuple[int, int]:
    """Output (height, width) of resizing the shorter side to ``size`` (torchvision: long = int(size·long/short))."""
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


def resize_short_side(x: Tensor, size: int, mode: str = "bicubic") -> Tensor:
    """Resize [n, 3, H, W] so the shorter side is ``size``, keeping the aspect ratio.

    Values are treated as 0..255 and clamped there (bicubic overshoots); uint8 input comes back rounded uint8,
    float input comes back float.
    """
    _check_frames(x)
    height, width = short_side_size(x.shape[-2], x.shape[-1], size)
    return _resize(x, height, width, mode)


def square_resize(x: Tensor, size: int, mode: str = "bicubic") -> Tensor:
    """Resize [n, 3, H, W] to exactly size × size (CLIP-ViP: the aspect ratio is not preserved)."""
    _check_frames(x)
    return _resize(x, size, size, mode)


def center_crop(x: Tensor, size: int) -> Tensor:
    """Central size × size crop of [..., H, W] (torchvision placement: top = round((H - size) / 2)).

    A side shorter than ``size`` is zero-padded first, as torchvision does.
    """
    height, width = x.shape[-2], x.shape[-1]
    if height < size or width < size:
        pad_h, pad_w = max(0, size - height), max(0, size - width)
        x = F.pad(x, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2))
        height, width = x.shape[-2], x.shape[-1]
    top = int(round((height - size) / 2.0))
    left = int(round((width - size) / 2.0))
    return x[..., top : top + size, left : left + size]


def normalize(x: Tensor, norm: PixelNorm = CLIP_NORM) -> Tensor:
    """Normalisation of [..., 3, H, W] images with values in [0, 1] (CLIP's unless ``norm`` says otherwise)."""
    if x.shape[-3] != 3:
        raise ValueError(f"normalize expects 3 channels at dim -3, got shape {tuple(x.shape)}")
    mean = torch.tensor(norm.mean, dtype=x.dtype, device=x.device).view(3, 1, 1)
    std = torch.tensor(norm.std, dtype=x.dtype, device=x.device).view(3, 1, 1)
    return (x - mean) / std


def to_tensor_frames(frames: np.ndarray | Tensor) -> Tensor:
    """uint8 [n, H, W, 3] (numpy or torch, as decoders return) → uint8 [n, 3, H, W]."""
    x = torch.as_tensor(np.asarray(frames)) if not isinstance(frames, Tensor) else frames
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"frames must be [n, H, W, 3], got shape {tuple(x.shape)}")
    return x.permute(0, 3, 1, 2).contiguous()


def clip_preprocess(
    frames: np.ndarray | Tensor,
    size: int,
    mode: str = "short_side",
    augment: Callable[..., Tensor] | None = None,
    generator: torch.Generator | None = None,
    norm: PixelNorm = CLIP_NORM,
) -> Tensor:
    """uint8 RGB frames [n, H, W, 3] → normalised float32 [n, 3, size, size] (``norm``: CLIP's by default; the
    two-tower backbone declares EfficientNet-Lite's).

    ``short_side``: bicubic resize of the shorter side to ``size``, then centre crop (CLIP4Clip/GARE).
    ``square``: bicubic resize to exactly size × size (CLIP-ViP).
    ``augment`` runs on the resized uint8 frames before the crop, called as ``augment(x, generator=generator)``.
    Resizing first is equivalent to the reference order (augment, then resize/crop) on videos already compressed
    to a 224 short side (§2.1), and keeps augmentation cheap on full-resolution sources.
    """
    if mode not in RESIZE_MODES:
        raise ValueError(f"unknown resize mode {mode!r}; expected one of {RESIZE_MODES}")
    x = to_tensor_frames(frames)
    if x.dtype != torch.uint8:
        raise ValueError(f"frames must be uint8, got {x.dtype}")
    x = resize_short_side(x, size) if mode == "short_side" else square_resize(x, size)
    if augment is not None:
        x = augment(x, generator=generator)
    x = center_crop(x, size)
    return normalize(x.float() / 255.0, norm)
