"""Nested results as plain JSON values: one walk over mappings and sequences, with each writer's own rule for the
values at the leaves (metrics refuse what they cannot write, the web API states anything as text, training turns
tensors and arrays into numbers and lists)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def plain_json(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with every mapping rebuilt as a dict with string keys, every list and tuple as a list, and every
    other value replaced by ``leaf(value)``."""
    if isinstance(value, Mapping):
        return {str(k): plain_json(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v, leaf) for v in value]
    return leaf(value)
