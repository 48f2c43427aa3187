"""Video resolver, pair/video/text datasets, skip markers, collates and (seed, epoch, index) determinism."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from videos import identify_frames, write_test_video

from tvr.config import DataConfig
from tvr.data.datasets import (
    PairDataset,
    TextDataset,
    VideoDataset,
    VideoNotFoundError,
    VideoResolver,
    collate_pairs,
    collate_texts,
    collate_videos,
    item_rng,
)
from tvr.data.transforms import CLIP_MEAN, CLIP_STD
from tvr.data.video import VideoDecodeError, load_clip


@dataclasses.dataclass
class Rec:
    video_id: str
    caption: str
    start: float | None = None
    end: float | None = None


class FakeTokenizer:
    """ids = character codes of the text (truncated), mask = 1 on them; enough to check wiring."""

    def __call__(self, texts: list[str], max_words: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(texts), max_words, dtype=torch.long)
        mask = torch.zeros(len(texts), max_words, dtype=torch.long)
        for row, text in enumerate(texts):
            codes = [ord(c) for c in text[:max_words]]
            ids[row, : len(codes)] = torch.tensor(codes, dtype=torch.long)
            mask[row, : len(codes)] = 1
        return ids, mask


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dataset_videos")
    write_test_video(root / "a.mp4", 40, 10.0)  # 4 s
    write_test_video(root / "b.mp4", 25, 5.0, size=(48, 64))  # 5 s, portrait
    write_test_video(root / "c.mkv", 30, 10.0)  # only as .mkv: found through the extension fallback
    (root / "bad.mp4").write_bytes(b"\x00not a video" * 50)
    return root


def _cfg(**overrides) -> DataConfig:
    base = dict(
        max_frames=4,
        frame_rate=1.0,
        image_size=16,
        max_words=8,
        sampling="clip4clip",
        augment=False,
        pixel_mean=CLIP_MEAN,
        pixel_std=CLIP_STD,
    )
    base.update(overrides)
    return DataConfig(**base)


def _identify(pixels: torch.Tensor) -> list[int]:
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1)
    images = ((pixels * std + mean) * 255).round().clamp(0, 255).to(torch.uint8)
    return identify_frames(images.permute(0, 2, 3, 1).numpy())


# ----------------------------------------------------------------------------------------- resolver


def test_resolver_pattern_and_extension_fallback(video_dir: Path) -> None:
    resolver = VideoResolver(video_dir)
    assert resolver("a") == video_dir / "a.mp4"
    assert resolver("c") == video_dir / "c.mkv"
    with pytest.raises(VideoNotFoundError) as info:
        resolver("ghost")
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, VideoDecodeError)
    assert err.video_id == "ghost"
    assert err.tried == [str(video_dir / f"ghost{ext}") for ext in (".mp4", ".webm", ".mkv", ".avi", ".mov")]
    assert "'ghost'" in str(err) and str(video_dir / "ghost.webm") in str(err)


def test_resolver_other_patterns_are_taken_literally(video_dir: Path) -> None:
    resolver = VideoResolver(video_dir, pattern="{video_id}.mkv")
    assert resolver("c") == video_dir / "c.mkv"
    with pytest.raises(VideoNotFoundError) as info:
        resolver("a")
    assert info.value.tried == [str(video_dir / "a.mkv")]
    with pytest.raises(ValueError, match="video_id"):
        VideoResolver(video_dir, pattern="clip.mp4")
    with pytest.raises(FileNotFoundError, match="video folder"):
        VideoResolver(video_dir / "nope")


# ----------------------------------------------------------------------------------------- pair dataset


def test_pair_item_contents(video_dir: Path) -> None:
    records = [Rec("a", "a red dog runs"), Rec("b", "hi", 1.0, 3.0)]
    ds = PairDataset(records, FakeTokenizer(), VideoResolver(video_dir), _cfg(), train=False, seed=0)
    item = ds[0]
    assert set(item) == {"text_ids", "text_mask", "video", "video_mask", "video_id", "caption", "index"}
    assert item["text_ids"].shape == (8,) and item["text_ids"].dtype == torch.long
    assert item["text_ids"].tolist() == [ord(c) for c in "a red do"] and item["text_mask"].tolist() == [1] * 8
    assert item["video"].shape == (4, 3, 16, 16) and item["video"].dtype == torch.float32
    assert item["video_mask"].tolist() == [1, 1, 1, 1]  # 4 s at 1 fps: candidates 0, 10, 20, 30
    assert _identify(item["video"]) == [0, 10, 20, 30]
    assert (item["video_id"], item["caption"], item["index"]) == ("a", "a red dog runs", 0)
    second = ds[1]  # 5 fps, window 1 s .. 3 s -> frames 5..15, stride 5
    assert second["video_mask"].tolist() == [1, 1, 1, 0] and _identify(second["video"][:3]) == [5, 10, 15]
    assert second["text_mask"].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]


def test_bad_and_missing_videos_become_skip_markers(video_dir: Path) -> None:
    records = [Rec("a", "first"), Rec("bad", "broken"), Rec("ghost", "missing"), Rec("b", "last")]
    ds = PairDataset(records, FakeTokenizer(), VideoResolver(video_dir), _cfg(), train=True, seed=0)
    bad, ghost = ds[1], ds[2]
    assert bad["skipped"] == "bad" and str(video_dir / "bad.mp4") in bad["error"] and "unreadable" in bad["error"]
    assert ghost["skipped"] == "ghost" and "ghost" in ghost["error"]
    batch = collate_pairs([ds[i] for i in range(4)])
    assert batch["video"].shape == (2, 4, 3, 16, 16) and batch["text_ids"].shape == (2, 8)
    assert batch["video_mask"].shape == (2, 4) and batch["text_mask"].shape == (2, 8)
    assert batch["video_ids"] == ["a", "b"] and batch["captions"] == ["first", "last"]
    assert batch["indices"].tolist() == [0, 3]
    assert batch["skipped"] == ["bad", "ghost"] and len(batch["errors"]) == 2
    torch.testing.assert_close(batch["video"][1], ds[3]["video"], rtol=0, atol=0)


def test_all_skipped_batch_has_empty_tensors(video_dir: Path) -> None:
    ds = PairDataset([Rec("bad", "x"), Rec("ghost", "y")], FakeTokenizer(), VideoResolver(video_dir), _cfg())
    batch = collate_pairs([ds[0], ds[1]])
    assert batch["video"].shape[0] == 0 and batch["text_ids"].shape[0] == 0 and batch["video_mask"].shape[0] == 0
    assert batch["video"].ndim == 5 and batch["text_ids"].ndim == 2
    assert batch["skipped"] == ["bad", "ghost"] and batch["video_ids"] == [] and batch["indices"].numel() == 0


def test_training_randomness_depends_only_on_seed_epoch_index(video_dir: Path) -> None:
    cfg = _cfg(sampling="clipvip", augment=True, max_frames=3)
    records = [Rec("a", "one"), Rec("b", "two"), Rec("a", "three")]

    def make(seed: int = 7) -> PairDataset:
        return PairDataset(records, FakeTokenizer(), VideoResolver(video_dir), cfg, train=True, seed=seed)

    ds = make()
    assert ds.augment is not None and ds.augment.num_ops == cfg.augment_num_ops
    epoch0 = [ds[i]["video"] for i in range(3)]
    # a fresh dataset (a resumed run) visiting items in another order sees the same clips
    resumed = make()
    for i in (2, 0, 1):
        torch.testing.assert_close(resumed[i]["video"], epoch0[i], rtol=0, atol=0)
    ds.set_epoch(1)
    epoch1 = [ds[i]["video"] for i in range(3)]
    assert any(not torch.equal(a, b) for a, b in zip(epoch0, epoch1, strict=True))
    ds.set_epoch(0)
    torch.testing.assert_close(ds[0]["video"], epoch0[0], rtol=0, atol=0)
    other_seed = make(seed=8)
    assert any(not torch.equal(other_seed[i]["video"], epoch0[i]) for i in range(3))
    # items 0 and 2 share a video and caption slot but not their randomness
    assert not torch.equal(epoch0[0], epoch0[2])


def test_train_item_matches_load_clip_with_the_item_rng(video_dir: Path) -> None:
    cfg = _cfg(sampling="clipvip", augment=True, max_frames=3)
    ds = PairDataset([Rec("b", "x")], FakeTokenizer(), VideoResolver(video_dir), cfg, train=True, seed=3)
    ds.set_epoch(2)
    expected, _ = load_clip(
        video_dir / "b.mp4", 3, 1.0, 16, sampling="clipvip", train=True, rng=item_rng(3, 2, 0), augment=ds.augment
    )
    torch.testing.assert_close(ds[0]["video"], expected, rtol=0, atol=0)


def test_eval_pairs_have_no_augmentation(video_dir: Path) -> None:
    cfg = _cfg(augment=True)
    ds = PairDataset([Rec("a", "x")], FakeTokenizer(), VideoResolver(video_dir), cfg, train=False, seed=0)
    assert ds.augment is None
    plain, _ = load_clip(video_dir / "a.mp4", 4, 1.0, 16)
    torch.testing.assert_close(ds[0]["video"], plain, rtol=0, atol=0)


def test_item_rng_streams() -> None:
    a = item_rng(1, 0, 5).integers(0, 2**31, 4)
    assert np.array_equal(a, item_rng(1, 0, 5).integers(0, 2**31, 4))
    assert not np.array_equal(a, item_rng(1, 1, 5).integers(0, 2**31, 4))
    assert not np.array_equal(a, item_rng(1, 0, 6).integers(0, 2**31, 4))
    with pytest.raises(ValueError, match=">= 0"):
        item_rng(-1, 0, 0)


# ----------------------------------------------------------------------------------------- eval datasets


def test_video_dataset_spans_and_collate(video_dir: Path) -> None:
    ids = ["a", "ghost", "b", "c"]
    spans = [(None, None), (None, None), (2.0, 4.0), (None, None)]
    ds = VideoDataset(ids, spans, VideoResolver(video_dir), _cfg())
    assert len(ds) == 4
    batch = collate_videos([ds[i] for i in range(4)])
    assert batch["video"].shape == (3, 4, 3, 16, 16)
    assert batch["video_ids"] == ["a", "b", "c"] and batch["indices"].tolist() == [0, 2, 3]
    assert batch["skipped"] == ["ghost"]
    assert batch["video_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]]
    assert _identify(batch["video"][1][:3]) == [10, 15, 20]  # 5 fps, frames 10..20, stride 5
    assert _identify(batch["video"][2][:3]) == [0, 10, 20]
    whole = VideoDataset(["b"], None, VideoResolver(video_dir), _cfg())
    assert whole[0]["video_mask"].tolist() == [1, 1, 1, 1]  # 25 frames at 5 fps: 0, 5, 10, 15, 20 -> thinned
    assert _identify(whole[0]["video"]) == [0, 5, 10, 20]  # linspace(0, 4, 4).astype(int) = [0, 1, 2, 4]
    with pytest.raises(ValueError, match="spans"):
        VideoDataset(ids, spans[:2], VideoResolver(video_dir), _cfg())


def test_text_dataset_and_collate() -> None:
    ds = TextDataset(["hello", "a much longer caption"], FakeTokenizer(), max_words=6)
    batch = collate_texts([ds[0], ds[1]])
    assert batch["text_ids"].shape == (2, 6) and batch["text_mask"].tolist() == [[1] * 5 + [0], [1] * 6]
    assert batch["captions"] == ["hello", "a much longer caption"] and batch["indices"].tolist() == [0, 1]


def test_dataloader_with_workers(video_dir: Path) -> None:
    records = [Rec("a", "one"), Rec("bad", "two"), Rec("b", "three"), Rec("c", "four")]
    ds = PairDataset(records, FakeTokenizer(), VideoResolver(video_dir), _cfg(augment=True), train=True, seed=1)
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate_pairs)
    batches = list(loader)
    assert [b["video_ids"] for b in batches] == [["a"], ["b", "c"]]
    assert batches[0]["skipped"] == ["bad"]
    torch.testing.assert_close(batches[1]["video"][0], ds[2]["video"], rtol=0, atol=0)


# ----------------------------------------------------------------------------------------- frame cache


def _frame_cache(videos: Path, cache: Path, cfg: DataConfig) -> Path:
    from tvr.data.frame_cache import FrameSettings
    from tvr.data.prepare import extract_frames

    settings = FrameSettings(cfg.max_frames, cfg.frame_rate, cfg.image_size, cfg.sampling)
    report = extract_frames(videos, cache, settings, workers=0, progress=False)
    assert report["summary"]["failed"] == 1  # bad.mp4 is reported, not cached
    return cache


@pytest.mark.parametrize("sampling", ["clip4clip", "clipvip"])
def test_frame_cache_gives_the_decoded_tensors(video_dir: Path, tmp_path: Path, sampling: str) -> None:
    cfg = _cfg(sampling=sampling, augment=True, max_frames=3)
    cached_cfg = dataclasses.replace(
        cfg, video_dir=str(video_dir), frame_cache=str(_frame_cache(video_dir, tmp_path / "cache", cfg))
    )
    resolver = VideoResolver(video_dir)
    ids = ["a", "b", "c", "bad"]
    plain, cached = VideoDataset(ids, None, resolver, cfg), VideoDataset(ids, None, resolver, cached_cfg)
    for k in range(3):
        assert torch.equal(cached[k]["video"], plain[k]["video"]) and torch.equal(
            cached[k]["video_mask"], plain[k]["video_mask"]
        )
    assert cached[3]["skipped"] == "bad"  # not in the cache: decoded, and unreadable as before
    # training items, RandAugment included, are the same with and without the cache
    records = [Rec(v, "x") for v in ("a", "b", "c")]
    train_plain = PairDataset(records, FakeTokenizer(), resolver, cfg, train=True, seed=5)
    train_cached = PairDataset(records, FakeTokenizer(), resolver, cached_cfg, train=True, seed=5)
    for ds in (train_plain, train_cached):
        ds.set_epoch(3)
    for k in range(3):
        assert torch.equal(train_cached[k]["video"], train_plain[k]["video"])


def test_frame_cache_is_read_where_it_applies_and_damage_falls_back(video_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(max_frames=3)
    cache = _frame_cache(video_dir, tmp_path / "cache", cfg)
    cached_cfg = dataclasses.replace(cfg, video_dir=str(video_dir), frame_cache=str(cache))
    resolver = VideoResolver(video_dir)
    decoded = VideoDataset(["a"], None, resolver, cfg)[0]["video"]
    # a cache entry whose frames differ from the video shows that the dataset reads the cache, not the video
    frames = np.load(cache / "a.npy")
    np.save(cache / "a.npy", 255 - frames)
    from_cache = VideoDataset(["a"], None, resolver, cached_cfg)[0]["video"]
    assert not torch.equal(from_cache, decoded)
    # a start/end window is not what the cache holds: decoded
    window = VideoDataset(["a"], [(1.0, 3.0)], resolver, cached_cfg)[0]["video"]
    assert torch.equal(window, VideoDataset(["a"], [(1.0, 3.0)], resolver, cfg)[0]["video"])
    # CLIP-ViP training jitter picks new frames every epoch: decoded even with a cache of the eval sampling
    vip = _cfg(sampling="clipvip", max_frames=3)
    vip_cached = dataclasses.replace(
        vip, video_dir=str(video_dir), frame_cache=str(_frame_cache(video_dir, tmp_path / "vip", vip))
    )
    np.save(tmp_path / "vip" / "a.npy", np.zeros_like(np.load(tmp_path / "vip" / "a.npy")))
    jittered = PairDataset([Rec("a", "x")], FakeTokenizer(), resolver, vip_cached, train=True, seed=1)[0]["video"]
    assert torch.equal(
        jittered, PairDataset([Rec("a", "x")], FakeTokenizer(), resolver, vip, train=True, seed=1)[0]["video"]
    )
    # a damaged entry is decoded from the video instead
    (cache / "a.npy").write_bytes(b"not an array")
    assert torch.equal(VideoDataset(["a"], None, resolver, cached_cfg)[0]["video"], decoded)


def test_frame_cache_built_with_other_settings_is_refused(video_dir: Path, tmp_path: Path) -> None:
    from tvr.config import ConfigError

    cache = _frame_cache(video_dir, tmp_path / "cache", _cfg(max_frames=3))
    other = _cfg(max_frames=4, video_dir=str(video_dir), frame_cache=str(cache))
    with pytest.raises(ConfigError, match=r"data.frame_cache = .* other frame settings \(max_frames: cache 3, run 4\)"):
        VideoDataset(["a"], None, VideoResolver(video_dir), other)
    with pytest.raises(ConfigError, match="not a frame cache"):
        VideoDataset(["a"], None, VideoResolver(video_dir), _cfg(frame_cache=str(tmp_path)))
