"""Two-tower backbone (``model.backbone: two_tower``, docs/methods/two_tower.md): a sentence-transformers text
tower and an ImageNet EfficientNet-Lite image tower, joined by a bridge (:mod:`tvr.models.backbones.two_tower.bridge`).

The backbone itself returns *tower features* — what a ``tvr features`` cache stores:

* text: ``TextFeatures(eot [N, Wt] = the model's pooled sentence embedding, words [N, L, Wt] = per-token features,
  word_mask [N, L])`` (MiniLM: Wt = 384);
* video: ``VideoFeatures(frames [N, F, Wi] = pooled image features, frame_mask [N, F])`` (EfficientNet-Lite: 1280).

``RetrievalModel.bridge`` (built by :func:`build_two_tower_bridge`) maps them into the shared space: learned
projections to ``embed_dim``, or ConSE into the text space. Frozen towers (the default) run without autograd and
stay in eval mode whatever the model's mode; frames go through the image tower in chunks of ``model.frame_chunk``
(0 = 16 per pass) to bound memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from tvr.config import ConfigError, ModelConfig
from tvr.data.transforms import PixelNorm
from tvr.models.backbones.base import NotExportableError, SentenceQuerySide
from tvr.models.backbones.two_tower.bridge import ConseBridge, FusedConseBridge, ProjectionBridge
from tvr.models.backbones.two_tower.config import TwoTowerConfig
from tvr.models.backbones.two_tower.image_tower import EFFICIENTNET_LITE_NORM, ImageTower, build_image_tower
from tvr.models.backbones.two_tower.text_tower import TextTower, load_sentence_model
from tvr.types import TextFeatures, VideoFeatures

log = logging.getLogger(__name__)

#: frames per image-tower pass when ``model.frame_chunk`` is 0: small batches keep a CNN's activations (~5 MB per
#: frame in lite0's widest layer) near the CPU caches; encoding is bound by memory traffic, not arithmetic
DEFAULT_FRAME_CHUNK = 16
#: the head's starting log temperature: CLIP's initial ln(1/0.07) (these towers carry no learned one)
TWO_TOWER_LOGIT_SCALE = math.log(1 / 0.07)


class TwoTowerBackbone(nn.Module):
    """Text tower + image tower producing tower features (module docstring)."""

    #: the pixel normalisation the image tower was trained with (the data pipeline applies it)
    pixel_norm: PixelNorm = EFFICIENTNET_LITE_NORM

    def __init__(
        self,
        text: TextTower,
        image: ImageTower,
        *,
        freeze_text: bool = True,
        freeze_image: bool = True,
        frame_chunk: int = 0,
    ) -> None:
        super().__init__()
        self.text_tower = text
        self.image_tower = image
        self.freeze_text = bool(freeze_text)
        self.freeze_image = bool(freeze_image)
        self.frame_chunk = int(frame_chunk) if frame_chunk > 0 else DEFAULT_FRAME_CHUNK
        self.text_tower.requires_grad_(not self.freeze_text)
        self.image_tower.requires_grad_(not self.freeze_image)
        self.train(False)

    @classmethod
    def from_config(cls, model_cfg: ModelConfig) -> TwoTowerBackbone:
        cfg = model_cfg.two_tower
        text = TextTower(load_sentence_model(cfg.text_model, cfg.tiny), str(cfg.text_model))
        image = build_image_tower(cfg)
        return cls(
            text,
            image,
            freeze_text=cfg.freeze_text or model_cfg.freeze_backbone,
            freeze_image=cfg.freeze_image or model_cfg.freeze_backbone,
            frame_chunk=model_cfg.frame_chunk,
        )

    # ------------------------------------------------------------------ properties
    @property
    def text_width(self) -> int:
        return self.text_tower.width

    @property
    def image_width(self) -> int:
        return self.image_tower.width

    @property
    def embed_dim(self) -> int:
        """Width of the text features (the image features are ``image_width``; the bridge makes them agree)."""
        return self.text_tower.width

    @property
    def image_size(self) -> int:
        return self.image_tower.image_size

    @property
    def logit_scale_value(self) -> float:
        return TWO_TOWER_LOGIT_SCALE

    def train(self, mode: bool = True) -> TwoTowerBackbone:
        """Frozen towers stay in eval mode (no dropout, fixed BatchNorm statistics) whatever the model's mode."""
        super().train(mode)
        self.text_tower.train(mode and not self.freeze_text)
        self.image_tower.train(mode and not self.freeze_image)
        return self

    def enable_gradient_checkpointing(self) -> None:
        """Recompute the trainable towers' layers in the backward pass (the text model's transformer layers through
        HF's activation checkpointing, the image tower's MBConv blocks through ``torch.utils.checkpoint``) instead of
        keeping their activations. A frozen tower keeps no activations for a backward anyway."""
        self.text_tower.enable_gradient_checkpointing()
        self.image_tower.gradient_checkpointing = True

    def maybe_half(self, device: torch.device | str) -> bool:
        """The towers stay float32 (they are small; the CLIP backbone's fp16 cast has no counterpart here)."""
        return False

    # ------------------------------------------------------------------ encoders
    def sentence_query_side(self, bridge: nn.Module | None) -> SentenceQuerySide:
        """The query side as the numpy query export reads it: a sentence-transformers BERT (Transformer + mean
        Pooling, optionally Normalize) and a ConSE or fused ConSE bridge; NotExportableError says what else it is."""
        modules = list(getattr(self.text_tower, "model", None) or [])
        names = [type(module).__name__ for module in modules]
        if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            raise NotExportableError(f"text tower modules {names}, not Transformer + Pooling (+ Normalize)")
        bert = modules[0].auto_model
        if type(bert).__name__ != "BertModel" or bert.config.hidden_act != "gelu":
            raise NotExportableError(
                f"text model {type(bert).__name__} with {bert.config.hidden_act!r}, not a gelu BertModel"
            )
        if getattr(bert.config, "position_embedding_type", "absolute") != "absolute" or bert.config.is_decoder:
            raise NotExportableError("text model with relative positions or a decoder")
        pooling = modules[1].get_config_dict()
        mean_only = pooling.get("pooling_mode") == "mean" or (
            pooling.get("pooling_mode_mean_tokens") is True
            and not any(
                value for key, value in pooling.items() if key.startswith("pooling_mode_") and "mean" not in key
            )
        )
        if not mean_only:
            raise NotExportableError(f"pooling {pooling}, not mean pooling")
        normalize = names[-1] == "Normalize"
        if isinstance(bridge, FusedConseBridge):
            fusion = {
                "kind": "fused",
                "weight": float(bridge.class_weight),
                "temperature": float(bridge.class_temperature),
            }
            return SentenceQuerySide(bert, normalize, fusion, bridge.class_embeddings)
        if isinstance(bridge, ConseBridge):
            return SentenceQuerySide(bert, normalize, {"kind": "none"})
        raise NotExportableError(f"bridge {type(bridge).__name__}, not ConSE or fused ConSE")

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> TextFeatures:
        """Token ids [N, L] (from :class:`~tvr.data.sentence_tokenizer.SentenceTokenizer`) → pooled [N, Wt] and
        per-token [N, L, Wt] text-tower features (float32)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_text):
            pooled, tokens = self.text_tower(input_ids, attention_mask)
        return TextFeatures(eot=pooled.float(), words=tokens.float(), word_mask=attention_mask)

    def encode_frames(self, pixels: Tensor) -> Tensor:
        """Frames [n, 3, S, S] (normalised with :attr:`pixel_norm`) → pooled image features [n, Wi], in chunks."""
        if pixels.ndim != 4 or pixels.shape[1] != 3:
            raise ValueError(f"encode_frames: expected pixels [n, 3, S, S], got {tuple(pixels.shape)}")
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_image):
            parts = [
                self.image_tower(pixels[start : start + self.frame_chunk])
                for start in range(0, pixels.shape[0], self.frame_chunk)
            ]
        if not parts:
            return pixels.new_zeros(0, self.image_width, dtype=torch.float32)
        return torch.cat(parts).float()

    def encode_video(self, pixels: Tensor, frame_mask: Tensor) -> VideoFeatures:
        """Frames [N, F, 3, S, S] and their mask [N, F] → ``VideoFeatures(frames [N, F, Wi], frame_mask)``.

        Only valid frames go through the image tower; padding slots get zero features (masked out downstream)."""
        if pixels.ndim != 5 or pixels.shape[2] != 3:
            raise ValueError(f"encode_video: expected pixels [N, F, 3, S, S], got {tuple(pixels.shape)}")
        n, f = pixels.shape[:2]
        valid = frame_mask.reshape(-1).bool().to(pixels.device)
        feats = self.encode_frames(pixels.reshape(n * f, *pixels.shape[2:])[valid])
        out = feats.new_zeros(n * f, self.image_width)
        out[valid] = feats
        return VideoFeatures(out.reshape(n, f, -1), frame_mask)

    def classify(self, pooled: Tensor) -> Tensor:
        """ImageNet logits of pooled image features [..., Wi] → [..., classes]."""
        return self.image_tower.logits(pooled)


# ------------------------------------------------------------------------------------------ bridge


def _text_tower_identity(backbone: TwoTowerBackbone) -> tuple[str, str]:
    """(weights, vocabulary) fingerprints of the text tower: what its embeddings of any text depend on."""
    from tvr.models.backbones.two_tower.conse import weights_fingerprint

    tower = backbone.text_tower
    vocabulary = json.dumps(sorted(tower.model.tokenizer.get_vocab().items()))
    return weights_fingerprint(tower), hashlib.sha256(vocabulary.encode()).hexdigest()


def _cached_or_embedded(backbone: TwoTowerBackbone, key: str, rows: int, embed: Callable[[], Tensor]) -> Tensor:
    """The text embeddings cached under ``key`` ([rows, Wt]), or ``embed()`` run with the text tower in eval mode and
    cached."""
    from tvr.models.backbones.two_tower.conse import cache_root, read_cached_embeddings, write_cached_embeddings

    cache_path = cache_root() / "conse" / f"{key}.pt"
    cached = read_cached_embeddings(cache_path, backbone.text_width, rows)
    if cached is not None:
        return cached
    tower = backbone.text_tower
    was_training = tower.training
    tower.eval()
    embeddings = embed()
    tower.train(was_training)
    write_cached_embeddings(cache_path, embeddings)
    return embeddings


def conse_class_embeddings(backbone: TwoTowerBackbone, cfg: TwoTowerConfig) -> Tensor:
    """[1000, Wt] L2-normalised text embeddings of the ImageNet class prompts, from the disk cache when these
    weights were already encoded with these settings (:mod:`tvr.models.backbones.two_tower.conse`)."""
    from tvr.models.backbones.two_tower.conse import (
        NUM_IMAGENET_CLASSES,
        class_embedding_cache_key,
        class_prompts,
        imagenet_class_names,
        pool_class_embeddings,
    )
    from tvr.models.backbones.two_tower.text_tower import embed_sentences

    key = class_embedding_cache_key(*_text_tower_identity(backbone), cfg.conse_prompt, cfg.conse_names)
    texts, owner = class_prompts(imagenet_class_names(), cfg.conse_prompt, cfg.conse_names)
    return _cached_or_embedded(
        backbone,
        key,
        NUM_IMAGENET_CLASSES,
        lambda: pool_class_embeddings(embed_sentences(backbone.text_tower, texts), owner, NUM_IMAGENET_CLASSES),
    )


def bank_embeddings(backbone: TwoTowerBackbone, cfg: TwoTowerConfig) -> Tensor:
    """[B, Wt] L2-normalised text embeddings of the fused ConSE bridge's sentence bank (``conse_bank``), cached on
    disk as the class embeddings are."""
    import torch.nn.functional as F

    from tvr.models.backbones.two_tower.class_fusion import bank_digest, read_bank
    from tvr.models.backbones.two_tower.conse import embedding_cache_key
    from tvr.models.backbones.two_tower.text_tower import embed_sentences

    try:
        sentences = read_bank(cfg.conse_bank)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    weights, vocabulary = _text_tower_identity(backbone)
    key = embedding_cache_key(weights=weights, tokenizer=vocabulary, bank=bank_digest(sentences))
    return _cached_or_embedded(
        backbone, key, len(sentences), lambda: F.normalize(embed_sentences(backbone.text_tower, sentences), dim=-1)
    )


def build_two_tower_bridge(backbone: TwoTowerBackbone, cfg: TwoTowerConfig, num_proxies: int = 0) -> nn.Module:
    """The bridge ``model.two_tower.bridge`` names; ``num_proxies`` > 0 derives that many proxies per clip."""
    if cfg.bridge == "projection":
        return ProjectionBridge(
            backbone.text_width, backbone.image_width, cfg.embed_dim, cfg.projection, num_proxies=num_proxies
        )
    if cfg.bridge != "conse":
        raise ConfigError(f"model.two_tower.bridge = {cfg.bridge!r}: expected one of ['conse', 'projection']")
    if not (backbone.freeze_text and backbone.freeze_image):
        raise ConfigError(
            "model.two_tower.bridge = conse is training-free: its class embeddings and classifier are "
            "fixed, so fine-tuning a tower would leave them stale; keep freeze_text and freeze_image "
            "true, or use bridge: projection"
        )
    if backbone.image_tower.num_classes != 1000:
        raise ConfigError(
            f"ConSE needs an ImageNet-1k classifier; the image tower has {backbone.image_tower.num_classes} classes"
        )
    fc = backbone.image_tower.net._fc
    conse = {
        "top_k": cfg.conse_top_k,
        "temperature": cfg.conse_temperature,
        "pooling": cfg.conse_pooling,
        "num_proxies": num_proxies,
    }
    classes = conse_class_embeddings(backbone, cfg)
    if not cfg.conse_fusion:
        return ConseBridge(fc.weight, fc.bias, classes, **conse)
    return FusedConseBridge(
        fc.weight,
        fc.bias,
        classes,
        bank_embeddings(backbone, cfg) if cfg.conse_bank_weight > 0 else None,
        class_weight=cfg.conse_class_weight,
        class_temperature=cfg.conse_class_temperature,
        bank_weight=cfg.conse_bank_weight,
        bank_neighbours=cfg.conse_bank_neighbours,
        **conse,
    )
