"""What a new user of ``tvr index`` tripped on (issue 46): every argument is checked before the model loads (one line,
exit 2); ``--set`` without ``--config`` is refused, not ignored; ``--device cuda`` without CUDA names ``--device``;
a folder with no video file is a warning naming the suffixes looked for (exit 1); Ctrl-C prints no worker
traceback and says exactly what was kept (and the resumed index is the uninterrupted one); library warnings stay off
stderr."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_search
import torch
from search_fixtures import VIDEOS, index_args
from typer.testing import CliRunner

import tvr.search.encoders as encoders
from tvr.cli import app
from tvr.search.layout import MANIFEST
from tvr.utils.io import is_temporary_name
from tvr.utils.lock import folder_lock

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _no_model(*_args, **_kwargs):
    raise AssertionError("the model was loaded before the arguments were checked")


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PretrainedEncoder", "CheckpointEncoder", "ConfigEncoder"):
        monkeypatch.setattr(encoders, name, _no_model)


def _one_line(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) <= 2, result.output  # the message, and the hint naming --debug
    return lines[0]


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("missing folder", "no such folder or list file"),
        ("out is a file", "is a file; expected a folder"),
        ("out is the folder", "is the indexed folder itself"),
        ("set without config", "--set model.clip=x: --set changes the settings of a --config"),
        ("model and config", "give one of --model, --checkpoint and --config"),
        ("missing model", "no such folder or file"),
        ("missing checkpoint", "--checkpoint"),
        ("bad device", "--device='cuda:7'"),
        ("locked", "is in use by another tvr job"),
    ],
)
def test_arguments_are_checked_before_the_model_loads(
    search_setup, dual_encoders, tmp_path: Path, no_model, case: str, named: str
) -> None:
    videos, out = search_setup.videos, tmp_path / "idx"
    args = {
        "missing folder": [str(tmp_path / "nowhere"), "--out", str(out)],
        "out is a file": [str(videos), "--out", str(search_setup.checkpoint)],
        "out is the folder": [str(videos), "--out", str(videos)],
        "set without config": [str(videos), "--out", str(out), "--set", "model.clip=x"],
        "model and config": [str(videos), "--out", str(out), "--model", str(dual_encoders.clip), "-c", "cpu/gare"],
        "missing model": [str(videos), "--out", str(out), "--model", str(tmp_path / "no-model")],
        "missing checkpoint": [str(videos), "--out", str(out), "--checkpoint", str(tmp_path / "no.pt")],
        "bad device": [str(videos), "--out", str(out), "--device", "cuda:7"],
        "locked": [str(videos), "--out", str(out), "--model", str(dual_encoders.clip)],
    }[case]
    start = time.monotonic()
    if case == "locked":
        with folder_lock(out, "index"):
            line = _one_line(runner.invoke(app, ["index", *args]))
    else:
        line = _one_line(runner.invoke(app, ["index", *args]))
    assert line.startswith("error:") and named in line, line
    assert "train.device" not in line
    assert time.monotonic() - start < 30
    assert case == "locked" or not out.exists()  # nothing written


def test_device_cuda_without_cuda_names_the_flag(search_setup, tmp_path: Path, no_model) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = _one_line(
        runner.invoke(app, ["index", str(search_setup.videos), "--out", str(tmp_path / "i"), "--device", "cuda"])
    )
    assert "--device='cuda' but CUDA is not available" in line and "train.device" not in line


def test_the_device_defaults_to_auto() -> None:
    import typer.main

    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}
    assert {p.name: p.default for p in commands["index"].params}["device"] == "auto"


@pytest.mark.parametrize("content", ["nothing", "text files only"])
def test_a_folder_without_videos_is_a_warning_naming_the_suffixes(tmp_path: Path, no_model, content: str) -> None:
    folder = tmp_path / "videos"
    (folder / "sub").mkdir(parents=True)
    if content == "text files only":
        (folder / "notes.txt").write_text("not a video\n")
        (folder / "sub" / "clip.mp4.txt").write_text("not a video either\n")
    result = runner.invoke(app, ["index", str(folder), "--out", str(tmp_path / "idx")])
    line = _one_line(result, code=1)
    assert line.startswith("warning: no video files in") and ".mp4" in line and ".webm" in line, line
    assert not (tmp_path / "idx").exists()


def test_a_ctrl_c_while_the_model_loads_says_nothing_was_written(
    search_setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(encoders, "CheckpointEncoder", interrupted)
    result = runner.invoke(app, index_args(search_setup.videos, tmp_path / "idx", search_setup.checkpoint))
    assert result.exit_code == 130, result.output
    assert "before anything was written" in result.output and "everything finished so far" not in result.output


def test_ctrl_c_prints_no_worker_traceback_and_says_what_was_kept(search_setup, tmp_path: Path) -> None:
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) while two decoding workers run, after the
    first shard: no traceback, exit 130, a line counting the videos kept; the resumed index is the uninterrupted
    one."""
    videos = tmp_path / "videos"
    for copy in range(3):
        for name in VIDEOS:
            target = videos / f"c{copy}" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(search_setup.videos / name, target)
    flags = ("--shard-windows", "1", "-j", "2")
    assert runner.invoke(app, index_args(videos, tmp_path / "whole", search_setup.checkpoint, *flags)).exit_code == 0
    out = tmp_path / "stopped"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVR_NO_PROGRESS": "1"}
    command = [sys.executable, "-m", "tvr", *index_args(videos, out, search_setup.checkpoint, *flags)]
    proc = subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a terminal's Ctrl-C is not ignored
    )
    deadline, sent = time.monotonic() + 180, False
    while time.monotonic() < deadline and proc.poll() is None:
        shards = [p for p in (out / "shards").glob("*") if not is_temporary_name(p.name)] if out.exists() else []
        if shards:
            os.killpg(proc.pid, signal.SIGINT)
            sent = True
            break
        time.sleep(0.005)
    output = proc.communicate(timeout=120)[0].decode()
    assert sent and proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    said = [line for line in output.splitlines() if line.startswith("interrupted:")]
    assert len(said) == 1 and "of 15 videos are embedded and kept in" in said[0], output
    kept = int(said[0].split("interrupted: ")[1].split(" of 15")[0])
    assert not (out / MANIFEST).exists()

    result = runner.invoke(app, command[3:])
    assert result.exit_code == 0, result.output
    report = test_search.json.loads((out / "report.json").read_text())
    assert report["reused"] == kept and report["embedded"] == 15 - kept
    test_search.assert_same_index(tmp_path / "whole", out)


def test_library_warnings_stay_off_stderr(search_setup, dual_encoders, tmp_path: Path) -> None:
    """Loading the tiny SigLIP makes transformers warn about its config and draw a "Loading weights" bar; `tvr
    index` keeps both off stderr, and `tvr --verbose index` shows them (so the check can fail)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVR_NO_PROGRESS": "1"}
    for variable in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):  # set by earlier in-process commands
        env.pop(variable, None)
    args = ["index", str(search_setup.videos), "--model", str(dual_encoders.siglip), "-j", "1"]
    quiet = subprocess.run(
        [sys.executable, "-m", "tvr", *args, "--out", str(tmp_path / "a")], env=env, capture_output=True, text=True
    )
    assert quiet.returncode == 0, quiet.stderr
    assert "[transformers]" not in quiet.stderr and "deprecated" not in quiet.stderr, quiet.stderr
    assert "Loading weights" not in quiet.stderr, quiet.stderr
    loud = subprocess.run(
        [sys.executable, "-m", "tvr", "--verbose", *args, "--out", str(tmp_path / "b")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert loud.returncode == 0 and "[transformers]" in loud.stderr, loud.stderr
    assert "Loading weights" in loud.stderr, loud.stderr
