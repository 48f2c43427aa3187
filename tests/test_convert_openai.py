"""OpenAI CLIP checkpoint -> HF CLIPModel: a tiny synthetic checkpoint with OpenAI's key names and layout, converted
and compared with a reference forward pass written directly on the raw OpenAI tensors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvr.config import ModelConfig
from tvr.models.backbones.clip.convert_openai import (
    ConversionError,
    convert_openai_checkpoint,
    convert_state_dict,
    load_openai_clip,
    load_openai_state_dict,
)
from tvr.models.backbones.clip.modeling import ClipBackbone

WIDTH, LAYERS, PATCH, IMAGE, CONTEXT, VOCAB, EMBED = 64, 2, 8, 32, 77, 49408, 48


def _block_tensors(prefix: str, width: int) -> dict[str, Tensor]:
    r = torch.randn
    return {
        f"{prefix}attn.in_proj_weight": 0.1 * r(3 * width, width),
        f"{prefix}attn.in_proj_bias": 0.1 * r(3 * width),
        f"{prefix}attn.out_proj.weight": 0.1 * r(width, width),
        f"{prefix}attn.out_proj.bias": 0.1 * r(width),
        f"{prefix}ln_1.weight": 1 + 0.1 * r(width),
        f"{prefix}ln_1.bias": 0.1 * r(width),
        f"{prefix}mlp.c_fc.weight": 0.1 * r(4 * width, width),
        f"{prefix}mlp.c_fc.bias": 0.1 * r(4 * width),
        f"{prefix}mlp.c_proj.weight": 0.1 * r(width, 4 * width),
        f"{prefix}mlp.c_proj.bias": 0.1 * r(width),
        f"{prefix}ln_2.weight": 1 + 0.1 * r(width),
        f"{prefix}ln_2.bias": 0.1 * r(width),
    }


def openai_state_dict() -> dict[str, Tensor]:
    """A tiny ViT CLIP in OpenAI's layout (key names, [in, out] projections, packed in_proj)."""
    r = torch.randn
    grid = IMAGE // PATCH
    sd = {
        "positional_embedding": 0.1 * r(CONTEXT, WIDTH),
        "text_projection": 0.1 * r(WIDTH, EMBED),
        "logit_scale": torch.tensor(math.log(100.0)),
        "token_embedding.weight": 0.1 * r(VOCAB, WIDTH),
        "ln_final.weight": 1 + 0.1 * r(WIDTH),
        "ln_final.bias": 0.1 * r(WIDTH),
        "visual.class_embedding": 0.1 * r(WIDTH),
        "visual.positional_embedding": 0.1 * r(grid * grid + 1, WIDTH),
        "visual.proj": 0.1 * r(WIDTH, EMBED),
        "visual.conv1.weight": 0.1 * r(WIDTH, 3, PATCH, PATCH),
        "visual.ln_pre.weight": 1 + 0.1 * r(WIDTH),
        "visual.ln_pre.bias": 0.1 * r(WIDTH),
        "visual.ln_post.weight": 1 + 0.1 * r(WIDTH),
        "visual.ln_post.bias": 0.1 * r(WIDTH),
    }
    for i in range(LAYERS):
        sd.update(_block_tensors(f"transformer.resblocks.{i}.", WIDTH))
        sd.update(_block_tensors(f"visual.transformer.resblocks.{i}.", WIDTH))
    return sd


# ----------------------------------------------------------------------------- reference on raw OpenAI tensors


def _ln(x: Tensor, sd: dict[str, Tensor], name: str) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], sd[f"{name}.weight"], sd[f"{name}.bias"], eps=1e-5)


def _resblock(x: Tensor, sd: dict[str, Tensor], p: str, heads: int, add_mask: Tensor | None) -> Tensor:
    """CLIP's ResidualAttentionBlock: x + MHA(ln_1(x)); x + c_proj(QuickGELU(c_fc(ln_2(x))))."""
    n, length, d = x.shape
    y = _ln(x, sd, p + "ln_1")
    qkv = y @ sd[p + "attn.in_proj_weight"].T + sd[p + "attn.in_proj_bias"]
    q, k, v = (t.reshape(n, length, heads, d // heads).transpose(1, 2) for t in qkv.split(d, dim=-1))
    logits = (q / math.sqrt(d // heads)) @ k.transpose(-1, -2)
    if add_mask is not None:
        logits = logits + add_mask[:, None]
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(n, length, d)
    x = x + out @ sd[p + "attn.out_proj.weight"].T + sd[p + "attn.out_proj.bias"]
    h = _ln(x, sd, p + "ln_2") @ sd[p + "mlp.c_fc.weight"].T + sd[p + "mlp.c_fc.bias"]
    h = h * torch.sigmoid(1.702 * h)
    return x + h @ sd[p + "mlp.c_proj.weight"].T + sd[p + "mlp.c_proj.bias"]


def reference_text(sd: dict[str, Tensor], ids: Tensor, mask: Tensor, heads: int) -> Tensor:
    """All projected token features [N, L, D] with causal + key-padding masking."""
    sd = {k: v.float() for k, v in sd.items()}
    length = ids.shape[1]
    x = sd["token_embedding.weight"][ids] + sd["positional_embedding"][:length]
    add = torch.full((length, length), float("-inf")).triu(1) + torch.where(mask.bool(), 0.0, float("-inf"))[:, None]
    for i in range(LAYERS):
        x = _resblock(x, sd, f"transformer.resblocks.{i}.", heads, add)
    return _ln(x, sd, "ln_final") @ sd["text_projection"]


def reference_image(sd: dict[str, Tensor], images: Tensor, heads: int) -> Tensor:
    """Projected CLS feature after ln_post, [N, D]."""
    sd = {k: v.float() for k, v in sd.items()}
    x = F.conv2d(images, sd["visual.conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)
    x = torch.cat([sd["visual.class_embedding"].expand(x.shape[0], 1, -1), x], dim=1)
    x = _ln(x + sd["visual.positional_embedding"], sd, "visual.ln_pre")
    for i in range(LAYERS):
        x = _resblock(x, sd, f"visual.transformer.resblocks.{i}.", heads, None)
    return _ln(x[:, 0], sd, "visual.ln_post") @ sd["visual.proj"]


def _tokens() -> tuple[Tensor, Tensor]:
    ids = torch.zeros(2, 10, dtype=torch.long)
    mask = torch.zeros(2, 10, dtype=torch.long)
    for row, length in enumerate((10, 6)):
        ids[row, :length] = torch.cat(
            [torch.tensor([49406]), torch.randint(1, 49000, (length - 2,)), torch.tensor([49407])]
        )
        mask[row, :length] = 1
    return ids, mask


def _check_against_reference(backbone: ClipBackbone, sd: dict[str, Tensor], text_heads: int, vision_heads: int):
    ids, mask = _tokens()
    images = torch.randn(3, 3, IMAGE, IMAGE)
    with torch.no_grad():
        text = backbone.encode_text(ids, mask)
        frames = backbone.encode_frames(images[None])[0]
    ref_words = reference_text(sd, ids, mask, text_heads)
    torch.testing.assert_close(text.words, ref_words, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(text.eot, ref_words[[0, 1], [9, 5]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(frames, reference_image(sd, images, vision_heads), atol=1e-5, rtol=1e-5)
    assert backbone.logit_scale_value == pytest.approx(float(sd["logit_scale"]), abs=1e-3)


class _Holder(nn.Module):
    """Container whose attribute names are path components of the OpenAI keys."""


class _ScriptableClip(nn.Module):
    def __init__(self, sd: dict[str, Tensor]) -> None:
        super().__init__()
        for key, value in sd.items():
            *path, leaf = key.split(".")
            node: nn.Module = self
            for part in path:
                if not hasattr(node, part):
                    node.add_module(part, _Holder())
                node = getattr(node, part)
            if value.is_floating_point():
                node.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
            else:
                node.register_buffer(leaf, value)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.logit_scale.exp()


def test_plain_state_dict_file_converts_exactly(tmp_path: Path) -> None:
    sd = openai_state_dict()
    path = tmp_path / "tiny-openai.pt"
    torch.save(sd, path)
    backbone = ClipBackbone.from_config(ModelConfig(clip=str(path))).eval()
    cfg = backbone.clip.config
    assert (cfg.vision_config.hidden_size, cfg.vision_config.patch_size, cfg.vision_config.image_size) == (64, 8, 32)
    assert (cfg.text_config.num_hidden_layers, cfg.vision_config.num_hidden_layers) == (LAYERS, LAYERS)
    assert (cfg.text_config.num_attention_heads, cfg.text_config.max_position_embeddings) == (1, CONTEXT)
    assert cfg.text_config.vocab_size == VOCAB and backbone.embed_dim == EMBED
    _check_against_reference(backbone, sd, text_heads=1, vision_heads=1)


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_torchscript_archive_with_fp16_weights(tmp_path: Path) -> None:
    # OpenAI's files are TorchScript with fp16 weights and three metadata scalars
    sd = {k: v.half() for k, v in openai_state_dict().items()}
    sd.update(
        input_resolution=torch.tensor(IMAGE), context_length=torch.tensor(CONTEXT), vocab_size=torch.tensor(VOCAB)
    )
    path = tmp_path / "ViT-tiny.pt"
    torch.jit.save(torch.jit.script(_ScriptableClip(sd)), str(path))
    loaded = load_openai_state_dict(path)
    assert set(loaded) == set(sd)
    out_dir = convert_openai_checkpoint(path, tmp_path / "hf")
    assert (out_dir / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ViT-tiny.pt", "hf"]  # nothing temporary left
    backbone = ClipBackbone.from_config(ModelConfig(clip=str(out_dir))).eval()
    assert backbone.clip.text_projection.weight.dtype == torch.float32
    ref_sd = {k: v for k, v in sd.items() if v.is_floating_point()}
    _check_against_reference(backbone, ref_sd, text_heads=1, vision_heads=1)
    with pytest.raises(FileExistsError):
        convert_openai_checkpoint(path, out_dir)


def test_multi_head_split_matches_reference() -> None:
    sd = openai_state_dict()
    model = convert_state_dict(sd, text_heads=4, vision_heads=2)
    backbone = ClipBackbone(model).eval()
    _check_against_reference(backbone, sd, text_heads=4, vision_heads=2)


def test_every_key_is_checked(tmp_path: Path) -> None:
    sd = openai_state_dict()
    with pytest.raises(ConversionError, match="extra.weight"):
        convert_state_dict({**sd, "extra.weight": torch.zeros(2)})
    missing = dict(sd)
    del missing["transformer.resblocks.1.mlp.c_fc.bias"]
    with pytest.raises(ConversionError, match=r"transformer\.resblocks\.1\.mlp\.c_fc\.bias"):
        convert_state_dict(missing)
    with pytest.raises(ConversionError, match="ResNet"):
        convert_state_dict({**sd, "visual.layer1.0.conv1.weight": torch.zeros(1)})
    with pytest.raises(ConversionError, match="input_resolution=224"):
        convert_state_dict({**sd, "input_resolution": torch.tensor(224)})
    with pytest.raises(FileNotFoundError):
        load_openai_clip(tmp_path / "absent.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ConversionError, match="junk.pt"):
        load_openai_state_dict(junk)


def test_a_state_dict_describing_a_larger_model_than_it_holds_is_refused_before_building_it(monkeypatch) -> None:
    """The layer count comes from key names and the widths from block 0: a file of tiny tensors under many block
    names must not get a model of that size allocated (it is checked against a skeleton on the meta device)."""
    from transformers import CLIPModel

    import tvr.models.backbones.clip.convert_openai as convert

    built: list[str] = []

    def recording_clip_model(config):
        built.append(torch.empty(()).device.type)
        return CLIPModel(config)

    monkeypatch.setattr(convert, "CLIPModel", recording_clip_model)
    sd = openai_state_dict()
    for i in range(LAYERS, 50):
        sd.update({k: torch.zeros(3) for k in _block_tensors(f"transformer.resblocks.{i}.", 1)})
    with pytest.raises(ConversionError, match=r"shape mismatch .*text_model\.encoder\.layers\.2\."):
        convert_state_dict(sd)
    assert built == ["meta"]
    sd["transformer.resblocks.2.attn.in_proj_weight"] = torch.zeros(2)
    with pytest.raises(ConversionError, match=r"in_proj_weight has shape \(2,\); expected 3 × width rows"):
        convert_state_dict(sd)
    convert_state_dict(openai_state_dict())
    assert built == ["meta", "meta", "cpu"]
