"""ClipBackbone on a tiny random CLIP: features against an independent forward pass, masks, loading, fp16 path."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from tvr.config import ModelConfig
from tvr.models.backbones.clip.config import TinyClipConfig
from tvr.models.backbones.clip.modeling import ClipBackbone, tiny_clip_config
from tvr.types import TextFeatures

VOCAB = 100


def _cfg(**model_overrides) -> ModelConfig:
    tiny = TinyClipConfig(
        embed_dim=48,
        text_width=32,
        text_layers=2,
        text_heads=4,
        vision_width=32,
        vision_layers=2,
        vision_heads=2,
        image_size=16,
        patch_size=8,
        context_length=12,
        vocab_size=VOCAB,
    )
    return ModelConfig(**{"clip": "tiny", "tiny": tiny, **model_overrides})


@pytest.fixture
def backbone() -> ClipBackbone:
    model = ClipBackbone.from_config(_cfg()).eval()
    with torch.no_grad():  # move LayerNorms/biases off their trivial init so the reference check sees them
        for name, p in model.clip.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _tokens() -> tuple[Tensor, Tensor]:
    """Rows of [SOT, words…, EOT, pad 0…]; EOT (= VOCAB-1) is the largest id of each row."""
    ids = torch.zeros(3, 8, dtype=torch.long)
    mask = torch.zeros(3, 8, dtype=torch.long)
    for row, length in enumerate((8, 5, 3)):
        ids[row, 0] = VOCAB - 2
        ids[row, 1 : length - 1] = torch.randint(1, VOCAB - 2, (length - 2,))
        ids[row, length - 1] = VOCAB - 1
        mask[row, :length] = 1
    return ids, mask


def _ln(x: Tensor, norm: torch.nn.LayerNorm) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias


def _block(x: Tensor, layer: torch.nn.Module, heads: int, add_mask: Tensor | None) -> Tensor:
    """Pre-LN residual block from the weights: multi-head attention with an additive [N, L, L] mask, QuickGELU MLP."""
    n, length, d = x.shape
    dh = d // heads
    a = layer.self_attn
    y = _ln(x, layer.layer_norm1)
    q, k, v = (y @ p.weight.T + p.bias for p in (a.q_proj, a.k_proj, a.v_proj))
    q, k, v = (t.view(n, length, heads, dh).transpose(1, 2) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(dh)
    if add_mask is not None:
        logits = logits + add_mask[:, None]
    attn = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(n, length, d)
    x = x + attn @ a.out_proj.weight.T + a.out_proj.bias
    y = _ln(x, layer.layer_norm2) @ layer.mlp.fc1.weight.T + layer.mlp.fc1.bias
    y = y * torch.sigmoid(1.702 * y)
    return x + y @ layer.mlp.fc2.weight.T + layer.mlp.fc2.bias


def _reference_words(bb: ClipBackbone, ids: Tensor, mask: Tensor, key_padding: bool = True) -> Tensor:
    tm = bb.clip.text_model
    length = ids.shape[1]
    x = tm.embeddings.token_embedding.weight[ids] + tm.embeddings.position_embedding.weight[:length]
    add = torch.full((length, length), float("-inf")).triu(1).expand(ids.shape[0], -1, -1)
    if key_padding:
        add = add + torch.where(mask.bool(), 0.0, float("-inf"))[:, None, :]
    for layer in tm.encoder.layers:
        x = _block(x, layer, bb.text_heads, add)
    return _ln(x, tm.final_layer_norm) @ bb.clip.text_projection.weight.T


def _reference_frames(bb: ClipBackbone, pixels: Tensor) -> Tensor:
    vm = bb.clip.vision_model
    emb = vm.embeddings
    flat = pixels.flatten(0, 1)
    patches = torch.nn.functional.conv2d(flat, emb.patch_embedding.weight, stride=emb.patch_size)
    x = patches.flatten(2).transpose(1, 2)
    x = torch.cat([emb.class_embedding.expand(x.shape[0], 1, -1), x], dim=1) + emb.position_embedding.weight
    x = _ln(x, vm.pre_layrnorm)
    for layer in vm.encoder.layers:
        x = _block(x, layer, bb.clip.config.vision_config.num_attention_heads, None)
    out = _ln(x[:, 0], vm.post_layernorm) @ bb.clip.visual_projection.weight.T
    return out.view(*pixels.shape[:2], -1)


def test_tiny_config_has_the_real_architecture() -> None:
    cfg = tiny_clip_config(_cfg().tiny)
    assert cfg.text_config.hidden_act == cfg.vision_config.hidden_act == "quick_gelu"
    assert cfg.text_config.intermediate_size == 4 * 32 and cfg.vision_config.intermediate_size == 4 * 32
    assert cfg.projection_dim == 48 and cfg.text_config.max_position_embeddings == 12
    with pytest.raises(ValueError, match="text_width"):
        tiny_clip_config(TinyClipConfig(text_width=30, text_heads=4))


def test_properties_and_accessors(backbone: ClipBackbone) -> None:
    assert backbone.embed_dim == 48 and backbone.text_width == 32 and backbone.context_length == 12
    assert backbone.text_heads == 4
    assert backbone.logit_scale_value == pytest.approx(math.log(1 / 0.07), abs=1e-4)
    assert len(backbone.text_blocks()) == 2
    assert backbone.text_position_embedding().shape == (12, 32)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_encode_text_matches_causal_plus_key_padding_reference(backbone: ClipBackbone, attn: str) -> None:
    backbone.clip.set_attn_implementation(attn)
    ids, mask = _tokens()
    with torch.no_grad():
        feats = backbone.encode_text(ids, mask)
        ref = _reference_words(backbone, ids, mask, key_padding=True)
        causal_only = _reference_words(backbone, ids, mask, key_padding=False)
    assert isinstance(feats, TextFeatures)
    assert feats.words.shape == (3, 8, 48) and feats.eot.shape == (3, 48)
    assert feats.words.dtype == torch.float32
    assert torch.equal(feats.word_mask, mask)
    # every position, padded ones included, follows causal + key-padding masking ...
    torch.testing.assert_close(feats.words, ref, atol=1e-5, rtol=1e-5)
    # ... which really differs from causal-only masking at padded rows (so the check above can fail)
    assert (ref[1:, 5:] - causal_only[1:, 5:]).abs().max() > 1e-3
    torch.testing.assert_close(ref[0], causal_only[0], atol=1e-5, rtol=1e-5)  # no padding in row 0
    # EOT feature = the row at argmax(ids), unnormalised
    torch.testing.assert_close(feats.eot, ref[torch.arange(3), torch.tensor([7, 4, 2])], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(feats.eot.norm(dim=-1), torch.ones(3))


def test_encode_text_rejects_bad_shapes(backbone: ClipBackbone) -> None:
    ids, mask = _tokens()
    with pytest.raises(ValueError, match="same shape"):
        backbone.encode_text(ids, mask[:, :5])
    long_ids = torch.ones(1, 13, dtype=torch.long)
    with pytest.raises(ValueError, match="context length 12"):
        backbone.encode_text(long_ids, torch.ones_like(long_ids))


def test_encode_frames_matches_reference_and_chunking(backbone: ClipBackbone) -> None:
    pixels = torch.randn(2, 3, 3, 16, 16)
    with torch.no_grad():
        out = backbone.encode_frames(pixels)
        ref = _reference_frames(backbone, pixels)
        backbone.frame_chunk = 4  # 6 frames in chunks of 4 and 2
        chunked = backbone.encode_frames(pixels)
        single = backbone.encode_frames(pixels[1:2, 2:3])
    assert out.shape == (2, 3, 48) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked, out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(single[0, 0], out[1, 2], atol=1e-6, rtol=1e-6)  # frames are independent
    with pytest.raises(ValueError, match=r"\[N, F, 3, S, S\]"):
        backbone.encode_frames(pixels[0])


def test_save_and_load_directory_roundtrip(backbone: ClipBackbone, tmp_path: Path) -> None:
    out_dir = backbone.save_pretrained(tmp_path / "clip")
    assert (out_dir / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["clip"]  # no temporary folder left behind
    loaded = ClipBackbone.from_config(_cfg(clip=str(out_dir))).eval()
    for key, value in backbone.clip.state_dict().items():
        assert torch.equal(loaded.clip.state_dict()[key], value), key
    ids, mask = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_text(ids, mask).words, backbone.encode_text(ids, mask).words)
    backbone.save_pretrained(out_dir)  # overwriting an existing folder works and leaves no debris
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip"]


def test_from_config_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        ClipBackbone.from_config(_cfg(clip=str(tmp_path / "missing.pt")))
    with pytest.raises(FileNotFoundError, match="path not found"):
        ClipBackbone.from_config(_cfg(clip=str(tmp_path / "no_such_dir")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        ClipBackbone.from_config(_cfg(clip=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="empty"):
        ClipBackbone.from_config(_cfg(clip=""))


def test_fp16_path_casts_outputs_back_to_float32(backbone: ClipBackbone) -> None:
    assert backbone.maybe_half("cpu") is False
    assert backbone.clip.text_projection.weight.dtype == torch.float32
    ids, mask = _tokens()
    pixels = torch.randn(1, 2, 3, 16, 16)
    with torch.no_grad():
        text32, frames32 = backbone.encode_text(ids, mask), backbone.encode_frames(pixels)
        backbone.half_weights()
        assert backbone.clip.text_projection.weight.dtype == torch.float16
        assert backbone.clip.logit_scale.dtype == torch.float32
        text16, frames16 = backbone.encode_text(ids, mask), backbone.encode_frames(pixels)
    assert text16.eot.dtype == text16.words.dtype == frames16.dtype == torch.float32
    torch.testing.assert_close(text16.eot, text32.eot, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(frames16, frames32, atol=2e-2, rtol=2e-2)
    assert backbone.maybe_half(torch.device("cuda")) is True  # the cast itself needs no GPU
    no_half = ClipBackbone.from_config(_cfg(clip_fp16_on_cuda=False))
    assert no_half.maybe_half("cuda") is False
