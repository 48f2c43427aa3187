"""Search your own videos: index a folder of videos with any tvr model, query it by text, serve it on a web page.

``tvr index`` (:func:`tvr.search.build.build_index`), ``tvr search`` and ``tvr serve``; the library entry point is
:func:`open_index`: ``open_index(path).search("a dog runs on the beach", k=10) -> list[Hit]``. Layout, manifest,
windows, resume, model stamping and serving are described in docs/search.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CaptionHit", "Hit", "SearchIndex", "open_index"]


def __getattr__(name: str) -> Any:
    # imported on first use, so that tvr.search.defaults (read by the command line) does not load torch
    if name in __all__:
        from tvr.search import index

        return getattr(index, name)
    raise AttributeError(f"module 'tvr.search' has no attribute {name!r}")
