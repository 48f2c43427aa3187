"""A two-tower index's query side in numpy: a cold ``tvr search`` that never imports torch.

``import torch`` alone takes longer than the 2 s a cold search may take on a small machine, so for the models whose
query side is small enough to write out — a sentence-transformers BERT text tower (mean pooling, optionally
normalised), ConSE's text side (the identity) or fused ConSE's (:mod:`tvr.models.backbones.two_tower.class_fusion`),
and an indexable
head whose shortlist vector is the normalised text vector (CLIP4Clip with mean pooling) — ``tvr index`` also writes
the query side as data next to the TorchScript export (:mod:`tvr.search.query_encoder`), under the model's stamp id:

* ``weights.npz``: the text tower's weights, and fused ConSE's class embeddings (arrays only, read with
  ``allow_pickle=False``);
* ``tokenizer.json``: the HF fast tokenizer, run by the ``tokenizers`` library as the model's tokenizer is run;
* ``meta.json``: the stamp, the tower's shape, the fusion's settings, and the largest difference measured against
  the model.

numpy's arithmetic is not torch's, so its query vectors are not bit-identical to the model's: an export is written
only when, on probe texts (short, long, truncated, non-ASCII), its token ids equal the model's and no coordinate of a
query vector differs from the model's by more than :data:`TOLERANCE` (the differences measured on MiniLM-L6 are
near 1e-7). Scores then differ from the model's by as little, so only windows whose scores are that close can
swap places. It answers single text queries only; a server (micro-batched queries whose answers must equal serial
ones bit for bit), an exact rerank and everything with video load the torch model.

Nothing in it runs as code, but it decides the rankings, so it is read as the TorchScript export is
(:mod:`tvr.search.export_files`): from a cache no other user can write, each file from the descriptor it was checked
on (a FIFO refused, not waited on), at the size and SHA-256 ``meta.json`` recorded when tvr wrote it, and the
weights only as an archive of stored (never deflated) float32 arrays whose shapes are the tower's that ``meta.json``
describes. Anything else is one warning, and the query goes to the torch path.
"""

from __future__ import annotations

import io
import logging
import math
import os
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tvr.search.export_files import (
    ExportFiles,
    bad_meta,
    check_fields,
    export_exists,
    is_count,
    is_number,
    load_current_export,
)
from tvr.search.stamps import check_stamp, checkpoint_file_state, numpy_queries_enabled
from tvr.utils.io import cache_root
from tvr.utils.private_files import UntrustedFileError

log = logging.getLogger(__name__)

FORMAT = "tvr-numpy-query"
#: 2: every file's size and SHA-256 recorded in meta.json, read through tvr.search.export_files
VERSION = 2
#: the largest weights.npz read (a BERT-large text tower is 1.3 GB)
MAX_WEIGHTS_BYTES = 4 << 30
#: the longest query, in tokens, an export may be made for
MAX_WORDS = 4096
#: the largest |difference| allowed between a coordinate of a numpy query vector and the model's (unit vectors)
TOLERANCE = 1e-5
WEIGHTS = "weights.npz"
TOKENIZER = "tokenizer.json"
META = "meta.json"


def export_root() -> Path:
    """The folder of every model's exported query sides (the TorchScript ones too, :mod:`tvr.search.query_encoder`)."""
    return cache_root() / "query-encoders"


def numpy_export_folder(stamp: dict[str, Any]) -> Path:
    """Where the numpy query side of the model with this stamp lives (beside its TorchScript export)."""
    return export_root() / f"{stamp['id']}-numpy-v{VERSION}"


# ------------------------------------------------------------------------------------------ the arithmetic


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(variance + np.float32(eps)) * weight + bias


class _ErfTable:
    """erf by cubic Hermite interpolation of a table of ``math.erf`` and its derivative (2/√π)·exp(−x²) every 1/1024
    on [0, 6] (erf is odd; beyond 6 it is 1 to double precision): the error is below h⁴/384 · max|erf⁗| ≈ 1e-14,
    far under float32's step, and it costs a few array operations where ``math.erf`` per element cost 25 ms a
    query. numpy has no erf, and scipy's import alone would cost a cold search a third of a second."""

    step = 1.0 / 1024.0
    limit = 6.0

    def __init__(self) -> None:
        grid = np.arange(0.0, self.limit + 2 * self.step, self.step)
        self.values = np.array([math.erf(x) for x in grid.tolist()])
        self.slopes = (2.0 / math.sqrt(math.pi)) * np.exp(-grid * grid) * self.step

    def __call__(self, z: np.ndarray) -> np.ndarray:
        scaled = np.minimum(np.abs(z), self.limit) / self.step
        i = scaled.astype(np.int64)
        t = scaled - i
        t2, t3 = t * t, t * t * t
        left, right = self.values[i], self.values[i + 1]
        value = (
            (2 * t3 - 3 * t2 + 1) * left
            + (t3 - 2 * t2 + t) * self.slopes[i]
            + (3 * t2 - 2 * t3) * right
            + (t3 - t2) * self.slopes[i + 1]
        )
        return np.copysign(value, z)


_ERF: _ErfTable | None = None


def gelu(x: np.ndarray) -> np.ndarray:
    """x·Φ(x) with the exact error function (BERT's ``gelu``), computed in float64 and rounded back."""
    global _ERF
    if _ERF is None:
        _ERF = _ErfTable()
    wide = x.astype(np.float64)
    return (0.5 * wide * (1.0 + _ERF(wide * (1.0 / math.sqrt(2.0))))).astype(np.float32)


def unit(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to length one (``F.normalize``: a zero row stays zero)."""
    norm = np.sqrt((x.astype(np.float64) ** 2).sum(axis=-1, keepdims=True))
    return (x / np.maximum(norm, eps)).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class BertSentenceTower:
    """A sentence-transformers BERT (absolute positions, ``gelu``) with mean pooling: token ids [n, L] and mask →
    sentence embeddings [n, D], normalised when the model's last module is ``Normalize``."""

    def __init__(self, weights: Mapping[str, np.ndarray], layers: int, heads: int, eps: float, normalize: bool) -> None:
        self.w = {
            name: np.asarray(array, dtype=np.float32) for name, array in weights.items() if name.startswith("bert.")
        }
        self.layers, self.heads, self.eps, self.normalize = int(layers), int(heads), float(eps), bool(normalize)

    @staticmethod
    def shape_problem(weights: Mapping[str, np.ndarray], layers: int, max_words: int) -> str | None:
        """Why ``weights`` are not the arrays of a ``layers``-layer tower that reads ``max_words`` tokens (what
        :meth:`__call__` indexes and multiplies), or None."""

        def shape(name: str) -> tuple[int, ...] | None:
            array = weights.get(f"bert.{name}")
            return None if array is None else tuple(array.shape)

        words, inner = shape("embeddings.word_embeddings.weight"), shape("encoder.layer.0.intermediate.dense.bias")
        if words is None or len(words) != 2 or not inner or len(inner) != 1:
            return "no word embeddings [vocabulary, width] or no first layer"
        width = words[1]
        positions, types = (
            shape("embeddings.position_embeddings.weight"),
            shape("embeddings.token_type_embeddings.weight"),
        )
        if positions is None or len(positions) != 2 or positions[1] != width or positions[0] < max_words:
            return f"array bert.embeddings.position_embeddings.weight is {positions}, not [>= {max_words}, {width}]"
        if types is None or len(types) != 2 or types[1] != width or types[0] < 1:
            return f"array bert.embeddings.token_type_embeddings.weight is {types}, not [>= 1, {width}]"
        want = {"embeddings.LayerNorm.weight": (width,), "embeddings.LayerNorm.bias": (width,)}
        for i in range(layers):
            at = f"encoder.layer.{i}"
            for name, rows, columns in (
                *((f"attention.self.{part}", width, width) for part in ("query", "key", "value")),
                ("attention.output.dense", width, width),
                ("intermediate.dense", width, inner[0]),
                ("output.dense", inner[0], width),
            ):
                want[f"{at}.{name}.weight"], want[f"{at}.{name}.bias"] = (rows, columns), (columns,)
            for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
                want[f"{at}.{norm}.weight"] = want[f"{at}.{norm}.bias"] = (width,)
        for name, expected in want.items():
            if shape(name) != expected:
                return f"array bert.{name} is {shape(name) or 'missing'}, not {list(expected)}"
        return None

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        # stored [in, out] (numpy_export.linear_layout): a product with a contiguous matrix, twice as fast as with
        # the transpose of torch's [out, in]
        return x @ self.w[f"bert.{name}.weight"] + self.w[f"bert.{name}.bias"]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return layer_norm(x, self.w[f"bert.{name}.weight"], self.w[f"bert.{name}.bias"], self.eps)

    def _attention(self, x: np.ndarray, at: str, blocked: np.ndarray) -> np.ndarray:
        n, length, width = x.shape
        size = width // self.heads

        def heads(name: str) -> np.ndarray:  # [n, heads, length, size]
            projected = self._linear(x, f"{at}.attention.self.{name}")
            return projected.reshape(n, length, self.heads, size).transpose(0, 2, 1, 3)

        q, k, v = heads("query"), heads("key"), heads("value")
        weights = softmax((q @ k.transpose(0, 1, 3, 2)) / np.float32(math.sqrt(size)) + blocked)
        context = (weights @ v).transpose(0, 2, 1, 3).reshape(n, length, width)
        return self._linear(context, f"{at}.attention.output.dense")

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        length = ids.shape[1]
        w = self.w
        x = (
            w["bert.embeddings.word_embeddings.weight"][ids]
            + w["bert.embeddings.position_embeddings.weight"][:length]
            + w["bert.embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        blocked = np.where(mask[:, None, None, :] > 0, np.float32(0.0), np.finfo(np.float32).min)
        for i in range(self.layers):
            at = f"encoder.layer.{i}"
            x = self._norm(self._attention(x, at, blocked) + x, f"{at}.attention.output.LayerNorm")
            hidden = gelu(self._linear(x, f"{at}.intermediate.dense"))
            x = self._norm(self._linear(hidden, f"{at}.output.dense") + x, f"{at}.output.LayerNorm")
        valid = mask[:, :, None].astype(np.float32)
        pooled = (x * valid).sum(axis=1) / np.maximum(valid.sum(axis=1), np.float32(1e-9))
        return unit(pooled) if self.normalize else pooled


def fused_query(embedding: np.ndarray, class_embeddings: np.ndarray, weight: float, temperature: float) -> np.ndarray:
    """Fused ConSE's text side (:func:`tvr.models.backbones.two_tower.class_fusion.fuse_text`): [n, W] → [n, W + C +
    2]."""
    u = unit(embedding)
    cosines = u @ class_embeddings.T
    classes = unit(softmax(cosines / np.float32(temperature)))
    ones = np.ones((len(u), 1), dtype=np.float32)
    return np.concatenate([(1.0 - weight) * u, weight * classes, ones, np.zeros_like(ones)], axis=1).astype(np.float32)


# ------------------------------------------------------------------------------------------ the encoder


class NumpyQueryEncoder:
    """The numpy query side of an index's model (module docstring): :meth:`query_vector` is the head's shortlist
    vector of one text, which for these heads is the exact score's."""

    #: the shortlist's score is the head's exact score: nothing is reranked
    indexable = True
    #: no image tower: ranking captions for a clip loads the full model
    has_image_side = False
    head = None

    def __init__(self, folder: str | os.PathLike) -> None:
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        with ExportFiles(self.folder, FORMAT, VERSION) as files:
            self.meta = files.meta
            _check_meta(self.meta, self.folder)
            self.max_words = int(self.meta["max_words"])
            tokenizer_text = files.read(TOKENIZER).decode("utf-8")
            arrays = read_arrays(files.read(WEIGHTS, max_bytes=MAX_WEIGHTS_BYTES), self.folder / WEIGHTS)
        try:
            self.tokenizer = Tokenizer.from_str(tokenizer_text)
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own exception type
            raise UntrustedFileError(self.folder / TOKENIZER, f"not a tokenizer ({exc})") from None
        self.tokenizer.enable_truncation(max_length=self.max_words)
        self.tokenizer.no_padding()
        tower, fusion = self.meta["tower"], self.meta["fusion"]
        _check_arrays(arrays, self.meta, self.tokenizer.get_vocab_size(with_added_tokens=True), self.folder)
        self.tower = BertSentenceTower(arrays, tower["layers"], tower["heads"], tower["eps"], tower["normalize"])
        self.class_embeddings = arrays["fusion.class_embeddings"] if fusion["kind"] == "fused" else None
        self.fusion = fusion

    def stamp(self) -> dict[str, Any]:
        return self.meta["stamp"]

    def check_stamp(self, stamp: dict[str, Any], where: str) -> None:
        check_stamp(self.stamp(), stamp, where)

    def token_ids(self, text: str) -> list[int]:
        """The text's token ids, truncated to ``max_words``, unpadded."""
        return list(self.tokenizer.encode(text).ids)

    def query_vector(self, text: str) -> np.ndarray:
        """The shortlist vector [1, E] (float32) of one query, encoded alone (so it never depends on other queries)."""
        from threadpoolctl import threadpool_limits

        ids = np.asarray([self.token_ids(text)], dtype=np.int64)
        # one BLAS thread: these products are small, and on a busy 2-core machine a second thread waiting for the
        # first made a query 5-8 times slower (270-445 ms against 53 ms, measured)
        with threadpool_limits(limits=1, user_api="blas"):
            embedding = self.tower(ids, np.ones_like(ids))
            if self.class_embeddings is not None:
                embedding = fused_query(
                    embedding, self.class_embeddings, float(self.fusion["weight"]), float(self.fusion["temperature"])
                )
            return unit(embedding)


def load_numpy_query_encoder(stamp: dict[str, Any]) -> NumpyQueryEncoder | None:
    """The numpy query side of the model ``stamp`` names, or None (none written, quick queries turned off, or a
    checkpoint that changed since: the torch export or the full model then loads). One that cannot be used (module
    docstring) is one warning."""
    if not numpy_queries_enabled() or not stamp.get("id"):
        return None
    return load_current_export(
        log, "numpy query side", numpy_export_folder(stamp), lambda folder: current_numpy_export(stamp, folder)
    )


def current_numpy_export(stamp: dict[str, Any], folder: Path) -> NumpyQueryEncoder | None:
    """The export in ``folder`` when it is the one of ``stamp``; None when there is none or it is another's (a
    changed checkpoint); raises when it cannot be read."""
    if not export_exists(folder):
        return None
    encoder = NumpyQueryEncoder(folder)
    if encoder.stamp().get("id") != stamp["id"] or (
        stamp.get("encoder") == "checkpoint" and encoder.meta.get("checkpoint_file") != checkpoint_file_state(stamp)
    ):
        return None
    return encoder


# ------------------------------------------------------------------------------------------ checks


#: a zip member's local header: signature, then (at 26) the lengths of its name and extra field
_LOCAL_HEADER = struct.Struct("<4s22xHH")


def read_arrays(data: bytes, path: Path) -> dict[str, np.ndarray]:
    """The float32 arrays of the ``np.savez`` archive ``data`` (the file ``path``), read only when every member is
    stored (``np.savez`` never compresses, and a deflated member could inflate a few kB into gigabytes) and its
    ``.npy`` header gives a C-order float32 array that fits in the bytes the member holds: the arrays take no more
    memory than the file's size. Their integrity is the SHA-256 checked when the file was read (the zip's CRCs are
    not computed again)."""
    arrays = {}
    view = memoryview(data)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
        for info in members:
            name = info.filename
            if info.compress_type != zipfile.ZIP_STORED or not name.endswith(".npy"):
                raise UntrustedFileError(path, f"member {name} is not a stored .npy array (np.savez writes those)")
            signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(data, info.header_offset)
            start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
            member = view[start : start + info.file_size]
            if signature != b"PK\x03\x04" or len(member) != info.file_size:
                raise UntrustedFileError(path, f"member {name} is cut short")
            arrays[name.removesuffix(".npy")] = _npy_view(member, name, path)
    except UntrustedFileError:
        raise
    except (zipfile.BadZipFile, struct.error, ValueError, EOFError) as exc:
        raise UntrustedFileError(path, f"not an archive of arrays tvr wrote ({exc})") from None
    return arrays


def _npy_view(member: memoryview, name: str, path: Path) -> np.ndarray:
    """The float32 array of one ``.npy`` member, a view of its bytes, once its header checks out."""
    header = io.BytesIO(member[:16])
    version = np.lib.format.read_magic(header)
    if version not in ((1, 0), (2, 0)):
        raise UntrustedFileError(path, f"member {name}: .npy format {version}, not 1.0 or 2.0")
    prefix = 10 if version == (1, 0) else 12  # magic, version, and the header's length (2 or 4 bytes)
    length = int.from_bytes(member[8:prefix], "little")
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    header = io.BytesIO(member[: prefix + length])
    np.lib.format.read_magic(header)
    shape, fortran, dtype = read_header(header)
    count = math.prod(shape)
    if dtype != np.dtype(np.float32) or fortran or prefix + length + 4 * count > len(member):
        raise UntrustedFileError(path, f"member {name}: {dtype} {list(shape)}, not a C-order float32 array it holds")
    # a copy, as np.load makes: aligned memory, so numpy multiplies with BLAS exactly as it did (a view of the bytes
    # can be misaligned, and numpy's own loop rounds differently: rankings must not change)
    return np.frombuffer(member, np.float32, count=count, offset=prefix + length).reshape(shape).copy()


def _is_fusion(fusion: Any) -> bool:
    if not isinstance(fusion, dict):
        return False
    if fusion.get("kind") == "fused":
        return is_number(fusion.get("weight")) and is_number(fusion.get("temperature"), positive=True)
    return fusion.get("kind") == "none"


def _check_meta(meta: dict[str, Any], folder: Path) -> None:
    """Refuse a ``meta.json`` whose fields are not what :class:`NumpyQueryEncoder` computes with."""
    stamp, tower, fusion = meta.get("stamp"), meta.get("tower"), meta.get("fusion")
    check_fields(
        folder,
        [
            ("stamp", isinstance(stamp, dict) and isinstance(stamp.get("id"), str), "the model stamp"),
            ("max_words", is_count(meta.get("max_words"), 1, MAX_WORDS), f"a count of tokens up to {MAX_WORDS}"),
            (
                "tower",
                isinstance(tower, dict)
                and is_count(tower.get("layers"), 1, 1024)
                and is_count(tower.get("heads"), 1, 1 << 16)
                and is_number(tower.get("eps"), positive=True)
                and isinstance(tower.get("normalize"), bool),
                "the tower's layers, heads, eps and normalize",
            ),
            ("fusion", _is_fusion(fusion), "none, or fused with a weight and a positive temperature"),
        ],
    )


def _check_arrays(arrays: dict[str, np.ndarray], meta: dict[str, Any], vocabulary: int, folder: Path) -> None:
    """Refuse weights that are not the tower (and class embeddings) ``meta.json`` describes, or a tokenizer whose
    ids reach past the word embeddings."""
    tower = meta["tower"]
    parts = (name.split(".") for name in arrays if name.startswith("bert.encoder.layer."))
    stored = {int(part[3]) if part[3].isdigit() else -1 for part in parts}
    if stored != set(range(tower["layers"])):
        raise bad_meta(folder, f"'tower.layers' is {tower['layers']}, but {WEIGHTS} holds {len(stored)} layers")
    problem = BertSentenceTower.shape_problem(arrays, tower["layers"], meta["max_words"])
    if problem is not None:
        raise UntrustedFileError(folder / WEIGHTS, problem)
    words, width = arrays["bert.embeddings.word_embeddings.weight"].shape
    if width % tower["heads"]:
        raise bad_meta(folder, f"'tower.heads' is {tower['heads']}, which does not divide the width {width}")
    if vocabulary > words:
        raise UntrustedFileError(folder / TOKENIZER, f"{vocabulary} tokens, more than the {words} word embeddings")
    if meta["fusion"]["kind"] == "fused":
        classes = arrays.get("fusion.class_embeddings")
        if classes is None or classes.ndim != 2 or classes.shape[1] != width or not len(classes):
            shape = None if classes is None else list(classes.shape)
            raise UntrustedFileError(
                folder / WEIGHTS, f"array fusion.class_embeddings is {shape}, not [classes, {width}]"
            )
