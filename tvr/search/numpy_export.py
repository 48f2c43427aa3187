"""Writing a model's query side as numpy data (read by :mod:`tvr.search.numpy_query`), checked against the model.

Only a model whose query side :mod:`tvr.search.numpy_query` computes is written: a backbone that answers its
``sentence_query_side`` (a sentence-transformers BERT — absolute positions, ``gelu`` — followed by mean pooling and
optionally ``Normalize``, with ConSE or fused ConSE as the bridge: the two-tower backbone's module answers it,
:class:`~tvr.models.backbones.base.SentenceQuerySide`), an HF fast tokenizer, and an indexable head. Whatever
else the model holds, the written export is then read back and compared with the model on probe texts; anything it
does not reproduce within :data:`~tvr.search.numpy_query.TOLERANCE` is not written, and that index keeps the torch
query path.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tvr.models.backbones.base import NotExportableError, SentenceQuerySide
from tvr.search.export_files import ExportWriter, write_failed, written_already
from tvr.search.numpy_query import (
    FORMAT,
    TOKENIZER,
    TOLERANCE,
    VERSION,
    WEIGHTS,
    NumpyQueryEncoder,
    current_numpy_export,
    numpy_export_folder,
)
from tvr.search.stamps import checkpoint_file_state, quick_queries_enabled

log = logging.getLogger(__name__)


def _query_side(encoder: Any) -> SentenceQuerySide:
    """What the model's backbone answers for its query side (:class:`~tvr.models.backbones.base.SentenceQuerySide`);
    NotExportableError when it has none."""
    backbone = getattr(encoder.model, "backbone", None)
    answer = getattr(backbone, "sentence_query_side", None)
    if answer is None:
        raise NotExportableError(f"backbone {type(backbone).__name__} has no sentence query side")
    return answer(getattr(encoder.model, "bridge", None))


def _tower(side: SentenceQuerySide, tokenizer: Any) -> tuple[dict[str, np.ndarray], dict[str, Any], str]:
    """The text tower's arrays (``bert.*``), its shape, and its tokenizer as ``tokenizer.json`` text."""
    hf = getattr(tokenizer, "tokenizer", None)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or hf.padding_side != "right":
        raise NotExportableError("its tokenizer is not an HF fast tokenizer")
    config = side.bert.config
    arrays = {
        f"bert.{name}": linear_layout(name, value.detach().float().cpu().numpy())
        for name, value in side.bert.state_dict().items()
    }
    shape = {
        "layers": int(config.num_hidden_layers),
        "heads": int(config.num_attention_heads),
        "eps": float(config.layer_norm_eps),
        "normalize": side.normalize,
    }
    return arrays, shape, backend.to_str()


def linear_layout(name: str, value: np.ndarray) -> np.ndarray:
    """A linear layer's weight [out, in] stored as [in, out] (what :class:`~tvr.search.numpy_query.BertSentenceTower`
    multiplies by); embeddings and vectors as they are."""
    if value.ndim == 2 and name.endswith(".weight") and "embeddings" not in name:
        return np.ascontiguousarray(value.T)
    return value


def _fusion(side: SentenceQuerySide) -> dict[str, np.ndarray]:
    if side.fusion["kind"] == "fused":
        return {"fusion.class_embeddings": side.class_embeddings.detach().float().cpu().numpy()}
    return {}


def largest_difference(encoder: Any, export: NumpyQueryEncoder, texts: list[str]) -> float:
    """The largest |difference| between a coordinate of the export's query vectors and the model's shortlist
    vectors, over ``texts`` encoded alone at every length a search pads to (inf when the token ids differ)."""
    from tvr.search.encoders import one_torch_thread, padded_lengths

    worst = 0.0
    lengths = padded_lengths(encoder.max_words)
    with torch.inference_mode(), one_torch_thread():  # as a search encodes queries
        for text in texts:
            ids, mask = encoder.token_ids([text], encoder.max_words)
            if ids[0][mask[0].bool()].tolist() != export.token_ids(text):
                return float("inf")
            got = export.query_vector(text)
            for length in lengths:
                if int(mask.sum()) > length:
                    continue
                want = encoder.head.shortlist_texts(encoder.encode_texts([text], length)).float().cpu().numpy()
                if want.shape != got.shape:
                    return float("inf")
                worst = max(worst, float(np.abs(want.astype(np.float64) - got).max()))
    return worst


def export_numpy_query(encoder: Any, probes: list[str]) -> Path | None:
    """Write the numpy query side of ``encoder`` (a model encoder on the CPU) to the cache when the model is one it
    computes and it agrees with the model on ``probes`` (module docstring); returns the folder, or None. A write
    that fails (a full disk) is one warning."""
    if not quick_queries_enabled() or not hasattr(encoder, "model") or not encoder.head.indexable:
        return None
    stamp = encoder.stamp()
    folder = numpy_export_folder(stamp)
    if written_already(lambda: current_numpy_export(stamp, folder)):
        return folder
    try:
        side = _query_side(encoder)
        arrays, shape, tokenizer = _tower(side, encoder.tokenizer())
        fusion_arrays, fusion = _fusion(side), side.fusion
    except NotExportableError as exc:
        log.info("no numpy query side for this model: %s", exc)
        return None
    try:
        return _write(encoder, stamp, folder, {**arrays, **fusion_arrays}, shape, fusion, tokenizer, probes)
    except Exception as exc:  # noqa: BLE001 - the torch query path is the fallback
        write_failed(log, "numpy query side", folder, exc)
        return None


def _write(
    encoder: Any,
    stamp: dict[str, Any],
    folder: Path,
    arrays: dict[str, np.ndarray],
    shape: dict[str, Any],
    fusion: dict[str, Any],
    tokenizer: str,
    probes: list[str],
) -> Path | None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with ExportWriter(folder) as writer:
        writer.write(WEIGHTS, buffer.getvalue())
        del buffer
        writer.write(TOKENIZER, tokenizer)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "stamp": stamp,
            "max_words": int(encoder.max_words),
            "tower": shape,
            "fusion": fusion,
            "checkpoint_file": checkpoint_file_state(stamp),
        }
        writer.write_meta(meta)
        worst = largest_difference(encoder, NumpyQueryEncoder(writer.work), probes)
        if not worst <= TOLERANCE:
            log.info("the numpy query side differs from the model by %.3g (> %g): not used", worst, TOLERANCE)
            return None
        writer.write_meta({**meta, "largest_difference": worst})
        return writer.commit()
