"""An exclusive lock on a folder a job writes (a run folder, a ``prepare`` or ``features`` destination).

Two jobs writing one folder corrupt each other quietly: two ``train`` on one ``--out`` interleave their logs, or
one deletes the other's checkpoint mid-write. :func:`folder_lock` holds an OS lock (``flock``) on
``<folder>/.tvr.lock`` for the life of the job, so a second job stops at once with a message naming the holder.

The OS drops the lock when its process dies, however it dies (``kill -9`` included), so a crash never leaves the
folder locked; the lock file of a crashed job is left behind, and the next job, finding it unlocked, takes it over
and logs that the earlier holder ended without releasing it. A job that ends normally removes the file.

The lock file is opened without following a symbolic link and must be a plain file with one name: a folder that
arrives with ``.tvr.lock`` linked to another file (``-> ../../victim.txt``, or a hard link) would otherwise have
that file truncated and overwritten with the holder's description.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tvr.utils.data_files import DataFileError, parse_json
from tvr.utils.errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = ".tvr.lock"


class FolderBusyError(UserError):
    """Another live process holds the folder's lock."""


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on the open file ``fd`` without waiting; False when another process holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


#: open flags of the lock file: never through a symbolic link (O_NOFOLLOW), never blocking on a FIFO (O_NONBLOCK)
_OPEN_FLAGS = (
    os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
)


def _open_lock_file(path: Path, what: str, folder: Path) -> int:
    """Open (creating it) the lock file at ``path``; a symbolic link, a hard link or anything but a plain file there
    is refused, since the holder's description is written into what is opened."""

    def refuse(kind: str) -> UserError:
        return UserError(
            f"{what} {folder}: {LOCK_NAME} is {kind}, not a lock file tvr wrote, and tvr never writes through it: "
            "remove it (after checking where it came from) or use another folder"
        )

    try:
        fd = os.open(path, _OPEN_FLAGS, 0o666)
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP
            raise refuse(f"a symbolic link to {os.readlink(path)!r}") from None
        if os.path.isdir(path):
            raise refuse("a folder") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise refuse("not a plain file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} names")
    return fd


def _read_holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", errors="replace")
        holder = parse_json(text, "the lock file") if text.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, DataFileError):
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "a process that did not say who it is"
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {when}: {holder.get('command', '?')}"


def _busy(what: str, folder: Path, holder: dict) -> FolderBusyError:
    return FolderBusyError(
        f"{what} {folder} is in use by another tvr job ({_describe(holder)}); wait for it to finish or use another "
        "folder"
    )


def check_unlocked(folder: str | os.PathLike, what: str = "folder") -> None:
    """Raise :class:`FolderBusyError` naming the holder when another live process holds ``folder``'s lock; nothing
    is created (a job checks this before its slow start, and takes the lock itself with :func:`folder_lock`)."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    if not path.exists() and not path.is_symlink():
        return
    fd = _open_lock_file(path, what, folder)
    try:
        if not _try_lock(fd):
            raise _busy(what, folder, _read_holder(fd))
    finally:
        os.close(fd)  # closing the file releases a lock this check took


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "folder") -> Iterator[Path]:
    """Hold an exclusive lock on ``folder`` (created if missing) inside the block; raises :class:`FolderBusyError`
    naming the holder when another live process holds it. ``what`` names the folder in messages (``run folder``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = _open_lock_file(path, what, folder)
        if not _try_lock(fd):
            holder = _read_holder(fd)
            os.close(fd)
            raise _busy(what, folder, holder)
        # a job that was releasing may have removed the file after we opened it: lock the file that is there now
        try:
            current = os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        mine = os.fstat(fd)
        if (mine.st_ino, mine.st_dev) == (current.st_ino, current.st_dev):
            break
        os.close(fd)
    try:
        previous = _read_holder(fd)
        if previous:
            log.warning(
                "%s %s: the lock of an earlier job (%s) was never released (it crashed or was killed); taking it over",
                what,
                folder,
                _describe(previous),
            )
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "command": " ".join(sys.argv)[:500],
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode("utf-8"))
        yield folder
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding the lock, so no one else can be using this file
        os.close(fd)
