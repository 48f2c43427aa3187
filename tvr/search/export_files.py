"""The files of a query export in tvr's cache, written and read the same way for both kinds (the TorchScript text side,
:mod:`tvr.search.query_encoder`; the numpy query side, :mod:`tvr.search.numpy_query`).

Writing (:class:`ExportWriter`): only under a cache no other user can write (:mod:`tvr.utils.private_files`); into a
temporary folder beside the export, every file from bytes tvr produced in memory (torch's own writers abort the
process when a disk fills up under them) through :func:`~tvr.utils.io.atomic_write_bytes`; then ``meta.json``, which
records every other file's size and SHA-256; group and others' write permission removed; the folder renamed into
place. A write that fails (a full disk) raises the OSError, and the temporary folder is removed; temporaries an
earlier, killed export left behind are removed once they are an hour old.

Reading (:class:`ExportFiles`): the folder opened by :class:`~tvr.utils.private_files.PrivateFolder` (every folder
from ``/`` down to it private to this user), ``meta.json`` read (at most :data:`META_MAX_BYTES`) and checked to be
of the expected format and version, every other file read from its checked descriptor at the size and SHA-256
``meta.json`` records, so what a reader loads is byte for byte what tvr wrote and checked against the model.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tvr.utils.data_files import DataFileError, parse_json
from tvr.utils.errors import first_line
from tvr.utils.io import atomic_write_bytes, atomic_write_json, create_temporary_dir, remove_stale_temporaries
from tvr.utils.private_files import (
    PrivateFolder,
    UntrustedFileError,
    check_private,
    describe_files,
    keep_private,
    make_folders,
)

META = "meta.json"
#: the most bytes a ``meta.json`` may hold (tvr's are a few kB: the stamp, the head's config, the file records)
META_MAX_BYTES = 4 << 20
#: how old a temporary folder in the export cache must be to be taken for one a killed export left behind
STALE_SECONDS = 3600.0

_warned: set[str] = set()
T = TypeVar("T")


def warn_once(log: logging.Logger, message: str, key: str | None = None) -> None:
    """``log.warning(message)`` once per process for each ``key`` (default: the message): a search that meets the
    same unusable cache file for both kinds of export, or when reading and again when writing, says so once."""
    key = message if key is None else key
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def not_used(log: logging.Logger, what: str, folder: Path, exc: BaseException) -> None:
    """Report an export that exists but is not read (``exc`` says why): one warning; the full model loads."""
    key = str(exc) if isinstance(exc, UntrustedFileError) else None
    detail = first_line(exc)
    if isinstance(exc, UntrustedFileError) and exc.path.is_relative_to(folder) and exc.path != folder:
        detail = f"{exc.path.relative_to(folder)}: {exc.why}"  # the folder is named once
    warn_once(log, f"not using the {what} in {folder} ({detail}); loading the full model", key)


def load_current_export(log: logging.Logger, what: str, folder: Path, current: Callable[[Path], T | None]) -> T | None:
    """``current(folder)``, the export in ``folder`` when it is the one wanted (else None), for a search to use: None
    too when it was removed meanwhile (another process writing it anew), and one warning when it exists but cannot be
    used (an unusable export is only slower: the caller falls back to the full model)."""
    try:
        return current(folder)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - see the docstring
        not_used(log, what, folder, exc)
        return None


def written_already(current: Callable[[], object | None]) -> bool:
    """Whether ``current()`` finds the wanted export written already, for an exporter to skip its work; one that
    cannot be read counts as none (it is written anew)."""
    try:
        return current() is not None
    except Exception:  # noqa: BLE001 - see the docstring
        return False


class ExportFormatError(UntrustedFileError):
    """An export whose ``meta.json`` (or a file it records) is not what tvr writes."""


def export_exists(folder: Path) -> bool:
    """Whether anything stands where the export's ``meta.json`` would be (a reader then reports what it finds)."""
    return os.path.lexists(folder / META)


class ExportFiles:
    """An export folder opened for reading (module docstring): :attr:`meta`, and :meth:`read` for its files."""

    def __init__(self, folder: str | os.PathLike, format: str, version: int) -> None:
        self.folder = Path(folder)
        self._private = PrivateFolder(self.folder)
        try:
            raw = self._private.read(META, max_bytes=META_MAX_BYTES)
            try:
                meta = parse_json(raw, self.folder / META)
            except DataFileError as exc:
                raise ExportFormatError(self.folder / META, exc.problem) from None
            if not isinstance(meta, dict) or meta.get("format") != format or meta.get("version") != version:
                raise ExportFormatError(self.folder / META, f"not a {format} version {version}")
            files = meta.get("files")
            if not isinstance(files, dict) or not all(
                isinstance(name, str) and isinstance(record, dict) for name, record in files.items()
            ):
                raise ExportFormatError(self.folder / META, "'files' is not the record of the export's files")
        except BaseException:
            self._private.close()
            raise
        self.meta: dict[str, Any] = meta

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        """The bytes of the export's file ``name``, as ``meta.json`` records them (and at most ``max_bytes``)."""
        record = self.meta["files"].get(name)
        if record is None:
            raise ExportFormatError(self.folder / name, f"not a file {META} records")
        return self._private.read(name, max_bytes=max_bytes, record=record)

    def close(self) -> None:
        self._private.close()

    def __enter__(self) -> ExportFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bad_meta(folder: Path, problem: str) -> ExportFormatError:
    """The error of a ``meta.json`` field that is not what the reader computes with."""
    return ExportFormatError(folder / META, problem)


def check_fields(folder: Path, checks: list[tuple[str, Any, str]]) -> None:
    """Refuse ``meta.json`` at the first ``(key, ok, expected)`` whose ``ok`` is false: "'key' is not expected"."""
    for key, ok, expected in checks:
        if not ok:
            raise bad_meta(folder, f"'{key}' is not {expected}")


def is_count(value: Any, low: int, high: int) -> bool:
    """An integer (not a bool) in [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def is_number(value: Any, positive: bool = False) -> bool:
    """A finite int or float (not a bool), > 0 when ``positive``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (value > 0 or not positive)


class ExportWriter:
    """A temporary folder beside the export ``folder`` to write it into (module docstring); :meth:`commit` puts it in
    place. Use it as a context manager: an export not committed is removed."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        make_folders(self.folder.parent)
        check_private(self.folder.parent)
        remove_stale_temporaries(self.folder.parent, min_age_seconds=STALE_SECONDS)
        self.work = create_temporary_dir(self.folder)
        os.chmod(self.work, 0o700)  # nobody else may open a file of the export while it is being written

    def write(self, name: str, data: bytes | str) -> Path:
        """Write one file of the export (text as UTF-8)."""
        return atomic_write_bytes(self.work / name, data.encode("utf-8") if isinstance(data, str) else data)

    def write_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Write ``meta.json``: ``meta`` and the record of every file written so far; returns what was written."""
        meta = {**meta, "files": describe_files(self.work, skip=(META,))}
        atomic_write_json(self.work / META, meta)
        keep_private(self.work)  # read back (checked against the model) as any reader reads it
        return meta

    def commit(self) -> Path:
        keep_private(self.work)
        if os.path.lexists(self.folder):
            if self.folder.is_dir() and not self.folder.is_symlink():
                shutil.rmtree(self.folder)
            else:
                self.folder.unlink()
        os.replace(self.work, self.folder)
        return self.folder

    def __enter__(self) -> ExportWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.work.exists():
            shutil.rmtree(self.work, ignore_errors=True)


def write_failed(log: logging.Logger, what: str, folder: Path, exc: BaseException) -> None:
    """Report an export that could not be written: a file system's failure (a full disk) or a cache others can
    write is a warning (searches of this model then load the full model), anything else only an info line."""
    if isinstance(exc, UntrustedFileError):
        message = f"the {what} of this model is not written to the cache ({exc}); searches load the full model"
        warn_once(log, message, str(exc))
    elif isinstance(exc, OSError):
        where = exc.filename or folder
        warn_once(
            log,
            f"the {what} of this model could not be written to {where} ({exc.strerror or exc}); searches load the "
            "full model",
        )
    else:
        log.info("the %s of this model was not written: %s", what, exc)
