"""Video decoding (PyAV) and the two frame-sampling schemes of spec §2.1 / §2.2.

Frames are numbered in display order, 0-based, counting every frame the decoder emits: that is what decord's
``VideoReader`` indexes in the reference code. Decoding runs once, sequentially, from the first frame up to the
last requested index and stops there, so no per-frame seeking can land on a wrong keyframe; the cost is decoding the
prefix of the video, which is small for the 3-fps compressed videos of the recipes (§2.1).

Known simplifications: rotation metadata (phone videos) is ignored, as decord ignores it; start/end windows are
converted with fractional seconds, whereas the GARE reference first truncates them to whole seconds.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import av
import numpy as np
import torch
from torch import Tensor

from tvr.data.transforms import CLIP_NORM, SAMPLING_RESIZE, PixelNorm, clip_preprocess

SAMPLING_MODES = tuple(SAMPLING_RESIZE)


class VideoDecodeError(Exception):
    """A video file cannot provide the requested frames.

    ``path`` is the file, ``reason`` a short code (missing | empty | unreadable | not a video | no video stream |
    no frames | truncated | no frame rate), ``decoded`` how many frames decoded before the stream ended (truncated
    files).
    """

    def __init__(self, path: str | os.PathLike, reason: str, detail: str = "", decoded: int | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.detail = detail
        self.decoded = decoded
        message = f"cannot read video {self.path}: {reason}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)

    def __reduce__(self):  # keep the attributes when the error crosses a DataLoader worker boundary
        return (type(self), (self.path, self.reason, self.detail, self.decoded))


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    """What sampling needs to know about a video. ``num_frames`` is exact when the container does not record it
    (it was counted by decoding), otherwise it is the container's count."""

    fps: float
    num_frames: int
    duration: float
    width: int
    height: int


# --------------------------------------------------------------------------------------------- opening


def _check_file(path: Path) -> None:
    if not path.exists():
        raise VideoDecodeError(path, "missing", "no such file")
    if not path.is_file():
        raise VideoDecodeError(path, "missing", "not a regular file")
    if path.stat().st_size == 0:
        raise VideoDecodeError(path, "empty", "zero-length file")


#: FFmpeg demuxers that render a text file as a "video" (ANSI art, binary text): any text file opens with them, so
#: a caption list passed where a clip belongs would otherwise be "decoded" as a fraction of a second of video
TEXT_DEMUXERS = frozenset({"tty", "bin", "xbin", "adf", "idf"})


def _open(path: Path) -> av.container.InputContainer:
    _check_file(path)
    try:
        container = av.open(str(path), mode="r")
    except av.FFmpegError as exc:
        raise VideoDecodeError(path, "unreadable", f"not a video container or corrupt: {exc}") from exc
    formats = set(str(container.format.name or "").split(","))
    if formats & TEXT_DEMUXERS:
        container.close()
        raise VideoDecodeError(path, "not a video", "a text file, which FFmpeg would show as frames of characters")
    if not container.streams.video:
        container.close()
        raise VideoDecodeError(path, "no video stream")
    return container


def _stream_fps(stream: av.video.stream.VideoStream) -> float:
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate is not None and float(rate) > 0:
            return float(rate)
    return 0.0


def _count_decoded(path: Path, container: av.container.InputContainer) -> int:
    count = 0
    try:
        for _ in container.decode(container.streams.video[0]):
            count += 1
    except av.FFmpegError as exc:
        if count == 0:
            raise VideoDecodeError(path, "unreadable", f"decoding failed before the first frame: {exc}") from exc
    return count


def probe_video(path: str | os.PathLike) -> VideoInfo:
    """Frame rate, frame count, duration (s) and size of the first video stream.

    When the container records no frame count (webm/mkv usually do not), the frames are counted by decoding the
    whole stream — exact but as slow as a full decode. Raises VideoDecodeError for unusable files.
    """
    path = Path(path)
    container = _open(path)
    try:
        stream = container.streams.video[0]
        fps = _stream_fps(stream)
        num_frames = int(stream.frames or 0)
        if num_frames <= 0:
            num_frames = _count_decoded(path, container)
        if num_frames <= 0:
            raise VideoDecodeError(path, "no frames", "the video stream decodes to zero frames")
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / av.time_base
        else:
            duration = num_frames / fps if fps > 0 else 0.0
        if fps <= 0 and duration > 0:
            fps = num_frames / duration
        width = int(stream.codec_context.width or stream.width or 0)
        height = int(stream.codec_context.height or stream.height or 0)
        return VideoInfo(fps=fps, num_frames=num_frames, duration=duration, width=width, height=height)
    finally:
        container.close()


# --------------------------------------------------------------------------------------------- sampling


def frame_window(num_frames: int, fps: float, start: float | None = None, end: float | None = None) -> tuple[int, int]:
    """Inclusive frame range [f_start, f_end] of a [start, end] window in seconds, clamped to the video.

    As in the reference: a reversed window is swapped, an empty one (start == end) is widened to one second,
    negative times count as 0. A window that starts after the video ends is clamped to the last frame.
    """
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    last = num_frames - 1
    if start is None and end is None:
        return 0, last
    if fps <= 0:
        raise ValueError(f"a start/end window needs a positive fps, got {fps}")
    s = max(0.0, float(start)) if start is not None else 0.0
    e = max(0.0, float(end)) if end is not None else math.inf
    if s > e:
        s, e = e, s
    elif s == e:
        e = s + 1.0
    f_start = min(int(s * fps), last)
    f_end = last if math.isinf(e) else min(int(e * fps), last)
    return f_start, max(f_start, f_end)


def clip4clip_indices(
    num_frames: int,
    fps: float,
    max_frames: int,
    frame_rate: float = 1.0,
    start: float | None = None,
    end: float | None = None,
) -> np.ndarray:
    """CLIP4Clip/GARE sampling (spec §2.1): candidates every round(fps / frame_rate) frames over the window,
    uniformly thinned to ``max_frames`` with ``linspace(0, n-1, max_frames).astype(int)`` when there are more.

    Returns int64 indices (at most ``max_frames``; the caller pads the rest).
    """
    if max_frames <= 0:
        raise ValueError(f"max_frames must be positive, got {max_frames}")
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if frame_rate <= 0:
        raise ValueError(f"frame_rate must be positive, got {frame_rate}")
    f_start, f_end = frame_window(num_frames, fps, start, end)
    # Python's round (ties to even) as in the reference
    stride = max(1, int(round(float(fps) / frame_rate)))
    # the candidates are f_start + stride·k; pick among them by position, never materialising all of them: the
    # frame count comes from the container, and a header claiming 2^31 frames must not allocate gigabytes
    count = (f_end - f_start) // stride + 1
    if count > max_frames:
        picked = np.linspace(0, count - 1, max_frames).astype(int).astype(np.int64)
    else:
        picked = np.arange(count, dtype=np.int64)
    return f_start + stride * picked


def clipvip_indices(
    num_frames: int, max_frames: int, train: bool, rng: np.random.Generator | None = None
) -> np.ndarray:
    """CLIP-ViP/TV-ProxyNet sampling (spec §2.2): always ``max_frames`` indices over all ``num_frames``.

    Test: ``linspace(0, T-1, F)``. Train (jitter): interval = ⌊T/(F-1)⌋, start ~ U{0..interval},
    end ~ U{T-1-interval..T-1}, ``linspace(start, end, F)``. Positions are truncated to integers with
    ``astype(int)`` exactly as the reference does, then clamped to [0, T-1]; start/end are clamped first and
    swapped if the draw reversed them (possible only for F = 2), so indices never decrease.
    Indices repeat when T < F (no padding, no mask in this scheme).
    """
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    if max_frames <= 0:
        raise ValueError(f"max_frames must be positive, got {max_frames}")
    last = num_frames - 1
    if train:
        rng = rng if rng is not None else np.random.default_rng()
        interval = num_frames // max(1, max_frames - 1)
        start = int(rng.integers(0, interval + 1))
        end = int(rng.integers(last - interval, last + 1))
        start, end = min(max(start, 0), last), min(max(end, 0), last)
        if start > end:
            start, end = end, start
        positions = np.linspace(start, end, max_frames)
    else:
        positions = np.linspace(0, last, max_frames)
    return np.clip(positions.astype(int), 0, last).astype(np.int64)


# --------------------------------------------------------------------------------------------- decoding


def decode_frames(path: str | os.PathLike, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """Decode the frames at ``indices`` (any order, repeats allowed) as uint8 RGB [n, H, W, 3].

    One sequential pass from the first frame, stopping after the largest requested index. Raises
    VideoDecodeError with reason "truncated" (and ``decoded`` = frames obtained) when the stream ends or breaks
    before that index; frames whose size changes mid-stream are rescaled to the first frame's size.
    """
    path = Path(path)
    wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
    if wanted.size == 0:
        raise ValueError("decode_frames needs at least one index")
    if wanted.min() < 0:
        raise ValueError(f"negative frame index {int(wanted.min())} for {path}")
    needed = set(int(i) for i in wanted)
    last_needed = int(wanted.max())
    got: dict[int, np.ndarray] = {}
    container = _open(path)
    count = 0
    failure = ""
    size: tuple[int, int] | None = None
    try:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                if count in needed:
                    if size is None:
                        size = (frame.width, frame.height)
                    if (frame.width, frame.height) != size:
                        frame = frame.reformat(width=size[0], height=size[1])
                    got[count] = frame.to_ndarray(format="rgb24")
                count += 1
                if count > last_needed:
                    break
        except av.FFmpegError as exc:
            failure = f"decoder error after {count} frames: {exc}"
    finally:
        container.close()
    if count == 0:
        raise VideoDecodeError(path, "unreadable", failure or "the video stream decodes to zero frames", decoded=0)
    if count <= last_needed:
        detail = f"stream ended after {count} frames but frame {last_needed} was requested"
        if failure:
            detail += f"; {failure}"
        raise VideoDecodeError(path, "truncated", detail, decoded=count)
    return np.stack([got[int(i)] for i in wanted])


# --------------------------------------------------------------------------------------------- clips


def sample_indices(
    info: VideoInfo,
    max_frames: int,
    frame_rate: float,
    sampling: str,
    start: float | None,
    end: float | None,
    train: bool,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """Indices for one clip under either scheme. For ``clipvip`` a start/end window restricts the frames the
    linspace runs over (the reference never passes one; this is our extension for segment datasets)."""
    if sampling == "clip4clip":
        if info.fps <= 0:
            raise ValueError("the container gives no frame rate, which clip4clip sampling needs")
        return clip4clip_indices(info.num_frames, info.fps, max_frames, frame_rate, start, end)
    if sampling == "clipvip":
        if start is None and end is None:
            return clipvip_indices(info.num_frames, max_frames, train, rng)
        if info.fps <= 0:
            raise ValueError("the container gives no frame rate, which a start/end window needs")
        f_start, f_end = frame_window(info.num_frames, info.fps, start, end)
        return f_start + clipvip_indices(f_end - f_start + 1, max_frames, train, rng)
    raise ValueError(f"unknown sampling {sampling!r}; expected one of {SAMPLING_MODES}")


def load_clip(
    path: str | os.PathLike,
    max_frames: int,
    frame_rate: float,
    image_size: int,
    sampling: str = "clip4clip",
    start: float | None = None,
    end: float | None = None,
    train: bool = False,
    rng: np.random.Generator | None = None,
    augment: Callable[..., Tensor] | None = None,
    allow_partial: bool = False,
    resize: str | None = None,
    norm: PixelNorm = CLIP_NORM,
) -> tuple[Tensor, Tensor]:
    """Decode, sample and preprocess one clip: returns (pixels float32 [max_frames, 3, S, S], mask long [max_frames]).

    ``sampling`` picks the scheme (clip4clip: 1-fps candidates, zero padding; clipvip: F linspace frames, mask all
    ones). ``resize`` defaults to the scheme's transform (clip4clip → short side + centre crop, clipvip → square).
    Padding slots hold zeros *in the normalised space* (i.e. mean-colour images), exactly as CLIP4Clip allocates
    ``np.zeros`` and fills only the real frames; their mask is 0.

    ``augment`` (e.g. VideoRandAugment) is called as ``augment(frames_uint8 [n,3,H,W], generator=g)`` after the
    resize and before the crop; ``g`` is a torch.Generator seeded from ``rng`` so one rng fixes the whole clip
    (with ``rng=None`` the augmentation draws from torch's global RNG).
    ``allow_partial``: when the file is shorter than its header says (truncated), sample again over the frames that
    did decode instead of raising.
    ``norm``: the pixel normalisation of the backbone that reads the clip (CLIP's by default).
    """
    path = Path(path)
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"unknown sampling {sampling!r}; expected one of {SAMPLING_MODES}")
    if max_frames <= 0 or frame_rate <= 0 or image_size <= 0:
        raise ValueError(
            f"max_frames, frame_rate and image_size must be positive, got {max_frames}, {frame_rate}, {image_size}"
        )
    if resize is None:
        resize = SAMPLING_RESIZE[sampling]
    info = probe_video(path)
    try:
        indices = sample_indices(info, max_frames, frame_rate, sampling, start, end, train, rng)
    except ValueError as exc:  # arguments are valid, so this is the video's missing frame rate
        raise VideoDecodeError(path, "no frame rate", str(exc)) from exc
    try:
        frames = decode_frames(path, indices)
    except VideoDecodeError as exc:
        if not (allow_partial and exc.reason == "truncated" and exc.decoded):
            raise
        info = dataclasses.replace(info, num_frames=exc.decoded)
        indices = sample_indices(info, max_frames, frame_rate, sampling, start, end, train, rng)
        frames = decode_frames(path, indices)
    return frames_to_clip(frames, image_size, max_frames, resize, augment, rng, norm)


def frames_to_clip(
    frames: np.ndarray,
    image_size: int,
    max_frames: int,
    resize: str,
    augment: Callable[..., Tensor] | None = None,
    rng: np.random.Generator | None = None,
    norm: PixelNorm = CLIP_NORM,
) -> tuple[Tensor, Tensor]:
    """Sampled uint8 RGB frames [n, H, W, 3] → (pixels [max_frames, 3, S, S], mask [max_frames]): the transform
    (augmentation seeded from ``rng``, as in :func:`load_clip`), then zero padding with mask 0 on the padding."""
    generator = None
    if augment is not None and rng is not None:
        generator = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
    pixels = clip_preprocess(frames, image_size, mode=resize, augment=augment, generator=generator, norm=norm)
    out = torch.zeros((max_frames, 3, image_size, image_size), dtype=torch.float32)
    mask = torch.zeros(max_frames, dtype=torch.long)
    n = min(len(pixels), max_frames)
    out[:n] = pixels[:n]
    mask[:n] = 1
    return out, mask
