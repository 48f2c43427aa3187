"""The train / val / test splits of a dataset's annotation files.

Each dataset format (``data.dataset``) is a registered reader in :mod:`tvr.data.formats` that takes the *exact* files
the dataset is distributed as (see docs/datasets.md); this module turns what it reads into a :class:`RetrievalSplit`:
the evaluation view (texts, their videos, the gallery, the protocol) that also yields the training view
(:attr:`RetrievalSplit.records`).

Where a dataset has no official validation split (MSR-VTT, ActivityNet, generic files without ``val`` rows),
``val_fraction`` of the *training videos* is held out with a seeded, order-independent rule (:func:`held_out_videos`)
and removed from training, so model selection never looks at the test split.

Malformed files raise :class:`AnnotationError` naming the file, the line or JSON path, and the expected format.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tvr.config import DataConfig, config_to_dict
from tvr.data.formats.base import SplitPart
from tvr.data.formats.reading import AnnotationError, clear_cache
from tvr.data.formats.registry import builtin_dataset_formats, dataset_format, registered_dataset_formats

SPLITS = ("train", "val", "test")
PROTOCOLS = ("one_to_one", "multi_caption", "paragraph")
#: the dataset formats of tvr itself (``tvr/data/formats/``)
DATASETS = tuple(builtin_dataset_formats())


def extra_splits() -> tuple[str, ...]:
    """The split names beyond train / val / test that some registered format reads (MSR-VTT: ``test_multi``, the
    1k-A test with all 20 captions per video), each format declaring its own (``DatasetFormat.extra_splits``)."""
    names = {split for cls in registered_dataset_formats().values() for split in cls.extra_splits}
    return tuple(sorted(names))


def known_splits() -> tuple[str, ...]:
    """Every split name a split may be read as (and a feature cache may hold): train, val, test and the extras."""
    return SPLITS + extra_splits()


def evaluation_splits() -> tuple[str, ...]:
    """What ``eval.split`` and ``tvr analyze --split`` may name: val, test, the formats' extra splits, train."""
    return ("val", "test", *extra_splits(), "train")


@dataclass
class CaptionRecord:
    """One training pair: a caption (or paragraph) and its video, optionally a time span in seconds."""

    video_id: str
    caption: str
    start: float | None = None
    end: float | None = None


@dataclass
class RetrievalSplit:
    """One split as texts, a video gallery and the ground truth between them.

    ``text_video[k]`` is the index in ``videos`` of text k's video; ``video_spans[j]`` is the (start, end) in
    seconds to read from video j (``(None, None)`` = the whole file).
    """

    name: str
    texts: list[str]
    text_video: list[int]
    videos: list[str]
    video_spans: list[tuple[float | None, float | None]]
    protocol: str
    #: annotation files this split was read from (for run records)
    files: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if len(self.texts) != len(self.text_video):
            raise ValueError(f"{len(self.texts)} texts but {len(self.text_video)} text_video entries")
        if len(self.videos) != len(self.video_spans):
            raise ValueError(f"{len(self.videos)} videos but {len(self.video_spans)} spans")
        bad = [v for v in self.text_video if not 0 <= v < len(self.videos)]
        if bad:
            raise ValueError(f"text_video holds {bad[0]}, outside the {len(self.videos)} videos")

    @property
    def records(self) -> list[CaptionRecord]:
        """The training view: one :class:`CaptionRecord` per text."""
        return [
            CaptionRecord(self.videos[v], text, *self.video_spans[v])
            for text, v in zip(self.texts, self.text_video, strict=True)
        ]

    @property
    def num_texts(self) -> int:
        return len(self.texts)

    @property
    def num_videos(self) -> int:
        return len(self.videos)


def _to_split(part: SplitPart, name: str, evaluation: bool, limit: int) -> RetrievalSplit:
    """Build the RetrievalSplit; evaluation splits are grouped per video (and must be square where required)."""
    pairs, videos = part.pairs, part.videos
    if evaluation:
        by_video: dict[str, list[str]] = {v: [] for v in videos}
        for vid, text in pairs:
            by_video[vid].append(text)
        if part.protocol in ("one_to_one", "paragraph"):
            several = next((v for v, t in by_video.items() if len(t) != 1), None)
            if several is not None:
                raise AnnotationError(
                    f"{', '.join(part.files)}: video {several!r} has {len(by_video[several])} texts; the "
                    f"{part.protocol} protocol needs exactly one text per video"
                )
        if limit > 0:  # first N items: pairs for square protocols, videos (with all captions) for multi_caption
            videos = videos[:limit]
        pairs = [(v, t) for v in videos for t in by_video[v]]
    elif limit > 0:
        pairs = pairs[:limit]
        used = {v for v, _ in pairs}
        videos = [v for v in videos if v in used]
    index = {v: k for k, v in enumerate(videos)}
    return RetrievalSplit(
        name=name,
        texts=[t for _, t in pairs],
        text_video=[index[v] for v, _ in pairs],
        videos=list(videos),
        video_spans=[(None, None)] * len(videos),
        protocol=part.protocol,
        files=list(part.files),
    )


# ============================================================================================ hold-out + API


def held_out_videos(video_ids: Sequence[str], fraction: float, seed: int) -> list[str]:
    """The videos held out for validation: ``round(fraction·N)`` (at least 1) of ``video_ids``.

    Each video gets the rank of ``sha256(f"{seed}:{video_id}")``; the lowest ranks are held out. The choice depends
    only on the set of ids and the seed (not on file order, Python version or RNG implementation), so it is
    reproducible forever. Returned in the input order.
    """
    if not 0.0 <= fraction < 1.0:
        raise AnnotationError(f"data.val_fraction must be in [0, 1), got {fraction}")
    if fraction == 0.0 or not video_ids:
        return []
    n = max(1, round(fraction * len(video_ids)))
    if n >= len(video_ids):
        raise AnnotationError(
            f"data.val_fraction={fraction} would hold out all {len(video_ids)} training videos; lower it"
        )
    ranked = sorted(video_ids, key=lambda v: hashlib.sha256(f"{seed}:{v}".encode()).hexdigest())
    chosen = set(ranked[:n])
    return [v for v in video_ids if v in chosen]


def _check_cfg(cfg: DataConfig) -> Path:
    dataset_format(cfg.dataset)  # an unknown name is refused before the folder is looked at
    if not cfg.annotations:
        raise AnnotationError(
            "data.annotations is empty; set it to the folder holding the annotation files (see docs/datasets.md)"
        )
    folder = Path(cfg.annotations).expanduser()
    if not folder.is_dir():
        raise AnnotationError(f"{folder}: annotation folder not found (data.annotations)")
    return folder


def _resolve(cfg: DataConfig, split: str) -> tuple[SplitPart, dict[str, Any]]:
    """The part for ``split`` after the validation hold-out, and a description of where it came from."""
    if split not in known_splits():
        raise AnnotationError(f"split must be one of {known_splits()}, got {split!r}")
    reader = dataset_format(cfg.dataset)
    if split not in SPLITS and split not in reader.extra_splits:
        raise AnnotationError(f"split {split!r} does not exist for {cfg.dataset} (no format file holds it)")
    folder = _check_cfg(cfg)
    if split.startswith("test"):
        part = reader.read(folder, cfg, split)
        assert part is not None
        return part, {"source": "official", "files": part.files}
    official_val = reader.read(folder, cfg, "val")
    if official_val is not None:
        part = official_val if split == "val" else reader.read(folder, cfg, "train")
        assert part is not None
        return part, {"source": "official", "files": official_val.files}
    train = reader.read(folder, cfg, "train")
    assert train is not None
    held = held_out_videos(train.videos, cfg.val_fraction, cfg.val_seed)
    info = {
        "source": "held_out_from_train",
        "files": train.files,
        "fraction": cfg.val_fraction,
        "seed": cfg.val_seed,
        "rule": "hold out the round(fraction*N) training videos with the smallest sha256(f'{seed}:{video_id}')",
        "num_train_videos_before": len(train.videos),
        "video_ids": held,
    }
    if split == "train":
        return train.restrict(set(train.videos) - set(held)), info
    if not held:
        raise AnnotationError(
            f"{cfg.dataset} has no official validation split and data.val_fraction is 0; set data.val_fraction > 0 "
            "to hold out training videos for validation"
        )
    return reader.validation_from_train(train.restrict(set(held))), info


def load_split(cfg: DataConfig, split: str) -> RetrievalSplit:
    """Read ``split`` (train | val | test; msrvtt also test_multi) of ``cfg.dataset`` from ``cfg.annotations``.

    The file layout is detected from the file names present (docs/datasets.md). ``cfg.limit_train`` keeps the
    first N training pairs; ``cfg.limit_eval`` the first N texts of a square split or the first N videos (with all
    their captions) of a multi-caption split.
    """
    part, _ = _resolve(cfg, split)
    name = f"{cfg.dataset}/{split}"
    if split == "train":
        return _to_split(part, name, evaluation=False, limit=cfg.limit_train)
    return _to_split(part, name, evaluation=True, limit=cfg.limit_eval)


def describe_split_source(cfg: DataConfig) -> dict[str, Any]:
    """Where train / val / test come from, including the held-out validation video ids (for the run dir)."""
    folder = _check_cfg(cfg)
    out: dict[str, Any] = {
        "dataset": cfg.dataset,
        "annotations": str(folder.resolve()),
        "limit_train": cfg.limit_train,
        "limit_eval": cfg.limit_eval,
    }
    own = dataset_format(cfg.dataset).settings(cfg)  # what only this format reads (msrvtt: train_split)
    out.update(config_to_dict(own) if own is not None else {})
    splits: dict[str, Any] = {}
    for split in SPLITS:
        try:
            data = load_split(cfg, split)
        except AnnotationError as exc:
            if split == "train":
                raise
            splits[split] = {"unavailable": str(exc)}
            continue
        splits[split] = {
            "files": data.files,
            "protocol": data.protocol,
            "num_texts": data.num_texts,
            "num_videos": data.num_videos,
        }
    _, val_info = _resolve(cfg, "train")
    splits["val"] = {**splits["val"], **{k: v for k, v in val_info.items() if k != "files"}}
    out["splits"] = splits
    return out


__all__ = [
    "DATASETS",
    "evaluation_splits",
    "extra_splits",
    "known_splits",
    "PROTOCOLS",
    "SPLITS",
    "AnnotationError",
    "CaptionRecord",
    "RetrievalSplit",
    "clear_cache",
    "describe_split_source",
    "held_out_videos",
    "load_split",
]
