"""A model's stamp: the identity an index records of the model that built it, and the check that refuses another.

A stamp is a dict with ``encoder`` (its kind: ``checkpoint``, ``config`` or ``pretrained``), ``id`` (a content hash:
two encoders with the same stamp embed identically) and descriptive fields. Kept apart from the encoders, which
import torch, so that a query path without torch (:mod:`tvr.search.numpy_query`) checks stamps as the others do.
"""

from __future__ import annotations

import os
from typing import Any

from tvr.utils.errors import UserError


class EncoderMismatchError(UserError, RuntimeError):
    """An index was built with another model than the one offered to query or extend it."""


def describe_stamp(stamp: dict[str, Any]) -> str:
    kind = stamp.get("encoder", "?")
    if kind == "checkpoint":
        return (
            f"checkpoint {stamp.get('path', '?')} (sha256 {str(stamp.get('id', '?'))[:12]}…, head "
            f"{stamp.get('head', '?')})"
        )
    if kind == "config":
        return (
            f"the model of config {stamp.get('name') or '?'} (weights sha256 {str(stamp.get('id', '?'))[:12]}…, "
            f"head {stamp.get('head', '?')})"
        )
    if kind == "pretrained":
        return (
            f"the pretrained model {stamp.get('name') or stamp.get('source') or '?'} ({stamp.get('family', '?')}, "
            f"weights sha256 {str(stamp.get('id', '?'))[:12]}…)"
        )
    return f"encoder {kind} ({str(stamp.get('id', '?'))[:12]}…)"


def check_stamp(mine: dict[str, Any], stamp: dict[str, Any], where: str) -> None:
    """Raise :class:`EncoderMismatchError` unless ``stamp`` (an index's) is the same model as ``mine``."""
    if (stamp.get("encoder"), stamp.get("id")) != (mine["encoder"], mine["id"]):
        raise EncoderMismatchError(
            f"{where} was built with {describe_stamp(stamp)}, not with {describe_stamp(mine)}: embeddings of "
            "different models cannot be compared; query it with the model it was built with, or build a new "
            "index with this one (--out elsewhere)"
        )


def quick_queries_enabled() -> bool:
    """Whether the exported query sides (:mod:`tvr.search.query_encoder`, :mod:`tvr.search.numpy_query`) are written
    and used (``TVR_QUICK_QUERIES=0`` turns both off)."""
    return os.environ.get("TVR_QUICK_QUERIES", "1") not in ("0", "", "false", "no")


def numpy_queries_enabled() -> bool:
    """Whether a search from the shell may answer from a numpy query side (:mod:`tvr.search.numpy_query`;
    ``TVR_NUMPY_QUERIES=0`` keeps the torch export, ``TVR_QUICK_QUERIES=0`` turns every export off)."""
    return quick_queries_enabled() and os.environ.get("TVR_NUMPY_QUERIES", "1") not in ("0", "", "false", "no")


def checkpoint_file_state(stamp: dict[str, Any]) -> list[int] | None:
    """(size, mtime_ns) of a checkpoint stamp's file, None when it is not a file (or the stamp is not a checkpoint):
    an export made from a checkpoint is used only while the file is unchanged."""
    if stamp.get("encoder") != "checkpoint":
        return None
    try:
        info = os.stat(stamp.get("path", ""))
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns]
