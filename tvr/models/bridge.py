"""Bridges of the two-tower backbone: from the towers' own spaces into the space the heads compare in.

A bridge sits between the backbone and the temporal module (``RetrievalModel.bridge``), so it runs on tower
features whether they come from the towers or from a ``tvr features`` cache — which therefore stores tower features
and serves every bridge. Two kinds (``model.two_tower.bridge``):

* :class:`ProjectionBridge`: learned maps text → D and image → D (linear, or a two-layer MLP); trains at the full
  ``train.lr`` (it is not part of the pretrained backbone).
* :class:`ConseBridge`: the training-free ConSE map (:mod:`tvr.models.conse`); text passes unchanged and each frame
  becomes the probability-weighted text embedding of its top-k ImageNet classes. No parameters; the classifier and
  the class embeddings are buffers saved with a checkpoint.

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

from tvr.models.conse import conse_combine
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


class _Projection(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, kind: str) -> None:
        super().__init__()
        if kind == "linear":
            self.net = nn.Linear(in_dim, out_dim)
        elif kind == "mlp":
            hidden = max(in_dim, out_dim)
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, out_dim))
        else:
            raise ValueError(f"projection kind {kind!r}: expected 'linear' or 'mlp'")

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
