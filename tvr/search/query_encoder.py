"""The text side of an index's model, exported once so that a cold ``tvr search`` loads only what a text query needs.

Querying an index needs the tokenizer, the backbone's text path (and the bridge's, for a two-tower model) and the
head; building the whole model for it imports transformers and sentence-transformers and loads the image tower,
which is most of a cold start. So when an index's model is loaded in full (``tvr index``, or the first query of an
index), its text side is exported to tvr's cache (``$TVR_CACHE_DIR``, default ``~/.cache/tvr``), under the model's
stamp id:

* ``text.pt``: ``model.text_features`` traced with TorchScript (token ids and mask in, ``TextFeatures`` fields out),
  frozen so that it holds only the weights the text path reads; it loads with torch alone;
* the tokenizer as data: an HF fast tokenizer's ``tokenizer.json`` (run by the ``tokenizers`` library with the
  padding and truncation tvr asks of it), or CLIP's ``vocab.json`` + ``merges.txt`` (run by tvr's own BPE);
* ``head.pt``: the head's state dict (read with ``weights_only``), rebuilt from the head config in ``meta.json``, so
  the shortlist embedding and the exact rerank run the head's own code.

An export is written only after it has been read back and checked against the full model on probe texts (one at a
time and batched, short, long, truncated and non-ASCII): the same token ids, bit-identical features and text state.
Anything else (a tokenizer of another kind, a model whose trace bakes in a batch size, a failed check) writes
nothing, and that index keeps loading the full model. A checkpoint's export is used only while the checkpoint file
still has the size and modification time it had when exported, so a changed checkpoint is refused as before.

``text.pt`` is TorchScript, which loading compiles and runs, so an export is written and read as
:mod:`tvr.search.export_files` describes: only in a cache no other user can write (every folder from ``/`` down),
each file read from the descriptor it was checked on, at the size and SHA-256 ``meta.json`` recorded when tvr wrote
it, and loaded from those bytes — the TorchScript torch compiles is the file tvr wrote and checked. torch's own
writers serialise into memory (``torch.jit.save`` aborts the process when a disk fills up under it), so a full disk
is one warning. Anything unusable is one warning, and the full model loads. ``TVR_QUICK_QUERIES=0`` turns the export
and its use off.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tvr.search.encoders import SearchEncoder, padded_lengths
from tvr.search.export_files import (
    ExportFiles,
    ExportWriter,
    check_fields,
    export_exists,
    is_count,
    is_number,
    load_current_export,
    write_failed,
    written_already,
)
from tvr.search.numpy_query import export_root  # one folder for both kinds of export
from tvr.search.stamps import checkpoint_file_state, quick_queries_enabled
from tvr.types import TextFeatures, VideoFeatures

log = logging.getLogger(__name__)

FORMAT = "tvr-query-encoder"
#: 2: every file's size and SHA-256 recorded in meta.json, read through tvr.search.export_files
VERSION = 2
#: the longest padded query an export may be made for (CLIP's context is 77 tokens)
MAX_WORDS = 4096
#: texts every export is checked on: plain, short, empty after cleaning, longer than any max_words, non-ASCII
PROBE_TEXTS = (
    "a dog runs on the beach",
    "a",
    "Ünïcödé café, 2 cats & a ‘quoted’ dog!! <b>bold</b>",
    " ".join(["a man rides a red bicycle along the river while children play"] * 8),
    "...",
    "people dancing at night",
)
_FEATURE_FIELDS = ("eot", "words", "word_mask")


def export_folder(stamp: dict[str, Any]) -> Path:
    """Where the export of the model with this stamp lives (TorchScript files are read by the torch that wrote
    them: the torch version is part of the name)."""
    return export_root() / f"{stamp['id']}-v{VERSION}-torch{torch.__version__}"


# ------------------------------------------------------------------------------------------ tokenizers as data


def _save_tokenizer(tokenizer: Any, folder: Path) -> dict[str, Any] | None:
    """Write ``tokenizer`` (a ``(texts, max_words) -> (ids, mask)`` callable) as data; None for a kind this module
    cannot rebuild without its library."""
    from tvr.data.sentence_tokenizer import SentenceTokenizer
    from tvr.data.tokenizer import ClipTokenizer

    if isinstance(tokenizer, ClipTokenizer):
        tokenizer.save(folder)
        return {"kind": "clip-bpe"}
    if isinstance(tokenizer, SentenceTokenizer):
        hf = tokenizer.tokenizer
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None or hf.padding_side != "right" or hf.pad_token_id is None:
            return None
        (folder / "tokenizer.json").write_text(backend.to_str(), encoding="utf-8")
        return {"kind": "tokenizers", "pad_id": int(hf.pad_token_id), "pad_token": str(hf.pad_token)}
    return None


class _FastTokenizer:
    """An HF fast tokenizer's backend called as :class:`~tvr.data.sentence_tokenizer.SentenceTokenizer` calls it
    (pad to ``max_words`` on the right, truncate to it, no token type ids). Thread-safe, as that one is: calls take
    turns, since changing the padding length changes the backend's state."""

    def __init__(self, text: str, pad_id: int, pad_token: str) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(text)
        self.pad_id, self.pad_token = pad_id, pad_token
        self._length: int | None = None
        self._lock = threading.Lock()

    def __call__(self, texts: list[str], max_words: int) -> tuple[Tensor, Tensor]:
        with self._lock:
            if self._length != max_words:
                self.backend.enable_truncation(max_length=max_words)
                self.backend.enable_padding(length=max_words, pad_id=self.pad_id, pad_token=self.pad_token)
                self._length = max_words
            encoded = self.backend.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in encoded], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in encoded], dtype=torch.long)
        return ids, mask


def _load_tokenizer(files: ExportFiles, spec: dict[str, Any]) -> Any:
    if spec["kind"] == "clip-bpe":
        from tvr.data.tokenizer import ClipTokenizer

        texts = {name: files.read(name).decode("utf-8") for name in ("vocab.json", "merges.txt")}
        # the Python BPE: exact (ClipTokenizer checks the two agree) and no transformers import
        return ClipTokenizer.from_texts(texts, files.folder, backend="python")
    if spec["kind"] == "tokenizers":
        return _FastTokenizer(files.read("tokenizer.json").decode("utf-8"), int(spec["pad_id"]), str(spec["pad_token"]))
    raise ValueError(f"unknown tokenizer kind {spec['kind']!r}")


def _is_tokenizer_spec(spec: Any) -> bool:
    """What :func:`_save_tokenizer` records."""
    if not isinstance(spec, dict):
        return False
    if spec.get("kind") == "tokenizers":
        return is_count(spec.get("pad_id"), 0, 1 << 31) and isinstance(spec.get("pad_token"), str)
    return spec.get("kind") == "clip-bpe"


def _check_meta(meta: dict[str, Any], folder: Path) -> None:
    """Refuse a ``meta.json`` whose fields are not what :class:`QueryEncoder` computes with."""
    stamp, tokenizer, head, fields = meta.get("stamp"), meta.get("tokenizer"), meta.get("head"), meta.get("fields")
    lengths = meta.get("query_lengths")
    check_fields(
        folder,
        [
            ("stamp", isinstance(stamp, dict) and isinstance(stamp.get("id"), str), "the model stamp"),
            ("max_words", is_count(meta.get("max_words"), 1, MAX_WORDS), f"a count of words up to {MAX_WORDS}"),
            (
                "query_lengths",
                isinstance(lengths, list) and all(is_count(n, 1, MAX_WORDS) for n in lengths),
                "a list of lengths",
            ),
            (
                "fields",
                isinstance(fields, list)
                and bool(fields)
                and len(set(fields)) == len(fields)
                and set(fields) <= set(_FEATURE_FIELDS),
                f"distinct names among {list(_FEATURE_FIELDS)}",
            ),
            ("tokenizer", _is_tokenizer_spec(tokenizer), "a tokenizer tvr exports"),
            (
                "head",
                isinstance(head, dict)
                and isinstance(head.get("config"), dict)
                and is_count(head.get("dim"), 1, 1 << 20)
                and is_number(head.get("logit_scale_init")),
                "the head's config, dim and logit scale",
            ),
        ],
    )


# ------------------------------------------------------------------------------------------ the encoder


class _TextPath(nn.Module):
    """``model.text_features`` as a module with tensor outputs (what TorchScript traces)."""

    def __init__(self, model: nn.Module, fields: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.fields = fields

    def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
        features = self.model.text_features({"text_ids": ids, "text_mask": mask})
        return tuple(getattr(features, name) for name in self.fields)


class QueryEncoder(SearchEncoder):
    """The exported text side of a model: encodes queries exactly as the full model does; it has no image side
    (:meth:`window_features` raises), so indexing and ranking captions for a clip load the full model."""

    has_image_side = False

    def __init__(self, folder: str | os.PathLike) -> None:
        from tvr.config import HeadConfig, build_section, check_import_trusted
        from tvr.models.heads.registry import build_head
        from tvr.utils.torch_files import load_torch_bytes

        self.folder = Path(folder)
        with ExportFiles(self.folder, FORMAT, VERSION) as files:
            self.meta = files.meta
            _check_meta(self.meta, self.folder)
            self.device = torch.device("cpu")
            self.max_words = int(self.meta["max_words"])
            self.fields = tuple(self.meta["fields"])
            self.tokenize = _load_tokenizer(files, self.meta["tokenizer"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript's; see export_query_encoder
                # the bytes that were checked, never the file's name again (module docstring)
                self.text_path = torch.jit.load(io.BytesIO(files.read("text.pt")), map_location="cpu")
            head_meta = self.meta["head"]
            head_cfg = build_section(HeadConfig, head_meta["config"], "the exported head config")
            check_import_trusted(head_cfg.name, "the exported head config's head.name")  # as for the full model
            self.head = build_head(head_cfg, int(head_meta["dim"]), float(head_meta["logit_scale_init"]))
            state = load_torch_bytes(files.read("head.pt"), self.folder / "head.pt")
        self.head.load_state_dict(state)
        self.head.eval()

    def stamp(self) -> dict[str, Any]:
        return self.meta["stamp"]

    def token_ids(self, texts: list[str], length: int) -> tuple[Tensor, Tensor]:
        return self.tokenize(list(texts), length)

    def text_features(self, texts: list[str], length: int | None = None) -> TextFeatures:
        ids, mask = self.token_ids(texts, length or self.max_words)
        # the graph as it is: the optimising executor would spend the first calls (all a cold search makes)
        # profiling shapes to specialise the graph for later ones
        with torch.jit.optimized_execution(False):
            outputs = self.text_path(ids, mask)
        return TextFeatures(**dict(zip(self.fields, outputs, strict=True)))

    def window_features(self, crops: Tensor, mask: Tensor) -> VideoFeatures:
        raise RuntimeError("a query encoder has no image side: load the index's full model to encode video")


def load_query_encoder(stamp: dict[str, Any]) -> QueryEncoder | None:
    """The export of the model ``stamp`` names, or None (none written, turned off, or a checkpoint that changed
    since: the full model then loads, and is checked against the stamp as always). An export that cannot be used
    (module docstring) is one warning."""
    if not quick_queries_enabled() or not stamp.get("id"):
        return None
    return load_current_export(
        log, "query encoder", export_folder(stamp), lambda folder: _current_export(stamp, folder)
    )


def _current_export(stamp: dict[str, Any], folder: Path) -> QueryEncoder | None:
    """The export in ``folder`` when it is the one of ``stamp``; None when there is none or it is another's (a
    changed checkpoint, another model, lengths it was not checked at); raises when it cannot be read."""
    if not export_exists(folder):
        return None
    encoder = QueryEncoder(folder)
    meta = encoder.meta
    changed = stamp.get("encoder") == "checkpoint" and checkpoint_file_state(stamp) != meta.get("checkpoint_file")
    unchecked = meta.get("query_lengths") != padded_lengths(encoder.max_words)
    if encoder.stamp().get("id") != stamp["id"] or changed or unchecked:
        return None  # a changed checkpoint, or a length a search pads to that the export was not checked at
    return encoder


def _same(a: Any, b: Any) -> bool:
    """Two feature / state dataclasses with bit-identical tensors (None where the other is None)."""
    import dataclasses

    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if (x is None) != (y is None) or (isinstance(x, Tensor) and not torch.equal(x, y)):
            return False
    return True


def export_query_encoder(encoder: Any) -> Path | None:
    """Export the text side of ``encoder`` (a :class:`~tvr.search.encoders.ModelEncoder` on the CPU) to the cache,
    checked against it (module docstring); returns the folder, or None when nothing was written. Never raises for a
    model it cannot export: that index keeps loading the full model."""
    if not quick_queries_enabled() or not hasattr(encoder, "model") or encoder.device.type != "cpu":
        return None
    if encoder.padded_lengths() != padded_lengths(encoder.max_words):
        return None  # a model fed one length only (SigLIP): an export pads queries to QUERY_LENGTHS
    stamp = encoder.stamp()
    folder = export_folder(stamp)
    try:
        from tvr.search.numpy_export import export_numpy_query

        export_numpy_query(encoder, list(PROBE_TEXTS))
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.info("the query side of this model was not exported to numpy: %s", exc)
    if written_already(lambda: _current_export(stamp, folder)):
        return folder
    try:
        return _write_export(encoder, stamp, folder)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        write_failed(log, "query export", folder, exc)
        return None


def _in_memory(save: Any) -> bytes:
    """What ``save(file)`` writes, as bytes: torch's writers abort the process (SIGABRT, a C++ backtrace) when the
    disk fills up under them, so they write to memory and the bytes are written by :class:`ExportWriter`."""
    buffer = io.BytesIO()
    save(buffer)
    return buffer.getvalue()


def _write_export(encoder: Any, stamp: dict[str, Any], folder: Path) -> Path | None:
    max_words = int(encoder.max_words)
    tokenizer = encoder.tokenizer()
    model = encoder.model
    head = encoder.head
    with ExportWriter(folder) as writer:
        spec = _save_tokenizer(tokenizer, writer.work)
        if spec is None:
            log.info("tokenizer %s cannot be exported as data", type(tokenizer).__name__)
            return None
        ids, mask = tokenizer(list(PROBE_TEXTS[:3]), max_words)
        with torch.no_grad():
            sample = model.text_features({"text_ids": ids, "text_mask": mask})
            fields = tuple(name for name in _FEATURE_FIELDS if getattr(sample, name) is not None)
            path = _TextPath(model, fields).eval()
            with warnings.catch_warnings():
                # TorchScript is deprecated in favour of torch.export, whose programs take several seconds of
                # imports to load: for a cold start TorchScript is the form that loads with torch alone
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(path, (ids, mask), check_trace=False)
                traced = torch.jit.freeze(traced, optimize_numerics=False)
                writer.write("text.pt", _in_memory(lambda buffer: torch.jit.save(traced, buffer)))
        writer.write("head.pt", _in_memory(lambda buffer: torch.save(head.state_dict(), buffer)))
        head_config = encoder.head_config()
        writer.write_meta(
            {
                "format": FORMAT,
                "version": VERSION,
                "stamp": stamp,
                "torch": torch.__version__,
                "max_words": max_words,
                "query_lengths": padded_lengths(max_words),
                "fields": list(fields),
                "tokenizer": spec,
                "head": {
                    "config": head_config,
                    "dim": int(head.dim),
                    "logit_scale_init": float(head.logit_scale.item()),
                },
                "checkpoint_file": checkpoint_file_state(stamp),
            }
        )
        check = QueryEncoder(writer.work)
        with torch.no_grad():
            ok = all(
                torch.equal(a, b)
                for a, b in zip(
                    tokenizer(list(PROBE_TEXTS), max_words), check.tokenize(list(PROBE_TEXTS), max_words), strict=True
                )
            )
            batches = [list(PROBE_TEXTS)] + [[text] for text in PROBE_TEXTS]
            # every length a search pads queries to (encoders.QUERY_LENGTHS): the trace must not bake in one
            lengths = padded_lengths(max_words)
            for texts, length in itertools.product(batches if ok else [], lengths):
                want = encoder.text_features(texts, length).to("cpu", torch.float32)
                got = check.text_features(texts, length).to("cpu", torch.float32)
                if not (_same(want, got) and _same(head.encode_texts(want), check.head.encode_texts(got))):
                    ok = False
                    break
        if not ok:
            log.info("the exported text side differs from the model on the probe texts: not used")
            return None
        return writer.commit()
