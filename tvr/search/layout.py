"""The on-disk layout of a search index, by name: its files and its format version, and the reader of its
settings. The index reader (:mod:`tvr.search.index`) and the builder (:mod:`tvr.search.build`) both use it, so
opening an index imports nothing of the builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tvr.search.store import IndexFormatError
from tvr.utils.data_files import read_json
from tvr.utils.errors import reason
from tvr.utils.io import json_kind

FORMAT = "tvr-search-index"
#: 2: the rerank state packed one record per window (``state.npy``), GARE's as standardised frames
VERSION = 2
SETTINGS = "settings.json"
MANIFEST = "manifest.json"
REPORT = "report.json"
ANN_FILE = "ann.faiss"
#: row tables written at finalisation: shard number, row inside the shard, video number, (start, end) seconds
TABLES = ("table_shard.npy", "table_row.npy", "table_video.npy", "table_times.npy")


def read_settings(index: Path) -> dict[str, Any]:
    path = index / SETTINGS
    try:
        settings = read_json(path)
    except FileNotFoundError:
        raise IndexFormatError(f"{index} is not a tvr search index (no {SETTINGS}); build one with tvr index") from None
    except (OSError, ValueError) as exc:
        raise IndexFormatError(f"{path}: unreadable ({reason(exc)})") from None
    if not isinstance(settings, dict) or settings.get("format") != FORMAT:
        raise IndexFormatError(f"{path}: not a tvr search index")
    if settings.get("version") != VERSION:
        raise IndexFormatError(
            f"{path}: index format version {settings.get('version')}, this tvr reads version {VERSION}: build the "
            "index again with tvr index into a new --out folder (the model's stamp and the videos are unchanged)"
        )
    if not isinstance(settings.get("model"), dict):
        raise IndexFormatError(f"{path}: the model stamp is {json_kind(settings.get('model'))}, not an object")
    return settings
