"""A frame cache (``tvr prepare frames``, ``data.frame_cache``) as runs read it: its settings, its manifest, one
cached clip, and :class:`FrameCacheReader`, which serves clips from it in place of decoding the videos.
:func:`tvr.data.prepare.extract_frames` builds it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tvr.data.transforms import CLIP_NORM, SAMPLING_RESIZE, PixelNorm
from tvr.utils.data_files import DataFileError, read_json
from tvr.utils.errors import UserError

FRAMES_MANIFEST = "frames_manifest.json"


class FrameCacheError(UserError, ValueError):
    """A folder is not a frame cache (no manifest)."""


@dataclasses.dataclass(frozen=True)
class FrameSettings:
    """What a frame cache holds: the evaluation-mode sampling of ``sampling`` with ``max_frames`` / ``frame_rate``,
    resized for ``image_size`` like ``clip_preprocess`` before its centre crop (``short_side`` for clip4clip,
    ``square`` for clipvip)."""

    max_frames: int = 12
    frame_rate: float = 1.0
    image_size: int = 224
    sampling: str = "clip4clip"

    @property
    def resize(self) -> str:
        return SAMPLING_RESIZE[self.sampling]


def read_frame_settings(cache_dir: str | os.PathLike) -> FrameSettings:
    """The settings a frame cache was built with (from its manifest)."""
    path = Path(cache_dir) / FRAMES_MANIFEST
    if not path.is_file():
        raise FrameCacheError(f"{path}: not a frame cache (build one with `tvr prepare frames SRC DST`)")
    try:
        saved = read_json(path)["settings"]
        return FrameSettings(**{f.name: saved[f.name] for f in dataclasses.fields(FrameSettings)})
    except DataFileError as exc:
        raise FrameCacheError(
            f"{path}: damaged ({exc.problem}); rebuild the frame cache (tvr prepare frames)"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise FrameCacheError(
            f"{path}: damaged ({type(exc).__name__}: {exc}); rebuild the frame cache (tvr prepare frames)"
        ) from None


def load_cached_clip(
    path: str | os.PathLike,
    max_frames: int,
    image_size: int,
    resize: str = "short_side",
    augment: Callable[..., Any] | None = None,
    rng: np.random.Generator | None = None,
    norm: PixelNorm = CLIP_NORM,
) -> tuple[Any, Any]:
    """(pixels float32 [max_frames, 3, S, S], mask long [max_frames]) from a cached ``.npy`` — the same tensors
    ``load_clip`` gives for the source video with the cache's settings (zero padding, mask 0 on padding)."""
    from tvr.data.video import frames_to_clip

    frames = np.load(path, mmap_mode="r")
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"{path}: expected uint8 frames [n, H, W, 3], got {frames.dtype} {frames.shape}")
    return frames_to_clip(np.array(frames), image_size, max_frames, resize, augment, rng, norm)


class FrameCacheReader:
    """Serves clips from a ``tvr prepare frames`` cache (``data.frame_cache``) in place of decoding the videos.

    The cache holds the evaluation-mode sampling of whole videos, so it stands in for decoding exactly when the clip
    reads a whole video with that sampling: always at evaluation, and in training under ``clip4clip`` sampling (its
    frame choice is deterministic; augmentation still runs on the cached frames, seeded as on decoded ones). CLIP-ViP
    training jitter and start/end windows read the video. A clip the cache lacks (or holds damaged) is decoded from
    the video as usual, so a partial cache is only slower, never wrong.

    The cache must have been built with the run's ``max_frames`` / ``frame_rate`` / ``image_size`` / ``sampling``
    (its manifest says), else the run stops at start naming the differences: mixed frames would be silent damage.
    """

    def __init__(self, cache_dir: str | os.PathLike, video_dir: str | os.PathLike, settings: FrameSettings) -> None:
        from tvr.config import ConfigError

        self.cache_dir = Path(cache_dir)
        try:
            built = read_frame_settings(self.cache_dir)
        except FrameCacheError as exc:
            raise ConfigError(f"data.frame_cache = {str(cache_dir)!r}: {exc}") from None
        differ = [
            f"{field.name}: cache {getattr(built, field.name)!r}, run {getattr(settings, field.name)!r}"
            for field in dataclasses.fields(FrameSettings)
            if getattr(built, field.name) != getattr(settings, field.name)
        ]
        if differ:
            raise ConfigError(
                f"data.frame_cache = {str(cache_dir)!r} was built with other frame settings ({'; '.join(differ)}); "
                "rebuild it with `tvr prepare frames VIDEOS CACHE --config FILE` or unset data.frame_cache"
            )
        self.settings = settings
        manifest = read_json(self.cache_dir / FRAMES_MANIFEST)["settings"]  # read just above
        self.flat = bool(manifest.get("flat", False))
        # the resolver's paths are data.video_dir joined with the file name, not resolved (the folder may be a link);
        # normalised (``a/../b`` → ``b``) so a name with ``..`` cannot stand for a place outside the folder
        self.video_root = Path(os.path.normpath(Path(video_dir).absolute()))

    def entry(self, video_path: str | os.PathLike, start: float | None, end: float | None, train: bool) -> Path | None:
        """The cached ``.npy`` standing in for this clip, or None when the clip must be decoded."""
        if start is not None or end is not None or (train and self.settings.sampling != "clip4clip"):
            return None
        video_path = Path(os.path.normpath(Path(video_path).absolute()))
        if self.flat:
            rel = Path(video_path.name)
        elif video_path.is_relative_to(self.video_root):
            rel = video_path.relative_to(self.video_root)
        else:
            return None  # not a file of data.video_dir (allow_outside_video_dir): decode it
        path = self.cache_dir / rel.with_suffix(".npy")
        return path if path.is_file() else None

    def load(
        self,
        path: Path,
        augment: Callable[..., Any] | None,
        rng: np.random.Generator | None,
        norm: PixelNorm = CLIP_NORM,
    ) -> tuple[Any, Any] | None:
        """The clip's tensors from the cached ``path``; None (decode instead) when the file is damaged."""
        try:
            return load_cached_clip(
                path,
                self.settings.max_frames,
                self.settings.image_size,
                resize=self.settings.resize,
                augment=augment,
                rng=rng,
                norm=norm,
            )
        except (OSError, ValueError) as exc:
            import logging

            logging.getLogger(__name__).warning(
                "frame cache entry %s is unreadable (%s); decoding the video", path, exc
            )
            return None
