"""The toy method's head: cosine of linear projections; loss = InfoNCE + w·alignment of the positive pairs."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from toy_method.losses import alignment
from tvr.config import bounded
from tvr.losses import symmetric_infonce
from tvr.models.heads.base import RetrievalHead
from tvr.types import Sliceable, TextFeatures, VideoFeatures
from tvr.utils.distributed import RowShard


@dataclasses.dataclass
class ToyOptions:
    #: width of the shared embedding
    proj_dim: int = bounded(16, ge=1)
    #: weight w of the alignment loss beside the InfoNCE
    align_weight: float = bounded(0.5, ge=0.0)


@dataclasses.dataclass
class ToyState(Sliceable):
    emb: Tensor


class ToyHead(RetrievalHead):
    """s_ij = norm(W_t t_i) · norm(W_v mean_f V_jf): a dot product of per-item embeddings, hence indexable."""

    Options = ToyOptions
    indexable = True
    analysis_figures = ".figures"  # toy_method/figures.py: write_figures(context)

    def build(self) -> None:
        self.text_proj = nn.Linear(self.dim, self.options.proj_dim)
        self.video_proj = nn.Linear(self.dim, self.options.proj_dim)

    def encode_texts(self, text: TextFeatures) -> ToyState:
        return ToyState(F.normalize(self.text_proj(text.eot.float()), dim=-1))

    def encode_videos(self, video: VideoFeatures) -> ToyState:
        mask = video.frame_mask.float().unsqueeze(-1)
        pooled = (video.frames.float() * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        return ToyState(F.normalize(self.video_proj(pooled), dim=-1))

    def score_block(self, text_state: ToyState, video_state: ToyState) -> Tensor:
        return text_state.emb @ video_state.emb.T

    def loss(self, text: TextFeatures, video: VideoFeatures, shard: RowShard | None = None) -> dict[str, Tensor]:
        t, v = self.encode_texts(text), self.encode_videos(video)
        infonce = symmetric_infonce(self.logit_scale.exp() * self.score_block(t, v))
        align = alignment(t.emb, v.emb).mean()
        total = infonce + self.options.align_weight * align
        return {"loss": total, "infonce": infonce.detach(), "alignment": align.detach()}

    @torch.no_grad()
    def reference_pair_scores(self, text: TextFeatures, video: VideoFeatures) -> Tensor:
        """cos(W_t t, W_v mean of the real frames), one pair at a time."""
        out = []
        for t, frames, mask in zip(text.eot, video.frames, video.frame_mask, strict=True):
            pooled = frames[mask > 0].float().mean(0)
            out.append(F.cosine_similarity(self.text_proj(t.float()), self.video_proj(pooled), dim=0))
        return torch.stack(out)
