"""Which pairs of a split an analysis reads: training-like batches and sampled negatives (seeded, reproducible)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def sample_pair_batches(
    text_video: list[int] | Tensor, batch_size: int, num_batches: int, seed: int = 0
) -> list[Tensor]:
    """Up to ``num_batches`` batches of caption indices, each of min(batch_size, #videos) distinct videos with one
    of their captions drawn at random (seeded). A batch drawn twice is kept once (a split of at most ``batch_size``
    videos with one caption each has a single batch)."""
    tv = torch.as_tensor(text_video).long()
    n_videos = int(tv.max()) + 1 if tv.numel() else 0
    size = min(int(batch_size), n_videos)
    if size < 2:
        raise ValueError(f"gradient analysis needs batches of at least 2 videos; the split has {n_videos}")
    captions = [torch.nonzero(tv == v).flatten() for v in range(n_videos)]
    videos_with_captions = torch.tensor([v for v in range(n_videos) if captions[v].numel()])
    size = min(size, videos_with_captions.numel())
    generator = torch.Generator().manual_seed(seed)
    batches, seen = [], set()
    for _ in range(num_batches):
        chosen = videos_with_captions[torch.randperm(videos_with_captions.numel(), generator=generator)[:size]]
        picks = [captions[int(v)][torch.randint(captions[int(v)].numel(), (1,), generator=generator)] for v in chosen]
        batch = torch.cat(picks)
        key = frozenset(batch.tolist())
        if key not in seen:
            seen.add(key)
            batches.append(batch)
    return batches


def sample_negatives(text_video: Any, n_videos: int, per_text: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``per_text`` distinct negative videos for every caption (fewer when the gallery is smaller), seeded:
    (text_index, video_index)."""
    tv = torch.as_tensor(text_video).long()
    count = min(per_text, n_videos - 1)
    if count <= 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    # a random draw among the n_videos − 1 others: index k ≥ gt shifts past the positive
    draws = torch.stack([torch.randperm(n_videos - 1, generator=generator)[:count] for _ in range(tv.numel())])
    draws = draws + (draws >= tv[:, None]).long()
    return torch.arange(tv.numel()).repeat_interleave(count), draws.reshape(-1)


def sample_captions(n_captions: int, max_count: int, seed: int = 0) -> Tensor:
    """Indices of at most ``max_count`` captions out of ``n_captions`` (all of them when they fit; else a seeded
    random sample, sorted), for the analyses that read sampled pairs of every caption."""
    if n_captions <= max_count:
        return torch.arange(n_captions)
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(n_captions, generator=generator)[:max_count].sort().values
