"""``data.caption_sampling``: CLIP-ViP's one random caption per video per epoch, reproducible per
(seed, epoch, video)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from videos import write_test_video

from tvr.config import DataConfig, config_from_dict
from tvr.data.datasets import PairDataset, VideoResolver, caption_rng, collate_pairs, item_rng
from tvr.data.transforms import CLIP_MEAN, CLIP_STD
from tvr.data.video import load_clip
from tvr.train.data import DatasetTrainData


@dataclasses.dataclass
class Rec:
    video_id: str
    caption: str
    start: float | None = None
    end: float | None = None


def _tokenizer(texts: list[str], max_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(len(texts), max_words, dtype=torch.long)
    for row, text in enumerate(texts):
        codes = [ord(c) for c in text[:max_words]]
        ids[row, : len(codes)] = torch.tensor(codes)
    return ids, (ids != 0).long()


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("caption_videos")
    for k, name in enumerate("abcd"):
        write_test_video(root / f"{name}.mp4", 8 + k, 4.0, size=(16, 16))
    return root


# a, b, c have 3, 1 and 2 captions, interleaved as MSR-VTT's sentence list is; d appears twice with two spans
RECORDS = [
    Rec("a", "a0"),
    Rec("b", "b0"),
    Rec("a", "a1"),
    Rec("c", "c0"),
    Rec("a", "a2"),
    Rec("c", "c1"),
    Rec("d", "d-early", 0.0, 1.0),
    Rec("d", "d-late", 1.0, 2.0),
]
CAPTIONS = [["a0", "a1", "a2"], ["b0"], ["c0", "c1"], ["d-early"], ["d-late"]]


def _cfg(**overrides) -> DataConfig:
    base = dict(
        max_frames=3,
        image_size=16,
        max_words=8,
        sampling="clipvip",
        caption_sampling="one_per_video",
        pixel_mean=CLIP_MEAN,
        pixel_std=CLIP_STD,
    )
    base.update(overrides)
    return DataConfig(**base)


def _dataset(video_dir: Path, seed: int = 5, **overrides) -> PairDataset:
    return PairDataset(RECORDS, _tokenizer, VideoResolver(video_dir), _cfg(**overrides), train=True, seed=seed)


def test_one_item_per_video_and_span_in_first_appearance_order(video_dir: Path) -> None:
    ds = _dataset(video_dir)
    assert len(ds) == 5
    assert [[RECORDS[k].caption for k in group] for group in ds.video_groups] == CAPTIONS
    assert len(_dataset(video_dir, caption_sampling="all_pairs")) == len(RECORDS)
    with pytest.raises(ValueError, match="data.caption_sampling='random'"):
        _dataset(video_dir, caption_sampling="random")


def test_the_draw_is_the_documented_function_of_seed_epoch_and_video(video_dir: Path) -> None:
    ds = _dataset(video_dir, seed=5)
    for epoch in range(4):
        ds.set_epoch(epoch)
        for k, captions in enumerate(CAPTIONS):
            expected = (
                captions[int(caption_rng(5, epoch, k).integers(len(captions)))] if len(captions) > 1 else captions[0]
            )
            assert ds[k]["caption"] == expected
            assert ds[k]["video_id"] == RECORDS[ds.video_groups[k][0]].video_id


def test_draws_are_reproducible_on_resume_and_vary_across_epochs(video_dir: Path) -> None:
    ds = _dataset(video_dir)
    picks = {}
    for epoch in range(40):
        ds.set_epoch(epoch)
        picks[epoch] = [ds.record_index(k) for k in range(len(ds))]
    resumed = _dataset(video_dir)  # a fresh dataset, epochs and items visited out of order
    for epoch in (17, 3, 39, 0):
        resumed.set_epoch(epoch)
        assert [resumed.record_index(k) for k in reversed(range(len(ds)))] == picks[epoch][::-1]
    # every caption of a multi-caption video is drawn over the epochs, each a reasonable share of the time
    counts = Counter(RECORDS[picks[e][0]].caption for e in picks)
    assert set(counts) == {"a0", "a1", "a2"} and min(counts.values()) >= 5
    assert {RECORDS[picks[e][1]].caption for e in picks} == {"b0"}  # one caption: always that one
    other_seed = _dataset(video_dir, seed=6)
    other = []
    for epoch in range(40):
        other_seed.set_epoch(epoch)
        other.append([other_seed.record_index(k) for k in range(len(ds))])
    assert other != [picks[e] for e in range(40)]


def test_frame_jitter_still_comes_from_the_item_stream(video_dir: Path) -> None:
    ds = _dataset(video_dir, seed=2)
    ds.set_epoch(3)
    item = ds[2]  # video c
    expected, mask = load_clip(video_dir / "c.mp4", 3, 1.0, 16, sampling="clipvip", train=True, rng=item_rng(2, 3, 2))
    torch.testing.assert_close(item["video"], expected, rtol=0, atol=0)
    # the caption stream is not the clip stream
    assert not np.array_equal(caption_rng(2, 3, 2).integers(0, 2**31, 4), item_rng(2, 3, 2).integers(0, 2**31, 4))
    with pytest.raises(ValueError, match=">= 0"):
        caption_rng(0, -1, 0)


def test_a_resumed_train_stream_sees_the_same_pairs(video_dir: Path) -> None:
    """Through the trainer's data source: batches from (epoch, start_batch) equal those of an uninterrupted run."""

    def stream(start_batch: int, epoch: int) -> list[list[str]]:
        data = DatasetTrainData(_dataset(video_dir, seed=9), batch_size=2, collate_fn=collate_pairs, seed=9)
        return [batch["captions"] for batch in data.batches(epoch, start_batch)]

    full = stream(0, epoch=1)
    assert len(full) == 2  # 5 videos, batch 2, drop_last
    assert stream(1, epoch=1) == full[1:]
    assert stream(0, epoch=2) != full or stream(0, epoch=3) != full


def test_config_key_is_read_from_yaml_values() -> None:
    cfg = config_from_dict({"data": {"caption_sampling": "one_per_video"}})
    assert cfg.data.caption_sampling == "one_per_video"
    assert DataConfig().caption_sampling == "all_pairs"
