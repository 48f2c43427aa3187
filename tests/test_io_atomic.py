"""Atomic writes: file modes follow the umask, and temporaries left by killed writes are found and removed."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tvr.utils.io import (
    atomic_copy,
    atomic_torch_save,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    create_temporary,
    create_temporary_dir,
    is_temporary_name,
    remove_stale_temporaries,
    temporary_path,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_written_files_honour_the_umask(tmp_path: Path, umask022) -> None:
    # mkstemp creates 0600 files and the rename carried that mode to the final file
    text = atomic_write_text(tmp_path / "a.txt", "hello")
    js = atomic_write_json(tmp_path / "sub" / "b.json", {"x": 1})
    pt = atomic_torch_save({"w": 1}, tmp_path / "c.pt")
    assert text.read_text() == "hello"
    assert [_mode(p) for p in (text, js, pt)] == [0o644, 0o644, 0o644]


def test_mode_follows_another_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = atomic_write_text(tmp_path / "private.txt", "x")
    finally:
        os.umask(old)
    assert _mode(path) == 0o600


def test_temporary_dir_honours_the_umask(tmp_path: Path, umask022) -> None:
    tmp = create_temporary_dir(tmp_path / "model")
    assert tmp.is_dir() and _mode(tmp) == 0o755
    assert is_temporary_name(tmp.name)


def test_temporary_names_have_the_documented_shape(tmp_path: Path) -> None:
    name = temporary_path(tmp_path / "last.pt").name
    assert name.startswith(".last.pt.tvr-") and name.endswith(".tmp") and len(name) == len(".last.pt.tvr-") + 8 + 4
    assert is_temporary_name(name)
    for other in (
        "last.pt",
        ".last.pt",
        ".last.pt.tmp",
        ".last.pt.abc.tmp",
        ".last.pt.ABCDEFGH.tmp",
        "x.abcdefgh.tmp",
        ".last.pt.tvr-abc.tmp",
    ):
        assert not is_temporary_name(other), other


def test_the_sweep_spares_temporaries_tvr_did_not_name(tmp_path: Path) -> None:
    """Another program's temporary of tempfile's shape (``.x.abcdefgh.tmp``) is data, not a leftover of ours."""
    theirs = [tmp_path / ".x.abcdefgh.tmp", tmp_path / "sub" / ".report.pdf.k2j4l5m6.tmp"]
    for path in theirs:
        path.parent.mkdir(exist_ok=True)
        path.write_text("someone else's")
    fd, ours = create_temporary(tmp_path / "sub" / "metrics.json")
    os.close(fd)
    assert remove_stale_temporaries(tmp_path, recursive=True) == [ours]
    assert all(path.exists() for path in theirs)


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def boom(handle) -> None:
        handle.write(b"partial")
        raise RuntimeError("disk on fire")

    atomic_write_text(tmp_path / "keep.txt", "old")
    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "keep.txt", boom)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert (tmp_path / "keep.txt").read_text() == "old"


def test_killed_write_leaves_a_temporary_that_cleanup_removes(tmp_path: Path) -> None:
    """A real SIGKILL in the middle of atomic_write: the target is untouched, the temporary stays until cleanup."""
    target = tmp_path / "run" / "last.pt"
    atomic_write_text(target, "previous checkpoint")
    script = textwrap.dedent(
        f"""
        import os, signal
        from tvr.utils.io import atomic_write
        def write(handle):
            handle.write(b"half a checkpoint")
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        atomic_write({str(target)!r}, write)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -9
    leftovers = [p for p in target.parent.iterdir() if p.name != "last.pt"]
    assert len(leftovers) == 1 and is_temporary_name(leftovers[0].name)
    assert leftovers[0].read_bytes() == b"half a checkpoint"
    assert target.read_text() == "previous checkpoint"

    (target.parent / "notes.tmp").write_text("user file")  # not ours: must survive
    (target.parent / ".hidden").write_text("user file")
    removed = remove_stale_temporaries(target.parent)
    assert removed == leftovers
    assert sorted(p.name for p in target.parent.iterdir()) == [".hidden", "last.pt", "notes.tmp"]


def test_cleanup_handles_folders_recursion_and_age(tmp_path: Path) -> None:
    fd, top = create_temporary(tmp_path / "a.json")
    os.close(fd)
    tmp_dir = create_temporary_dir(tmp_path / "clip")
    (tmp_dir / "weights.bin").write_bytes(b"x")
    fd, nested = create_temporary(tmp_path / "test_best" / "metrics.json")
    os.close(fd)
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([top, tmp_dir])
    assert nested.exists()
    old = os.stat(nested).st_mtime - 3600
    fd, fresh = create_temporary(tmp_path / "test_best" / "metrics.md")
    os.close(fd)
    os.utime(nested, (old, old))
    assert remove_stale_temporaries(tmp_path, recursive=True, min_age_seconds=60) == [nested]
    assert fresh.exists()
    assert remove_stale_temporaries(tmp_path / "missing") == []


def test_atomic_copy(tmp_path: Path, umask022) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    os.chmod(src, 0o600)
    dst = atomic_copy(src, tmp_path / "out" / "dst.bin")
    assert dst.read_bytes() == src.read_bytes() and _mode(dst) == 0o644


def test_a_full_disk_names_the_file_the_user_asked_for(tmp_path: Path) -> None:
    """``write`` on a full disk raises ENOSPC naming no file, a library writing the temporary names the temporary,
    numpy reports a short write with no errno: each is raised naming the target, and the temporary is removed."""
    import errno

    import numpy as np

    from tvr.utils.io import atomic_output, atomic_write, is_disk_full, naming_errors

    target = tmp_path / "out" / "metrics.json"

    def full(handle) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_naming_the_temporary(handle) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", handle.name)

    def short_numpy_write(handle) -> None:
        raise OSError("301056 requested and 290688 written")

    for write in (full, full_naming_the_temporary, short_numpy_write):
        with pytest.raises(OSError) as info:
            atomic_write(target, write)
        assert is_disk_full(info.value) and info.value.filename == str(target), info.value
        assert list(target.parent.iterdir()) == []
    assert "wrote 290,688 of 301,056 bytes" in str(info.value)
    with pytest.raises(OSError) as info, atomic_output(target) as tmp:
        np.save(tmp, np.zeros(3))
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp))
    assert is_disk_full(info.value) and info.value.filename == str(target)
    other = tmp_path / "elsewhere.txt"
    with pytest.raises(FileNotFoundError) as info, naming_errors(target):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(other))
    assert info.value.filename == str(other)  # an error about another file keeps its name
