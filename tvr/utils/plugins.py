"""Plug-ins of installed packages: the objects an entry-point group names, each loaded and checked on its own, so
one broken plug-in is reported and does not hide the others."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)


def load_entry_points(group: str, check: Callable[[Any, str], Any], kind: str) -> Iterator[tuple[str, Any]]:
    """(name, checked object) for every entry point of ``group`` that loads and passes ``check(obj, what)``; one
    that does not is logged as a warning naming the ``kind`` of plug-in, and skipped."""
    for entry in importlib.metadata.entry_points(group=group):
        try:
            yield entry.name, check(entry.load(), f"entry point {entry.name} = {entry.value}")
        except Exception as exc:  # one broken plug-in must not hide the others
            log.warning("%s entry point %s (%s) could not be loaded: %s", kind, entry.name, entry.value, exc)
