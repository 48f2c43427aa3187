"""Timestamped clip windows of a video, and the frames each window reads.

A video is indexed as overlapping windows of ``window`` seconds every ``stride`` seconds (defaults: 10 s every 5 s,
:data:`DEFAULT_WINDOW` / :data:`DEFAULT_STRIDE`), so a hit says where in the video it is. Windows start at 0, s, 2s,
… while they fit inside the video; when the last one stops short of the end, one more window ends exactly at the
end (it overlaps its neighbour by more than the others do). A video no longer than one window is a single window
[0, duration]. Every window is sampled like a training clip of the encoder's frame settings (CLIP4Clip sampling:
``frame_rate`` candidates per second thinned to ``max_frames``; CLIP-ViP sampling: ``max_frames`` evenly spaced
frames), with the window as the clip's start/end.

:func:`decode_windows` decodes a video once (one sequential pass up to the last frame any window reads) and returns
every window's frames, resized and centre-cropped to the encoder's input size as uint8: the worker processes of
``tvr index`` run it, so only small uint8 crops cross the process boundary.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np

from tvr.data.transforms import RESIZE_MODES, SAMPLING_RESIZE
from tvr.search.defaults import DEFAULT_STRIDE, DEFAULT_WINDOW

#: windows whose ends differ by less than this are the same window (float rounding of durations)
_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class FrameSpec:
    """How an encoder reads one window: the sampling of ``tvr.data.video.sample_indices`` (``sampling``,
    ``max_frames``, ``frame_rate``) and the uint8 crop it takes (``resize``: short_side + centre crop, or square;
    ``image_size`` pixels)."""

    max_frames: int
    frame_rate: float
    image_size: int
    sampling: str = "clip4clip"
    resize: str = "short_side"

    def __post_init__(self) -> None:
        if self.max_frames < 1 or self.frame_rate <= 0 or self.image_size < 1:
            raise ValueError(f"frame settings: max_frames, frame_rate and image_size must be positive, got {self}")
        if self.sampling not in SAMPLING_RESIZE:
            raise ValueError(f"frame settings: sampling {self.sampling!r}, expected one of {list(SAMPLING_RESIZE)}")
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"frame settings: resize {self.resize!r}, expected one of {list(RESIZE_MODES)}")


def check_window(window: float, stride: float) -> None:
    """Raise ValueError unless 0 < stride <= window (a gap between windows would leave footage unsearchable)."""
    if not (isinstance(window, (int, float)) and math.isfinite(window) and window > 0):
        raise ValueError(f"--window {window!r}: expected a positive number of seconds")
    if not (isinstance(stride, (int, float)) and math.isfinite(stride) and 0 < stride <= window):
        raise ValueError(f"--stride {stride!r}: expected a positive number of seconds, at most --window ({window})")


def plan_windows(
    duration: float, window: float = DEFAULT_WINDOW, stride: float = DEFAULT_STRIDE
) -> list[tuple[float, float]]:
    """The (start, end) seconds of every window of a video of ``duration`` seconds (see the module docstring)."""
    check_window(window, stride)
    if not math.isfinite(duration) or duration <= window + _EPS:
        return [(0.0, round(max(float(duration), 0.0), 6) if math.isfinite(duration) else 0.0)]
    out: list[tuple[float, float]] = []
    k = 0
    while k * stride + window <= duration + _EPS:
        start = k * stride
        out.append((round(start, 6), round(start + window, 6)))
        k += 1
    if out[-1][1] < duration - _EPS:
        out.append((round(duration - window, 6), round(duration, 6)))
    return out


def window_indices(
    path: str | os.PathLike, info, spec: FrameSpec, windows: list[tuple[float, float]]
) -> list[np.ndarray]:
    """The frame indices each window of ``path`` (probed as ``info``) reads: ``tvr.data.video.sample_indices`` in
    evaluation mode, a single window being the whole clip."""
    from tvr.data.video import VideoDecodeError, sample_indices

    out = []
    for start, end in windows:
        whole = len(windows) == 1
        try:
            out.append(
                sample_indices(
                    info,
                    spec.max_frames,
                    spec.frame_rate,
                    spec.sampling,
                    None if whole else start,
                    None if whole else end,
                    train=False,
                    rng=None,
                )
            )
        except ValueError as exc:  # valid settings, so the container gives no frame rate
            raise VideoDecodeError(path, "no frame rate", str(exc)) from exc
    return out


def crop_frames(frames: np.ndarray, spec: FrameSpec) -> np.ndarray:
    """uint8 RGB [n, H, W, 3] → uint8 [n, S, S, 3]: the resize and centre crop of
    :func:`tvr.data.transforms.clip_preprocess` before it converts to float (so normalising these crops gives
    exactly its output)."""
    import torch

    from tvr.data.transforms import center_crop, resize_short_side, square_resize, to_tensor_frames

    x = to_tensor_frames(frames)
    with torch.no_grad():
        x = resize_short_side(x, spec.image_size) if spec.resize == "short_side" else square_resize(x, spec.image_size)
        x = center_crop(x, spec.image_size)
    return np.ascontiguousarray(x.permute(0, 2, 3, 1).numpy())


@dataclasses.dataclass
class DecodedVideo:
    """Every window of one video: ``frames`` uint8 [n_unique, S, S, 3] (each sampled frame once), ``slots``
    [n_windows, max_frames] rows into ``frames`` (−1 = padding), and the windows' (start, end) seconds."""

    duration: float
    windows: list[tuple[float, float]]
    frames: np.ndarray
    slots: np.ndarray


def decode_windows(path: str | os.PathLike, spec: FrameSpec, window: float, stride: float) -> DecodedVideo:
    """Probe ``path``, plan its windows and decode the frames they read in one pass (VideoDecodeError when the
    file is unusable). A file that ends before its header says (truncated) is indexed over the frames that do
    decode."""
    from tvr.data.video import VideoDecodeError, decode_frames, probe_video

    path = Path(path)
    info = probe_video(path)
    for attempt in range(2):
        duration = info.duration if info.duration > 0 else (info.num_frames / info.fps if info.fps > 0 else 0.0)
        windows = plan_windows(duration, window, stride)
        per_window = window_indices(path, info, spec, windows)
        unique = np.unique(np.concatenate(per_window))
        try:
            frames = decode_frames(path, unique)
            break
        except VideoDecodeError as exc:
            if attempt or exc.reason != "truncated" or not exc.decoded:
                raise
            info = dataclasses.replace(
                info, num_frames=exc.decoded, duration=exc.decoded / info.fps if info.fps > 0 else 0.0
            )
    slots = np.full((len(windows), spec.max_frames), -1, dtype=np.int64)
    for w, indices in enumerate(per_window):
        rows = np.searchsorted(unique, indices)
        slots[w, : min(len(rows), spec.max_frames)] = rows[: spec.max_frames]
    return DecodedVideo(float(duration), windows, crop_frames(frames, spec), slots)
