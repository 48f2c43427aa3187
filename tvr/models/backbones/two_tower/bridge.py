"""Bridges of the two-tower backbone: from the towers' own spaces into the space the heads compare in.

A bridge sits between the backbone and the temporal module (``RetrievalModel.bridge``), so it runs on tower
features whether they come from the towers or from a ``tvr features`` cache — which therefore stores tower features
and serves every bridge. Two kinds (``model.two_tower.bridge``):

* :class:`ProjectionBridge`: learned maps text → D and image → D (linear, a two-layer MLP, or CLIP's ending: a
  LayerNorm and a bias-free map); trains at the full ``train.lr`` (it is not part of the pretrained backbone).
* :class:`ConseBridge`: the training-free ConSE map (:mod:`tvr.models.backbones.two_tower.conse`); text passes
unchanged and each frame
  becomes the probability-weighted text embedding of its top-k ImageNet classes. No parameters; the classifier and
  the class embeddings are buffers saved with a checkpoint.
* :class:`FusedConseBridge`: ConSE plus class-space scoring and hubness correction with a fixed sentence bank, as
  one dot product (:mod:`tvr.models.backbones.two_tower.class_fusion`); one fused vector per clip.

Derived proxies. TV-ProxyNet reads M per-video proxy embeddings, which CLIP-ViP's video tower produces and these
towers do not. With ``num_proxies = M > 0`` (the builder sets it to ``head.options.num_proxies`` for a head that
requires proxies) a bridge adds ``VideoFeatures.proxies`` = the means of M consecutive temporal segments of a clip's
valid frames, in the shared space (:func:`segment_means`; ConSE with clip-level pooling averages each segment's class
probabilities instead, as it does for the whole clip).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvr.models.backbones.two_tower.class_fusion import fuse_text, fuse_video, fused_width
from tvr.models.backbones.two_tower.conse import conse_combine
from tvr.types import TextFeatures, VideoFeatures


def segment_weights(frame_mask: Tensor, num_segments: int) -> Tensor:
    """[N, M, F] averaging weights of M consecutive segments over each clip's valid frames.

    With n valid frames (in any slots), segment m holds the valid frames of rank r with ⌊m·n/M⌋ ≤ r < ⌊(m+1)·n/M⌋,
    and at least the frame of rank ⌊m·n/M⌋ (so with n < M frames some frames serve several segments); every row
    sums to one. A clip with no valid frame gets uniform weights over all slots."""
    mask = frame_mask.float()
    n_valid = mask.sum(dim=1, keepdim=True)  # [N, 1]
    rank = mask.cumsum(dim=1) - 1.0  # [N, F] rank of each valid frame
    m = torch.arange(num_segments, device=mask.device, dtype=mask.dtype)[None, :]  # [1, M]
    start = torch.floor(m * n_valid / num_segments)  # [N, M]
    end = torch.maximum(torch.floor((m + 1) * n_valid / num_segments), start + 1)
    inside = (rank[:, None, :] >= start[:, :, None]) & (rank[:, None, :] < end[:, :, None]) & (mask[:, None, :] > 0)
    weights = inside.float()
    empty = weights.sum(dim=2, keepdim=True) == 0
    weights = torch.where(empty, torch.ones_like(weights), weights)
    return weights / weights.sum(dim=2, keepdim=True)


def segment_means(frames: Tensor, frame_mask: Tensor, num_segments: int) -> Tensor:
    """[N, M, D]: the means of M consecutive temporal segments of each clip's valid frames (:func:`segment_weights`)."""
    return torch.bmm(segment_weights(frame_mask, num_segments).to(frames.dtype), frames)


#: ``model.two_tower.projection`` kinds: a linear map, an MLP, or CLIP's ending (LayerNorm, then a bias-free map)
PROJECTION_KINDS = ("linear", "mlp", "clip")


class _Projection(nn.Module):
    """One tower's map into the shared space.

    ``clip`` ends the tower the way CLIP's towers end (``ln_final`` / ``ln_post``, then ``text_projection`` /
    ``proj``): a LayerNorm over the tower's feature, then a map without bias initialised N(0, in_dim^-1/2), as CLIP
    initialises its projections. Every vector reaches the map standardised, so its output has about √D norm at
    init whatever scale the tower works at: the two modalities arrive at the heads at comparable scales (a linear
    map instead carries each tower's own scale through; docs/bench.md, "Regime")."""

    def __init__(self, in_dim: int, out_dim: int, kind: str) -> None:
        super().__init__()
        if kind == "linear":
            self.net = nn.Linear(in_dim, out_dim)
        elif kind == "mlp":
            hidden = max(in_dim, out_dim)
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, out_dim))
        elif kind == "clip":
            projection = nn.Linear(in_dim, out_dim, bias=False)
            nn.init.normal_(projection.weight, std=in_dim**-0.5)
            self.net = nn.Sequential(nn.LayerNorm(in_dim), projection)
        else:
            raise ValueError(f"projection kind {kind!r}: expected one of {list(PROJECTION_KINDS)}")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class ProjectionBridge(nn.Module):
    """Learned projections text_width → D and image_width → D; the text map is applied to the pooled embedding and
    to every token (as CLIP's text projection is)."""

    def __init__(self, text_width: int, image_width: int, dim: int, kind: str = "linear", num_proxies: int = 0) -> None:
        super().__init__()
        self.embed_dim = int(dim)
        self.num_proxies = int(num_proxies)
        self.text_proj = _Projection(text_width, dim, kind)
        self.image_proj = _Projection(image_width, dim, kind)

    def text(self, feats: TextFeatures) -> TextFeatures:
        words = self.text_proj(feats.words.float()) if feats.words is not None else None
        return TextFeatures(self.text_proj(feats.eot.float()), words, feats.word_mask)

    def video(self, feats: VideoFeatures) -> VideoFeatures:
        frames = self.image_proj(feats.frames.float())
        proxies = segment_means(frames, feats.frame_mask, self.num_proxies) if self.num_proxies else None
        return VideoFeatures(frames, feats.frame_mask, proxies)


class ConseBridge(nn.Module):
    """ConSE (Norouzi et al. 2014): frame → Σ_top-k p·s(class) / Σ_top-k p in the text tower's space.

    ``pooling``: ``frame`` maps every frame (slots stay frames; the temporal module and head pool them) | ``video``
    averages the class probabilities over a clip's valid frames first (one slot per clip, mask 1)."""

    def __init__(
        self,
        classifier_weight: Tensor,
        classifier_bias: Tensor,
        class_embeddings: Tensor,
        *,
        top_k: int = 10,
        temperature: float = 1.0,
        pooling: str = "frame",
        num_proxies: int = 0,
    ) -> None:
        super().__init__()
        if (
            classifier_weight.shape[0] != class_embeddings.shape[0]
            or classifier_bias.shape[0] != classifier_weight.shape[0]
        ):
            raise ValueError(
                f"ConSE: {classifier_weight.shape[0]} classifier classes but {class_embeddings.shape[0]} "
                "class embeddings"
            )
        if pooling not in ("frame", "video"):
            raise ValueError(f"ConSE pooling {pooling!r}: expected 'frame' or 'video'")
        self.register_buffer("classifier_weight", classifier_weight.detach().float().clone())
        self.register_buffer("classifier_bias", classifier_bias.detach().float().clone())
        self.register_buffer("class_embeddings", class_embeddings.detach().float().clone())
        self.top_k, self.temperature, self.pooling = int(top_k), float(temperature), pooling
        self.num_proxies = int(num_proxies)
        self.embed_dim = int(class_embeddings.shape[1])

    def extra_repr(self) -> str:
        return (
            f"classes={self.class_embeddings.shape[0]}, dim={self.embed_dim}, top_k={self.top_k}, "
            f"temperature={self.temperature}, pooling={self.pooling!r}, num_proxies={self.num_proxies}"
        )

    def probabilities(self, pooled: Tensor) -> Tensor:
        """Class probabilities [..., C] of image features [..., W] at the bridge's temperature."""
        logits = F.linear(pooled.float(), self.classifier_weight, self.classifier_bias)
        return torch.softmax(logits / self.temperature, dim=-1)

    def embed(self, probs: Tensor) -> Tensor:
        return conse_combine(probs, self.class_embeddings, self.top_k)

    def text(self, feats: TextFeatures) -> TextFeatures:
        return feats

    def video(self, feats: VideoFeatures) -> VideoFeatures:
        probs = self.probabilities(feats.frames)  # [N, F, C]
        mask = feats.frame_mask
        if self.pooling == "frame":
            frames = self.embed(probs)
            proxies = segment_means(frames, mask, self.num_proxies) if self.num_proxies else None
            return VideoFeatures(frames, mask, proxies)
        weights = segment_weights(mask, 1)  # [N, 1, F]: the mean over valid frames
        clip = self.embed(torch.bmm(weights, probs))  # [N, 1, D]
        proxies = self.embed(torch.bmm(segment_weights(mask, self.num_proxies), probs)) if self.num_proxies else None
        return VideoFeatures(clip, torch.ones(mask.shape[0], 1, dtype=mask.dtype, device=mask.device), proxies)


class FusedConseBridge(ConseBridge):
    """ConSE fused with class-space scoring and a generic-sentence bank
    (:mod:`tvr.models.backbones.two_tower.class_fusion`).

    Text → [(1 − w)·e_t, w·q̂_t, 1, 0]; a clip → one slot [e_v, p̂_v, −β·b_v, β·√(1 − b_v²)], where e_v is the clip's
    unit ConSE embedding (``pooling``: the mean of its frames' unit ConSE embeddings, as CLIP4Clip's mean pooling
    makes it, or ConSE of the mean probabilities) and p̂_v its normalised mean class distribution. Derived proxies
    are the same vectors of temporal segments. ``bank``: unit embeddings [B, W] of the bank sentences (None when
    ``bank_weight`` is 0). Text has no per-token features."""

    def __init__(
        self,
        classifier_weight: Tensor,
        classifier_bias: Tensor,
        class_embeddings: Tensor,
        bank: Tensor | None,
        *,
        class_weight: float,
        class_temperature: float,
        bank_weight: float,
        bank_neighbours: int,
        top_k: int = 10,
        temperature: float = 1.0,
        pooling: str = "frame",
        num_proxies: int = 0,
    ) -> None:
        super().__init__(
            classifier_weight,
            classifier_bias,
            class_embeddings,
            top_k=top_k,
            temperature=temperature,
            pooling=pooling,
            num_proxies=num_proxies,
        )
        if bank_weight > 0 and (bank is None or bank.ndim != 2 or bank.shape[1] != class_embeddings.shape[1]):
            width = class_embeddings.shape[1]
            raise ValueError(f"fused ConSE: bank_weight {bank_weight} needs bank embeddings [B, {width}]")
        self.register_buffer("bank", F.normalize(bank.detach().float(), dim=-1).clone() if bank_weight > 0 else None)
        self.class_weight, self.class_temperature = float(class_weight), float(class_temperature)
        self.bank_weight, self.bank_neighbours = float(bank_weight), int(bank_neighbours)
        self.embed_dim = fused_width(class_embeddings.shape[1], class_embeddings.shape[0])

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, class_weight={self.class_weight}, class_temperature={self.class_temperature}, "
            f"bank={0 if self.bank is None else len(self.bank)}, bank_weight={self.bank_weight}, "
            f"bank_neighbours={self.bank_neighbours}"
        )

    def text(self, feats: TextFeatures) -> TextFeatures:
        """The fused query vectors; no per-token features (a token is not a query: a head that reads words, such as
        GARE with ``context: words``, says so)."""
        return TextFeatures(fuse_text(feats.eot, self.class_embeddings, self.class_weight, self.class_temperature))

    def fused(self, probs: Tensor, weights: Tensor) -> Tensor:
        """Fused vectors [N, S, D'] of the frame groups ``weights`` [N, S, F] (rows sum to one) of ``probs``
        [N, F, C]."""
        if self.pooling == "frame":
            frames = F.normalize(self.embed(probs), dim=-1)
            embedding = F.normalize(torch.bmm(weights, frames), dim=-1)
        else:
            embedding = F.normalize(self.embed(torch.bmm(weights, probs)), dim=-1)
        distribution = torch.bmm(weights, probs)
        return fuse_video(embedding, distribution, self.bank, self.bank_weight, self.bank_neighbours)

    def video(self, feats: VideoFeatures) -> VideoFeatures:
        probs = self.probabilities(feats.frames)  # [N, F, C]
        mask = feats.frame_mask
        clip = self.fused(probs, segment_weights(mask, 1))
        proxies = self.fused(probs, segment_weights(mask, self.num_proxies)) if self.num_proxies else None
        return VideoFeatures(clip, torch.ones(mask.shape[0], 1, dtype=mask.dtype, device=mask.device), proxies)
