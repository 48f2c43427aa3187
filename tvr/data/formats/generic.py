"""A user's own captions: one CSV (columns video, caption[, split]) or JSON-lines file (``data.generic_file``,
relative to ``data.annotations``); rows without a split are training rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tvr.config import DataConfig
from tvr.data.formats.base import DatasetFormat, SplitPart, evaluation_protocol
from tvr.data.formats.reading import (
    annotation_error,
    cached_parse,
    need_str,
    not_a_file,
    read_csv,
    read_jsonl,
)
from tvr.data.formats.registry import register_dataset_format

GENERIC_SPLIT_VALUES = ("train", "val", "test")


def _generic_rows(path: Path) -> list[tuple[int, str, str, str]]:
    """(line, video, caption, split) for a user CSV / JSONL file with fields video, caption[, split]."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        expected = "a CSV with columns video,caption[,split]"
        raw = [(line, row) for line, row in read_csv(path, ("video", "caption"), expected)]
    elif suffix in (".jsonl", ".ndjson"):
        expected = "JSON lines {video, caption[, split]}"
        raw = read_jsonl(path, expected)
    else:
        raise annotation_error(
            path,
            "unsupported generic annotation format; expected a .csv or .jsonl file with fields video, caption[, split]",
        )
    rows = []
    first_split: dict[str, tuple[str, int]] = {}
    for line, row in raw:
        vid = need_str(row.get("video"), path, line, "video", expected).strip()
        cap = need_str(row.get("caption"), path, line, "caption", expected)
        split = row.get("split")
        split = "" if split is None else split
        if not isinstance(split, str):
            raise annotation_error(
                path, f"expected split to be one of {GENERIC_SPLIT_VALUES} or empty, got {split!r}", line, "split"
            )
        split = split.strip().lower() or "train"
        if split not in GENERIC_SPLIT_VALUES:
            raise annotation_error(
                path, f"expected split to be one of {GENERIC_SPLIT_VALUES} or empty, got {split!r}", line, "split"
            )
        other = first_split.setdefault(vid, (split, line))
        if other[0] != split:
            raise annotation_error(
                path,
                f"video {vid!r} is in split {split!r} here but in {other[0]!r} on line {other[1]}; "
                "a video must belong to one split",
                line,
            )
        rows.append((line, vid, cap, split))
    return rows


def _generic_part(folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
    path = Path(Generic().settings(cfg).generic_file)
    if not path.is_absolute():
        path = folder / path
    if not path.is_file():
        raise annotation_error(
            path,
            f"{not_a_file(path)}; the generic format needs data.generic_file (relative to "
            "data.annotations): a .csv or .jsonl file with fields video, caption[, split]",
        )
    rows = cached_parse("generic-rows", [path], lambda: _generic_rows(path))
    chosen = [(vid, cap) for _, vid, cap, s in rows if s == split]
    if not chosen:
        if split == "val":
            return None
        raise annotation_error(
            path,
            f"no rows with split={split!r}" + (" (rows without a split count as train)" if split == "test" else ""),
        )
    videos = list(dict.fromkeys(vid for vid, _ in chosen))
    part = SplitPart(chosen, videos, "multi_caption", [path.name])
    part.protocol = evaluation_protocol(part)
    return part


@dataclass
class GenericSettings:
    """The ``data.*`` settings only the generic format reads."""

    #: path of the CSV / JSONL captions file (relative to ``data.annotations``)
    generic_file: str = "captions.csv"


@register_dataset_format("generic")
class Generic(DatasetFormat):
    Settings = GenericSettings

    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        return _generic_part(folder, cfg, split)
