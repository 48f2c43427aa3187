"""A method head defined outside the ``tvr`` package, used by its import path (``toy_heads:BilinearHead``): the
test that a user's own head trains and evaluates through the CLI with no change to tvr."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvr.config import bounded, choice
from tvr.losses import symmetric_infonce
from tvr.models.heads.base import RetrievalHead
from tvr.types import Sliceable, TextFeatures, VideoFeatures
from tvr.utils.distributed import RowShard


@dataclasses.dataclass
class BilinearOptions:
    #: width of the shared embedding
    proj_dim: int = bounded(16, ge=1)
    #: how frames are pooled before the projection
    pool: str = choice("mean", "mean", "max")


@dataclasses.dataclass
class Emb(Sliceable):
    emb: Tensor


class BilinearHead(RetrievalHead):
    """s_ij = norm(W_t t_i) · norm(W_v pool_f V_jf): a dot product of per-item embeddings, hence indexable."""

    Options = BilinearOptions
    indexable = True

    def build(self) -> None:  # the recipe of docs/architecture.md: the base constructor validated the options
        dim = self.dim
        self.text_proj = nn.Linear(dim, self.options.proj_dim)
        self.video_proj = nn.Linear(dim, self.options.proj_dim)

    def encode_texts(self, text: TextFeatures) -> Emb:
        return Emb(F.normalize(self.text_proj(text.eot.float()), dim=-1))

    def encode_videos(self, video: VideoFeatures) -> Emb:
        mask = video.frame_mask.float().unsqueeze(-1)
        if self.options.pool == "mean":
            pooled = (video.frames.float() * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        else:
            pooled = video.frames.float().masked_fill(mask == 0, float("-inf")).amax(1)
        return Emb(F.normalize(self.video_proj(pooled), dim=-1))

    def score_block(self, text_state: Emb, video_state: Emb) -> Tensor:
        return text_state.emb @ video_state.emb.T

    def loss(self, text: TextFeatures, video: VideoFeatures, shard: RowShard | None = None) -> dict[str, Tensor]:
        scores = self.score_block(self.encode_texts(text), self.encode_videos(video))
        loss = symmetric_infonce(self.logit_scale.exp() * scores)
        return {"loss": loss, "infonce": loss.detach(), "logit_scale": self.logit_scale.detach().exp()}

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """The contract test's oracle: the formula of the class docstring, one pair at a time."""
        out = []
        for t, frames, mask in zip(text.eot, video.frames, video.frame_mask, strict=True):
            real = frames[mask > 0]
            pooled = real.mean(0) if self.options.pool == "mean" else real.max(0).values
            out.append(F.cosine_similarity(self.text_proj(t), self.video_proj(pooled), dim=0))
        return torch.stack(out)


class NotAHead(nn.Module):
    """For the error path: an importable class that is not a RetrievalHead."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


@dataclasses.dataclass
class MixtureOptions:
    #: the candidates validation chooses the mixing weight γ from
    gammas: tuple[float, float, float] = (0.0, 0.5, 2.0)


@dataclasses.dataclass
class TwoViews(Sliceable):
    a: Tensor
    b: Tensor


class MixtureHead(RetrievalHead):
    """s_ij = cos(t_i, v_j) + γ·cos(t_i, w_j) with v = mean frame, w = first frame; γ is an inference setting chosen
    on validation (the shape of TV-ProxyNet's γ), stored in a buffer so it travels with the checkpoint."""

    Options = MixtureOptions

    def __init__(self, dim: int, options: MixtureOptions | None = None, **scale: float) -> None:
        # a head may still write its own constructor (heads written before build() existed keep working)
        super().__init__(dim, options, **scale)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("gamma", torch.tensor(float(self.options.gammas[0])))

    def encode_texts(self, text: TextFeatures) -> Emb:
        return Emb(F.normalize(self.proj(text.eot.float()), dim=-1))

    def encode_videos(self, video: VideoFeatures) -> TwoViews:
        frames = video.frames.float()
        return TwoViews(F.normalize(frames.mean(1), dim=-1), F.normalize(frames[:, 0], dim=-1))

    def shortlist_texts(self, text_state: Emb) -> Tensor:
        return text_state.emb

    def shortlist_videos(self, video_state: TwoViews) -> Tensor:
        return video_state.a

    def score_block(self, text_state: Emb, video_state: TwoViews) -> Tensor:
        return text_state.emb @ video_state.a.T + self.gamma * (text_state.emb @ video_state.b.T)

    def score_components(self, text_state, video_state, text_chunk=None, video_chunk=None, settings=None):  # noqa: ANN001, ANN201
        return {"mean": text_state.emb @ video_state.a.T, "first": text_state.emb @ video_state.b.T}

    def combine_scores(self, components: dict[str, Tensor], setting: dict) -> Tensor:
        return components["mean"] + setting["gamma"] * components["first"]

    def inference_candidates(self) -> list[dict]:
        return [{"gamma": g} for g in self.options.gammas]

    def inference_setting(self) -> dict:
        return {"gamma": float(self.gamma)}

    def set_inference_setting(self, setting: dict) -> None:
        self.gamma.fill_(float(setting["gamma"]))

    def baseline_settings(self) -> dict[str, dict]:
        return {"gamma=0": {"gamma": 0.0}}

    def loss(self, text: TextFeatures, video: VideoFeatures, shard: RowShard | None = None) -> dict[str, Tensor]:
        scores = self.score_block(self.encode_texts(text), self.encode_videos(video))
        loss = symmetric_infonce(self.logit_scale.exp() * scores)
        return {"loss": loss}

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """The contract test's oracle: cos(W t, mean frame) + γ·cos(W t, first frame), one pair at a time (every
        frame slot counts, as in encode_videos)."""
        out = []
        for t, frames in zip(text.eot, video.frames, strict=True):
            query = self.proj(t)
            out.append(
                F.cosine_similarity(query, frames.mean(0), dim=0)
                + float(self.gamma) * F.cosine_similarity(query, frames[0], dim=0)
            )
        return torch.stack(out)
