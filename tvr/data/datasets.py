"""torch Datasets that turn annotation records into training pairs and evaluation items, and their collates.

Batch keys follow ``tvr.models.model``: text_ids/text_mask [B, L], video [B, F, 3, S, S], video_mask [B, F],
plus ``video_ids``/``captions`` lists and ``skipped``/``errors`` for unreadable videos.

Unreadable videos never crash a run: the dataset returns a marker item ``{"skipped": video_id, "error": message}``
and the collate leaves it out of the tensors and lists it under ``skipped``. A batch in which *every* item was
skipped has tensors whose first dimension is 0; the trainer must skip such a batch (no loss, no optimizer step).

Randomness (clipvip jitter, RandAugment, the caption drawn under ``caption_sampling: one_per_video``) is a pure
function of (seed, epoch, index): call ``set_epoch`` before each epoch, and a resumed run sees identical items.
With ``persistent_workers=True`` a DataLoader keeps stale copies of the dataset, so ``set_epoch`` would not reach
them: use non-persistent workers.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from tvr.config import ConfigError, DataConfig
from tvr.data.augment import VideoRandAugment
from tvr.data.frame_cache import FrameCacheReader, FrameSettings
from tvr.data.transforms import CLIP_NORM, PixelNorm
from tvr.data.video import VideoDecodeError, load_clip

logger = logging.getLogger(__name__)

#: ``data.caption_sampling`` values (see :class:`PairDataset`)
CAPTION_SAMPLING = ("all_pairs", "one_per_video")
#: extra entropy word that separates the caption-draw stream from ``item_rng``'s clip stream (must not be 0:
#: numpy's SeedSequence treats a trailing 0 as absent)
_CAPTION_STREAM = 0xCA9

#: tried, in this order, when the pattern ends with .mp4 and that file does not exist
FALLBACK_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov")

Tokenizer = Callable[[list[str], int], tuple[Tensor, Tensor]]


class CaptionLike(Protocol):
    video_id: str
    caption: str
    start: float | None
    end: float | None


class VideoNotFoundError(VideoDecodeError, FileNotFoundError):
    """No file for a video id. Subclasses both VideoDecodeError (datasets turn it into a skip marker) and
    FileNotFoundError; ``video_id`` and ``tried`` (the paths looked at) are attributes."""

    def __init__(self, video_id: str, tried: Sequence[str | os.PathLike]) -> None:
        self.video_id = video_id
        self.tried = [str(p) for p in tried]
        super().__init__(self.tried[0] if self.tried else video_id, "missing", f"tried {', '.join(self.tried)}")
        # the message leads with the id: the first tried path is only a guess at the file
        self.args = (f"no video file for id {video_id!r}: tried {', '.join(self.tried)}",)

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.video_id, self.tried))


class VideoOutsideDirError(VideoDecodeError):
    """A video id resolves (after ``..`` and symlinks) to a file outside ``data.video_dir``. Reason code
    ``"outside video_dir"``; datasets turn it into a skip marker like any unreadable video."""

    REASON = "outside video_dir"

    def __init__(self, video_id: str, path: str | os.PathLike, real: str | os.PathLike, video_dir: str) -> None:
        self.video_id = video_id
        self.real = str(real)
        self.video_dir = str(video_dir)
        super().__init__(
            path,
            self.REASON,
            f"resolves to {self.real}, not inside {self.video_dir}; set data.allow_outside_video_dir: true to allow",
        )

    def __reduce__(self):
        return (type(self), (self.video_id, self.path, self.real, self.video_dir))


class VideoNameError(VideoDecodeError):
    """A video id that cannot name a file here: a NUL byte, a name longer than the file system allows, a symbolic
    link loop. Reason code ``"invalid name"``; datasets turn it into a skip marker like any unreadable video."""

    REASON = "invalid name"

    def __init__(self, video_id: str, path: str | os.PathLike, detail: str) -> None:
        self.video_id = video_id
        super().__init__(path, self.REASON, detail)

    def __reduce__(self):
        return (type(self), (self.video_id, self.path, self.detail))


def _name_problem(exc: BaseException) -> str:
    if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP:
        return f"a symbolic link loop ({exc})"
    if getattr(exc, "errno", None) == errno.ENAMETOOLONG:
        return "the file name is longer than the file system allows"
    if isinstance(exc, ValueError) and "null" in str(exc):
        return "the id holds a NUL byte, which no file name can"
    return f"cannot be looked up ({type(exc).__name__}: {exc})"


class VideoResolver:
    """Map a video id to its file: ``video_dir / pattern.replace("{video_id}", id)``. ``{video_stem}`` stands for
    the id without its extension, for ids that name the raw file (DiDeMo's ``…_d8b58466fa.mov``) when the folder
    holds the ``tvr prepare`` outputs (``…_d8b58466fa.mp4``): ``video_pattern: "{video_stem}.mp4"``.

    When the pattern ends with ``.mp4`` and that file is missing, the same name with .webm, .mkv, .avi and .mov is
    tried too (raw MSR-VTT/DiDeMo/ActivityNet downloads mix containers). Any other pattern is used as written.

    The file must lie inside ``video_dir`` once ``..`` and symlinks are resolved (``video_dir`` itself may be a
    symlink): an id such as ``../x.mp4`` or ``/etc/x.mp4`` from a user CSV, or a symlink in the folder that
    points elsewhere, raises :class:`VideoOutsideDirError` (reason ``"outside video_dir"``), which datasets report
    as a skipped video. ``allow_outside=True`` (``data.allow_outside_video_dir``) turns the check off, e.g. for a
    folder of symlinks into a shared video store.
    """

    def __init__(
        self, video_dir: str | os.PathLike, pattern: str = "{video_id}.mp4", allow_outside: bool = False
    ) -> None:
        self.video_dir = Path(video_dir)
        if "{video_id}" not in pattern and "{video_stem}" not in pattern:
            raise ConfigError(f"data.video_pattern = {pattern!r}: must contain '{{video_id}}' (or '{{video_stem}}')")
        if not self.video_dir.is_dir():
            raise FileNotFoundError(f"video folder not found: {self.video_dir}")
        self.pattern = pattern
        self.allow_outside = bool(allow_outside)
        self.root = self.video_dir.resolve()

    @classmethod
    def from_config(cls, data_cfg: DataConfig) -> VideoResolver:
        """The resolver for ``data.video_dir`` / ``data.video_pattern`` / ``data.allow_outside_video_dir``."""
        return cls(data_cfg.video_dir, data_cfg.video_pattern, data_cfg.allow_outside_video_dir)

    def candidates(self, video_id: str) -> list[Path]:
        stem = os.path.splitext(video_id)[0]
        first = self.video_dir / self.pattern.replace("{video_id}", video_id).replace("{video_stem}", stem)
        if not self.pattern.endswith(".mp4"):
            return [first]
        stem = str(first)[: -len(".mp4")]
        return [first] + [Path(stem + ext) for ext in FALLBACK_EXTENSIONS if ext != ".mp4"]

    def check_inside(self, video_id: str, path: Path) -> None:
        """Raise :class:`VideoOutsideDirError` when ``path`` resolves outside ``video_dir`` (unless allowed)."""
        if self.allow_outside:
            return
        real = path.resolve()
        if real != self.root and not real.is_relative_to(self.root):
            raise VideoOutsideDirError(video_id, path, real, str(self.root))

    def __call__(self, video_id: str) -> Path:
        tried = self.candidates(video_id)
        try:
            for path in tried:
                if path.is_file():
                    self.check_inside(video_id, path)
                    return path
            # a missing file whose name already points outside is reported as outside: fixing the file would not help
            self.check_inside(video_id, tried[0])
        except (ValueError, OSError, RuntimeError) as exc:  # NUL byte, over-long name, symlink loop
            if isinstance(exc, VideoDecodeError):
                raise
            raise VideoNameError(video_id, repr(str(tried[0])), _name_problem(exc)) from None
        raise VideoNotFoundError(video_id, tried)


def item_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one item in one epoch; independent streams for distinct (seed, epoch, index)."""
    if min(seed, epoch, index) < 0:
        raise ValueError(f"seed, epoch and index must be >= 0, got {(seed, epoch, index)}")
    return np.random.default_rng([seed, epoch, index])


def caption_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator that picks item ``index``'s caption in ``epoch`` (one_per_video); independent of
    :func:`item_rng`'s stream for the same (seed, epoch, index), so frame jitter is unchanged by the draw."""
    if min(seed, epoch, index) < 0:
        raise ValueError(f"seed, epoch and index must be >= 0, got {(seed, epoch, index)}")
    return np.random.default_rng([seed, epoch, index, _CAPTION_STREAM])


def build_augment(data_cfg: DataConfig) -> VideoRandAugment | None:
    """The training augmentation the config asks for (``rand-m{magnitude}-n{num_ops}-mstd0.5-inc1``), or None."""
    if not data_cfg.augment:
        return None
    return VideoRandAugment(
        num_ops=data_cfg.augment_num_ops, magnitude=data_cfg.augment_magnitude, magnitude_std=0.5, increasing=True
    )


def check_pixel_settings(data_cfg: DataConfig, image_size: bool = True) -> None:
    """``data.image_size`` and ``data.sampling`` are set: left unset, they are the backbone's, filled in when the run
    config is resolved (:func:`tvr.models.run_spec.resolve_run`; every CLI job and ``tvr.pipeline`` do it), so
    reading clips from an unresolved config is a mistake of the caller. ``image_size=False``: only the sampling is
    needed (``tvr check-data`` counts sampled frames but makes no pixels)."""
    if data_cfg.sampling is None:
        raise ConfigError(
            "data.sampling (and data.image_size) not resolved: they default to the backbone's; call "
            "cfg = tvr.pipeline.resolve_config(cfg) (or tvr.models.run_spec.resolve_run(cfg)) first, or set them"
        )
    if data_cfg.pixel_mean is None or data_cfg.pixel_std is None:
        raise ConfigError(
            "data.pixel_mean / data.pixel_std not resolved: they default to the backbone's normalisation; call "
            "cfg = tvr.pipeline.resolve_config(cfg) (or tvr.models.run_spec.resolve_run(cfg)) first, or set them"
        )
    if image_size and data_cfg.image_size is None:
        raise ConfigError(
            "data.image_size is unset and the backbone's input size cannot be read without downloading model.clip "
            "(a path that does not exist yet, or a hub model that is not in the local cache); set data.image_size "
            "(224 for CLIP ViT-B/32 and B/16)"
        )


def data_pixel_norm(data_cfg: DataConfig) -> PixelNorm:
    """The normalisation of a resolved data config (``data.pixel_mean`` / ``data.pixel_std``, the backbone's unless
    the config sets them)."""
    check_pixel_settings(data_cfg, image_size=False)
    return PixelNorm(tuple(data_cfg.pixel_mean), tuple(data_cfg.pixel_std))


def frame_cache_reader(data_cfg: DataConfig) -> FrameCacheReader | None:
    """The reader of ``data.frame_cache`` (checked against the run's frame settings), or None when unset."""
    if not data_cfg.frame_cache:
        return None
    check_pixel_settings(data_cfg)
    settings = FrameSettings(data_cfg.max_frames, data_cfg.frame_rate, data_cfg.image_size, data_cfg.sampling)
    return FrameCacheReader(data_cfg.frame_cache, data_cfg.video_dir, settings)


def read_clip(
    path: Path,
    data_cfg: DataConfig,
    frame_cache: FrameCacheReader | None,
    *,
    start: float | None,
    end: float | None,
    train: bool,
    rng: np.random.Generator | None,
    augment: Callable[..., Tensor] | None,
    allow_partial: bool,
    norm: PixelNorm = CLIP_NORM,
) -> tuple[Tensor, Tensor]:
    """One clip's (pixels, mask): from the frame cache where it holds this clip, else decoded by ``load_clip``
    (the two give identical tensors); pixels normalised with ``norm`` (the backbone's)."""
    if frame_cache is not None:
        entry = frame_cache.entry(path, start, end, train)
        if entry is not None:
            clip = frame_cache.load(entry, augment, rng, norm)
            if clip is not None:
                return clip
    return load_clip(
        path,
        data_cfg.max_frames,
        data_cfg.frame_rate,
        data_cfg.image_size,
        sampling=data_cfg.sampling,
        start=start,
        end=end,
        train=train,
        rng=rng,
        augment=augment,
        allow_partial=allow_partial,
        norm=norm,
    )


def _tokenize_one(tokenizer: Tokenizer, text: str, max_words: int) -> tuple[Tensor, Tensor]:
    ids, mask = tokenizer([text], max_words)
    return ids[0].long(), mask[0].long()


class PairDataset(Dataset):
    """Training pairs from caption records (``.video_id .caption .start .end``).

    ``data_cfg.caption_sampling``:

    * ``all_pairs`` (CLIP4Clip): one item per record; an epoch visits every caption once.
    * ``one_per_video`` (CLIP-ViP's MSR-VTT recipe, spec §2.2): one item per video (records grouped by
      (video_id, start, end) in order of first appearance); each epoch item k uses the caption
      ``caption_rng(seed, epoch, k)`` draws uniformly from its video's captions, so the choice is reproducible
      per (seed, epoch, video) and a resumed run sees the same pairs. Frame jitter and augmentation still come
      from ``item_rng(seed, epoch, k)``.

    Item: text_ids/text_mask LongTensor [L], video FloatTensor [F, 3, S, S], video_mask LongTensor [F],
    video_id, caption, index; or ``{"skipped": video_id, "error": message, "index": i}`` for an unreadable video.
    Augmentation (``data_cfg.augment``) and clipvip jitter apply only when ``train`` is true.
    Limits such as ``data_cfg.limit_train`` are the caller's business (slice ``records``).
    ``norm``: the pixel normalisation (default: the resolved config's ``data.pixel_mean`` / ``pixel_std``, the
    backbone's unless the config sets them).
    """

    def __init__(
        self,
        records: Sequence[CaptionLike],
        tokenizer: Tokenizer,
        resolver: Callable[[str], Path],
        data_cfg: DataConfig,
        train: bool = True,
        seed: int = 0,
        allow_partial: bool = False,
        norm: PixelNorm | None = None,
    ) -> None:
        self.records = list(records)
        self.norm = norm if norm is not None else data_pixel_norm(data_cfg)
        self.tokenizer = tokenizer
        self.resolver = resolver
        check_pixel_settings(data_cfg)
        self.cfg = data_cfg
        self.train = train
        self.seed = seed
        self.allow_partial = allow_partial
        self.augment = build_augment(data_cfg) if train else None
        self.frame_cache = frame_cache_reader(data_cfg)
        self.epoch = 0
        mode = data_cfg.caption_sampling
        if mode not in CAPTION_SAMPLING:
            raise ValueError(f"data.caption_sampling={mode!r}: expected one of {list(CAPTION_SAMPLING)}")
        self.caption_sampling = mode
        #: one_per_video: record indices of each video's captions (item k = video k); None under all_pairs
        self.video_groups: list[list[int]] | None = None
        if mode == "one_per_video":
            groups: dict[tuple[str, float | None, float | None], list[int]] = {}
            for k, rec in enumerate(self.records):
                groups.setdefault((rec.video_id, rec.start, rec.end), []).append(k)
            self.video_groups = list(groups.values())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.records) if self.video_groups is None else len(self.video_groups)

    def record_index(self, index: int) -> int:
        """The record item ``index`` uses in the current epoch."""
        if self.video_groups is None:
            return index
        group = self.video_groups[index]
        if len(group) == 1:
            return group[0]
        return group[int(caption_rng(self.seed, self.epoch, index).integers(len(group)))]

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[self.record_index(index)]
        rng = item_rng(self.seed, self.epoch, index)
        try:
            video, video_mask = read_clip(
                self.resolver(record.video_id),
                self.cfg,
                self.frame_cache,
                start=record.start,
                end=record.end,
                train=self.train,
                rng=rng,
                augment=self.augment,
                allow_partial=self.allow_partial,
                norm=self.norm,
            )
        except VideoDecodeError as exc:
            logger.warning("skipping video %s: %s", record.video_id, exc)
            return {"skipped": record.video_id, "error": str(exc), "index": index}
        text_ids, text_mask = _tokenize_one(self.tokenizer, record.caption, self.cfg.max_words)
        return {
            "text_ids": text_ids,
            "text_mask": text_mask,
            "video": video,
            "video_mask": video_mask,
            "video_id": record.video_id,
            "caption": record.caption,
            "index": index,
        }


class VideoDataset(Dataset):
    """Evaluation videos: one item per video id, deterministic sampling, no augmentation.

    ``spans`` holds (start, end) seconds per video or (None, None); None means whole videos.
    Item: video, video_mask, video_id, index; or a skip marker. ``norm``: as in :class:`PairDataset`.
    """

    def __init__(
        self,
        video_ids: Sequence[str],
        spans: Sequence[tuple[float | None, float | None]] | None,
        resolver: Callable[[str], Path],
        data_cfg: DataConfig,
        allow_partial: bool = False,
        norm: PixelNorm | None = None,
    ) -> None:
        self.video_ids = list(video_ids)
        self.norm = norm if norm is not None else data_pixel_norm(data_cfg)
        self.spans = list(spans) if spans is not None else [(None, None)] * len(self.video_ids)
        if len(self.spans) != len(self.video_ids):
            raise ValueError(f"{len(self.video_ids)} video ids but {len(self.spans)} spans")
        self.resolver = resolver
        check_pixel_settings(data_cfg)
        self.cfg = data_cfg
        self.allow_partial = allow_partial
        self.frame_cache = frame_cache_reader(data_cfg)

    def __len__(self) -> int:
        return len(self.video_ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        video_id = self.video_ids[index]
        start, end = self.spans[index]
        try:
            video, video_mask = read_clip(
                self.resolver(video_id),
                self.cfg,
                self.frame_cache,
                start=start,
                end=end,
                train=False,
                rng=None,
                augment=None,
                allow_partial=self.allow_partial,
                norm=self.norm,
            )
        except VideoDecodeError as exc:
            logger.warning("skipping video %s: %s", video_id, exc)
            return {"skipped": video_id, "error": str(exc), "index": index}
        return {"video": video, "video_mask": video_mask, "video_id": video_id, "index": index}


class TextDataset(Dataset):
    """Evaluation queries: item = text_ids, text_mask, caption, index."""

    def __init__(self, texts: Sequence[str], tokenizer: Tokenizer, max_words: int) -> None:
        self.texts = list(texts)
        self.tokenizer = tokenizer
        self.max_words = max_words

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> dict[str, Any]:
        text_ids, text_mask = _tokenize_one(self.tokenizer, self.texts[index], self.max_words)
        return {"text_ids": text_ids, "text_mask": text_mask, "caption": self.texts[index], "index": index}


# --------------------------------------------------------------------------------------------- collate


def _stack(items: list[dict[str, Any]], key: str, empty_dims: int, dtype: torch.dtype) -> Tensor:
    if items:
        return torch.stack([item[key] for item in items])
    return torch.zeros((0,) * empty_dims, dtype=dtype)


def _split(items: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    kept = [item for item in items if "skipped" not in item]
    skipped = [item["skipped"] for item in items if "skipped" in item]
    errors = [item["error"] for item in items if "skipped" in item]
    return kept, skipped, errors


def collate_pairs(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack PairDataset items: text_ids, text_mask [B, L], video [B, F, 3, S, S], video_mask [B, F], indices [B],
    video_ids, captions (lists), skipped (ids) and errors (messages) of the marker items, which are left out.
    With every item skipped the tensors have first dimension 0 and the trainer must skip the batch."""
    kept, skipped, errors = _split(items)
    return {
        "text_ids": _stack(kept, "text_ids", 2, torch.long),
        "text_mask": _stack(kept, "text_mask", 2, torch.long),
        "video": _stack(kept, "video", 5, torch.float32),
        "video_mask": _stack(kept, "video_mask", 2, torch.long),
        "indices": torch.tensor([item["index"] for item in kept], dtype=torch.long),
        "video_ids": [item["video_id"] for item in kept],
        "captions": [item["caption"] for item in kept],
        "skipped": skipped,
        "errors": errors,
    }


def collate_videos(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack VideoDataset items: video, video_mask, indices (positions in the dataset, to place features),
    video_ids, skipped, errors. Same empty-batch rule as ``collate_pairs``."""
    kept, skipped, errors = _split(items)
    return {
        "video": _stack(kept, "video", 5, torch.float32),
        "video_mask": _stack(kept, "video_mask", 2, torch.long),
        "indices": torch.tensor([item["index"] for item in kept], dtype=torch.long),
        "video_ids": [item["video_id"] for item in kept],
        "skipped": skipped,
        "errors": errors,
    }


def collate_texts(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack TextDataset items: text_ids, text_mask [B, L], indices [B], captions."""
    items = list(items)
    return {
        "text_ids": _stack(items, "text_ids", 2, torch.long),
        "text_mask": _stack(items, "text_mask", 2, torch.long),
        "indices": torch.tensor([item["index"] for item in items], dtype=torch.long),
        "captions": [item["caption"] for item in items],
    }
