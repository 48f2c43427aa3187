"""ActivityNet Captions: the original ``train.json`` / ``val_1.json`` or CLIP-ViP's JSON lines; ``val_1`` is the
test split and validation is held out of training; a video's sentences are one paragraph.
"""

from __future__ import annotations

from pathlib import Path

from tvr.data.formats.base import ParagraphFormat
from tvr.data.formats.reading import (
    annotation_error,
    cached_parse,
    need_str_list,
    read_json,
)
from tvr.data.formats.registry import register_dataset_format


def _activitynet_original(path: Path) -> list[tuple[str, list[str]]]:
    expected = (
        "a JSON object video_id -> {duration, timestamps, sentences} (ActivityNet Captions train.json/val_1.json)"
    )

    def parse() -> list[tuple[str, list[str]]]:
        data = read_json(path, expected)
        if not isinstance(data, dict) or not data:
            raise annotation_error(path, f"expected {expected}, got {type(data).__name__}")
        groups = []
        for vid, item in data.items():
            if not isinstance(item, dict):
                raise annotation_error(path, f"expected an object ({expected})", field_path=vid)
            groups.append((vid, need_str_list(item.get("sentences"), path, None, f"{vid}.sentences", expected)))
        return groups

    return cached_parse("activitynet-original", [path], parse)


@register_dataset_format("activitynet")
class ActivityNet(ParagraphFormat):
    protocol = "paragraph"
    title = "ActivityNet"
    #: per split: the original file, or CLIP-ViP's JSON lines (validation is held out of training)
    files = {"train": ("train.json", "train.jsonl"), "test": ("val_1.json", "val1.jsonl")}
    jsonl_fields = "{clip_id, text[], timestamps[], num_frame} (CLIP-ViP layout)"
    held_out = ("val",)  # val_1 is the test split; val is held out from train

    read_original = staticmethod(_activitynet_original)
