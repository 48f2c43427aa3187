"""Annotation readers for the standard text-video retrieval files, and the train / val / test splits.

Every reader takes the *exact* files the datasets are distributed as (see docs/datasets.md) and returns a
:class:`RetrievalSplit`: the evaluation view (texts, their videos, the gallery, the protocol) that also yields the
training view (:attr:`RetrievalSplit.records`).

Conventions shared by all datasets:

* ``one_to_one`` and ``paragraph`` splits are square with a diagonal ground truth: text k belongs to video k.
* ``multi_caption`` evaluation splits list each video's captions contiguously, videos in gallery order.
* Training splits keep the order of the annotation file (CLIP4Clip iterates MSR-VTT sentences in file order).
* Where a dataset has no official validation split (MSR-VTT, ActivityNet, generic files without ``val`` rows),
  ``val_fraction`` of the *training videos* is held out with a seeded, order-independent rule
  (:func:`held_out_videos`) and removed from training, so model selection never looks at the test split.

Malformed files raise :class:`AnnotationError` naming the file, the line or JSON path, and the expected format.
"""

from __future__ import annotations

import csv
import hashlib
import io
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tvr.config import DataConfig
from tvr.utils.data_files import DataFileError, parse_json
from tvr.utils.errors import UserError, first_line
from tvr.utils.pickle_scan import PickleRefusedError, scan_pickle

SPLITS = ("train", "val", "test")
#: extra split names: the MSR-VTT 1k-A test with all 20 captions per video (``MSRVTT_test1ka.jsonl``)
EXTRA_SPLITS = ("test_multi",)
PROTOCOLS = ("one_to_one", "multi_caption", "paragraph")
DATASETS = ("msrvtt", "msvd", "didemo", "activitynet", "generic")

# MSR-VTT
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
# MSVD (CLIP4Clip layout)
MSVD_CAPTIONS = "raw-captions.pkl"
MSVD_LISTS = {"train": "train_list.txt", "val": "val_list.txt", "test": "test_list.txt"}
# DiDeMo: CLIP4Clip original files, or CLIP-ViP JSON lines
DIDEMO_FILES = {
    "train": ("train_data.json", "train.jsonl"),
    "val": ("val_data.json", "val.jsonl"),
    "test": ("test_data.json", "test.jsonl"),
}
# ActivityNet Captions: original files, or CLIP-ViP JSON lines; val_1 is the test split
ACTIVITYNET_FILES = {"train": ("train.json", "train.jsonl"), "test": ("val_1.json", "val1.jsonl")}
GENERIC_SPLIT_VALUES = ("train", "val", "test")


class AnnotationError(UserError, ValueError):
    """An annotation file is missing or malformed; the message names the file, the place and what was expected."""


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


# ============================================================================================ low-level readers


def _where(path: Path | str, line: int | None = None, field_path: str | None = None) -> str:
    out = str(path)
    if line is not None:
        out += f" line {line}"
    if field_path:
        out += f" field {field_path!r}"
    return out


def _fail(path: Path | str, message: str, line: int | None = None, field_path: str | None = None) -> AnnotationError:
    return AnnotationError(f"{_where(path, line, field_path)}: {message}")


def _not_a_file(path: Path) -> str:
    """What stands at ``path`` instead of the file an annotation reader wanted."""
    return "is a folder" if path.is_dir() else "is not a regular file" if path.exists() else "file not found"


def _read_text(path: Path, expected: str) -> str:
    if not path.is_file():
        raise _fail(path, f"{_not_a_file(path)}; expected {expected}")
    data = path.read_bytes()
    return _decode(data, path, expected)


def _decode(data: bytes, where: Path | str, expected: str) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _fail(where, f"not UTF-8 text ({exc.reason}); expected {expected}", line) from exc
    if not text.strip():
        raise _fail(where, f"file is empty; expected {expected}")
    return text


def _parse_json(text: str, where: Path | str, expected: str, line: int | None = None) -> Any:
    try:
        return parse_json(text, where, line=line)
    except DataFileError as exc:
        raise _fail(where, f"{exc.problem}; expected {expected}", exc.line) from None


def _read_json(path: Path, expected: str) -> Any:
    return _parse_json(_read_text(path, expected), path, expected)


def _read_jsonl(path: Path, expected: str) -> list[tuple[int, dict]]:
    """(line number, object) for every non-blank line; CRLF and a missing final newline are fine."""
    rows = []
    for number, line in enumerate(_read_text(path, expected).split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        obj = _parse_json(line, path, expected, number)
        if not isinstance(obj, dict):
            raise _fail(path, f"expected a JSON object per line ({expected}), got {type(obj).__name__}", number)
        rows.append((number, obj))
    return rows


def _csv_problem(exc: csv.Error, start: int, expected: str) -> tuple[str, int]:
    """(message, line) for a row the CSV reader refused; a field over the reader's size limit names itself (it is
    valid CSV: a caption that long, or an unclosed quote that made the rest of the file one field)."""
    if "field larger than field limit" in str(exc):
        limit = csv.field_size_limit()
        return (
            f"a field longer than {limit:,} characters, the most a CSV field may hold here: a caption that long is "
            'not read, and an unclosed quote (") makes everything after it one field; expected ' + expected,
            start,
        )
    return f"not valid CSV ({exc}); expected {expected}", start


def _read_csv(path: Path, required: Sequence[str], expected: str) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) for every data row; the header must contain ``required``."""
    text = _read_text(path, expected)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except csv.Error as exc:
        raise _fail(path, *_csv_problem(exc, 1, expected)) from exc
    for column in required:
        if column not in header:
            raise _fail(path, f"expected a {column!r} column in the header ({expected}); found {header}", 1)
    rows = []
    while True:
        start = reader.line_num + 1  # where the next row starts (a quoted field may span lines)
        try:
            values = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise _fail(path, *_csv_problem(exc, start, expected)) from exc
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise _fail(path, f"expected {len(header)} fields {header}, found {len(values)}: {values}", reader.line_num)
        rows.append((reader.line_num, dict(zip(header, values, strict=True))))
    return rows


def _read_id_list(path: Path, expected: str) -> list[tuple[int, str]]:
    """(line number, id) for a one-id-per-line text file; duplicates are an error."""
    seen: dict[str, int] = {}
    out = []
    for number, line in enumerate(_read_text(path, expected).split("\n"), start=1):
        vid = line.strip()
        if not vid:
            continue
        if vid in seen:
            raise _fail(path, f"video id {vid!r} listed twice (first on line {seen[vid]})", number)
        seen[vid] = number
        out.append((number, vid))
    return out


def _need_str(value: Any, where: Path | str, line: int | None, field_path: str, expected: str) -> str:
    """A non-empty string field, or an error naming where it is and what was expected."""
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise _fail(where, f"expected a non-empty string ({expected}), got {got}", line, field_path)
    if not value.strip():
        raise _fail(where, f"empty string; expected {expected}", line, field_path)
    return value


def _need_str_list(value: Any, where: Path | str, line: int | None, field_path: str, expected: str) -> list[str]:
    if not isinstance(value, list) or not value:
        got = "missing" if value is None else repr(value)[:60]
        raise _fail(where, f"expected a non-empty list of strings ({expected}), got {got}", line, field_path)
    return [_need_str(v, where, line, f"{field_path}[{k}]", expected) for k, v in enumerate(value)]


# ------------------------------------------------------------------------------------------ parse cache

_CACHE: OrderedDict[tuple, Any] = OrderedDict()
_CACHE_SIZE = 16


def _cached(tag: str, paths: Sequence[Path], parse: Callable[[], Any]) -> Any:
    """Memoise ``parse()`` on the identity (path, size, mtime) of the files it reads.

    load_split is called for train, val and describe_split_source in one run; the MSR-VTT release JSON is 23 MB, so
    parse it once. Cached values are never mutated by callers.
    """
    key: tuple = (tag,)
    for p in paths:
        if not p.is_file():
            raise _fail(p, "file not found")
        st = p.stat()
        key += (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    value = parse()
    _CACHE[key] = value
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def clear_cache() -> None:
    """Forget parsed annotation files (they are re-read when their size or mtime changes anyway)."""
    _CACHE.clear()


# ============================================================================================ intermediate form


@dataclass
class _Part:
    """A split before hold-out and limits: (video, text) pairs in order and the gallery order."""

    pairs: list[tuple[str, str]]
    videos: list[str]
    protocol: str
    files: list[str]
    #: MSR-VTT ``sen_id`` of each pair (the held-out val picks each video's smallest)
    keys: list[int] | None = None

    def restrict(self, keep: set[str]) -> _Part:
        idx = [k for k, (v, _) in enumerate(self.pairs) if v in keep]
        return _Part(
            [self.pairs[k] for k in idx],
            [v for v in self.videos if v in keep],
            self.protocol,
            self.files,
            None if self.keys is None else [self.keys[k] for k in idx],
        )


def _groups_part(groups: list[tuple[str, list[str]]], protocol: str, files: list[str]) -> _Part:
    """Part from (video, captions) groups; ``paragraph`` joins each group's stripped sentences with spaces."""
    if protocol == "paragraph":
        # CLIP4Clip joins with " ".join(sentences); ActivityNet sentences often keep a leading space. Stripping each
        # sentence first gives the same tokens (the tokenizer collapses whitespace) and a clean stored string.
        pairs = [(vid, " ".join(s.strip() for s in caps)) for vid, caps in groups]
    else:
        pairs = [(vid, cap) for vid, caps in groups for cap in caps]
    return _Part(pairs, [vid for vid, _ in groups], protocol, files)


def _to_split(part: _Part, name: str, evaluation: bool, limit: int) -> RetrievalSplit:
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


def _eval_protocol(part: _Part) -> str:
    counts: dict[str, int] = {}
    for vid, _ in part.pairs:
        counts[vid] = counts.get(vid, 0) + 1
    return "one_to_one" if all(n == 1 for n in counts.values()) else "multi_caption"


# ============================================================================================ MSR-VTT


def _parse_msrvtt_release(obj: Any, where: str) -> tuple[tuple[tuple[str, str, int], ...], frozenset[str]]:
    """(video_id, caption, sen_id) per sentence, and every video id the file knows."""
    expected = "an MSR-VTT release JSON object with 'videos' and 'sentences' lists"
    if not isinstance(obj, dict):
        raise _fail(where, f"expected {expected}, got a JSON {type(obj).__name__}")
    sentences = obj.get("sentences")
    if not isinstance(sentences, list) or not sentences:
        raise _fail(where, f"expected a non-empty list ({expected})", field_path="sentences")
    out = []
    sen_expected = "sentences[] entries {video_id, caption, sen_id}"
    for k, s in enumerate(sentences):
        if not isinstance(s, dict):
            raise _fail(where, f"expected an object ({sen_expected})", field_path=f"sentences[{k}]")
        vid = _need_str(s.get("video_id"), where, None, f"sentences[{k}].video_id", sen_expected)
        cap = _need_str(s.get("caption"), where, None, f"sentences[{k}].caption", sen_expected)
        sen_id = s.get("sen_id", k)
        if isinstance(sen_id, bool) or not isinstance(sen_id, int):
            raise _fail(where, f"expected an integer sen_id, got {sen_id!r}", field_path=f"sentences[{k}].sen_id")
        out.append((vid, cap, sen_id))
    known = {vid for vid, _, _ in out}
    videos = obj.get("videos", [])
    if not isinstance(videos, list):
        raise _fail(where, f"expected a list ({expected})", field_path="videos")
    for k, v in enumerate(videos):
        if not isinstance(v, dict):
            raise _fail(where, "expected an object {video_id, ...}", field_path=f"videos[{k}]")
        known.add(_need_str(v.get("video_id"), where, None, f"videos[{k}].video_id", "videos[] {video_id, ...}"))
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
                raise _fail(path, f"expected the zip to contain {member}; it holds {archive.namelist()[:10]}")
            return archive.read(names[0]), f"{path}:{names[0]}"
    except zipfile.BadZipFile as exc:
        raise _fail(path, f"not a valid zip file ({exc}); expected the MSR-VTT release zip holding {member}") from exc


def _load_msrvtt_captions(folder: Path) -> tuple[tuple[tuple[str, str, int], ...], frozenset[str], list[str]]:
    sources = _msrvtt_sources(folder)

    def parse() -> tuple[tuple[tuple[str, str, int], ...], frozenset[str]]:
        sentences: list[tuple[str, str, int]] = []
        known: set[str] = set()
        for path, member in sources:
            expected = "an MSR-VTT release JSON object with 'videos' and 'sentences' lists"
            if member is None:
                where: str = str(path)
                obj = _read_json(path, expected)
            else:
                data, where = _read_zip_member(path, member)
                obj = _parse_json(_decode(data, where, expected), where, expected)
            s, k = _parse_msrvtt_release(obj, where)
            sentences.extend(s)
            known |= k
        return tuple(sentences), frozenset(known)

    sentences, known = _cached("msrvtt-captions", [p for p, _ in sources], parse)
    return sentences, known, [p.name for p, _ in sources]


def _one_caption_csv(path: Path, what: str) -> _Part:
    """A 1k-A-style CSV (key,vid_key,video_id,sentence): one caption per video, ``one_to_one``."""
    expected = f"{what} CSV with columns key,vid_key,video_id,sentence"
    rows = _cached(f"msrvtt-csv:{what}", [path], lambda: _read_csv(path, ("video_id", "sentence"), expected))
    seen: dict[str, int] = {}
    pairs = []
    for line, row in rows:
        vid = _need_str(row["video_id"], path, line, "video_id", expected)
        text = _need_str(row["sentence"], path, line, "sentence", expected)
        if vid in seen:
            raise _fail(path, f"video {vid!r} appears twice (also line {seen[vid]}); one caption per video", line)
        seen[vid] = line
        pairs.append((vid, text))
    return _Part(pairs, [v for v, _ in pairs], "one_to_one", [path.name])


def _msrvtt_part(folder: Path, cfg: DataConfig, split: str) -> _Part | None:
    val_path = folder / MSRVTT_VAL_CSV
    if split == "val":
        # MSR-VTT has no official val (held out from the training list); a set that ships MSRVTT_val.csv (tvr synth
        # with val_like_test) has one, built like its test
        return _one_caption_csv(val_path, "validation") if val_path.is_file() else None
    if split == "test":
        path = folder / MSRVTT_TEST_CSV
        if not path.is_file():
            raise _fail(
                path,
                f"file not found; the MSR-VTT 1k-A test needs {MSRVTT_TEST_CSV} "
                "(columns key,vid_key,video_id,sentence)",
            )
        return _one_caption_csv(path, "MSR-VTT 1k-A")
    if split == "test_multi":
        path = folder / MSRVTT_TEST_JSONL
        groups = _jsonl_groups(path, "JSON lines {clip_id, text[]} (MSR-VTT 1k-A, all captions)")
        return _groups_part(groups, "multi_caption", [path.name])
    # train
    if cfg.train_split not in MSRVTT_TRAIN_LISTS:
        raise AnnotationError(f"data.train_split must be one of {sorted(MSRVTT_TRAIN_LISTS)}, got {cfg.train_split!r}")
    list_path = folder / MSRVTT_TRAIN_LISTS[cfg.train_split]
    expected = "a CSV with a 'video_id' column, one training video per row"
    sentences, known, caption_files = _load_msrvtt_captions(folder)
    if not list_path.is_file():
        raise _fail(
            list_path, f"file not found; data.train_split={cfg.train_split!r} needs {list_path.name} ({expected})"
        )
    rows = _cached("msrvtt-train-list", [list_path], lambda: _read_csv(list_path, ("video_id",), expected))
    train: dict[str, int] = {}
    for line, row in rows:
        vid = _need_str(row["video_id"], list_path, line, "video_id", expected).strip()
        if vid in train:
            raise _fail(list_path, f"video {vid!r} listed twice (first on line {train[vid]})", line)
        if vid not in known:
            raise _fail(list_path, f"video {vid!r} is not in the caption file(s) {caption_files}", line)
        train[vid] = line
    if val_path.is_file():  # the validation videos are never trained on, whichever list holds them
        for vid in _one_caption_csv(val_path, "validation").videos:
            train.pop(vid, None)
    chosen = [(vid, cap, sen) for vid, cap, sen in sentences if vid in train]
    with_captions = {vid for vid, _, _ in chosen}
    missing = next((v for v in train if v not in with_captions), None)
    if missing is not None:
        raise _fail(list_path, f"video {missing!r} has no sentences in {caption_files}", train[missing])
    return _Part(
        [(vid, cap) for vid, cap, _ in chosen],
        list(train),
        "multi_caption",
        [list_path.name, *caption_files],
        keys=[sen for _, _, sen in chosen],
    )


# ============================================================================================ JSON-lines layout


def _jsonl_groups(path: Path, expected: str) -> list[tuple[str, list[str]]]:
    """(clip_id, text[]) per line of a CLIP-ViP style JSONL file; clip ids must be unique."""

    def parse() -> list[tuple[str, list[str]]]:
        seen: dict[str, int] = {}
        groups = []
        for line, obj in _read_jsonl(path, expected):
            vid = _need_str(obj.get("clip_id"), path, line, "clip_id", expected)
            texts = obj.get("text")
            if isinstance(texts, str):  # some CLIP-ViP files hold a single caption as a plain string
                texts = [texts]
            texts = _need_str_list(texts, path, line, "text", expected)
            if vid in seen:
                raise _fail(path, f"clip_id {vid!r} appears twice (also line {seen[vid]})", line)
            seen[vid] = line
            groups.append((vid, texts))
        return groups

    if not path.is_file():
        raise _fail(path, f"file not found; expected {expected}")
    return _cached("jsonl-groups", [path], parse)


def _paragraph_part(
    path: Path, jsonl_fields: str, read_original: Callable[[Path], list[tuple[str, list[str]]]]
) -> _Part:
    """A paragraph-protocol split (DiDeMo, ActivityNet) from ``path``: a CLIP-ViP JSON-lines file (one object of
    ``jsonl_fields`` a line) or the dataset's original JSON, which ``read_original`` reads."""
    if path.suffix == ".jsonl":
        groups = _jsonl_groups(path, f"JSON lines {jsonl_fields}")
    else:
        groups = read_original(path)
    return _groups_part(groups, "paragraph", [path.name])


def _pick(folder: Path, names: Sequence[str], what: str) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise AnnotationError(f"{folder}: no {what} annotation file; expected one of {list(names)}")


# ============================================================================================ MSVD


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
            raise _fail(path, f"file is empty; expected {expected}")
        try:
            scan_pickle(data, str(path))
        except PickleRefusedError as exc:
            raise _fail(path, f"{exc.reason}; expected {expected}") from None
        try:
            obj = _PlainUnpickler(io.BytesIO(data), encoding="utf-8").load()
        except Exception as exc:
            raise _fail(path, f"cannot unpickle ({first_line(exc)}); expected {expected}") from exc
        if not isinstance(obj, dict) or not obj:
            raise _fail(path, f"expected {expected}, got {type(obj).__name__}")
        budget = min(MSVD_MAX_TEXT_BYTES, MSVD_MAX_EXPANSION * len(data))
        total = 0
        seen_lists: set[int] = set()  # a caption list or word list met twice is a shared reference
        out: dict[str, list[str]] = {}
        for vid, caps in obj.items():
            key = f"[{vid!r}]"
            if not isinstance(vid, str) or not isinstance(caps, (list, tuple)) or not caps:
                raise _fail(path, f"expected a non-empty list of captions ({expected})", field_path=key)
            texts = []
            for k, words in enumerate([caps, *caps]):
                where = key if k == 0 else f"{key}[{k - 1}]"
                if isinstance(words, (list, tuple)):
                    if id(words) in seen_lists:
                        raise _fail(
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
                    raise _fail(path, f"expected a non-empty list of word strings ({expected})", field_path=where)
                if len(words) > MSVD_MAX_WORDS_PER_CAPTION:
                    raise _fail(
                        path,
                        f"a caption of {len(words)} words; captions have at most {MSVD_MAX_WORDS_PER_CAPTION}",
                        field_path=where,
                    )
                total += sum(len(w) + 1 for w in words)
                if total > budget:
                    raise _fail(
                        path,
                        f"the captions hold more than {budget:,} characters of text, more than a "
                        f"{len(data):,}-byte file can honestly hold (shared references to long words?)",
                        field_path=where,
                    )
                texts.append(" ".join(words))
            out[vid] = texts
        return out

    if not path.is_file():
        raise _fail(path, f"file not found; expected {expected}")
    return _cached("msvd-captions", [path], parse)


def _msvd_part(folder: Path, cfg: DataConfig, split: str) -> _Part | None:
    if split not in MSVD_LISTS:
        raise AnnotationError(f"MSVD has splits {list(MSVD_LISTS)}, not {split!r}")
    cap_path = folder / MSVD_CAPTIONS
    list_path = folder / MSVD_LISTS[split]
    if not list_path.is_file():
        raise _fail(list_path, f"file not found; MSVD needs {MSVD_CAPTIONS} and {list(MSVD_LISTS.values())}")
    captions = _load_msvd_captions(cap_path)
    ids = _read_id_list(list_path, "one MSVD video id per line")
    groups = []
    for line, vid in ids:
        if vid not in captions:
            raise _fail(list_path, f"video {vid!r} is not in {MSVD_CAPTIONS}", line)
        groups.append((vid, captions[vid]))
    return _groups_part(groups, "multi_caption", [list_path.name, cap_path.name])


# ============================================================================================ DiDeMo


def _didemo_original(path: Path) -> list[tuple[str, list[str]]]:
    expected = "a JSON list of {video, times, description, ...} (DiDeMo / CLIP4Clip *_data.json)"

    def parse() -> list[tuple[str, list[str]]]:
        data = _read_json(path, expected)
        if not isinstance(data, list) or not data:
            raise _fail(path, f"expected {expected}, got {type(data).__name__}")
        groups: dict[str, list[str]] = {}
        for k, item in enumerate(data):
            if not isinstance(item, dict):
                raise _fail(path, f"expected an object ({expected})", field_path=f"[{k}]")
            vid = _need_str(item.get("video"), path, None, f"[{k}].video", expected)
            text = _need_str(item.get("description"), path, None, f"[{k}].description", expected)
            groups.setdefault(vid, []).append(text)
        return list(groups.items())

    return _cached("didemo-original", [path], parse)


def _didemo_part(folder: Path, cfg: DataConfig, split: str) -> _Part | None:
    if split not in DIDEMO_FILES:
        raise AnnotationError(f"DiDeMo has splits {list(DIDEMO_FILES)}, not {split!r}")
    path = _pick(folder, DIDEMO_FILES[split], f"DiDeMo {split}")
    return _paragraph_part(path, "{clip_id, text[], timestamps[]} (CLIP-ViP DiDeMo layout)", _didemo_original)


# ============================================================================================ ActivityNet


def _activitynet_original(path: Path) -> list[tuple[str, list[str]]]:
    expected = (
        "a JSON object video_id -> {duration, timestamps, sentences} (ActivityNet Captions train.json/val_1.json)"
    )

    def parse() -> list[tuple[str, list[str]]]:
        data = _read_json(path, expected)
        if not isinstance(data, dict) or not data:
            raise _fail(path, f"expected {expected}, got {type(data).__name__}")
        groups = []
        for vid, item in data.items():
            if not isinstance(item, dict):
                raise _fail(path, f"expected an object ({expected})", field_path=vid)
            groups.append((vid, _need_str_list(item.get("sentences"), path, None, f"{vid}.sentences", expected)))
        return groups

    return _cached("activitynet-original", [path], parse)


def _activitynet_part(folder: Path, cfg: DataConfig, split: str) -> _Part | None:
    if split == "val":
        return None  # val_1 is the test split; val is held out from train
    if split not in ACTIVITYNET_FILES:
        raise AnnotationError(f"ActivityNet has splits train / val / test, not {split!r}")
    path = _pick(folder, ACTIVITYNET_FILES[split], f"ActivityNet {split}")
    return _paragraph_part(path, "{clip_id, text[], timestamps[], num_frame} (CLIP-ViP layout)", _activitynet_original)


# ============================================================================================ generic


def _generic_rows(path: Path) -> list[tuple[int, str, str, str]]:
    """(line, video, caption, split) for a user CSV / JSONL file with fields video, caption[, split]."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        expected = "a CSV with columns video,caption[,split]"
        raw = [(line, row) for line, row in _read_csv(path, ("video", "caption"), expected)]
    elif suffix in (".jsonl", ".ndjson"):
        expected = "JSON lines {video, caption[, split]}"
        raw = _read_jsonl(path, expected)
    else:
        raise _fail(
            path,
            "unsupported generic annotation format; expected a .csv or .jsonl file with fields video, caption[, split]",
        )
    rows = []
    first_split: dict[str, tuple[str, int]] = {}
    for line, row in raw:
        vid = _need_str(row.get("video"), path, line, "video", expected).strip()
        cap = _need_str(row.get("caption"), path, line, "caption", expected)
        split = row.get("split")
        split = "" if split is None else split
        if not isinstance(split, str):
            raise _fail(
                path, f"expected split to be one of {GENERIC_SPLIT_VALUES} or empty, got {split!r}", line, "split"
            )
        split = split.strip().lower() or "train"
        if split not in GENERIC_SPLIT_VALUES:
            raise _fail(
                path, f"expected split to be one of {GENERIC_SPLIT_VALUES} or empty, got {split!r}", line, "split"
            )
        other = first_split.setdefault(vid, (split, line))
        if other[0] != split:
            raise _fail(
                path,
                f"video {vid!r} is in split {split!r} here but in {other[0]!r} on line {other[1]}; "
                "a video must belong to one split",
                line,
            )
        rows.append((line, vid, cap, split))
    return rows


def _generic_part(folder: Path, cfg: DataConfig, split: str) -> _Part | None:
    path = Path(cfg.generic_file)
    if not path.is_absolute():
        path = folder / path
    if not path.is_file():
        raise _fail(
            path,
            f"{_not_a_file(path)}; the generic format needs data.generic_file (relative to "
            "data.annotations): a .csv or .jsonl file with fields video, caption[, split]",
        )
    rows = _cached("generic-rows", [path], lambda: _generic_rows(path))
    chosen = [(vid, cap) for _, vid, cap, s in rows if s == split]
    if not chosen:
        if split == "val":
            return None
        raise _fail(
            path,
            f"no rows with split={split!r}" + (" (rows without a split count as train)" if split == "test" else ""),
        )
    videos = list(dict.fromkeys(vid for vid, _ in chosen))
    part = _Part(chosen, videos, "multi_caption", [path.name])
    part.protocol = _eval_protocol(part)
    return part


_READERS: dict[str, Callable[[Path, DataConfig, str], _Part | None]] = {
    "msrvtt": _msrvtt_part,
    "msvd": _msvd_part,
    "didemo": _didemo_part,
    "activitynet": _activitynet_part,
    "generic": _generic_part,
}


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
    if cfg.dataset not in DATASETS:
        raise AnnotationError(f"data.dataset must be one of {DATASETS}, got {cfg.dataset!r}")
    if not cfg.annotations:
        raise AnnotationError(
            "data.annotations is empty; set it to the folder holding the annotation files (see docs/datasets.md)"
        )
    folder = Path(cfg.annotations).expanduser()
    if not folder.is_dir():
        raise AnnotationError(f"{folder}: annotation folder not found (data.annotations)")
    return folder


def _val_from_train(cfg: DataConfig, train: _Part, held: list[str]) -> _Part:
    val = train.restrict(set(held))
    if cfg.dataset == "msrvtt":
        # one caption per held-out video, the one with the smallest sen_id, so val uses the 1k-A protocol
        best: dict[str, tuple[int, str]] = {}
        for (vid, cap), key in zip(val.pairs, val.keys or [], strict=True):
            if vid not in best or key < best[vid][0]:
                best[vid] = (key, cap)
        return _Part([(v, best[v][1]) for v in val.videos], val.videos, "one_to_one", val.files)
    if val.protocol != "paragraph":
        val.protocol = _eval_protocol(val)
    return val


def _resolve(cfg: DataConfig, split: str) -> tuple[_Part, dict[str, Any]]:
    """The part for ``split`` after the validation hold-out, and a description of where it came from."""
    if split not in SPLITS + EXTRA_SPLITS:
        raise AnnotationError(f"split must be one of {SPLITS + EXTRA_SPLITS}, got {split!r}")
    if split in EXTRA_SPLITS and cfg.dataset != "msrvtt":
        raise AnnotationError(f"split {split!r} exists only for msrvtt ({MSRVTT_TEST_JSONL})")
    folder = _check_cfg(cfg)
    reader = _READERS[cfg.dataset]
    if split.startswith("test"):
        part = reader(folder, cfg, split)
        assert part is not None
        return part, {"source": "official", "files": part.files}
    official_val = reader(folder, cfg, "val")
    if official_val is not None:
        part = official_val if split == "val" else reader(folder, cfg, "train")
        assert part is not None
        return part, {"source": "official", "files": official_val.files}
    train = reader(folder, cfg, "train")
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
    return _val_from_train(cfg, train, held), info


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
    if cfg.dataset == "msrvtt":
        out["train_split"] = cfg.train_split
    if cfg.dataset == "generic":
        out["generic_file"] = cfg.generic_file
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
