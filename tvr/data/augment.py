"""Video-consistent RandAugment (``rand-m7-n4-mstd0.5-inc1``, spec §2.1), in torch, without PIL/torchvision.

Semantics of the policy string (timm's RandAugment, which the GARE reference wraps for frame lists):
  * ``n4``: 4 ops drawn uniformly *with replacement* from the op list; each is applied with probability 0.5.
  * ``m7``/``mstd0.5``: each op draws its own magnitude ~ N(7, 0.5²), clipped to [0, 10].
  * ``inc1``: the "increasing" op variants, whose strength grows with the magnitude (Posterize/Solarize/enhance
    ops); geometric ops and enhance factors get a random sign.
Video consistency: every random choice above is made once per clip and the same op with the same argument is
applied to every frame, as ``AugmentOp.__call__(img_list)`` does. Ops that depend on image statistics
(AutoContrast, Equalize, Contrast) still use each frame's own statistics, as a per-image op does.

Pixel arithmetic follows PIL's definitions (blend truncation, ITU-R 601 luma in integers, the SMOOTH kernel,
PIL's equalize/autocontrast look-up tables, affine maps on pixel centres) and rounds back to integers after every
op, because PIL works in uint8 between ops. Geometric ops use ``grid_sample``; their edges are filled with the
CLIP mean colour. Two deliberate differences: the bilinear/bicubic choice for geometric ops is drawn once per op per
clip (timm draws it per image), and torch's bicubic kernel (a = -0.75) differs slightly from PIL's.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tvr.data.transforms import CLIP_MEAN

LEVEL_DENOM = 10.0
#: timm's ``_RAND_INCREASING_TRANSFORMS`` (the op list selected by ``inc1``)
INCREASING_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd",
    "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
    "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
)  # fmt: skip
#: timm's ``_RAND_TRANSFORMS`` (``inc0``)
DEFAULT_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd",
    "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
)  # fmt: skip
ALL_OPS = tuple(sorted(set(INCREASING_OPS) | set(DEFAULT_OPS) | {"TranslateX", "TranslateY"}))
#: fill colour of geometric ops: the CLIP mean as uint8, so filled areas normalise to ≈ 0
CLIP_FILL = tuple(round(255 * m) for m in CLIP_MEAN)
TRANSLATE_PCT = 0.45


@dataclasses.dataclass(frozen=True)
class AugStep:
    """One sampled op of a clip's plan. ``argument`` is what the op uses (degrees, shear, fraction or pixels of
    translation, enhance factor, bits, threshold, addend), already signed; None for parameterless ops."""

    name: str
    applied: bool
    magnitude: float
    argument: float | None
    interpolation: str


# --------------------------------------------------------------------------------------------- arguments


def op_argument(name: str, magnitude: float, negate: bool, short_side: int = 224) -> float | None:
    """timm's level→argument map for ``name`` at ``magnitude`` (0..10); ``negate`` flips signed arguments.

    ``short_side`` sets ``translate_const`` = 0.45 · short side (100.8 px for 224-px frames) for the absolute
    TranslateX/Y ops; the Rel variants translate 0.45 · level/10 of the frame's own width/height.
    """
    level = magnitude / LEVEL_DENOM
    sign = -1.0 if negate else 1.0
    if name in ("AutoContrast", "Equalize", "Invert"):
        return None
    if name == "Rotate":
        return sign * level * 30.0
    if name in ("ShearX", "ShearY"):
        return sign * level * 0.3
    if name in ("TranslateXRel", "TranslateYRel"):
        return sign * level * TRANSLATE_PCT
    if name in ("TranslateX", "TranslateY"):
        return sign * level * TRANSLATE_PCT * short_side
    if name in ("ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"):
        return 1.0 + sign * level * 0.9
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return level * 1.8 + 0.1
    if name == "PosterizeIncreasing":
        return float(4 - int(level * 4))
    if name == "Posterize":
        return float(int(level * 4))
    if name == "SolarizeIncreasing":
        return float(256 - int(level * 256))
    if name == "Solarize":
        return float(int(level * 256))
    if name == "SolarizeAdd":
        return float(int(level * 110))
    raise ValueError(f"unknown RandAugment op {name!r}; known: {ALL_OPS}")


# --------------------------------------------------------------------------------------------- pixel ops
# All take and return float tensors [n, 3, H, W] holding integers 0..255.


def _blend(degenerate: Tensor, image: Tensor, factor: float) -> Tensor:
    """PIL ``Image.blend(degenerate, image, factor)``: float32 interpolation, clipped, truncated to uint8."""
    alpha = torch.tensor(factor, dtype=torch.float32)
    out = degenerate + alpha * (image - degenerate)
    return out.clamp_(0.0, 255.0).floor_()


def _luma(x: Tensor) -> Tensor:
    """PIL RGB→L: (19595 R + 38470 G + 7471 B + 0x8000) >> 16, shape [n, 1, H, W]."""
    xi = x.to(torch.int64)
    weights = torch.tensor([19595, 38470, 7471], dtype=torch.int64).view(1, 3, 1, 1)
    return (((xi * weights).sum(dim=1, keepdim=True) + 0x8000) >> 16).to(x.dtype)


def auto_contrast(x: Tensor) -> Tensor:
    """PIL ``ImageOps.autocontrast`` (cutoff 0): stretch each frame's channel to 0..255, ``int(v·scale + offset)``."""
    flat = x.reshape(x.shape[0], x.shape[1], -1).double()
    lo = flat.min(dim=2, keepdim=True).values
    hi = flat.max(dim=2, keepdim=True).values
    span = hi - lo
    valid = span > 0
    scale = torch.where(valid, 255.0 / span.clamp(min=1.0), torch.ones_like(span))
    offset = torch.where(valid, -lo * scale, torch.zeros_like(lo))
    out = (flat * scale + offset).floor().clamp(0, 255)
    return out.view_as(x).to(x.dtype)


def equalize(x: Tensor) -> Tensor:
    """PIL ``ImageOps.equalize`` per frame and channel: lut[i] = (step//2 + #pixels below i) // step with
    step = (#pixels − count of the highest occupied level) // 255; identity when step is 0."""
    n, c, h, w = x.shape
    xi = x.to(torch.int64).reshape(n * c, h * w)
    rows = torch.arange(n * c).unsqueeze(1) * 256
    hist = torch.bincount((xi + rows).flatten(), minlength=n * c * 256).view(n * c, 256)
    occupied = hist > 0
    top_level = 255 - occupied.flip(dims=[1]).int().argmax(dim=1)
    top_count = hist.gather(1, top_level.unsqueeze(1)).squeeze(1)
    step = (hist.sum(dim=1) - top_count) // 255
    below = torch.cumsum(hist, dim=1) - hist
    safe = step.clamp(min=1).unsqueeze(1)
    lut = ((step.unsqueeze(1) // 2 + below) // safe).clamp(max=255)
    identity = torch.arange(256).expand(n * c, 256)
    lut = torch.where((step > 0).unsqueeze(1), lut, identity)
    return lut.gather(1, xi).view(n, c, h, w).to(x.dtype)


def posterize(x: Tensor, bits: int) -> Tensor:
    """Keep the ``bits`` most significant bits (PIL ``ImageOps.posterize``; bits ≥ 8 is the identity)."""
    if bits >= 8:
        return x
    shift = 8 - max(0, bits)
    return ((x.to(torch.int64) >> shift) << shift).to(x.dtype)


def solarize(x: Tensor, threshold: float) -> Tensor:
    """Invert pixels ≥ threshold (PIL ``ImageOps.solarize``)."""
    return torch.where(x < threshold, x, 255.0 - x)


def solarize_add(x: Tensor, addend: float, threshold: float = 128.0) -> Tensor:
    """Add ``addend`` to pixels below ``threshold``, saturating at 255 (timm ``solarize_add``)."""
    return torch.where(x < threshold, (x + addend).clamp(max=255.0), x)


def adjust_color(x: Tensor, factor: float) -> Tensor:
    """PIL ``ImageEnhance.Color``: blend with the frame's grey (L) version."""
    return _blend(_luma(x).expand_as(x), x, factor)


def adjust_contrast(x: Tensor, factor: float) -> Tensor:
    """PIL ``ImageEnhance.Contrast``: blend with a flat image of the frame's rounded mean luma."""
    mean = torch.floor(_luma(x).double().mean(dim=(1, 2, 3), keepdim=True) + 0.5).to(x.dtype)
    return _blend(mean.expand_as(x), x, factor)


def adjust_brightness(x: Tensor, factor: float) -> Tensor:
    """PIL ``ImageEnhance.Brightness``: blend with black."""
    return _blend(torch.zeros_like(x), x, factor)


def adjust_sharpness(x: Tensor, factor: float) -> Tensor:
    """PIL ``ImageEnhance.Sharpness``: blend with the SMOOTH-filtered frame (3×3 kernel [1 1 1; 1 5 1; 1 1 1]/13,
    rounded, border pixels left as they are)."""
    if x.shape[-1] < 3 or x.shape[-2] < 3:
        return x
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    weight = kernel.to(x.dtype).view(1, 1, 3, 3).repeat(3, 1, 1, 1)
    smooth = F.conv2d(x, weight, groups=3)
    degenerate = x.clone()
    degenerate[..., 1:-1, 1:-1] = torch.floor(smooth + 0.5).clamp(0.0, 255.0)
    return _blend(degenerate, x, factor)


def affine(x: Tensor, matrix: tuple[float, ...], interpolation: str, fill: tuple[int, int, int] = CLIP_FILL) -> Tensor:
    """PIL-style affine transform: output pixel (x, y) takes the input at
    (a·X + b·Y + c, d·X + e·Y + f), with X = x + 0.5, Y = y + 0.5 (pixel centres); outside → ``fill``."""
    n, _, h, w = x.shape
    a, b, c, d, e, f = matrix
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float64) + 0.5, torch.arange(w, dtype=torch.float64) + 0.5, indexing="ij"
    )
    u = a * xs + b * ys + c
    v = d * xs + e * ys + f
    grid = torch.stack([2.0 * u / w - 1.0, 2.0 * v / h - 1.0], dim=-1).to(torch.float32)
    grid = grid.unsqueeze(0).expand(n, h, w, 2)
    with_alpha = torch.cat([x.float(), torch.ones_like(x[:, :1]).float()], dim=1)
    sampled = F.grid_sample(with_alpha, grid, mode=interpolation, padding_mode="zeros", align_corners=False)
    rgb, alpha = sampled[:, :3], sampled[:, 3:].clamp(0.0, 1.0)
    fill_t = torch.tensor(fill, dtype=torch.float32).view(1, 3, 1, 1)
    out = rgb + (1.0 - alpha) * fill_t
    return out.clamp_(0.0, 255.0).round_().to(x.dtype)


def rotation_matrix(degrees: float, width: int, height: int) -> tuple[float, ...]:
    """Output→input map of a counter-clockwise rotation by ``degrees`` about the frame centre (PIL ``rotate``)."""
    phi = -math.radians(degrees)
    cos, sin = math.cos(phi), math.sin(phi)
    cx, cy = width / 2.0, height / 2.0
    # input = R (out - centre) + centre
    return (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)


def apply_op(x: Tensor, name: str, argument: float | None, interpolation: str = "bilinear") -> Tensor:
    """Apply one named op with its (already sampled) argument to float frames [n, 3, H, W]."""
    h, w = x.shape[-2], x.shape[-1]
    if name == "AutoContrast":
        return auto_contrast(x)
    if name == "Equalize":
        return equalize(x)
    if name == "Invert":
        return 255.0 - x
    if name == "Rotate":
        return affine(x, rotation_matrix(argument, w, h), interpolation)
    if name == "ShearX":
        return affine(x, (1.0, argument, 0.0, 0.0, 1.0, 0.0), interpolation)
    if name == "ShearY":
        return affine(x, (1.0, 0.0, 0.0, argument, 1.0, 0.0), interpolation)
    if name == "TranslateXRel":
        return affine(x, (1.0, 0.0, argument * w, 0.0, 1.0, 0.0), interpolation)
    if name == "TranslateYRel":
        return affine(x, (1.0, 0.0, 0.0, 0.0, 1.0, argument * h), interpolation)
    if name == "TranslateX":
        return affine(x, (1.0, 0.0, argument, 0.0, 1.0, 0.0), interpolation)
    if name == "TranslateY":
        return affine(x, (1.0, 0.0, 0.0, 0.0, 1.0, argument), interpolation)
    if name in ("Posterize", "PosterizeIncreasing"):
        return posterize(x, int(argument))
    if name in ("Solarize", "SolarizeIncreasing"):
        return solarize(x, argument)
    if name == "SolarizeAdd":
        return solarize_add(x, argument)
    if name in ("Color", "ColorIncreasing"):
        return adjust_color(x, argument)
    if name in ("Contrast", "ContrastIncreasing"):
        return adjust_contrast(x, argument)
    if name in ("Brightness", "BrightnessIncreasing"):
        return adjust_brightness(x, argument)
    if name in ("Sharpness", "SharpnessIncreasing"):
        return adjust_sharpness(x, argument)
    raise ValueError(f"unknown RandAugment op {name!r}; known: {ALL_OPS}")


# --------------------------------------------------------------------------------------------- policy


class VideoRandAugment:
    """RandAugment with one random plan per clip, applied identically to all frames.

    ``__call__(frames [n, 3, H, W] uint8 or float 0..255, generator=None)`` returns the same shape and dtype.
    Randomness comes only from ``generator`` (a torch.Generator; the global torch RNG when None), with a fixed
    number of draws per op, so a seeded generator reproduces the plan exactly.
    """

    def __init__(
        self,
        num_ops: int = 4,
        magnitude: float = 7.0,
        magnitude_std: float = 0.5,
        prob: float = 0.5,
        increasing: bool = True,
        ops: tuple[str, ...] | None = None,
        magnitude_max: float = LEVEL_DENOM,
    ) -> None:
        if num_ops < 0:
            raise ValueError(f"num_ops must be >= 0, got {num_ops}")
        self.ops = tuple(ops) if ops is not None else (INCREASING_OPS if increasing else DEFAULT_OPS)
        for name in self.ops:
            op_argument(name, 0.0, False)  # validates the name
        if not self.ops:
            raise ValueError("VideoRandAugment needs at least one op")
        self.num_ops = num_ops
        self.magnitude = magnitude
        self.magnitude_std = magnitude_std
        self.prob = prob
        self.magnitude_max = magnitude_max

    def __repr__(self) -> str:
        return (
            f"VideoRandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, "
            f"magnitude_std={self.magnitude_std}, prob={self.prob}, ops={len(self.ops)})"
        )

    def sample_plan(self, short_side: int = 224, generator: torch.Generator | None = None) -> list[AugStep]:
        """Draw the clip's ops: op ids, then per op (apply?, magnitude noise, sign, interpolation)."""
        choice = torch.randint(len(self.ops), (self.num_ops,), generator=generator)
        plan = []
        for index in choice.tolist():
            draws = torch.rand(3, generator=generator).tolist()
            noise = float(torch.randn(1, generator=generator))
            name = self.ops[index]
            magnitude = self.magnitude + self.magnitude_std * noise if self.magnitude_std > 0 else self.magnitude
            magnitude = max(0.0, min(magnitude, self.magnitude_max))
            plan.append(
                AugStep(
                    name=name,
                    applied=draws[0] < self.prob,
                    magnitude=magnitude,
                    argument=op_argument(name, magnitude, negate=draws[1] < 0.5, short_side=short_side),
                    interpolation="bicubic" if draws[2] < 0.5 else "bilinear",
                )
            )
        return plan

    @staticmethod
    def apply_plan(frames: Tensor, plan: list[AugStep]) -> Tensor:
        if frames.ndim != 4 or frames.shape[1] != 3:
            raise ValueError(f"frames must be [n, 3, H, W], got shape {tuple(frames.shape)}")
        x = frames.float() if frames.dtype == torch.uint8 else frames.float().round().clamp(0, 255)
        for step in plan:
            if step.applied:
                x = apply_op(x, step.name, step.argument, step.interpolation)
        return x.to(torch.uint8) if frames.dtype == torch.uint8 else x.to(frames.dtype)

    def __call__(self, frames: Tensor, generator: torch.Generator | None = None) -> Tensor:
        plan = self.sample_plan(min(frames.shape[-2], frames.shape[-1]), generator)
        return self.apply_plan(frames, plan)
