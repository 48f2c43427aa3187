"""Temporal modules: pass-through, seqTransf maths against an independent reference, masking, CLIP init."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from tvr.config import ModelConfig
from tvr.models.backbones.clip.config import TinyClipConfig
from tvr.models.backbones.clip.modeling import ClipBackbone
from tvr.models.temporal import PassThrough, SeqTransformer, build_temporal


def _tiny_backbone(**overrides) -> ClipBackbone:
    tiny = TinyClipConfig(
        embed_dim=32,
        text_width=32,
        text_layers=3,
        text_heads=4,
        vision_width=32,
        vision_layers=1,
        vision_heads=2,
        image_size=16,
        patch_size=8,
        context_length=20,
        vocab_size=100,
    )
    for key, value in overrides.items():
        setattr(tiny, key, value)
    return ClipBackbone.from_config(ModelConfig(clip="tiny", tiny=tiny))


def _randomise(module: torch.nn.Module) -> None:
    """Non-trivial LayerNorm/bias values so the reference check covers every parameter."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))


def _reference(module: SeqTransformer, frames: Tensor, mask: Tensor) -> Tensor:
    """Written from the spec: explicit per-head loops, QuickGELU, pre-LN, additive (1-m)·(-1e6) key mask."""
    n, f, d = frames.shape
    h = module.num_heads
    dh = d // h
    x = frames + module.frame_position_embeddings.weight[:f]
    add = (1.0 - mask.float()) * -1e6  # [N, F] over keys

    def ln(t: Tensor, norm: torch.nn.LayerNorm) -> Tensor:
        mu = t.mean(-1, keepdim=True)
        var = ((t - mu) ** 2).mean(-1, keepdim=True)
        return (t - mu) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias

    for blk in module.blocks:
        a = blk.self_attn
        y = ln(x, blk.layer_norm1)
        q = y @ a.q_proj.weight.T + a.q_proj.bias
        k = y @ a.k_proj.weight.T + a.k_proj.bias
        v = y @ a.v_proj.weight.T + a.v_proj.bias
        out = torch.zeros_like(x)
        for b in range(n):
            parts = []
            for head in range(h):
                sl = slice(head * dh, (head + 1) * dh)
                logits = q[b, :, sl] @ k[b, :, sl].T / math.sqrt(dh) + add[b][None, :]
                parts.append(torch.softmax(logits, dim=-1) @ v[b, :, sl])
            out[b] = torch.cat(parts, dim=-1)
        x = x + out @ a.out_proj.weight.T + a.out_proj.bias
        y = ln(x, blk.layer_norm2)
        y = y @ blk.mlp.fc1.weight.T + blk.mlp.fc1.bias
        y = y * torch.sigmoid(1.702 * y)
        x = x + y @ blk.mlp.fc2.weight.T + blk.mlp.fc2.bias
    return x + frames


def test_passthrough_kinds_return_frames_unchanged() -> None:
    frames, mask = torch.randn(2, 5, 32), torch.ones(2, 5)
    for kind in ("meanP", "none"):
        module = build_temporal(kind, None, 32)
        assert isinstance(module, PassThrough)
        assert sum(p.numel() for p in module.parameters()) == 0
        assert torch.equal(module(frames, mask), frames)
    with pytest.raises(ValueError, match="seqTransf"):
        build_temporal("lstm", None, 32)


@pytest.mark.parametrize("num_heads", [1, 4])
def test_seqtransf_matches_reference(num_heads: int) -> None:
    module = SeqTransformer(32, num_layers=2, num_heads=num_heads, max_positions=10).eval()
    _randomise(module)
    frames = torch.randn(3, 6, 32)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    out = module(frames, mask)
    assert out.shape == frames.shape
    torch.testing.assert_close(out, _reference(module, frames, mask), atol=1e-5, rtol=1e-5)


def test_seqtransf_masked_frames_do_not_affect_real_positions() -> None:
    module = SeqTransformer(32, num_layers=2, num_heads=2, max_positions=10).eval()
    frames = torch.randn(2, 6, 32)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    out = module(frames, mask)
    changed = frames.clone()
    changed[0, 4:] = 100.0 * torch.randn(2, 32)
    out2 = module(changed, mask)
    # exp(-1e6) underflows to exactly 0 in float32: real rows are bit-identical
    torch.testing.assert_close(out2[0, :4], out[0, :4], atol=1e-6, rtol=0)
    torch.testing.assert_close(out2[1], out[1], atol=0, rtol=0)
    # without the mask the same change does leak into real positions (the check above can fail)
    ones = torch.ones_like(mask)
    assert (module(changed, ones)[0, :4] - module(frames, ones)[0, :4]).abs().max() > 1e-3


def test_seqtransf_zeroed_blocks_give_input_plus_positions_residual() -> None:
    module = SeqTransformer(32, num_layers=3, num_heads=2, max_positions=10)
    with torch.no_grad():
        for blk in module.blocks:
            for lin in (blk.self_attn.out_proj, blk.mlp.fc2):
                lin.weight.zero_()
                lin.bias.zero_()
    frames = torch.randn(2, 7, 32)
    out = module(frames, torch.ones(2, 7))
    # each block is the identity, so Transformer(x + P) = x + P and the output is (x + P) + x
    expected = 2 * frames + module.frame_position_embeddings.weight[:7]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_seqtransf_init_copies_clip_text_blocks_and_positions() -> None:
    backbone = _tiny_backbone()
    module = build_temporal("seqTransf", backbone, backbone.embed_dim, num_layers=2)
    assert isinstance(module, SeqTransformer)
    assert module.num_heads == backbone.text_heads == 4
    assert torch.equal(module.frame_position_embeddings.weight, backbone.text_position_embedding())
    for mine, theirs in zip(module.blocks, backbone.text_blocks()[:2], strict=True):
        ours, ref = mine.state_dict(), theirs.state_dict()
        assert set(ours) == set(ref)
        for key in ref:
            assert torch.equal(ours[key], ref[key]), key
    # a copy, not shared storage: training the temporal module must not move CLIP
    with torch.no_grad():
        module.blocks[0].layer_norm1.weight.add_(1.0)
    assert not torch.equal(module.blocks[0].layer_norm1.weight, backbone.text_blocks()[0].layer_norm1.weight)


def test_seqtransf_copied_block_computes_like_the_hf_clip_layer() -> None:
    backbone = _tiny_backbone()
    module = build_temporal("seqTransf", backbone, backbone.embed_dim, num_layers=1).eval()
    x = torch.randn(2, 5, 32)
    hf_layer = backbone.text_blocks()[0].eval()
    expected = hf_layer(x, attention_mask=torch.zeros(2, 1, 5, 5))
    torch.testing.assert_close(module.blocks[0](x, torch.zeros(2, 1, 1, 5)), expected, atol=1e-5, rtol=1e-5)


def test_seqtransf_init_refuses_mismatched_clip() -> None:
    backbone = _tiny_backbone(embed_dim=48)  # text width 32 != embed dim 48
    with pytest.raises(ValueError, match="text width 32"):
        build_temporal("seqTransf", backbone, 48)
    with pytest.raises(ValueError, match="fewer than temporal_layers"):
        SeqTransformer(32, num_layers=5, num_heads=4, max_positions=20).init_from_clip(_tiny_backbone())
    with pytest.raises(ValueError, match="heads"):
        SeqTransformer(32, num_layers=1, num_heads=2, max_positions=20).init_from_clip(_tiny_backbone())


def test_seqtransf_without_backbone_and_too_many_frames() -> None:
    module = build_temporal("seqTransf", None, 64, num_layers=2)
    assert isinstance(module, SeqTransformer) and module.num_heads == 1 and module.max_positions == 77
    with pytest.raises(ValueError, match="78 frames"):
        module(torch.randn(1, 78, 64), torch.ones(1, 78))
