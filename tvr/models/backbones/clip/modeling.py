"""CLIP backbone (spec §1.1) on Hugging Face ``transformers``' ``CLIPModel``.

The backbone turns tokens into projected per-token text features and frames into projected per-frame features;
everything method-specific (temporal aggregation, pooling, scoring) lives elsewhere.

Text masking. The reference (CLIP4Clip/GARE ``module_clip.py``) runs the text transformer with a causal mask *plus* a
key-padding mask: a padded key gets −∞ for every query. In ``transformers`` 5.x, ``CLIPTextModel.forward`` passes a
2-D ``attention_mask`` to ``masking_utils.create_causal_mask``, which ANDs the causal pattern with the padding mask
(``padding_mask_function``) for the eager and SDPA back-ends alike, so the HF call below already applies both
(checked numerically on 5.23: identical to causal + key-padding, and different from causal-only at padded rows).
Since the way HF builds CLIP's masks has been rewritten between major versions, ``tests/test_clip_backbone.py``
checks every token's output (padded positions included, which is where the two schemes differ) against an
independent forward pass with causal + key-padding masking, for both the eager and the SDPA implementations.
Real tokens are unaffected by padding either way (causality hides the padding, which always follows EOT); only the
``words`` rows at padded positions depend on it, and heads that use words mask those rows out anyway.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import CLIPConfig, CLIPModel

from tvr.config import ConfigError, ModelConfig
from tvr.models.backbones.base import check_token_batch
from tvr.models.backbones.clip.config import TinyClipConfig
from tvr.models.backbones.clip.convert_openai import load_openai_clip
from tvr.models.backbones.clip.files import EOT_ID, SOT_ID, save_clip_atomic
from tvr.models.hub import hub_unreachable, offline_requested
from tvr.types import TextFeatures, VideoFeatures
from tvr.utils.data_files import DataFileError, read_json
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import TorchFileError, check_model_folder, weights_only_refusal

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def tiny_clip_config(cfg: TinyClipConfig) -> CLIPConfig:
    """A CLIPConfig of the real architecture (pre-LN, QuickGELU, 4× MLP) with the tiny sizes of ``cfg``."""
    for name in ("text_width", "vision_width"):
        width = getattr(cfg, name)
        heads = getattr(cfg, name.replace("width", "heads"))
        if heads < 1 or width % heads:
            raise ConfigError(f"model.tiny.{name}={width} is not divisible by its number of heads ({heads})")
    if cfg.image_size % cfg.patch_size:
        raise ConfigError(f"model.tiny.image_size={cfg.image_size} is not a multiple of patch_size={cfg.patch_size}")
    # special ids only matter to HF's own pooler (unused here); keep them inside the vocabulary
    eos = min(EOT_ID, cfg.vocab_size - 1)
    text = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.text_width,
        "intermediate_size": 4 * cfg.text_width,
        "num_hidden_layers": cfg.text_layers,
        "num_attention_heads": cfg.text_heads,
        "max_position_embeddings": cfg.context_length,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": cfg.embed_dim,
        "pad_token_id": 0,
        "bos_token_id": min(SOT_ID, cfg.vocab_size - 2),
        "eos_token_id": eos,
    }
    vision = {
        "hidden_size": cfg.vision_width,
        "intermediate_size": 4 * cfg.vision_width,
        "num_hidden_layers": cfg.vision_layers,
        "num_attention_heads": cfg.vision_heads,
        "image_size": cfg.image_size,
        "patch_size": cfg.patch_size,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": cfg.embed_dim,
    }
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=cfg.embed_dim)


def load_clip_model(spec: str) -> CLIPModel:
    """Load a float32 ``CLIPModel`` from a local HF directory, an OpenAI ``.pt``/``.pth`` file, or a hub id."""
    path = Path(os.path.expanduser(spec))
    if spec.endswith((".pt", ".pth")):
        if not path.is_file():
            raise FileNotFoundError(f"model.clip: OpenAI CLIP checkpoint not found: {path}")
        return load_openai_clip(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.clip: {path} is a folder but has no config.json (not a HF CLIP folder)")
        try:
            check_model_folder(path)  # transformers torch.loads a pytorch_model.bin itself: scanned first
            read_json(path / "config.json")  # and reads config.json with a recursive parser: bounded first
        except (PickleRefusedError, TorchFileError, DataFileError) as exc:
            raise ConfigError(f"model.clip: {exc}") from None
        try:
            return CLIPModel.from_pretrained(str(path), dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - a broken config.json or truncated weights raise many types
            refusal = weights_only_refusal(str(exc))  # transformers torch.loads pytorch_model.bin (weights only)
            if refusal is not None:
                raise ConfigError(f"model.clip: {path}: its weights were {refusal}") from None
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"model.clip: {path}: not a loadable HF CLIP folder ({type(exc).__name__}: {first}); a damaged "
                "config.json or truncated weights? Convert or download it again"
            ) from exc
    if path.exists():
        raise ConfigError(f"model.clip: {path} is a file but not an OpenAI .pt/.pth checkpoint; expected a HF folder")
    looks_like_path = spec.startswith(("/", ".", "~")) or os.sep + os.sep in spec or spec.count("/") > 1
    if looks_like_path or not _HUB_ID.match(spec):
        raise FileNotFoundError(
            f"model.clip: path not found: {path} (expected 'tiny', a HF CLIP folder, an OpenAI "
            f".pt file or a hub id like 'openai/clip-vit-base-patch32')"
        )
    return _load_hub_model(spec)


def _load_hub_model(spec: str) -> CLIPModel:
    """A hub model from the local cache without touching the network; online only when the hub answers. Offline,
    this fails in seconds with what to do, instead of retrying for a minute."""
    advice = (
        "download it once online (it is cached then), or set model.clip to a local HF CLIP folder or an "
        "OpenAI .pt file (tvr convert-openai)"
    )
    try:
        return CLIPModel.from_pretrained(spec, dtype=torch.float32, local_files_only=True)
    except OSError as cached_miss:
        if offline_requested():
            raise ConfigError(
                f"model.clip: hub model {spec!r} is not in the local Hugging Face cache and offline mode "
                f"is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE): {advice}"
            ) from cached_miss
    unreachable = hub_unreachable()
    if unreachable is not None:
        raise ConfigError(
            f"model.clip: hub model {spec!r} is not in the local Hugging Face cache and the hub cannot "
            f"be reached ({unreachable}); offline? {advice}"
        )
    try:
        return CLIPModel.from_pretrained(spec, dtype=torch.float32)
    except OSError as exc:
        raise ConfigError(
            f"model.clip: could not load hub model {spec!r} (no local folder of that name, and the hub "
            f"has no such model or refused it): {exc}"
        ) from exc


def backbone_image_size(model_cfg: ModelConfig) -> tuple[int, str] | None:
    """(the image size ``model.clip`` takes, where that number comes from), read without loading any weights: the
    tiny config, a HF folder's or the local hub cache's ``config.json``. None when it cannot be known cheaply (an
    OpenAI ``.pt`` file, a model not cached yet); loading the model then reports a mismatch itself."""
    spec = str(model_cfg.clip).strip()
    if spec == "tiny":
        return model_cfg.tiny.image_size, "model.tiny.image_size"
    path = Path(os.path.expanduser(spec))
    config_file: Path | None = path / "config.json" if path.is_dir() else None
    if config_file is None and not path.exists() and _HUB_ID.match(spec) and not spec.endswith((".pt", ".pth")):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(spec, "config.json")
            config_file = Path(cached) if isinstance(cached, str) else None
        except Exception:  # noqa: BLE001 - only a pre-flight hint
            config_file = None
    if config_file is None or not config_file.is_file():
        return None
    try:
        size = read_json(config_file)["vision_config"]["image_size"]
    except (DataFileError, KeyError, TypeError, OSError):
        return None  # a damaged config.json is reported when the model loads (load_clip_model reads it first)
    return (
        (int(size), f"model.clip = {spec!r} (its config.json vision_config.image_size)")
        if isinstance(size, int)
        else None
    )


def clip_from_config(model_cfg: ModelConfig) -> CLIPModel:
    """The CLIPModel ``model.clip`` names: ``"tiny"`` (random init from ``model.tiny``), a HF folder, an OpenAI
    ``.pt`` file or a hub id."""
    spec = str(model_cfg.clip).strip()
    if not spec:
        raise ConfigError("model.clip is empty; expected 'tiny', a HF CLIP folder, an OpenAI .pt file or a hub id")
    return CLIPModel(tiny_clip_config(model_cfg.tiny)) if spec == "tiny" else load_clip_model(spec)


class ClipBackbone(nn.Module):
    """CLIP text and image towers producing unnormalised projected features (spec §1.1).

    ``frame_chunk`` (0 = all at once) bounds how many frames go through the vision tower per call, to cap
    activation memory when N·F is large.
    """

    def __init__(self, clip: CLIPModel, frame_chunk: int = 0, fp16_on_cuda: bool = True) -> None:
        super().__init__()
        self.clip = clip
        # CLIP's own log temperature only seeds the head's (``logit_scale_value``); the head trains its copy. Left
        # trainable it would never get a gradient, which DistributedDataParallel (without the per-step cost of
        # find_unused_parameters) cannot tolerate. It stays in the state dict, so weights round-trip unchanged.
        clip.logit_scale.requires_grad_(False)
        self.frame_chunk = int(frame_chunk)
        self.fp16_on_cuda = bool(fp16_on_cuda)
        #: set by :meth:`enable_gradient_checkpointing`
        self.gradient_checkpointing = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, model_cfg: ModelConfig, frame_chunk: int | None = None) -> ClipBackbone:
        """``clip == "tiny"``: random init from ``model_cfg.tiny``; else a HF folder, an OpenAI .pt, or a hub id."""
        chunk = model_cfg.frame_chunk if frame_chunk is None else frame_chunk
        return cls(clip_from_config(model_cfg), frame_chunk=chunk, fp16_on_cuda=model_cfg.clip_fp16_on_cuda)

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """Write the wrapped CLIPModel as a HF folder (atomically); ``from_config`` can load it back."""
        return save_clip_atomic(self.clip, out_dir, overwrite=True)

    def maybe_half(self, device: torch.device | str) -> bool:
        """Cast the CLIP weights to fp16 when ``device`` is CUDA and fp16 is enabled, as the reference does.

        Outputs are cast back to float32 by the encoders. ``logit_scale`` stays float32 (the reference's
        ``convert_weights`` never touches it either). Returns whether the cast happened.
        """
        if torch.device(device).type != "cuda" or not self.fp16_on_cuda:
            return False
        self.half_weights()
        return True

    def half_weights(self) -> None:
        """Unconditional fp16 cast (used by ``maybe_half``; public so CPU tests can exercise the fp16 path)."""
        self.clip.half()
        self.clip.logit_scale.data = self.clip.logit_scale.data.float()

    def enable_gradient_checkpointing(self) -> None:
        """Recompute every transformer layer of both CLIP towers in the backward pass instead of keeping its
        activations (HF's activation checkpointing, non-reentrant; only while training with autograd on): the
        per-layer activations of a step are no longer held, at the cost of one more forward of each layer."""
        enable = getattr(self.clip, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # transformers before activation_checkpointing_enable
            self.clip.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.gradient_checkpointing = True

    # ------------------------------------------------------------------ properties
    @property
    def embed_dim(self) -> int:
        return int(self.clip.config.projection_dim)

    @property
    def text_width(self) -> int:
        return int(self.clip.config.text_config.hidden_size)

    @property
    def text_heads(self) -> int:
        return int(self.clip.config.text_config.num_attention_heads)

    @property
    def context_length(self) -> int:
        return int(self.clip.config.text_config.max_position_embeddings)

    @property
    def logit_scale_value(self) -> float:
        """CLIP's learnable log temperature (ln 100 for pretrained CLIP, ln(1/0.07) at random init)."""
        return float(self.clip.logit_scale.detach().float().item())

    def text_blocks(self) -> list[nn.Module]:
        """The HF text encoder layers (``CLIPEncoderLayer``), in order; seqTransf copies the first few."""
        return list(self.clip.text_model.encoder.layers)

    def text_position_embedding(self) -> Tensor:
        """CLIP's text positional embedding, [context_length, text_width] (seqTransf's frame positions init)."""
        return self.clip.text_model.embeddings.position_embedding.weight

    @property
    def _dtype(self) -> torch.dtype:
        return self.clip.text_projection.weight.dtype

    def reference_precision(self) -> contextlib.AbstractContextManager:
        """While the weights are fp16 (:meth:`maybe_half`, the reference's ``convert_weights``), the encoders run in
        fp16 as the reference's CLIP does, with autocast suspended: under a training run's bf16 autocast the fp16
        weights would otherwise be recast to bf16 (3 fewer mantissa bits) and the features would differ from the
        reference's and from a ``tvr features`` cache. float32 weights follow the surrounding autocast."""
        if self._dtype != torch.float16:
            return contextlib.nullcontext()
        device = self.clip.text_projection.weight.device
        return torch.autocast(device_type=device.type, enabled=False)

    # ------------------------------------------------------------------ encoders
    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> TextFeatures:
        """Tokens [N, L] → TextFeatures(eot [N, D], words [N, L, D], word_mask [N, L]); nothing is normalised.

        ``input_ids`` must hold CLIP ids with EOT as the largest id of each row (the position of argmax is EOT).
        """
        check_token_batch(input_ids, attention_mask, self.context_length, "encode_text", "CLIP's context length")
        # transformers 5.x combines the causal mask with this key-padding mask (see module docstring)
        with self.reference_precision():
            hidden = self.clip.text_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            words = self.clip.text_projection(hidden).float()  # final_layer_norm is applied inside text_model
        rows = torch.arange(words.shape[0], device=words.device)
        eot = words[rows, input_ids.argmax(dim=-1).to(words.device)]
        return TextFeatures(eot=eot, words=words, word_mask=attention_mask)

    def encode_frames(self, pixels: Tensor) -> Tensor:
        """Frames [N, F, 3, S, S] → projected CLS features [N, F, D] (float32), each frame independently."""
        if pixels.ndim != 5 or pixels.shape[2] != 3:
            raise ValueError(f"encode_frames: expected pixels [N, F, 3, S, S], got {tuple(pixels.shape)}")
        n, f = pixels.shape[:2]
        flat = pixels.reshape(n * f, *pixels.shape[2:]).to(self._dtype)
        step = self.frame_chunk if self.frame_chunk > 0 else max(flat.shape[0], 1)
        outs = []
        for start in range(0, flat.shape[0], step):
            # pooler_output = post_layernorm(CLS); the projection is CLIP's visual proj
            with self.reference_precision():
                cls_token = self.clip.vision_model(pixel_values=flat[start : start + step]).pooler_output
                outs.append(self.clip.visual_projection(cls_token).float())
        if not outs:
            return pixels.new_zeros(n, f, self.embed_dim, dtype=torch.float32)
        return torch.cat(outs).reshape(n, f, -1)

    def encode_video(self, pixels: Tensor, frame_mask: Tensor) -> VideoFeatures:
        """Frames [N, F, 3, S, S] and their mask [N, F] → per-frame features (the temporal module comes after).

        The interface every video backbone offers to :class:`~tvr.models.model.RetrievalModel`; a backbone with
        video-level tokens (CLIP-ViP) returns its own pooled slot and ``proxies`` instead."""
        return VideoFeatures(self.encode_frames(pixels), frame_mask)
