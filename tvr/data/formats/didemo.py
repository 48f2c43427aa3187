"""DiDeMo: CLIP4Clip's ``*_data.json`` or CLIP-ViP's JSON lines, one split each; a video's sentences are one
paragraph (the ``paragraph`` protocol).
"""

from __future__ import annotations

from pathlib import Path

from tvr.data.formats.base import ParagraphFormat
from tvr.data.formats.reading import (
    annotation_error,
    cached_parse,
    need_str,
    read_json,
)
from tvr.data.formats.registry import register_dataset_format


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


@register_dataset_format("didemo")
class DiDeMo(ParagraphFormat):
    protocol = "paragraph"
    title = "DiDeMo"
    #: per split: CLIP4Clip's original file, or CLIP-ViP's JSON lines
    files = {
        "train": ("train_data.json", "train.jsonl"),
        "val": ("val_data.json", "val.jsonl"),
        "test": ("test_data.json", "test.jsonl"),
    }
    jsonl_fields = "{clip_id, text[], timestamps[]} (CLIP-ViP DiDeMo layout)"

    read_original = staticmethod(_didemo_original)
