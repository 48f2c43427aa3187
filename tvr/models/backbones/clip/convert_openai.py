"""Convert an OpenAI CLIP checkpoint (``ViT-B-32.pt``, ``ViT-B-16.pt``, …) into a Hugging Face ``CLIPModel``.

The OpenAI files are TorchScript archives whose weights are fp16; their tensors are read from the zip as data,
never by ``torch.jit.load`` (which runs code from the file: :mod:`tvr.models.backbones.clip.torchscript_reader`).
A plain ``torch.save``-d state dict with the same key names is accepted too (weights only). The architecture is read
off the tensor shapes (as OpenAI's own ``build_model`` does), every key is mapped explicitly, and the conversion
refuses to finish if any target parameter was left unfilled or any source tensor was left unused, so a layout
surprise can never produce a half-random model.

Usage: ``python -m tvr.models.backbones.clip.convert_openai ViT-B-32.pt out/clip-vit-b32``.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from transformers import CLIPConfig, CLIPModel

from tvr.models.backbones.clip.files import EOT_ID, SOT_ID, save_clip_atomic
from tvr.models.backbones.clip.torchscript_reader import (
    TorchScriptArchiveError,
    is_torchscript_archive,
    read_torchscript_state_dict,
)
from tvr.utils.errors import UserError
from tvr.utils.io import describe_file_start
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import TorchFileError, load_torch_file

#: scalars stored next to the weights in OpenAI's TorchScript archives; checked, not converted
METADATA_KEYS = ("input_resolution", "context_length", "vocab_size")

# per residual block: OpenAI suffix -> HF suffix (in_proj_* is split into q/k/v separately)
_BLOCK_MAP = {
    "attn.out_proj.weight": "self_attn.out_proj.weight",
    "attn.out_proj.bias": "self_attn.out_proj.bias",
    "ln_1.weight": "layer_norm1.weight",
    "ln_1.bias": "layer_norm1.bias",
    "mlp.c_fc.weight": "mlp.fc1.weight",
    "mlp.c_fc.bias": "mlp.fc1.bias",
    "mlp.c_proj.weight": "mlp.fc2.weight",
    "mlp.c_proj.bias": "mlp.fc2.bias",
    "ln_2.weight": "layer_norm2.weight",
    "ln_2.bias": "layer_norm2.bias",
}

# whole-model tensors copied as they are: OpenAI key -> HF key
_DIRECT_MAP = {
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "logit_scale": "logit_scale",
}

# OpenAI stores x @ P projections as [in, out]; nn.Linear wants [out, in]
_TRANSPOSED_MAP = {
    "text_projection": "text_projection.weight",
    "visual.proj": "visual_projection.weight",
}


class ConversionError(UserError, ValueError):
    """The checkpoint does not have the OpenAI ViT CLIP layout."""


def load_openai_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """The tensors of an OpenAI TorchScript archive, read as data (never run: see
    :mod:`tvr.models.backbones.clip.torchscript_reader`), or of a plain state dict saved with ``torch.save`` (weights
    only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"OpenAI CLIP checkpoint not found: {path}")
    if is_torchscript_archive(path):
        try:
            return read_torchscript_state_dict(path)
        except TorchScriptArchiveError as exc:
            raise ConversionError(str(exc)) from None
    try:
        obj = load_torch_file(path)
    except PickleRefusedError as exc:
        raise ConversionError(str(exc)) from None
    except TorchFileError as exc:
        raise ConversionError(
            f"{path}: not an OpenAI CLIP checkpoint: {describe_file_start(path)}; expected OpenAI's TorchScript .pt "
            "file (ViT-B-32.pt, …) or a torch.save-d CLIP state dict"
        ) from exc
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ConversionError(f"{path}: holds a {type(obj).__name__}; expected a CLIP state dict (name -> tensor)")
    if not obj:
        raise ConversionError(f"{path}: holds an empty dict; expected a CLIP state dict (name -> tensor)")
    other = next(((k, v) for k, v in obj.items() if not isinstance(v, Tensor)), None)
    if other is not None:
        raise ConversionError(
            f"{path}: entry {other[0]!r} is a {type(other[1]).__name__}, not a tensor; expected a CLIP state dict "
            "(name -> tensor)"
        )
    return dict(obj)


def count_blocks(state: dict[str, Tensor], prefix: str) -> int:
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.")
    indices = {int(m.group(1)) for key in state if (m := pattern.match(key))}
    if indices != set(range(len(indices))):
        raise ConversionError(f"residual blocks under '{prefix}' are not numbered 0..n-1: {sorted(indices)}")
    return len(indices)


def _need(state: dict[str, Tensor], key: str) -> Tensor:
    if key not in state:
        raise ConversionError(f"checkpoint has no '{key}' (not an OpenAI ViT CLIP state dict?)")
    return state[key]


def infer_config(
    state: dict[str, Tensor], text_heads: int | None = None, vision_heads: int | None = None
) -> CLIPConfig:
    """Read the architecture off the tensor shapes; heads default to width // 64 as in OpenAI's ``build_model``."""
    if any(key.startswith("visual.layer1.") for key in state):
        raise ConversionError("ResNet CLIP checkpoints (RN50, RN101, …) are not supported; use a ViT checkpoint")
    conv = _need(state, "visual.conv1.weight")
    vision_width, patch = int(conv.shape[0]), int(conv.shape[-1])
    positions = int(_need(state, "visual.positional_embedding").shape[0])
    grid = round((positions - 1) ** 0.5)
    if grid * grid + 1 != positions:
        raise ConversionError(f"visual.positional_embedding has {positions} rows; expected grid² + 1")
    vision_layers = count_blocks(state, "visual.transformer.resblocks.")
    text_layers = count_blocks(state, "transformer.resblocks.")
    if vision_layers == 0 or text_layers == 0:
        raise ConversionError(f"found {vision_layers} vision and {text_layers} text residual blocks; expected > 0")
    text_width = int(_need(state, "ln_final.weight").shape[0])
    embed_dim = int(_need(state, "text_projection").shape[1])
    visual_proj = _need(state, "visual.proj")
    if tuple(visual_proj.shape) != (vision_width, embed_dim):
        raise ConversionError(
            f"visual.proj has shape {tuple(visual_proj.shape)}; expected ({vision_width}, {embed_dim})"
        )
    context_length = int(_need(state, "positional_embedding").shape[0])
    vocab_size = int(_need(state, "token_embedding.weight").shape[0])
    text_heads = text_heads or max(text_width // 64, 1)
    vision_heads = vision_heads or max(vision_width // 64, 1)
    text_mlp = int(_need(state, "transformer.resblocks.0.mlp.c_fc.weight").shape[0])
    vision_mlp = int(_need(state, "visual.transformer.resblocks.0.mlp.c_fc.weight").shape[0])

    expected = {"input_resolution": patch * grid, "context_length": context_length, "vocab_size": vocab_size}
    for key in METADATA_KEYS:
        if key in state and int(state[key]) != expected[key]:
            raise ConversionError(f"checkpoint says {key}={int(state[key])} but the weights imply {expected[key]}")

    text = {
        "vocab_size": vocab_size,
        "hidden_size": text_width,
        "intermediate_size": text_mlp,
        "num_hidden_layers": text_layers,
        "num_attention_heads": text_heads,
        "max_position_embeddings": context_length,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": embed_dim,
        "pad_token_id": 0,
        "bos_token_id": min(SOT_ID, vocab_size - 2),
        "eos_token_id": min(EOT_ID, vocab_size - 1),
    }
    vision = {
        "hidden_size": vision_width,
        "intermediate_size": vision_mlp,
        "num_hidden_layers": vision_layers,
        "num_attention_heads": vision_heads,
        "image_size": patch * grid,
        "patch_size": patch,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": embed_dim,
    }
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=embed_dim)


def map_state_dict(
    state: dict[str, Tensor], text_layers: int, vision_layers: int, origins: dict[str, str] | None = None
) -> tuple[dict[str, Tensor], set]:
    """OpenAI keys -> HF keys (float32). Returns the mapped dict and the set of source keys consumed.

    ``origins``, when given, receives HF key -> the OpenAI key it came from (``...in_proj_weight[q]`` for a slice).
    """
    out: dict[str, Tensor] = {}
    used: set[str] = set()

    def take(key: str) -> Tensor:
        used.add(key)
        return _need(state, key).float()

    for src, dst in _DIRECT_MAP.items():
        out[dst] = take(src)
        if origins is not None:
            origins[dst] = src
    for src, dst in _TRANSPOSED_MAP.items():
        out[dst] = take(src).t().contiguous()
        if origins is not None:
            origins[dst] = f"{src} (transposed)"
    towers = (
        ("transformer.resblocks.", "text_model.encoder.layers.", text_layers),
        ("visual.transformer.resblocks.", "vision_model.encoder.layers.", vision_layers),
    )
    for src_prefix, dst_prefix, layers in towers:
        for i in range(layers):
            out.update(map_residual_block(take, f"{src_prefix}{i}.", f"{dst_prefix}{i}.", origins))
    used.update(key for key in METADATA_KEYS if key in state)
    return out, used


def map_residual_block(
    take: Callable[[str], Tensor], src: str, dst: str, origins: dict[str, str] | None = None
) -> dict[str, Tensor]:
    """One OpenAI ``ResidualAttentionBlock`` (keys under ``src``) as HF ``CLIPEncoderLayer`` keys under ``dst``.

    ``take(key)`` returns the source tensor (and may record it as used). The fused ``attn.in_proj_*`` of
    ``nn.MultiheadAttention`` packs [W_q; W_k; W_v] row-wise and is split into ``q_proj`` / ``k_proj`` /
    ``v_proj``. The same layout is used by CLIP4Clip's and GARE's temporal transformer (``transformerClip``).
    ``origins`` as in :func:`map_state_dict`.
    """
    out: dict[str, Tensor] = {}
    for kind in ("weight", "bias"):
        fused = f"{src}attn.in_proj_{kind}"
        packed = take(fused)
        if packed.dim() == 0 or packed.shape[0] % 3:
            raise ConversionError(f"{fused} has shape {tuple(packed.shape)}; expected 3 × width rows (q, k, v)")
        for name, part in zip("qkv", packed.chunk(3, dim=0), strict=True):
            out[f"{dst}self_attn.{name}_proj.{kind}"] = part.contiguous()
            if origins is not None:
                origins[f"{dst}self_attn.{name}_proj.{kind}"] = f"{fused}[{name}]"
    for src_suffix, dst_suffix in _BLOCK_MAP.items():
        out[dst + dst_suffix] = take(src + src_suffix)
        if origins is not None:
            origins[dst + dst_suffix] = src + src_suffix
    return out


def convert_state_dict(
    state: dict[str, Tensor], text_heads: int | None = None, vision_heads: int | None = None
) -> CLIPModel:
    """Build a float32 HF ``CLIPModel`` holding exactly the weights of an OpenAI ViT CLIP state dict."""
    config = infer_config(state, text_heads=text_heads, vision_heads=vision_heads)
    mapped, used = map_state_dict(state, config.text_config.num_hidden_layers, config.vision_config.num_hidden_layers)
    unused = sorted(set(state) - used)
    if unused:
        raise ConversionError(f"{len(unused)} checkpoint tensor(s) have no HF counterpart: {unused[:20]}")
    # checked against a skeleton without storage first: the architecture is read off a few tensors (the layer
    # count off key names, the widths off block 0), so a small file could describe a model of many gigabytes
    with torch.device("meta"):
        target = CLIPModel(config).state_dict()
    missing = sorted(set(target) - set(mapped))
    unexpected = sorted(set(mapped) - set(target))
    if missing or unexpected:
        raise ConversionError(
            f"HF parameters left unfilled: {missing[:20]}; mapped keys HF does not have: {unexpected[:20]}"
        )
    wrong = [
        f"{k}: {tuple(mapped[k].shape)} vs {tuple(target[k].shape)}"
        for k in target
        if mapped[k].shape != target[k].shape
    ]
    if wrong:
        raise ConversionError(f"shape mismatch (converted vs HF): {wrong[:20]}")
    model = CLIPModel(config)  # every parameter is one of the file's tensors, checked above
    model.load_state_dict(mapped, strict=True)
    return model.eval()


def load_openai_clip(
    path: str | os.PathLike, text_heads: int | None = None, vision_heads: int | None = None
) -> CLIPModel:
    """Load and convert in memory (what ``ClipBackbone.from_config`` does for a ``.pt`` path)."""
    state = load_openai_state_dict(path)  # its errors name the file already
    try:
        return convert_state_dict(state, text_heads=text_heads, vision_heads=vision_heads)
    except ConversionError as exc:
        raise ConversionError(f"{path}: {exc}") from None


def convert_openai_checkpoint(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    bpe: str | os.PathLike | None = None,
) -> Path:
    """Convert ``src`` and write a HF CLIP folder (config.json + weights, and with ``bpe`` — CLIP's
    ``bpe_simple_vocab_16e6.txt.gz`` — the tokenizer files) to ``out_dir`` atomically: every input is read and
    checked first, and the folder appears complete or not at all."""
    from tvr.data.tokenizer import read_clip_merges, write_tokenizer_files

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"output folder already exists: {out_dir} (pass --overwrite to replace it)")
    merges = read_clip_merges(bpe) if bpe is not None else None
    model = load_openai_clip(src)
    extra = None if merges is None else (lambda folder: write_tokenizer_files(folder, merges))
    return save_clip_atomic(model, out_dir, overwrite=overwrite, extra=extra)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert an OpenAI CLIP .pt checkpoint to a HF CLIPModel folder")
    parser.add_argument("src", help="OpenAI checkpoint, e.g. ViT-B-32.pt")
    parser.add_argument("out_dir", help="output folder (must not exist unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--bpe", help="bpe_simple_vocab_16e6.txt.gz: also write the tokenizer files")
    args = parser.parse_args(argv)
    print(convert_openai_checkpoint(args.src, args.out_dir, overwrite=args.overwrite, bpe=args.bpe))


if __name__ == "__main__":
    main()
