"""Where an index's windows are kept: the index folder (FAISS, the default) or a Qdrant collection, behind one seam
(:mod:`tvr.search.stores.base`). :func:`parse_target` tells which an ``--out`` / index argument names; the Qdrant
modules import ``qdrant-client`` / ``qdrant-edge-py`` only when a Qdrant address is used."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tvr.search.stores.qdrant import QdrantAddress


def parse_target(target: str | os.PathLike) -> Path | QdrantAddress:
    """A folder (a path), or a Qdrant store's address (``qdrant://HOST:PORT/COLLECTION``, ``qdrant+https://…``,
    ``qdrant+local:PATH``, ``qdrant+edge:PATH``); a URL of any other scheme is refused in a line."""
    if isinstance(target, Path):
        return target
    from tvr.search.stores.qdrant import looks_like_address, parse_address

    text = os.fspath(target)
    return parse_address(text) if looks_like_address(text) else Path(text)
