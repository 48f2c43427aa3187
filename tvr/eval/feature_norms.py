"""How large each modality's features are where the heads read them: the scale two towers hand a head.

A cosine head ignores the scale of its inputs; a head that adds or subtracts features before normalising them
(GARE's gap query v̄_j − t_i and its corrected text t_i + Δ_ij) does not, so a bench records, for every run, the L2
norms of the features a head reads (``tvr bench``, docs/bench.md "Regime"): the text feature (the EOT / sentence
feature), every real frame after the temporal module, and each video's mean over its real frames (the v̄_j of the
gap query, the vector a mean-pooling head scores).
"""

from __future__ import annotations

import math

from torch import Tensor

from tvr.types import TextFeatures, VideoFeatures


def _summary(norms: Tensor) -> dict[str, float]:
    values = norms.double()
    n = values.numel()
    mean = float(values.mean()) if n else math.nan
    sd = float(values.std(unbiased=True)) if n > 1 else math.nan
    return {"mean": mean, "sd": sd, "min": float(values.min()) if n else math.nan,
            "max": float(values.max()) if n else math.nan, "n": n}  # fmt: skip


def feature_norms(text: TextFeatures, video: VideoFeatures) -> dict[str, dict[str, float] | float]:
    """Norm summaries (mean, sd, min, max, n) of the text features, the real frames and the per-video mean of the
    real frames, and ``video_to_text``: the ratio of the mean video-mean norm to the mean text norm."""
    text_norms = text.eot.float().norm(dim=-1)
    mask = video.frame_mask.bool()
    frames = video.frames.float()
    frame_norms = frames.norm(dim=-1)[mask]
    weights = mask.to(frames.dtype).unsqueeze(-1)
    means = (frames * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
    has_frames = mask.any(dim=1)
    out: dict[str, dict[str, float] | float] = {
        "text": _summary(text_norms),
        "frame": _summary(frame_norms),
        "video_mean": _summary(means.norm(dim=-1)[has_frames]),
    }
    text_mean, video_mean = out["text"]["mean"], out["video_mean"]["mean"]  # type: ignore[index]
    out["video_to_text"] = video_mean / text_mean if text_mean > 0 else math.nan
    return out


__all__ = ["feature_norms"]
