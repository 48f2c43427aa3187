"""Temporal aggregation of per-frame CLIP features (spec §1.2).

Every module maps ``frames [N, F, D], frame_mask [N, F] -> [N, F, D]``; pooling over frames is the head's job.

* ``meanP`` / ``none``: frames pass through unchanged (the two names differ only in what the head is told).
* ``seqTransf``: learned frame positions + a CLIP-style residual transformer + a residual to the input,
  initialised from CLIP's text transformer (blocks 0..L-1 and the text positional embedding), as in CLIP4Clip/GARE.

The blocks are written here (not HF ``CLIPEncoderLayer``) so the module's maths does not move with ``transformers``
releases, but their parameter names equal HF's (``layer_norm1``, ``self_attn.q_proj`` …, ``mlp.fc1``), so copying
a CLIP text layer is a strict ``load_state_dict``.

Width mismatch policy: copying CLIP's text blocks needs ``dim == text_width`` and the same number of heads. When
they differ, ``init_from_clip`` raises (it never silently keeps a random init, which would quietly change the
method); pick ``temporal=meanP`` or a CLIP whose text width equals its embedding dim (all OpenAI ViTs do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvr.config import ConfigError

if TYPE_CHECKING:
    from tvr.models.backbones.clip.modeling import ClipBackbone

#: additive mask value for padded key frames, as in the reference (finite, so an all-padding row stays finite)
MASK_VALUE = -1e6


class QuickGELU(nn.Module):
    """CLIP's activation x·σ(1.702x)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"temporal transformer: width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        n, f, d = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(n, f, self.num_heads, d // self.num_heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)), attn_mask=bias
        )
        return self.out_proj(out.transpose(1, 2).reshape(n, f, d))


class _Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = QuickGELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ResidualBlock(nn.Module):
    """Pre-LN block: x + Attn(LN1(x)), then x + MLP(LN2(x)); no causal mask."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.self_attn = _SelfAttention(dim, num_heads)
        self.layer_norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = _Mlp(dim)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x), bias)
        return x + self.mlp(self.layer_norm2(x))


class PassThrough(nn.Module):
    """``meanP`` / ``none``: no parameters, frames returned unchanged."""

    def __init__(self, kind: str = "meanP") -> None:
        super().__init__()
        self.kind = kind

    def forward(self, frames: Tensor, frame_mask: Tensor) -> Tensor:
        return frames

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


class SeqTransformer(nn.Module):
    """seqTransf: ``out = Transformer(x + P[:F], key mask) + x`` (spec §1.2)."""

    def __init__(self, dim: int, num_layers: int = 4, num_heads: int | None = None, max_positions: int = 77) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"seqTransf needs at least one layer, got num_layers={num_layers}")
        self.dim = dim
        self.num_heads = num_heads if num_heads is not None else max(dim // 64, 1)
        self.max_positions = max_positions
        self.frame_position_embeddings = nn.Embedding(max_positions, dim)
        self.blocks = nn.ModuleList(ResidualBlock(dim, self.num_heads) for _ in range(num_layers))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random init used when there is no CLIP to copy from: N(0, 0.02) weights, zero biases, unit LayerNorms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    @torch.no_grad()
    def init_from_clip(self, backbone: ClipBackbone) -> None:
        """Copy CLIP text blocks 0..num_layers-1 and the text positional embedding exactly."""
        clip_blocks = backbone.text_blocks()
        positions = backbone.text_position_embedding()
        problems = []
        if backbone.text_width != self.dim:
            problems.append(f"CLIP text width {backbone.text_width} != temporal width {self.dim}")
        if backbone.text_heads != self.num_heads:
            problems.append(f"CLIP text heads {backbone.text_heads} != temporal heads {self.num_heads}")
        if len(clip_blocks) < len(self.blocks):
            problems.append(f"CLIP has {len(clip_blocks)} text blocks, fewer than temporal_layers={len(self.blocks)}")
        if tuple(positions.shape) != tuple(self.frame_position_embeddings.weight.shape):
            problems.append(
                f"CLIP text positions {tuple(positions.shape)} != frame positions "
                f"{tuple(self.frame_position_embeddings.weight.shape)}"
            )
        if problems:
            raise ValueError(
                "cannot initialise seqTransf from CLIP: "
                + "; ".join(problems)
                + " (use model.temporal=meanP, or a CLIP whose text width equals its embed dim)"
            )
        self.frame_position_embeddings.weight.copy_(positions.float())
        for mine, theirs in zip(self.blocks, clip_blocks, strict=False):
            mine.load_state_dict({k: v.float() for k, v in theirs.state_dict().items()}, strict=True)

    def forward(self, frames: Tensor, frame_mask: Tensor) -> Tensor:
        n, f, d = frames.shape
        if f > self.max_positions:
            raise ValueError(f"seqTransf: {f} frames exceed its {self.max_positions} frame positions")
        if frame_mask.shape != (n, f):
            raise ValueError(f"seqTransf: frame_mask {tuple(frame_mask.shape)} does not match frames {(n, f)}")
        x = frames + self.frame_position_embeddings.weight[:f].to(frames.dtype)
        # additive key mask (1 - m_k)·(-1e6), shared by every query and head: [N, 1, 1, F]
        bias = ((1.0 - frame_mask.to(frames.dtype)) * MASK_VALUE)[:, None, None, :]
        for block in self.blocks:
            x = block(x, bias)
        return x + frames


#: ``model.temporal`` values
TEMPORAL_MODULES = ("meanP", "seqTransf", "none")


def build_temporal(kind: str, backbone: ClipBackbone | None, dim: int, num_layers: int = 4) -> nn.Module:
    """The temporal module named by ``model.temporal``; seqTransf copies CLIP's text layers when given a backbone."""
    if kind in ("meanP", "none"):
        return PassThrough(kind)
    if kind != "seqTransf":
        raise ConfigError(f"model.temporal={kind!r}: expected one of {list(TEMPORAL_MODULES)}")
    if backbone is None:
        return SeqTransformer(dim, num_layers)
    if backbone.text_width != dim:
        raise ConfigError(
            f"cannot initialise seqTransf from CLIP: text width {backbone.text_width} != embed dim {dim} "
            f"(use model.temporal=meanP, or a CLIP whose text width equals its embed dim)"
        )
    module = SeqTransformer(dim, num_layers, num_heads=backbone.text_heads, max_positions=backbone.context_length)
    module.init_from_clip(backbone)
    return module
