"""MSVD in CLIP4Clip's layout: ``raw-captions.pkl`` (video id → captions, each a list of words; a pickle, scanned
before it is unpickled and unpickled into dicts, lists and strings only) and one id list per split.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from tvr.config import DataConfig
from tvr.data.formats.base import DatasetFormat, SplitPart, groups_part
from tvr.data.formats.reading import (
    AnnotationError,
    annotation_error,
    cached_parse,
    read_id_list,
)
from tvr.data.formats.registry import register_dataset_format
from tvr.utils.errors import first_line
from tvr.utils.pickle_scan import PickleRefusedError, scan_pickle

MSVD_CAPTIONS = "raw-captions.pkl"
MSVD_LISTS = {"train": "train_list.txt", "val": "val_list.txt", "test": "test_list.txt"}


class _PlainUnpickler(pickle.Unpickler):
    """raw-captions.pkl holds only dicts, lists and strings: refuse anything that would import code."""

    def find_class(self, module: str, name: str) -> Any:
        if module in ("builtins", "__builtin__") and name in ("dict", "list", "str", "unicode", "tuple"):
            return {"dict": dict, "list": list, "tuple": tuple}.get(name, str)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


#: raw-captions.pkl bounds: a pickle can reference one object many times, so a few kB can stand for gigabytes of
#: captions once the words are joined. Real MSVD captions have at most a few dozen words, the file ~3 MB of text.
MSVD_MAX_WORDS_PER_CAPTION = 1_000
MSVD_MAX_TEXT_BYTES = 256 << 20
#: captions may hold at most this many times the file's size in text (word strings are shared by the pickle memo)
MSVD_MAX_EXPANSION = 64


def _load_msvd_captions(path: Path) -> dict[str, list[str]]:
    expected = "a pickled dict video_id -> list of captions, each a list of words (CLIP4Clip raw-captions.pkl)"

    def parse() -> dict[str, list[str]]:
        data = path.read_bytes()
        if not data:
            raise annotation_error(path, f"file is empty; expected {expected}")
        try:
            scan_pickle(data, str(path))
        except PickleRefusedError as exc:
            raise annotation_error(path, f"{exc.reason}; expected {expected}") from None
        try:
            obj = _PlainUnpickler(io.BytesIO(data), encoding="utf-8").load()
        except Exception as exc:
            raise annotation_error(path, f"cannot unpickle ({first_line(exc)}); expected {expected}") from exc
        if not isinstance(obj, dict) or not obj:
            raise annotation_error(path, f"expected {expected}, got {type(obj).__name__}")
        budget = min(MSVD_MAX_TEXT_BYTES, MSVD_MAX_EXPANSION * len(data))
        total = 0
        seen_lists: set[int] = set()  # a caption list or word list met twice is a shared reference
        out: dict[str, list[str]] = {}
        for vid, caps in obj.items():
            key = f"[{vid!r}]"
            if not isinstance(vid, str) or not isinstance(caps, (list, tuple)) or not caps:
                raise annotation_error(path, f"expected a non-empty list of captions ({expected})", field_path=key)
            texts = []
            for k, words in enumerate([caps, *caps]):
                where = key if k == 0 else f"{key}[{k - 1}]"
                if isinstance(words, (list, tuple)):
                    if id(words) in seen_lists:
                        raise annotation_error(
                            path,
                            "the same list is referenced twice (a pickle's shared reference, as a "
                            "decompression bomb uses); every caption must be its own list",
                            field_path=where,
                        )
                    seen_lists.add(id(words))
                if k == 0:
                    continue
                if isinstance(words, str):
                    words = words.split()
                if not isinstance(words, (list, tuple)) or not words or not all(isinstance(w, str) for w in words):
                    raise annotation_error(
                        path, f"expected a non-empty list of word strings ({expected})", field_path=where
                    )
                if len(words) > MSVD_MAX_WORDS_PER_CAPTION:
                    raise annotation_error(
                        path,
                        f"a caption of {len(words)} words; captions have at most {MSVD_MAX_WORDS_PER_CAPTION}",
                        field_path=where,
                    )
                total += sum(len(w) + 1 for w in words)
                if total > budget:
                    raise annotation_error(
                        path,
                        f"the captions hold more than {budget:,} characters of text, more than a "
                        f"{len(data):,}-byte file can honestly hold (shared references to long words?)",
                        field_path=where,
                    )
                texts.append(" ".join(words))
            out[vid] = texts
        return out

    if not path.is_file():
        raise annotation_error(path, f"file not found; expected {expected}")
    return cached_parse("msvd-captions", [path], parse)


def _msvd_part(folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
    if split not in MSVD_LISTS:
        raise AnnotationError(f"MSVD has splits {list(MSVD_LISTS)}, not {split!r}")
    cap_path = folder / MSVD_CAPTIONS
    list_path = folder / MSVD_LISTS[split]
    if not list_path.is_file():
        raise annotation_error(list_path, f"file not found; MSVD needs {MSVD_CAPTIONS} and {list(MSVD_LISTS.values())}")
    captions = _load_msvd_captions(cap_path)
    ids = read_id_list(list_path, "one MSVD video id per line")
    groups = []
    for line, vid in ids:
        if vid not in captions:
            raise annotation_error(list_path, f"video {vid!r} is not in {MSVD_CAPTIONS}", line)
        groups.append((vid, captions[vid]))
    return groups_part(groups, "multi_caption", [list_path.name, cap_path.name])


@register_dataset_format("msvd")
class Msvd(DatasetFormat):
    protocol = "multi_caption"

    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        return _msvd_part(folder, cfg, split)
