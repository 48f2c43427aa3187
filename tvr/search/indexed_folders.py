"""Which folder this user indexed into which index: the folder ``tvr serve`` serves videos from by default.

An index records the folder it was built from (``manifest.json``'s ``source.root``), but an index is data that may
come from elsewhere, and a manifest edited to say ``/`` (or any folder above the indexed one) would otherwise widen
what the server reads to every file whose size and modification time it names. So the default is not taken from the
index alone: when ``tvr index`` (:func:`~tvr.search.build.build_index`) finishes an index it also records, in this
user's cache (``$TVR_CACHE_DIR/indexed-folders/``, private to the user like every cache file tvr trusts,
:mod:`tvr.utils.private_files`), the pair (the index folder's real path, the folder it indexed). ``tvr serve`` then
serves from the manifest's folder only when this user's record for that index names the same folder; an index made
elsewhere, moved, or whose manifest names another folder needs ``--media-root``, and the operator names the folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from tvr.utils.data_files import parse_json
from tvr.utils.errors import UserError
from tvr.utils.io import atomic_write_json, cache_root
from tvr.utils.private_files import PrivateFolder, UntrustedFileError, check_private, keep_private, make_folders

log = logging.getLogger(__name__)

FORMAT = "tvr-indexed-folder"
#: the most bytes a record may hold (two paths)
MAX_RECORD_BYTES = 64 << 10


def records_folder() -> Path:
    """Where the records live: ``$TVR_CACHE_DIR/indexed-folders`` (default ``~/.cache/tvr``)."""
    return cache_root() / "indexed-folders"


def _record_name(index: str | os.PathLike) -> tuple[str, str]:
    """(the index folder's real path, the name of its record)."""
    real = os.path.realpath(index)
    return real, hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json"


def record_indexed_folder(index: str | os.PathLike, root: str | os.PathLike) -> None:
    """Record that this user indexed ``root`` into ``index``. A record that cannot be written (a full disk, a cache
    others can write) is a warning: the index is complete, and ``tvr serve`` then needs ``--media-root``."""
    real, name = _record_name(index)
    folder = records_folder()
    try:
        make_folders(folder, mode=0o700)  # nobody else may even open a record while it is being written
        check_private(folder)
        atomic_write_json(folder / name, {"format": FORMAT, "index": real, "root": str(root)})
        keep_private(folder)
    except (OSError, UntrustedFileError) as exc:
        log.warning(
            "could not record in %s that %s holds the videos of %s (%s); tvr serve will need --media-root",
            folder,
            root,
            real,
            exc,
        )


def _recorded_root(index: str | os.PathLike) -> tuple[str | None, str]:
    """(the folder this user's record says was indexed into ``index``, or None; why there is none)."""
    real, name = _record_name(index)
    try:
        with PrivateFolder(records_folder()) as folder:
            record: Any = parse_json(folder.read(name, max_bytes=MAX_RECORD_BYTES), records_folder() / name)
    except FileNotFoundError:
        return None, "this user did not build it from that folder with tvr index (made elsewhere, moved or copied)"
    except (OSError, ValueError) as exc:
        return None, f"its record cannot be read ({exc})"
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("index") != real:
        return None, f"its record in {records_folder()} is not one tvr wrote"
    root = record.get("root")
    return (root, "") if isinstance(root, str) else (None, "its record names no folder")


def default_media_root(index: str | os.PathLike, root: str | os.PathLike) -> Path:
    """``root`` (the folder an index's manifest names) when this user indexed that folder into ``index``; otherwise a
    :class:`~tvr.utils.errors.UserError` asking for ``--media-root``."""
    recorded, why = _recorded_root(index)
    if recorded is not None and recorded == str(root):
        return Path(root)
    if recorded is not None:
        why = f"this user indexed {recorded} into it, so the manifest was changed since"
    raise UserError(
        f"{index}: the index says its videos are in {root}, but {why}; videos are served only from a folder you "
        "indexed or name: pass --media-root FOLDER"
    )
