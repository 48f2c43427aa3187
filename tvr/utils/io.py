"""Atomic writes: every file the library produces is written beside its target and renamed into place,
so a crash never leaves a half-written file behind.

A process killed mid-write (``kill -9``, power loss) can still leave its *temporary* behind. Temporaries are
always named ``.<target name>.tvr-<8 random characters>.tmp`` in the target's folder (:func:`temporary_path`), so
:func:`remove_stale_temporaries` can find and delete them when a job starts or resumes, and nothing else: the
``tvr-`` marker keeps other programs' temporaries (``tempfile``'s ``.<name>.<8 random>.tmp`` shape included) out of
the sweep.

Files are created with mode ``0o666`` filtered by the process umask (0644 under the usual umask 022), like any
file ``open(path, "w")`` creates; ``tempfile.mkstemp`` would give 0600, which the rename would then carry over to
the final file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tvr.utils.errors import UserError

#: the random part of a temporary name (the alphabet and length ``tempfile`` uses)
_RANDOM_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"
_RANDOM_LENGTH = 8
#: what marks a temporary as tvr's own: the sweep never touches a name without it
TEMP_MARKER = "tvr-"
_TEMP_PATTERN = re.compile(rf"^\.(?P<name>.+)\.{re.escape(TEMP_MARKER)}[{_RANDOM_ALPHABET}]{{{_RANDOM_LENGTH}}}\.tmp$")


def _random_part() -> str:
    return "".join(secrets.choice(_RANDOM_ALPHABET) for _ in range(_RANDOM_LENGTH))


def temporary_path(path: str | os.PathLike) -> Path:
    """A fresh (not yet existing) temporary name for ``path``: ``<folder>/.<name>.tvr-<random>.tmp``."""
    path = Path(path)
    return path.parent / f".{path.name}.{TEMP_MARKER}{_random_part()}.tmp"


def is_temporary_name(name: str, target: str | None = None) -> bool:
    """Whether a file name has the shape of this module's temporaries (``.<name>.tvr-<random>.tmp``), and when
    ``target`` is given, is a temporary of the file or folder named ``target``."""
    match = _TEMP_PATTERN.match(name)
    return match is not None and (target is None or match.group("name") == target)


def create_temporary(path: str | os.PathLike) -> tuple[int, Path]:
    """Create and open (write-only, exclusive) a new temporary file for ``path``; returns (fd, temp path).

    ``os.open`` with mode 0o666 lets the kernel apply the umask, exactly as for an ordinary new file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = temporary_path(path)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name for {path} after 100 tries")


def create_temporary_dir(path: str | os.PathLike) -> Path:
    """Create a new empty temporary folder for ``path`` (mode 0o777 filtered by the umask, unlike ``mkdtemp``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        tmp = temporary_path(path)
        try:
            os.mkdir(tmp, 0o777)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name for {path} after 100 tries")


def default_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 filtered by the process umask (0644 under 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_path(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: a full disk, or a full quota: the machine's state, not a bug
DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
#: how numpy reports a write the device took only part of (an OSError with no errno)
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def naming_path(exc: BaseException, path: str | os.PathLike, *stand_ins: str | os.PathLike) -> BaseException:
    """``exc``, or when it is an OSError that names no file (``write`` on a full disk raises ENOSPC with no name)
    or names a temporary of ``path``, one of ``stand_ins`` (a folder written in its place) or a file inside one, the
    same error naming ``path``: the file the user asked for, so a message can say which one could not be written,
    and where. numpy's short write (an OSError with no errno) is the full disk it is."""
    if not isinstance(exc, OSError) or isinstance(exc, UserError):
        return exc
    short = _SHORT_WRITE.fullmatch(str(exc)) if exc.errno is None else None
    if short:  # np.save / tofile: a regular file takes fewer bytes than written only when the device is full
        why = f"{os.strerror(errno.ENOSPC)} (wrote {int(short[2]):,} of {int(short[1]):,} bytes)"
        return OSError(errno.ENOSPC, why, str(path))
    named = None if exc.filename is None else Path(os.fsdecode(exc.filename))
    target = Path(path)
    stand_in = named is not None and (
        (named.parent == target.parent and is_temporary_name(named.name, target.name))
        or any(named == Path(p) or Path(p) in named.parents for p in stand_ins)
    )
    if exc.errno is None or not (named is None or stand_in):
        return exc
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


@contextlib.contextmanager
def naming_errors(path: str | os.PathLike, *stand_ins: str | os.PathLike) -> Iterator[None]:
    """Inside the block, an OSError is raised naming ``path`` (:func:`naming_path`)."""
    try:
        yield
    except OSError as exc:
        named = naming_path(exc, path, *stand_ins)
        if named is exc:
            raise
        raise named from exc


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path (an empty file) beside ``path`` for a writer that needs a file name (an encoder, a
    library's ``save``); when the block ends normally it is fsynced and renamed over ``path``, when it raises the
    temporary is removed."""
    path = Path(path)
    with naming_errors(path):
        fd, tmp = create_temporary(path)
    os.close(fd)
    try:
        with naming_errors(path):
            yield tmp
            fsync_path(tmp)
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(fileobj)`` on a temporary file in the target folder, fsync, then rename over ``path``."""
    with atomic_output(path) as tmp, open(tmp, "wb") as handle:
        write(handle)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda h: h.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in words for a message ("a number", "a list", …)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` through :func:`atomic_write`. A write that fails inside torch (a full disk) surfaces as torch's
    RuntimeError ("unexpected pos …") with the OSError as its context: that OSError is raised instead, naming
    ``path``, so a full disk reads as one."""
    import torch

    def save(handle: BinaryIO) -> None:
        try:
            torch.save(obj, handle)
        except RuntimeError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, OSError) and cause.errno is not None:
                raise OSError(cause.errno, cause.strerror, str(path)) from exc
            raise

    return atomic_write(path, save)


#: how Rust libraries (safetensors, tokenizers) end the message of an OS error: "... (os error 28)"
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def write_error(exc: BaseException, path: str | os.PathLike) -> OSError | None:
    """The failure of a library writing ``path`` (a file or a folder) as an OSError naming ``path``, when an OS error
    is behind it: an OSError itself (Python's writes name no file), one in its cause or context (torch's
    RuntimeError), or one a Rust library's message gives by number (safetensors' ``SafetensorError: … No space
    left on device (os error 28)``); None for any other failure."""
    for error in (exc, exc.__cause__, exc.__context__):
        if isinstance(error, OSError) and error.errno is not None:
            return OSError(error.errno, error.strerror, str(path))
    match = _RUST_OS_ERROR.search(str(exc))
    if match is not None:
        number = int(match.group(1))
        return OSError(number, os.strerror(number), str(path))
    return None


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy ``src`` to ``dst`` through a temporary, so ``dst`` is either absent or complete."""
    with open(src, "rb") as source:
        return atomic_write(dst, lambda h: shutil.copyfileobj(source, h, 1 << 20))


def _walk_temporaries(folder: Path, recursive: bool) -> Iterator[Path]:
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        if is_temporary_name(entry.name):
            yield Path(entry.path)
        elif recursive and entry.is_dir(follow_symlinks=False):
            yield from _walk_temporaries(Path(entry.path), recursive)


def remove_stale_temporaries(
    folder: str | os.PathLike, recursive: bool = False, min_age_seconds: float = 0.0
) -> list[Path]:
    """Delete the temporaries (``.<name>.tvr-<random>.tmp`` files, and folders of that name) left in ``folder`` by
    writes that never finished; returns what was removed.

    Call it when a job that owns ``folder`` starts or resumes: at that point no write of the job is in flight, so
    every temporary is a leftover of a killed run. ``min_age_seconds`` spares temporaries modified more recently
    than that, for folders another live process might still be writing into. Symlinks are never followed.
    """
    removed: list[Path] = []
    now = time.time()
    for tmp in _walk_temporaries(Path(folder), recursive):
        try:
            st = tmp.lstat()
            if min_age_seconds > 0 and now - st.st_mtime < min_age_seconds:
                continue
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
        except FileNotFoundError:
            continue
        removed.append(tmp)
    return removed


def describe_file_start(path: str | os.PathLike) -> str:
    """What a file that a loader rejected looks like, from its first bytes (an empty file, a zip archive, a pickle,
    text, …), so an error can say more than the loader's internal code."""
    with open(path, "rb") as handle:
        return describe_start(handle.read(64))


def describe_start(head: bytes) -> str:
    """:func:`describe_file_start` of a file whose first bytes are ``head``."""
    head = head[:64]
    if not head:
        return "an empty file"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive that cannot be read as a checkpoint (truncated or corrupt?)"
    if head[:1] == b"\x80":
        return "a pickle that cannot be read as weights only (truncated, or it holds objects other than tensors)"
    try:
        head.decode("utf-8")
        return f"a text file (starting {head[:24]!r})"
    except UnicodeDecodeError:
        return f"neither a zip archive nor a pickle (first bytes {head[:12]!r})"


class NotRegularFileError(UserError, OSError):
    """A path that should hold a file's bytes is a FIFO, a device, a socket or a folder: ``filename`` and
    ``strerror`` (why) as for any OSError."""

    def __init__(self, path: str | os.PathLike, why: str) -> None:
        super().__init__(errno.EINVAL, why, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words, when it is not a regular file ("a FIFO", "a folder", …)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def why_not_regular_file(path: str | os.PathLike) -> str | None:
    """Why ``path`` (links followed) cannot be read as a file's bytes, or None when it can: opening a FIFO blocks
    until a writer comes, a device never ends."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if os.path.islink(path):
            return f"a broken or looping symbolic link ({exc.strerror})"
        return f"cannot stat it ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    return f"{file_kind(mode)}, not a regular file; only regular files are read"


def check_regular_file(path: str | os.PathLike) -> Path:
    """``path``, or :class:`NotRegularFileError` (or the ``FileNotFoundError``) naming it, for a reader that opens by
    name (``np.load`` with a memory map)."""
    why = why_not_regular_file(path)
    if why is not None:
        if not os.path.lexists(path):
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        raise NotRegularFileError(path, why)
    return Path(path)


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading (unbuffered), refused with :class:`NotRegularFileError` unless it is a regular
    file; the open itself never blocks (``O_NONBLOCK``), so a FIFO put in a file's place is refused, not waited on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFileError(path, f"{file_kind(mode)}, not a regular file; only regular files are read")
    return os.fdopen(fd, "rb", buffering=0)


def read_regular_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`)."""
    with open_regular(path) as handle:
        return handle.read()


def file_sha256(path: str | os.PathLike, block: int = 1 << 22) -> str:
    """The SHA-256 of a file's bytes (hex), read in blocks."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


#: a name from a file that tvr makes part of a path (a bench method, a transfer set, a sweep's dial): one plain
#: file or folder name, so it can neither climb out of the folder it is put in (``..``, ``/``), nor hide (``.x``)
_SAFE_NAME = re.compile(r"\w[\w.+=@-]{0,99}")


class UnsafeNameError(UserError, ValueError):
    """A name that tvr would put into a path is not a plain file or folder name."""


def safe_name(name: Any, what: str) -> str:
    """``name`` when it can stand as one file or folder name as it is: letters, digits and ``. _ - + = @``, starting
    with a letter, digit or ``_``, at most 100 characters (so never ``..``, a path, a hidden name or a NUL);
    :class:`UnsafeNameError` naming ``what`` otherwise."""
    if isinstance(name, str) and _SAFE_NAME.fullmatch(name):
        return name
    shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
    raise UnsafeNameError(
        f"{what} {shown}: expected a plain name (letters, digits and . _ - + = @, at most 100 characters, starting "
        "with a letter or digit), as it names a file or folder"
    )


def inside(folder: str | os.PathLike, name: Any, what: str) -> Path:
    """``folder / name`` for a ``name`` that :func:`safe_name` accepts: a path that stays inside ``folder``."""
    return Path(folder) / safe_name(name, what)


def cache_root() -> Path:
    """tvr's cache folder: ``$TVR_CACHE_DIR``, default ``~/.cache/tvr``."""
    return Path(os.environ.get("TVR_CACHE_DIR") or Path.home() / ".cache" / "tvr")
