"""Video probing, both sampling formulas, decoding (checked through colour-coded frames) and error reporting."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from videos import frame_colour, identify_frames, write_test_video

from tvr.data.transforms import CLIP_MEAN, CLIP_STD, clip_preprocess
from tvr.data.video import (
    VideoDecodeError,
    VideoInfo,
    clip4clip_indices,
    clipvip_indices,
    decode_frames,
    frame_window,
    load_clip,
    probe_video,
    sample_indices,
)


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("videos")
    paths = {
        "v40": root / "v40.mp4",  # 40 frames, 10 fps, 64x48
        "portrait": root / "portrait.mp4",  # 30 frames, 30 fps, 48x64 (w x h)
        "mkv": root / "nocount.mkv",  # 25 frames, 5 fps, no frame count in the container
        "moov_end": root / "moov_end.mp4",  # index at the end of the file
    }
    write_test_video(paths["v40"], 40, 10.0)
    write_test_video(paths["portrait"], 30, 30.0, size=(48, 64))
    write_test_video(paths["mkv"], 25, 5.0)
    write_test_video(paths["moov_end"], 40, 10.0, faststart=False)
    data = paths["v40"].read_bytes()
    paths["truncated"] = root / "truncated.mp4"
    paths["truncated"].write_bytes(data[: int(len(data) * 0.6)])
    moov_end = paths["moov_end"].read_bytes()
    paths["no_index"] = root / "no_index.mp4"
    paths["no_index"].write_bytes(moov_end[: int(len(moov_end) * 0.6)])
    paths["empty"] = root / "empty.mp4"
    paths["empty"].write_bytes(b"")
    paths["garbage"] = root / "garbage.mp4"
    paths["garbage"].write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    paths["audio"] = root / "audio.wav"
    with av.open(str(paths["audio"]), mode="w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), dtype=np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    paths["missing"] = root / "does_not_exist.mp4"
    return paths


# ----------------------------------------------------------------------------------------- sampling formulas


def test_clip4clip_stride_and_no_thinning_below_max() -> None:
    # 95 frames at 30 fps, 1 candidate per second: stride round(30/1) = 30
    np.testing.assert_array_equal(clip4clip_indices(95, 30.0, 12), [0, 30, 60, 90])
    # 29.97 fps rounds to a stride of 30 as well
    np.testing.assert_array_equal(clip4clip_indices(95, 29.97, 12), [0, 30, 60, 90])
    # 3 fps (the compressed videos), 2 candidates per second: stride round(1.5) = 2
    np.testing.assert_array_equal(clip4clip_indices(7, 3.0, 12, frame_rate=2.0), [0, 2, 4, 6])
    # Python's round ties to even: round(2.5) = 2
    np.testing.assert_array_equal(clip4clip_indices(9, 2.5, 12), [0, 2, 4, 6, 8])
    # stride never drops below 1
    np.testing.assert_array_equal(clip4clip_indices(4, 3.0, 12, frame_rate=10.0), [0, 1, 2, 3])


def test_clip4clip_thins_uniformly_to_max_frames() -> None:
    # 300 frames at 30 fps: 10 candidates 0, 30, ..., 270; linspace(0, 9, 5).astype(int) = [0, 2, 4, 6, 9]
    np.testing.assert_array_equal(clip4clip_indices(300, 30.0, 5), [0, 60, 120, 180, 270])
    # 12 of 40 candidates
    candidates = np.arange(0, 400, 10)
    expected = candidates[np.linspace(0, 39, 12).astype(int)]
    np.testing.assert_array_equal(clip4clip_indices(400, 10.0, 12), expected)


def test_clip4clip_start_end_window() -> None:
    # 100 frames at 10 fps, window 2.5 s - 6.1 s -> frames 25..61, stride 10
    np.testing.assert_array_equal(clip4clip_indices(100, 10.0, 12, start=2.5, end=6.1), [25, 35, 45, 55])
    # reversed window is swapped
    np.testing.assert_array_equal(clip4clip_indices(100, 10.0, 12, start=6.1, end=2.5), [25, 35, 45, 55])
    # an empty window is widened to one second
    np.testing.assert_array_equal(clip4clip_indices(100, 10.0, 12, start=3.0, end=3.0), [30, 40])
    # clamped to the video
    np.testing.assert_array_equal(clip4clip_indices(100, 10.0, 12, start=-4.0, end=50.0), np.arange(0, 100, 10))
    np.testing.assert_array_equal(clip4clip_indices(100, 10.0, 12, start=20.0, end=30.0), [99])
    np.testing.assert_array_equal(clip4clip_indices(100, 10.0, 12, start=8.0), [80, 90])


def test_clip4clip_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_frames"):
        clip4clip_indices(0, 10.0, 12)
    with pytest.raises(ValueError, match="fps"):
        clip4clip_indices(10, 0.0, 12)
    with pytest.raises(ValueError, match="max_frames"):
        clip4clip_indices(10, 10.0, 0)


def test_clipvip_test_is_linspace_over_all_frames() -> None:
    np.testing.assert_array_equal(clipvip_indices(100, 12, train=False), np.linspace(0, 99, 12).astype(int))
    # fewer frames than slots: indices repeat, always F of them
    np.testing.assert_array_equal(clipvip_indices(5, 12, train=False), np.linspace(0, 4, 12).astype(int))
    assert clipvip_indices(1, 4, train=False).tolist() == [0, 0, 0, 0]


def test_clipvip_train_jitter_formula() -> None:
    T, F = 100, 12
    interval = T // (F - 1)  # 9
    starts = set()
    for seed in range(40):
        reference = np.random.default_rng(seed)
        start = int(reference.integers(0, interval + 1))
        end = int(reference.integers(T - 1 - interval, T))
        expected = np.linspace(start, end, F).astype(int)
        got = clipvip_indices(T, F, train=True, rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(got, expected)
        assert 0 <= got[0] <= interval and T - 1 - interval <= got[-1] <= T - 1
        assert np.all(np.diff(got) >= 0)
        starts.add(int(got[0]))
    assert len(starts) > 3  # the jitter actually moves the window


def test_clipvip_train_short_and_two_frame_videos_stay_in_range() -> None:
    for seed in range(30):
        rng = np.random.default_rng(seed)
        for T, F in [(3, 12), (10, 2), (1, 12), (12, 12)]:
            got = clipvip_indices(T, F, train=True, rng=rng)
            assert len(got) == F
            assert got.min() >= 0 and got.max() <= T - 1
            assert np.all(np.diff(got) >= 0)


def _info(num_frames: int, fps: float) -> VideoInfo:
    return VideoInfo(fps=fps, num_frames=num_frames, duration=num_frames / fps, width=32, height=32)


def test_clipvip_window_test_mode_spans_the_whole_window() -> None:
    """A start/end window in clipvip mode: linspace over the window's frames f_start..f_end *inclusive*."""
    info = _info(100, 10.0)
    # 1.0 s - 3.0 s at 10 fps = frames 10..30 (21 frames); linspace(0, 20, 5) = 0, 5, 10, 15, 20
    got = sample_indices(info, 5, 1.0, "clipvip", 1.0, 3.0, train=False, rng=None)
    assert got.tolist() == [10, 15, 20, 25, 30]
    # 2.5 s - 6.1 s = frames 25..61 (37 frames); linspace(0, 36, 5) = 0, 9, 18, 27, 36
    got = sample_indices(info, 5, 1.0, "clipvip", 2.5, 6.1, train=False, rng=None)
    assert got.tolist() == [25, 34, 43, 52, 61]
    # open-ended: 8.0 s to the end = frames 80..99; linspace(0, 19, 4) = 0, 6.33, 12.67, 19 -> 0, 6, 12, 19
    got = sample_indices(info, 4, 1.0, "clipvip", 8.0, None, train=False, rng=None)
    assert got.tolist() == [80, 86, 92, 99]
    # more slots than window frames: 0.5 s - 0.8 s = frames 5..8 (4 frames), linspace(0, 3, 6) = 0, .6, 1.2, 1.8,
    # 2.4, 3 -> repeats, and the last slot is still the window's last frame
    got = sample_indices(info, 6, 1.0, "clipvip", 0.5, 0.8, train=False, rng=None)
    assert got.tolist() == [5, 5, 6, 6, 7, 8]


def test_clipvip_window_train_jitter_reaches_the_last_window_frame() -> None:
    """Train mode inside frames 10..30 (T = 21, F = 5): interval = 21 // 4 = 5, start ~ U{0..5}, end ~ U{15..20}
    (window-relative), linspace(start, end, 5) truncated, shifted by 10 (bounds worked out by hand)."""
    info = _info(100, 10.0)
    lasts, firsts = set(), set()
    for seed in range(60):
        reference = np.random.default_rng(seed)
        start = int(reference.integers(0, 6))
        end = int(reference.integers(15, 21))
        expected = 10 + np.linspace(start, end, 5).astype(int)
        got = sample_indices(info, 5, 1.0, "clipvip", 1.0, 3.0, train=True, rng=np.random.default_rng(seed))
        assert got.tolist() == expected.tolist(), seed
        assert 10 <= got.min() and got.max() <= 30
        firsts.add(int(got[0]))
        lasts.add(int(got[-1]))
    assert firsts == set(range(10, 16)) and lasts == set(range(25, 31))  # 30, the window's last frame, is drawn
    # one seed pinned outright: default_rng(0) draws start 5 (of 0..5), end 18 (of 15..20);
    # linspace(5, 18, 5) = 5, 8.25, 11.5, 14.75, 18 -> 5, 8, 11, 14, 18, + 10
    got = sample_indices(info, 5, 1.0, "clipvip", 1.0, 3.0, train=True, rng=np.random.default_rng(0))
    assert got.tolist() == [15, 18, 21, 24, 28]


def test_load_clip_clipvip_window_decodes_the_window_frames(videos: dict[str, Path]) -> None:
    # v40: 40 frames at 10 fps; 1.0 s - 3.0 s = frames 10..30, 5 slots -> 10, 15, 20, 25, 30 (decoded and identified)
    pixels, mask = load_clip(videos["v40"], 5, 1.0, 16, sampling="clipvip", start=1.0, end=3.0)
    assert mask.tolist() == [1] * 5
    assert _identify_pixels(pixels) == [10, 15, 20, 25, 30]


# ----------------------------------------------------------------------------------------- probing / decoding


def test_probe_reads_container_metadata(videos: dict[str, Path]) -> None:
    info = probe_video(videos["v40"])
    assert info == VideoInfo(fps=10.0, num_frames=40, duration=pytest.approx(4.0), width=64, height=48)
    portrait = probe_video(videos["portrait"])
    assert (portrait.width, portrait.height, portrait.num_frames, portrait.fps) == (48, 64, 30, 30.0)


def test_probe_counts_frames_when_container_has_no_count(videos: dict[str, Path]) -> None:
    with av.open(str(videos["mkv"])) as container:
        assert container.streams.video[0].frames == 0  # the case under test
    info = probe_video(videos["mkv"])
    assert info.num_frames == 25 and info.fps == 5.0
    assert info.duration == pytest.approx(5.0, abs=0.25)


def test_decode_picks_the_requested_frames(videos: dict[str, Path]) -> None:
    indices = [0, 7, 39, 7, 3, 21]
    frames = decode_frames(videos["v40"], indices)
    assert frames.shape == (6, 48, 64, 3) and frames.dtype == np.uint8
    assert identify_frames(frames) == indices
    # colours survive H.264 within a few levels
    assert np.abs(frames[2].astype(int) - frame_colour(39).astype(int)).max() <= 8
    assert identify_frames(decode_frames(videos["mkv"], [24, 0])) == [24, 0]


def test_decode_rejects_out_of_range_and_negative(videos: dict[str, Path]) -> None:
    with pytest.raises(VideoDecodeError, match="truncated") as info:
        decode_frames(videos["v40"], [3, 40])
    assert info.value.decoded == 40 and str(videos["v40"]) in str(info.value)
    with pytest.raises(ValueError, match="negative"):
        decode_frames(videos["v40"], [-1])


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("missing", "missing"),
        ("empty", "empty"),
        ("garbage", "unreadable"),
        ("no_index", "unreadable"),
        ("audio", "no video stream"),
    ],
)
def test_unusable_files_raise_with_path_and_cause(videos: dict[str, Path], name: str, reason: str) -> None:
    for call in (lambda p: probe_video(p), lambda p: decode_frames(p, [0]), lambda p: load_clip(p, 4, 1.0, 32)):
        with pytest.raises(VideoDecodeError) as info:
            call(videos[name])
        assert info.value.reason == reason
        assert info.value.path == str(videos[name])
        assert str(videos[name]) in str(info.value) and reason in str(info.value)


def test_truncated_file_raises_unless_partial_allowed(videos: dict[str, Path]) -> None:
    path = videos["truncated"]
    assert probe_video(path).num_frames == 40  # the header still promises 40 frames
    with pytest.raises(VideoDecodeError, match="truncated") as info:
        decode_frames(path, [0, 39])
    decoded = info.value.decoded
    assert 1 <= decoded < 40 and str(path) in str(info.value)
    # frames before the break decode fine
    assert identify_frames(decode_frames(path, [0, decoded - 1])) == [0, decoded - 1]
    with pytest.raises(VideoDecodeError, match="truncated"):
        load_clip(path, 12, 1.0, 32, sampling="clipvip")
    # allowed: resample over what decoded (clipvip test: linspace over the decoded frames)
    pixels, mask = load_clip(path, 6, 1.0, 32, sampling="clipvip", allow_partial=True)
    assert pixels.shape == (6, 3, 32, 32) and mask.tolist() == [1] * 6
    expected = np.linspace(0, decoded - 1, 6).astype(int)
    assert _identify_pixels(pixels) == expected.tolist()


# ----------------------------------------------------------------------------------------- load_clip


def _identify_pixels(pixels: torch.Tensor) -> list[int]:
    """Undo CLIP normalisation of [n, 3, S, S] and read the frame colours back."""
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1)
    images = ((pixels * std + mean) * 255).round().clamp(0, 255).to(torch.uint8)
    return identify_frames(images.permute(0, 2, 3, 1).numpy())


def test_load_clip_clip4clip_pads_with_zeros_and_masks(videos: dict[str, Path]) -> None:
    pixels, mask = load_clip(videos["v40"], max_frames=6, frame_rate=1.0, image_size=32)
    assert pixels.shape == (6, 3, 32, 32) and pixels.dtype == torch.float32
    assert mask.dtype == torch.long and mask.tolist() == [1, 1, 1, 1, 0, 0]
    assert _identify_pixels(pixels[:4]) == [0, 10, 20, 30]
    assert torch.count_nonzero(pixels[4:]) == 0  # padding: zeros after normalisation
    # the real slots are exactly the preprocessed decoded frames
    expected = clip_preprocess(decode_frames(videos["v40"], [0, 10, 20, 30]), 32)
    torch.testing.assert_close(pixels[:4], expected, rtol=0, atol=0)


def test_load_clip_window_and_thinning(videos: dict[str, Path]) -> None:
    _, mask = load_clip(videos["v40"], 6, 1.0, 32, start=1.0, end=2.5)
    assert mask.tolist() == [1, 1, 0, 0, 0, 0]
    pixels, mask = load_clip(videos["v40"], 3, 5.0, 32)  # stride 2 -> 20 candidates, keep linspace(0,19,3)
    assert mask.tolist() == [1, 1, 1]
    assert _identify_pixels(pixels) == [0, 18, 38]


def test_load_clip_clipvip_square_and_full_mask(videos: dict[str, Path]) -> None:
    pixels, mask = load_clip(videos["portrait"], 4, 1.0, 16, sampling="clipvip")
    assert pixels.shape == (4, 3, 16, 16) and mask.tolist() == [1, 1, 1, 1]
    assert _identify_pixels(pixels) == np.linspace(0, 29, 4).astype(int).tolist()
    train_a, _ = load_clip(videos["portrait"], 4, 1.0, 16, sampling="clipvip", train=True, rng=np.random.default_rng(3))
    train_b, _ = load_clip(videos["portrait"], 4, 1.0, 16, sampling="clipvip", train=True, rng=np.random.default_rng(3))
    torch.testing.assert_close(train_a, train_b, rtol=0, atol=0)
    reference = np.random.default_rng(3)
    start, end = int(reference.integers(0, 11)), int(reference.integers(19, 30))  # interval = 30 // 3 = 10
    assert _identify_pixels(train_a) == np.linspace(start, end, 4).astype(int).tolist()


def test_load_clip_rejects_unknown_sampling(videos: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="sampling"):
        load_clip(videos["v40"], 4, 1.0, 32, sampling="dense")


def test_real_portrait_clip(shared_data: Path) -> None:
    path = shared_data / "real-scenes" / "parakeet_ladder.mp4"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    info = probe_video(path)
    assert (info.width, info.height, info.num_frames) == (252, 448, 240)
    assert info.fps == pytest.approx(30.0)
    indices = clip4clip_indices(info.num_frames, info.fps, 12, 1.0)
    np.testing.assert_array_equal(indices, np.arange(0, 240, 30))
    pixels, mask = load_clip(path, 12, 1.0, 224)
    assert pixels.shape == (12, 3, 224, 224) and mask.tolist() == [1] * 8 + [0] * 4
    assert torch.isfinite(pixels).all() and pixels[:8].std() > 0.1
    assert torch.count_nonzero(pixels[8:]) == 0


def test_clip4clip_indices_equal_the_materialised_candidates() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        num, fps = int(rng.integers(1, 3000)), float(rng.choice([2.5, 3.0, 10.0, 25.0, 29.97, 30.0, 60.0]))
        max_frames, rate = int(rng.integers(1, 40)), float(rng.choice([0.5, 1.0, 2.0, 3.0]))
        start = None if rng.random() < 0.5 else float(rng.uniform(0, num / fps))
        end = None if start is None else start + float(rng.uniform(0, 30))
        f_start, f_end = frame_window(num, fps, start, end)
        candidates = np.arange(f_start, f_end + 1, max(1, int(round(fps / rate))), dtype=np.int64)
        if len(candidates) > max_frames:
            candidates = candidates[np.linspace(0, len(candidates) - 1, max_frames).astype(int)]
        got = clip4clip_indices(num, fps, max_frames, rate, start, end)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, candidates)


def _avi_claiming(path: Path, frames: int, claimed: int) -> None:
    """An AVI of ``frames`` real frames whose headers (avih dwTotalFrames, strh dwLength) claim ``claimed``."""
    write_test_video(path.with_suffix(".tmp.avi"), frames, 10.0, size=(32, 32))
    data = bytearray(path.with_suffix(".tmp.avi").read_bytes())
    path.with_suffix(".tmp.avi").unlink()
    avih, strh = data.find(b"avih"), data.find(b"strh")
    struct.pack_into("<I", data, avih + 8 + 16, claimed)
    struct.pack_into("<I", data, strh + 8 + 32, claimed)
    path.write_bytes(bytes(data))


def test_a_header_claiming_two_billion_frames_allocates_nothing_large(tmp_path: Path) -> None:
    path = tmp_path / "huge.avi"
    _avi_claiming(path, 10, 2**31)
    assert probe_video(path).num_frames == 2**31  # the container's claim, as read
    tracemalloc.start()
    try:
        with pytest.raises(VideoDecodeError, match="truncated"):
            load_clip(path, max_frames=4, frame_rate=10.0, image_size=16)
        pixels, mask = load_clip(path, max_frames=4, frame_rate=10.0, image_size=16, allow_partial=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # the candidates were never materialised (2^31 int64 would be 16 GiB)
    assert int(mask.sum()) == 4 and pixels.shape == (4, 3, 16, 16)
