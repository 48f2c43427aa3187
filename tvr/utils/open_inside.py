"""Opening a file by its path inside a folder so that what is opened is inside the folder, whatever changes meanwhile.

Resolving a path by name and opening it afterwards is a race: whoever can write inside the folder can replace a
checked file, or a folder on its way, with a symbolic link to a file elsewhere between the check and the open.
:func:`open_inside` never opens a name through a link: it walks the path one component at a time from the folder's
open descriptor (``openat`` with ``O_NOFOLLOW``), and when a component is a symbolic link it reads the link and
walks its target the same way — from the folder holding the link, or, for an absolute target, from the folder's
own descriptor when the target names a place inside it. A ``..`` above the folder, or an absolute target elsewhere,
raises :class:`OutsideFolderError`. Links that stay inside keep working (a video indexed through one is served),
as ``openat2(RESOLVE_BENEATH)`` would do on Linux 5.6+, but in portable Python. The file is opened without blocking
(``O_NONBLOCK``: a FIFO is refused by the caller's ``fstat``, not waited on); the caller checks the descriptor.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: links followed on one path before it is refused as a loop (Linux's limit)
MAX_LINKS = 40
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
#: what ``open`` with ``O_NOFOLLOW`` answers for a symbolic link (Linux: ELOOP, or ENOTDIR with O_DIRECTORY;
#: FreeBSD: EMLINK)
_LINK_ERRORS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


class OutsideFolderError(OSError):
    """The path leads out of the folder (``..`` above it, or a symbolic link to a place elsewhere)."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EXDEV, "leads outside the folder", path)


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def open_inside(folder_fd: int, folder: str | os.PathLike, path: str) -> int:
    """A new descriptor of the file at the relative ``path`` inside the folder open as ``folder_fd`` (whose real
    path, no link in it, is ``folder``), opened as the module docstring says; :class:`OutsideFolderError` when it
    leads out, the OSError of a name that is not there."""
    root = _parts(str(folder))
    pending = _parts(path)
    walked = [os.dup(folder_fd)]  # the folders walked so far; walked[0] is the folder itself
    links = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == "..":
                if len(walked) == 1:
                    raise OutsideFolderError(path)
                os.close(walked.pop())
                continue
            flags = _FILE_FLAGS if not pending else _FOLDER_FLAGS
            try:
                fd = os.open(name, flags, dir_fd=walked[-1])
            except OSError as exc:
                if exc.errno not in _LINK_ERRORS:
                    raise
                try:
                    target = os.readlink(name, dir_fd=walked[-1])
                except OSError:
                    raise exc from None  # not a link: a file where a folder should be
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path) from None
                if target.startswith("/"):
                    inside = _parts(target)
                    if inside[: len(root)] != root:
                        raise OutsideFolderError(path) from None
                    while len(walked) > 1:
                        os.close(walked.pop())
                    target = "/".join(inside[len(root) :])
                pending = _parts(target) + pending
                continue
            if not pending:
                return fd
            walked.append(fd)
        raise IsADirectoryError(errno.EISDIR, "names a folder, not a file", path)
    finally:
        for fd in walked:
            os.close(fd)


def open_folder(folder: str | os.PathLike) -> tuple[int, Path]:
    """(a descriptor of ``folder``, its real path): what :func:`open_inside` walks from."""
    real = Path(os.path.realpath(folder))
    return os.open(real, _FOLDER_FLAGS), real
