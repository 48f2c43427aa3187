"""What the command line prints, as a shell user reads it: ``tvr --version``; results (a table and its title) on
stdout, messages on stderr; into a pipe or a file every line goes whole (rich folds at 80 columns otherwise), while a
terminal still folds at its width."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import tvr

REPO = Path(__file__).resolve().parents[1]


def tvr_piped(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``tvr ARGUMENTS`` in a fresh process, stdout and stderr each a pipe (as in ``tvr ... | grep``)."""
    return subprocess.run(
        [sys.executable, "-m", "tvr", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_version_prints_the_installed_version_and_exits_0() -> None:
    done = tvr_piped("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"tvr {tvr.__version__}\n" and done.stderr == ""
    # one source: the package metadata reads tvr/__init__.py
    assert importlib.metadata.version("tvr") == tvr.__version__


def _longest_head_option_description() -> str:
    from tvr.models.heads.registry import available_heads, head_class
    from tvr.utils.fielddoc import field_comments

    descriptions = [
        field_comments(head_class(name).Options).get(f.name, "")
        for name in available_heads()
        for f in dataclasses.fields(head_class(name).Options)
    ]
    return max(descriptions, key=len)


def test_a_piped_table_keeps_its_title_and_whole_rows() -> None:
    description = _longest_head_option_description()
    assert len(description) > 200  # would fold at 80 columns, into several lines of its cell
    done = tvr_piped("heads")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert any(description in line for line in lines)  # the whole description on its row's one line
    # every table's title on stdout, right above its table
    titles = [k for k, line in enumerate(lines) if line.startswith("head.name: ")]
    assert len(titles) >= 4 and all(lines[k + 1].startswith("┏") for k in titles)


def test_a_terminal_still_folds_at_its_width() -> None:
    """The same command on a terminal of 100 columns: rows folded to fit it."""
    import fcntl
    import pty
    import re
    import struct
    import termios

    from rich.cells import cell_len

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tvr", "heads"], stdin=follower, stdout=follower, stderr=follower, env=os.environ
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the process closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", b"".join(chunks).decode())
    widths = [cell_len(line.rstrip("\r")) for line in text.splitlines()]  # columns (v̄: one)
    assert max(widths) == 100 and len(widths) > 100


def test_a_piped_search_table_and_its_title_are_whole_on_stdout(search_index: Path, tmp_path: Path) -> None:
    query = "a red screen, " * 8 + "bright red"
    done = tvr_piped("search", str(search_index), query, "-k", "5", env={"TVR_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    title = f"{query!r} in {search_index}"
    assert len(title) > 120 and lines[0].strip() == title  # on stdout with its table, on one line
    rows = [line for line in lines if "red.mp4" in line]
    assert len(rows) == 1 and rows[0].split("│")[1:-1][0].strip() == "1"  # the whole row: rank 1 … red.mp4


def test_messages_on_a_piped_stderr_are_whole_lines() -> None:
    from tvr.config import PRESET_DIR

    benches = ", ".join(sorted(p.stem for p in (PRESET_DIR / "bench").glob("*.yaml")))
    done = tvr_piped("presets")
    assert done.returncode == 0
    line = f"bench configs for tvr bench --config: {benches}"
    assert len(line) > 80 and line in done.stderr.splitlines()


def test_backbones_and_datasets_list_the_settings_each_declares() -> None:
    """``tvr backbones`` / ``tvr datasets`` show what each backbone / dataset format reads, from its ``Settings``
    dataclass (a section's fields one level down), with default, allowed values and its ``#:`` description."""
    done = tvr_piped("backbones")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    tables = done.stdout.split("model.backbone: ")
    clipvip = next(t for t in tables if t.startswith("clipvip\n"))
    rows = {line.split("│")[1].strip(): line for line in clipvip.splitlines() if line.count("│") >= 4}
    assert {"clip", "tiny", "tiny.embed_dim", "clipvip", "clipvip.num_proxies"} <= set(rows)
    assert "'tiny'" in rows["clip"] and "a local HF CLIP directory" in rows["clip"]
    assert ">= 1 and <= 1024" in rows["tiny.embed_dim"]
    two_tower = next(t for t in tables if t.startswith("two_tower\n"))
    assert "two_tower.bridge" in two_tower and "tiny.embed_dim" not in two_tower
    done = tvr_piped("datasets")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    msrvtt = next(t for t in done.stdout.split("data.dataset: ") if t.startswith("msrvtt "))
    assert msrvtt.startswith("msrvtt (splits: train, val, test, test_multi)")
    assert "train_split" in msrvtt and "'9k' | '7k'" not in msrvtt and "9k | 7k" in msrvtt
    msvd = next(t for t in done.stdout.split("data.dataset: ") if t.startswith("msvd "))
    assert "(no settings of its own)" in msvd
