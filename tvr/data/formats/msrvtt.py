"""MSR-VTT: the release JSON (merged ``MSRVTT_data.json``, or the 1.0 release's two files, zipped or not), the
9k / 7k training lists, the 1k-A test CSV, its all-captions JSON lines (``test_multi``), and an optional
validation CSV built like the test (``tvr synth --val-like-test`` writes one).

MSR-VTT has no official validation split: without ``MSRVTT_val.csv`` it is held out of the training list, one
caption per held-out video (the smallest ``sen_id``), so validation poses the 1k-A test's task.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tvr.config import DataConfig, choice
from tvr.data.formats.base import DatasetFormat, SplitPart, groups_part, jsonl_groups
from tvr.data.formats.reading import (
    AnnotationError,
    annotation_error,
    cached_parse,
    decode_text,
    need_str,
    parse_json_text,
    read_csv,
    read_json,
)
from tvr.data.formats.registry import register_dataset_format

MSRVTT_DATA = "MSRVTT_data.json"
MSRVTT_RELEASE = (  # (zip, member) pairs of the original 1.0 release; the members may also lie unzipped
    ("train_val_annotation.zip", "train_val_videodatainfo.json"),
    ("test_videodatainfo.json.zip", "test_videodatainfo.json"),
)
MSRVTT_TRAIN_LISTS = {"9k": "MSRVTT_train.9k.csv", "7k": "MSRVTT_train.7k.csv"}
MSRVTT_TEST_CSV = "MSRVTT_JSFUSION_test.csv"
MSRVTT_TEST_JSONL = "MSRVTT_test1ka.jsonl"
#: an optional validation split in the test CSV's columns (MSR-VTT itself has none; tvr synth writes one)
MSRVTT_VAL_CSV = "MSRVTT_val.csv"


def _parse_msrvtt_release(obj: Any, where: str) -> tuple[tuple[tuple[str, str, int], ...], frozenset[str]]:
    """(video_id, caption, sen_id) per sentence, and every video id the file knows."""
    expected = "an MSR-VTT release JSON object with 'videos' and 'sentences' lists"
    if not isinstance(obj, dict):
        raise annotation_error(where, f"expected {expected}, got a JSON {type(obj).__name__}")
    sentences = obj.get("sentences")
    if not isinstance(sentences, list) or not sentences:
        raise annotation_error(where, f"expected a non-empty list ({expected})", field_path="sentences")
    out = []
    sen_expected = "sentences[] entries {video_id, caption, sen_id}"
    for k, s in enumerate(sentences):
        if not isinstance(s, dict):
            raise annotation_error(where, f"expected an object ({sen_expected})", field_path=f"sentences[{k}]")
        vid = need_str(s.get("video_id"), where, None, f"sentences[{k}].video_id", sen_expected)
        cap = need_str(s.get("caption"), where, None, f"sentences[{k}].caption", sen_expected)
        sen_id = s.get("sen_id", k)
        if isinstance(sen_id, bool) or not isinstance(sen_id, int):
            raise annotation_error(
                where, f"expected an integer sen_id, got {sen_id!r}", field_path=f"sentences[{k}].sen_id"
            )
        out.append((vid, cap, sen_id))
    known = {vid for vid, _, _ in out}
    videos = obj.get("videos", [])
    if not isinstance(videos, list):
        raise annotation_error(where, f"expected a list ({expected})", field_path="videos")
    for k, v in enumerate(videos):
        if not isinstance(v, dict):
            raise annotation_error(where, "expected an object {video_id, ...}", field_path=f"videos[{k}]")
        known.add(need_str(v.get("video_id"), where, None, f"videos[{k}].video_id", "videos[] {video_id, ...}"))
    return tuple(out), frozenset(known)


def _msrvtt_sources(folder: Path) -> list[tuple[Path, str | None]]:
    """Where the MSR-VTT captions come from: MSRVTT_data.json, else the release JSONs (zipped or extracted)."""
    merged = folder / MSRVTT_DATA
    if merged.is_file():
        return [(merged, None)]
    sources: list[tuple[Path, str | None]] = []
    for zip_name, member in MSRVTT_RELEASE:
        if (folder / member).is_file():
            sources.append((folder / member, None))
        elif (folder / zip_name).is_file():
            sources.append((folder / zip_name, member))
        else:
            raise AnnotationError(
                f"{folder}: no MSR-VTT captions; expected {MSRVTT_DATA} (merged release JSON), or both release "
                f"files {MSRVTT_RELEASE[0][0]} and {MSRVTT_RELEASE[1][0]} (or their extracted "
                f"{MSRVTT_RELEASE[0][1]} / {MSRVTT_RELEASE[1][1]}); missing {zip_name}"
            )
    return sources


def _read_zip_member(path: Path, member: str) -> tuple[bytes, str]:
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n == member or n.endswith("/" + member)]
            if not names:
                raise annotation_error(
                    path, f"expected the zip to contain {member}; it holds {archive.namelist()[:10]}"
                )
            return archive.read(names[0]), f"{path}:{names[0]}"
    except zipfile.BadZipFile as exc:
        raise annotation_error(
            path, f"not a valid zip file ({exc}); expected the MSR-VTT release zip holding {member}"
        ) from exc


def _load_msrvtt_captions(folder: Path) -> tuple[tuple[tuple[str, str, int], ...], frozenset[str], list[str]]:
    sources = _msrvtt_sources(folder)

    def parse() -> tuple[tuple[tuple[str, str, int], ...], frozenset[str]]:
        sentences: list[tuple[str, str, int]] = []
        known: set[str] = set()
        for path, member in sources:
            expected = "an MSR-VTT release JSON object with 'videos' and 'sentences' lists"
            if member is None:
                where: str = str(path)
                obj = read_json(path, expected)
            else:
                data, where = _read_zip_member(path, member)
                obj = parse_json_text(decode_text(data, where, expected), where, expected)
            s, k = _parse_msrvtt_release(obj, where)
            sentences.extend(s)
            known |= k
        return tuple(sentences), frozenset(known)

    sentences, known = cached_parse("msrvtt-captions", [p for p, _ in sources], parse)
    return sentences, known, [p.name for p, _ in sources]


def _one_caption_csv(path: Path, what: str) -> SplitPart:
    """A 1k-A-style CSV (key,vid_key,video_id,sentence): one caption per video, ``one_to_one``."""
    expected = f"{what} CSV with columns key,vid_key,video_id,sentence"
    rows = cached_parse(f"msrvtt-csv:{what}", [path], lambda: read_csv(path, ("video_id", "sentence"), expected))
    seen: dict[str, int] = {}
    pairs = []
    for line, row in rows:
        vid = need_str(row["video_id"], path, line, "video_id", expected)
        text = need_str(row["sentence"], path, line, "sentence", expected)
        if vid in seen:
            raise annotation_error(
                path, f"video {vid!r} appears twice (also line {seen[vid]}); one caption per video", line
            )
        seen[vid] = line
        pairs.append((vid, text))
    return SplitPart(pairs, [v for v, _ in pairs], "one_to_one", [path.name])


def _msrvtt_part(folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
    val_path = folder / MSRVTT_VAL_CSV
    if split == "val":
        # MSR-VTT has no official val (held out from the training list); a set that ships MSRVTT_val.csv (tvr synth
        # with val_like_test) has one, built like its test
        return _one_caption_csv(val_path, "validation") if val_path.is_file() else None
    if split == "test":
        path = folder / MSRVTT_TEST_CSV
        if not path.is_file():
            raise annotation_error(
                path,
                f"file not found; the MSR-VTT 1k-A test needs {MSRVTT_TEST_CSV} "
                "(columns key,vid_key,video_id,sentence)",
            )
        return _one_caption_csv(path, "MSR-VTT 1k-A")
    if split == "test_multi":
        path = folder / MSRVTT_TEST_JSONL
        groups = jsonl_groups(path, "JSON lines {clip_id, text[]} (MSR-VTT 1k-A, all captions)")
        return groups_part(groups, "multi_caption", [path.name])
    # train
    train_split = MsrVtt().settings(cfg).train_split
    list_path = folder / MSRVTT_TRAIN_LISTS[train_split]
    expected = "a CSV with a 'video_id' column, one training video per row"
    sentences, known, caption_files = _load_msrvtt_captions(folder)
    if not list_path.is_file():
        raise annotation_error(
            list_path, f"file not found; data.train_split={train_split!r} needs {list_path.name} ({expected})"
        )
    rows = cached_parse("msrvtt-train-list", [list_path], lambda: read_csv(list_path, ("video_id",), expected))
    train: dict[str, int] = {}
    for line, row in rows:
        vid = need_str(row["video_id"], list_path, line, "video_id", expected).strip()
        if vid in train:
            raise annotation_error(list_path, f"video {vid!r} listed twice (first on line {train[vid]})", line)
        if vid not in known:
            raise annotation_error(list_path, f"video {vid!r} is not in the caption file(s) {caption_files}", line)
        train[vid] = line
    if val_path.is_file():  # the validation videos are never trained on, whichever list holds them
        for vid in _one_caption_csv(val_path, "validation").videos:
            train.pop(vid, None)
    chosen = [(vid, cap, sen) for vid, cap, sen in sentences if vid in train]
    with_captions = {vid for vid, _, _ in chosen}
    missing = next((v for v in train if v not in with_captions), None)
    if missing is not None:
        raise annotation_error(list_path, f"video {missing!r} has no sentences in {caption_files}", train[missing])
    return SplitPart(
        [(vid, cap) for vid, cap, _ in chosen],
        list(train),
        "multi_caption",
        [list_path.name, *caption_files],
        keys=[sen for _, _, sen in chosen],
    )


@dataclass
class MsrVttSettings:
    """The ``data.*`` settings only the MSR-VTT format reads."""

    #: the training list: 9k (MSRVTT_train.9k.csv, the 1k-A protocol's) | 7k (MSRVTT_train.7k.csv)
    train_split: str = choice("9k", *MSRVTT_TRAIN_LISTS)


@register_dataset_format("msrvtt")
class MsrVtt(DatasetFormat):
    protocol = "one_to_one"
    Settings = MsrVttSettings
    extra_splits = ("test_multi",)

    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        return _msrvtt_part(folder, cfg, split)

    def validation_from_train(self, val: SplitPart) -> SplitPart:
        """One caption per held-out video, the one with the smallest ``sen_id``, so validation uses the 1k-A
        protocol."""
        best: dict[str, tuple[int, str]] = {}
        for (vid, cap), key in zip(val.pairs, val.keys or [], strict=True):
            if vid not in best or key < best[vid][0]:
                best[vid] = (key, cap)
        return SplitPart([(v, best[v][1]) for v in val.videos], val.videos, "one_to_one", val.files)
