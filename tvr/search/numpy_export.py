"""Writing a model's query side as numpy data (read by :mod:`tvr.search.numpy_query`), checked against the model.

Only a model whose query side :mod:`tvr.search.numpy_query` computes is written: a two-tower backbone whose text
tower is a sentence-transformers BERT (absolute positions, ``gelu``) followed by mean pooling and optionally
``Normalize``, ConSE or fused ConSE as the bridge, and an indexable head. Whatever else the model holds, the written
export is then read back and compared with the model on probe texts; anything it does not reproduce within
:data:`~tvr.search.numpy_query.TOLERANCE` is not written, and that index keeps the torch query path.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tvr.search.export_files import ExportWriter, write_failed
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


class NotExportableError(Exception):
    """The model's query side is not one :mod:`tvr.search.numpy_query` computes (the message says why)."""


def _tower(encoder: Any) -> tuple[dict[str, np.ndarray], dict[str, Any], str]:
    """The text tower's arrays (``bert.*``), its shape, and its tokenizer as ``tokenizer.json`` text."""
    backbone = getattr(encoder.model, "backbone", None)
    tower = getattr(backbone, "text_tower", None)
    modules = list(getattr(tower, "model", None) or [])
    names = [type(module).__name__ for module in modules]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise NotExportableError(f"text tower modules {names}, not Transformer + Pooling (+ Normalize)")
    bert = modules[0].auto_model
    config = bert.config
    if type(bert).__name__ != "BertModel" or config.hidden_act != "gelu":
        raise NotExportableError(f"text model {type(bert).__name__} with {config.hidden_act!r}, not a gelu BertModel")
    if getattr(config, "position_embedding_type", "absolute") != "absolute" or config.is_decoder:
        raise NotExportableError("text model with relative positions or a decoder")
    pooling = modules[1].get_config_dict()
    mean_only = pooling.get("pooling_mode") == "mean" or (
        pooling.get("pooling_mode_mean_tokens") is True
        and not any(value for key, value in pooling.items() if key.startswith("pooling_mode_") and "mean" not in key)
    )
    if not mean_only:
        raise NotExportableError(f"pooling {pooling}, not mean pooling")
    hf = getattr(encoder.tokenizer(), "tokenizer", None)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or hf.padding_side != "right":
        raise NotExportableError("its tokenizer is not an HF fast tokenizer")
    arrays = {
        f"bert.{name}": linear_layout(name, value.detach().float().cpu().numpy())
        for name, value in bert.state_dict().items()
    }
    shape = {
        "layers": int(config.num_hidden_layers),
        "heads": int(config.num_attention_heads),
        "eps": float(config.layer_norm_eps),
        "normalize": names[-1] == "Normalize",
    }
    return arrays, shape, backend.to_str()


def linear_layout(name: str, value: np.ndarray) -> np.ndarray:
    """A linear layer's weight [out, in] stored as [in, out] (what :class:`~tvr.search.numpy_query.BertSentenceTower`
    multiplies by); embeddings and vectors as they are."""
    if value.ndim == 2 and name.endswith(".weight") and "embeddings" not in name:
        return np.ascontiguousarray(value.T)
    return value


def _fusion(encoder: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    bridge = getattr(encoder.model, "bridge", None)
    kind = type(bridge).__name__
    if kind == "ConseBridge":
        return {}, {"kind": "none"}
    if kind == "FusedConseBridge":
        arrays = {"fusion.class_embeddings": bridge.class_embeddings.detach().float().cpu().numpy()}
        return arrays, {
            "kind": "fused",
            "weight": float(bridge.class_weight),
            "temperature": float(bridge.class_temperature),
        }
    raise NotExportableError(f"bridge {kind}, not ConSE or fused ConSE")


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
    try:
        if current_numpy_export(stamp, folder) is not None:
            return folder
    except Exception:  # noqa: BLE001 - an export that cannot be used is written anew
        pass
    try:
        arrays, shape, tokenizer = _tower(encoder)
        fusion_arrays, fusion = _fusion(encoder)
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
