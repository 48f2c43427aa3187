"""A dataset format: the contract each module of ``tvr/data/formats/`` implements, and the intermediate form its reader
returns (:class:`SplitPart`: (video, text) pairs in file order and the gallery order, before the validation hold-out
and the limits that :func:`tvr.data.annotations.load_split` applies).

Conventions shared by all formats:

* ``one_to_one`` and ``paragraph`` splits are square with a diagonal ground truth: text k belongs to video k.
* ``multi_caption`` evaluation splits list each video's captions contiguously, videos in gallery order.
* Training splits keep the order of the annotation file (CLIP4Clip iterates MSR-VTT sentences in file order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tvr.config import DataConfig, build_section, config_to_dict, settings_fields
from tvr.data.formats.reading import (
    AnnotationError,
    annotation_error,
    cached_parse,
    need_str,
    need_str_list,
    read_jsonl,
)


@dataclass
class SplitPart:
    """A split before hold-out and limits: (video, text) pairs in order and the gallery order."""

    pairs: list[tuple[str, str]]
    videos: list[str]
    protocol: str
    files: list[str]
    #: MSR-VTT ``sen_id`` of each pair (the held-out val picks each video's smallest)
    keys: list[int] | None = None

    def restrict(self, keep: set[str]) -> SplitPart:
        idx = [k for k, (v, _) in enumerate(self.pairs) if v in keep]
        return SplitPart(
            [self.pairs[k] for k in idx],
            [v for v in self.videos if v in keep],
            self.protocol,
            self.files,
            None if self.keys is None else [self.keys[k] for k in idx],
        )


def groups_part(groups: list[tuple[str, list[str]]], protocol: str, files: list[str]) -> SplitPart:
    """Part from (video, captions) groups; ``paragraph`` joins each group's stripped sentences with spaces."""
    if protocol == "paragraph":
        # CLIP4Clip joins with " ".join(sentences); ActivityNet sentences often keep a leading space. Stripping each
        # sentence first gives the same tokens (the tokenizer collapses whitespace) and a clean stored string.
        pairs = [(vid, " ".join(s.strip() for s in caps)) for vid, caps in groups]
    else:
        pairs = [(vid, cap) for vid, caps in groups for cap in caps]
    return SplitPart(pairs, [vid for vid, _ in groups], protocol, files)


def evaluation_protocol(part: SplitPart) -> str:
    counts: dict[str, int] = {}
    for vid, _ in part.pairs:
        counts[vid] = counts.get(vid, 0) + 1
    return "one_to_one" if all(n == 1 for n in counts.values()) else "multi_caption"


def jsonl_groups(path: Path, expected: str) -> list[tuple[str, list[str]]]:
    """(clip_id, text[]) per line of a CLIP-ViP style JSONL file; clip ids must be unique."""

    def parse() -> list[tuple[str, list[str]]]:
        seen: dict[str, int] = {}
        groups = []
        for line, obj in read_jsonl(path, expected):
            vid = need_str(obj.get("clip_id"), path, line, "clip_id", expected)
            texts = obj.get("text")
            if isinstance(texts, str):  # some CLIP-ViP files hold a single caption as a plain string
                texts = [texts]
            texts = need_str_list(texts, path, line, "text", expected)
            if vid in seen:
                raise annotation_error(path, f"clip_id {vid!r} appears twice (also line {seen[vid]})", line)
            seen[vid] = line
            groups.append((vid, texts))
        return groups

    if not path.is_file():
        raise annotation_error(path, f"file not found; expected {expected}")
    return cached_parse("jsonl-groups", [path], parse)


def pick_file(folder: Path, names: Sequence[str], what: str) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise AnnotationError(f"{folder}: no {what} annotation file; expected one of {list(names)}")


class DatasetFormat:
    """One dataset's annotation files: how a split is read, and how a validation split held out of training looks.

    A subclass registers itself with :func:`tvr.data.formats.registry.register_dataset_format`; ``data.dataset``
    names it.
    """

    #: the registry name (``data.dataset``), set by the decorator
    name: ClassVar[str] = ""
    #: the settings only this format reads, a dataclass whose fields are ``data.<key>`` keys (msrvtt's
    #: ``train_split``); a run's ``splits.json`` records them. None: it reads none
    Settings: ClassVar[type | None] = None
    #: split names beyond train / val / test that this format reads (MSR-VTT: ``test_multi``)
    extra_splits: ClassVar[tuple[str, ...]] = ()
    #: the evaluation protocol of its test split (spec §6); None where the files decide (generic)
    protocol: ClassVar[str | None] = None

    def settings(self, cfg: DataConfig) -> Any:
        """Its :attr:`Settings` as ``cfg`` sets them (defaults for those it leaves out; ConfigError for a bad one)."""
        if self.Settings is None:
            return None
        names = {f.name for f in settings_fields(self.Settings)}
        given = {key: config_to_dict(value) for key, value in cfg.declared.items() if key in names}
        return build_section(self.Settings, given, "data")

    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        """``split`` (train | val | test | one of :attr:`extra_splits`) from the annotation ``folder``; None for a
        ``val`` the dataset does not have (it is then held out of training)."""
        raise NotImplementedError

    def validation_from_train(self, val: SplitPart) -> SplitPart:
        """The validation split made of the training pairs of the held-out videos (``val``): by default every caption
        of each, scored one-to-one where each has one and multi-caption otherwise."""
        if val.protocol != "paragraph":
            val.protocol = evaluation_protocol(val)
        return val


class ParagraphFormat(DatasetFormat):
    """A format whose videos are each described by one paragraph (DiDeMo, ActivityNet: the ``paragraph`` protocol),
    a split in one file: CLIP-ViP's JSON lines (``*.jsonl``, one object of :attr:`jsonl_fields` a line) or the
    dataset's original JSON, which :meth:`read_original` reads."""

    #: the dataset's name in messages
    title: ClassVar[str] = ""
    #: per split, the file names it may have (the first found is read)
    files: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: what each line of the JSON-lines layout holds, for messages
    jsonl_fields: ClassVar[str] = ""

    #: splits the dataset has no file for, held out of training instead (ActivityNet: its val_1 is the test split)
    held_out: ClassVar[tuple[str, ...]] = ()

    def read_original(self, path: Path) -> list[tuple[str, list[str]]]:
        """(video, sentences) per video of the dataset's original JSON file."""
        raise NotImplementedError

    def read(self, folder: Path, cfg: DataConfig, split: str) -> SplitPart | None:
        if split in self.held_out:
            return None
        if split not in self.files:
            names = [s for s in ("train", "val", "test") if s in self.files or s in self.held_out]
            raise AnnotationError(f"{self.title} has splits {' / '.join(names)}, not {split!r}")
        path = pick_file(folder, self.files[split], f"{self.title} {split}")
        if path.suffix == ".jsonl":
            groups = jsonl_groups(path, f"JSON lines {self.jsonl_fields}")
        else:
            groups = self.read_original(path)
        return groups_part(groups, "paragraph", [path.name])
