"""DiDeMo: CLIP4Clip's ``*_data.json`` or CLIP-ViP's JSON lines, one split each; a video's sentences are one
paragraph (the ``paragraph`` protocol).
"""

from __future__ import annotations

from pathlib import Path

from tvr.config import DataConfig
from tvr.data.formats.base import DatasetFormat, SplitPart, paragraph_part, pick_file
from tvr.data.formats.reading import (
    AnnotationError,
    annotation_error,
    cached_parse,
    need_str,
    read_json,
)
from tvr.data.formats.registry import register_dataset_format

DIDEMO_FILES = {
    "train": ("train_data.json", "train.jsonl"),
    "val": ("val_data.json", "val.jsonl"),
    "test": ("test_data.json", "test.jsonl"),
}
# ActivityNet Captions: original files, or CLIP-ViP JSON lines; val_1 is the test split


def _didemo_original(path: Path) -> list[tuple[str, list[str]]]:
    expected = "a JSON list of {video, times, description, ...} (DiDeMo / CLIP4Clip *_data.json)"

    def parse() -> list[tuple[str, list[str]]]:
        data = read_json(path, expected)
        if not isinstance(data, list) or not data:
            raise annotation_error(path, f"expected {expected}, got {type(data).__name__}")
        groups: dict[str, list[str]] = {}
        for k, item in enumerate(data):
            if not isinstance(item, dict):
                raise annotation_error(path, f"expected an object ({expected})", field_path=f"[{k}]")
            vid = need_str(item.get("video"), path, None, f"[{k}].video", expected)
            text = need_str(item.get("description"), path, None, f"[{k}].description", expected)
            groups.setdefault(vid, []).append(text)
        return list(groups.items())

    return cached_parse("didemo-original", [path], parse)


def _didemo_part(folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
    if split not in DIDEMO_FILES:
        raise AnnotationError(f"DiDeMo has splits {list(DIDEMO_FILES)}, not {split!r}")
    path = pick_file(folder, DIDEMO_FILES[split], f"DiDeMo {split}")
    return paragraph_part(path, "{clip_id, text[], timestamps[]} (CLIP-ViP DiDeMo layout)", _didemo_original)


@register_dataset_format("didemo")
class DiDeMo(DatasetFormat):
    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        return _didemo_part(folder, cfg, split)
