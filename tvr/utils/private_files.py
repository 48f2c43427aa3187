"""Files tvr trusts because it wrote them itself: what it keeps in its cache (the query exports it loads instead of
a model, the record of which folder a user indexed into an index).

A cache is trusted only as far as nobody else can write it. Whoever can write the cache root, or any folder above
it, can rename a folder of it away and put their own in its place between a check and a read; a check by name
followed by a read by name is therefore a race. So, as ssh does for ``~/.ssh``, a cache folder is opened with
:class:`PrivateFolder`:

* its path (links resolved once) is walked from ``/`` one folder at a time, each opened relative to the one above it
  without following a symbolic link (``openat`` with ``O_NOFOLLOW``) and checked on its open descriptor: it belongs
  to this user or to root, and nobody else can write it — a folder others may write is accepted only when it is
  sticky and belongs to this user or root (``/tmp``: others may add names there, never rename or remove ours);
* a file is opened relative to the folder's descriptor, without following a link and without blocking
  (``O_NONBLOCK``: a FIFO in a file's place is refused, not waited on), checked on its descriptor (a regular file of
  this user or root that nobody else can write, of the size recorded when it was written) and read whole from that
  descriptor; its SHA-256 is compared with the one recorded when it was written (:func:`describe_files`).

A caller loads what it reads from those bytes (``io.BytesIO``), never from the file's name again, so the file loaded
is the file checked. Anything else raises :class:`UntrustedFileError` naming the path and why (or the OSError of a
file or folder that is not there).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from tvr.utils.errors import UserError
from tvr.utils.io import file_kind, file_sha256

#: how a folder on the way is opened: never through a symbolic link
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: how a file is opened: never through a symbolic link, never waiting for a FIFO's writer
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class UntrustedFileError(UserError, ValueError):
    """A cache file or folder tvr does not read: another user could have written it, it is not a regular file, or it
    is not what tvr recorded when it wrote it."""

    def __init__(self, path: str | os.PathLike, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = Path(path)
        self.why = why


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _owner_problem(info: os.stat_result, folder: bool) -> str | None:
    """Why another user could have written what ``info`` describes, or None."""
    if not hasattr(os, "getuid"):  # pragma: no cover - no Unix permissions to check
        return None
    me = os.getuid()
    if info.st_uid not in (me, 0):
        return f"it belongs to another user (uid {info.st_uid}), not to this one (uid {me}) or root"
    if info.st_mode & 0o022:
        if folder and info.st_mode & stat.S_ISVTX:
            return None  # sticky: others may add names, but never rename or remove this user's or root's
        return f"others can write it (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _open_below(dir_fd: int, name: str, flags: int, path: Path) -> int:
    """``name`` opened relative to ``dir_fd`` with ``flags``; a symbolic link there is refused by name."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            try:
                linked = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                linked = False
            if linked:
                raise UntrustedFileError(path, "a symbolic link; tvr reads its cache without following links") from None
        raise


class PrivateFolder:
    """A cache folder opened by the walk of the module docstring; :meth:`read` reads a file of it by its descriptor.
    Use it as a context manager (the descriptor is closed at the end)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(os.path.realpath(path))
        fd = os.open("/", _FOLDER_FLAGS)
        walked = Path("/")
        try:
            self._check_folder(fd, walked)
            for name in self.path.parts[1:]:
                walked = walked / name
                below = _open_below(fd, name, _FOLDER_FLAGS, walked)
                os.close(fd)
                fd = below
                self._check_folder(fd, walked)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    @staticmethod
    def _check_folder(fd: int, path: Path) -> None:
        problem = _owner_problem(os.fstat(fd), folder=True)
        if problem is not None:
            raise UntrustedFileError(path, f"{problem}; tvr trusts a cache folder only if no other user can change it")

    def read(self, name: str, *, max_bytes: int | None = None, record: dict[str, Any] | None = None) -> bytes:
        """The bytes of the file ``name`` of this folder: at most ``max_bytes``, or of the size and SHA-256 that
        ``record`` (``{"size": …, "sha256": …}``, :func:`describe_files`) gives."""
        path = self.path / name
        if os.sep in name or name in ("", ".", ".."):
            raise UntrustedFileError(path, "not a file name")
        fd = _open_below(self.fd, name, _FILE_FLAGS, path)
        with os.fdopen(fd, "rb", buffering=0) as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UntrustedFileError(
                    path, f"{file_kind(info.st_mode)}, not a regular file; only regular files are read"
                )
            problem = _owner_problem(info, folder=False)
            if problem is not None:
                raise UntrustedFileError(
                    path, f"{problem}; tvr trusts a cache file only if no other user can change it"
                )
            size = info.st_size
            expected = None if record is None else record.get("size")
            if record is not None and size != expected:
                wrote = f"{expected:,}" if isinstance(expected, int) else repr(expected)
                raise UntrustedFileError(path, f"{size:,} bytes, not the {wrote} tvr wrote")
            if max_bytes is not None and size > max_bytes:
                raise UntrustedFileError(path, f"{size:,} bytes; at most {max_bytes:,} expected")
            data = handle.read(size + 1)
        if len(data) != size:
            raise UntrustedFileError(path, "it changed while it was read")
        if record is not None and sha256_hex(data) != record.get("sha256"):
            raise UntrustedFileError(path, "its SHA-256 is not the one recorded when tvr wrote it (changed since)")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> PrivateFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe_files(folder: str | os.PathLike, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """``{name: {"size": bytes, "sha256": hex}}`` of the regular files of ``folder`` (but ``skip``): the record a
    writer keeps beside them for :meth:`PrivateFolder.read`."""
    files = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name not in skip and entry.is_file(follow_symlinks=False):
            files[entry.name] = {"size": entry.stat().st_size, "sha256": file_sha256(entry.path)}
    return files


def keep_private(folder: str | os.PathLike) -> None:
    """Take away group's and others' write permission from ``folder`` and every file in it (a umask of 002 would
    give it to the group): what :class:`PrivateFolder` reads must not be writable by anyone else."""
    folder = Path(folder)
    for path in [folder, *folder.iterdir()]:
        info = path.lstat()
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o022)


def make_folders(folder: str | os.PathLike, mode: int = 0o755) -> None:
    """Create ``folder`` (with ``mode``) and the folders above it that are missing (0755), none writable by group or
    others whatever the umask (``mkdir -p`` would give them the umask's mode, 0775 under 002, which
    :class:`PrivateFolder` refuses)."""
    folder = Path(folder)
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, mode if path == missing[0] else 0o755)
        except FileExistsError:
            continue  # made meanwhile by another process: the walk checks what it is


def check_private(folder: str | os.PathLike) -> None:
    """Raise :class:`UntrustedFileError` unless every folder from ``/`` to ``folder`` passes the walk (for a writer
    about to put something there that a reader will trust)."""
    PrivateFolder(folder).close()
