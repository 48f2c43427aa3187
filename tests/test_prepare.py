"""``tvr prepare``: the training form (frame rate, size, codec, no audio), failures reported and never lost, a run
killed with SIGKILL resumes to byte-identical outputs, and the frame cache reproduces load_clip exactly."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from typer.testing import CliRunner
from videos import identify_frames, write_test_video

from tvr.cli import app
from tvr.data.frame_cache import FrameCacheError, FrameSettings, load_cached_clip, read_frame_settings
from tvr.data.prepare import (
    EncodeSettings,
    PrepareError,
    encode_video,
    extract_frames,
    output_size,
    prepare_videos,
)
from tvr.data.video import decode_frames, load_clip, probe_video
from tvr.utils.io import is_temporary_name


def _files(folder: Path, suffix: str = ".mp4") -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob(f"*{suffix}"))}


def test_output_size() -> None:
    assert output_size(320, 240, 224) == (298, 224)  # 298.67 truncated to even
    assert output_size(240, 320, 224) == (224, 298)
    assert output_size(448, 448, 224) == (224, 224)
    assert output_size(1920, 1080, 224) == (398, 224)
    assert output_size(250, 448, 224) == (224, 400)  # 401.4 → 400
    assert output_size(65, 49, 0) == (64, 48)


@pytest.mark.parametrize("fps", [30.0, 25.0, 2.0])
def test_encoded_form_and_frame_selection(tmp_path: Path, fps: float) -> None:
    """Output frame k holds the last source frame i with round(t_i · 3) = k (empty slots repeat the previous one),
    the fps filter's rule; checked by reading each output frame's colour code."""
    n = int(fps * 4)
    write_test_video(tmp_path / "src.mp4", n, fps, size=(64, 48))
    info = encode_video(tmp_path / "src.mp4", tmp_path / "out.mp4", EncodeSettings())
    probe = probe_video(tmp_path / "out.mp4")
    assert (probe.width, probe.height, probe.fps) == (298, 224, 3.0) and info["frames_in"] == n
    slot = [math.floor(Fraction(i) / Fraction(fps) * 3 + Fraction(1, 2)) for i in range(n)]
    expected, last = [], 0
    for k in range(probe.num_frames):
        here = [i for i in range(n) if slot[i] == k]
        last = here[-1] if here else last
        expected.append(last)
    assert probe.num_frames == info["frames_out"] == 12
    assert identify_frames(decode_frames(tmp_path / "out.mp4", np.arange(probe.num_frames))) == expected
    with av.open(str(tmp_path / "out.mp4")) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        assert container.streams.video[0].codec_context.pix_fmt == "yuv420p"


def test_audio_is_dropped_and_settings_apply(tmp_path: Path) -> None:
    src = tmp_path / "with_audio.mkv"
    with av.open(str(src), "w") as container:
        video = container.add_stream("libx264", rate=10)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        audio = container.add_stream("aac", rate=16000)
        for k in range(20):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 10 * k, np.uint8), format="rgb24")
            container.mux(video.encode(frame))
            sound = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            sound.sample_rate = 16000
            container.mux(audio.encode(sound))
        container.mux(video.encode(None))
        container.mux(audio.encode(None))
    encode_video(src, tmp_path / "out.mp4", EncodeSettings(fps=5.0, short_side=32, crf=30))
    with av.open(str(tmp_path / "out.mp4")) as container:
        assert len(container.streams.audio) == 0 and len(container.streams.video) == 1
    probe = probe_video(tmp_path / "out.mp4")
    assert (probe.width, probe.height, probe.fps, probe.num_frames) == (42, 32, 5.0, 10)
    with pytest.raises(PrepareError, match="even"):
        EncodeSettings(short_side=225).validate()
    with pytest.raises(PrepareError, match="codec"):
        EncodeSettings(codec="no-such-codec").validate()


@pytest.fixture
def raw_videos(tmp_path: Path) -> Path:
    """Eight 10-second 30-fps clips in two folders (long enough to be caught mid-write), plus a broken file."""
    src = tmp_path / "raw"
    for k in range(8):
        folder = src / ("a" if k % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        write_test_video(folder / f"clip{k}.mp4", 300, 30.0, size=(160, 120), pattern="moving_square")
    return src


def test_kill_9_mid_run_then_resume_gives_identical_files(raw_videos: Path, tmp_path: Path) -> None:
    """Uninterrupted run vs. a run SIGKILLed (whole process group) while a file is half written, then resumed:
    byte-identical outputs; the killed run's temporary is removed; finished files are not redone."""
    whole = prepare_videos(raw_videos, tmp_path / "whole", workers=1, progress=False)
    assert whole["summary"]["encoded"] == 8
    reference = _files(tmp_path / "whole")
    assert len(reference) == 8

    dst = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tvr", "prepare", "videos", str(raw_videos), str(dst), "-j", "1"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    caught = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        done = list(dst.rglob("*.mp4")) if dst.exists() else []
        temps = [p for p in dst.rglob(".*.tmp")] if dst.exists() else []
        if done and temps:
            os.killpg(proc.pid, signal.SIGKILL)
            caught = (len(done), temps)
            break
        time.sleep(0.002)
    proc.wait()
    assert caught is not None, "the run finished before it could be killed mid-write"
    assert proc.returncode == -signal.SIGKILL
    finished_before, _ = caught
    leftovers = [p for p in dst.rglob("*") if p.is_file() and is_temporary_name(p.name)]
    assert leftovers  # the half-written temporary is still there
    assert 1 <= finished_before < 8

    resumed = prepare_videos(raw_videos, dst, workers=2, progress=False)
    assert resumed["summary"]["skipped"] >= 1 and resumed["summary"]["encoded"] == 8 - resumed["summary"]["skipped"]
    assert sorted(resumed["stale_temporaries_removed"]) == sorted(str(p) for p in leftovers)
    assert not [p for p in dst.rglob("*") if is_temporary_name(p.name)]
    assert _files(dst) == reference  # byte-identical to the uninterrupted run

    again = prepare_videos(raw_videos, dst, workers=1, progress=False)
    assert again["summary"] == {"total": 8, "skipped": 8, "seconds": again["summary"]["seconds"]}
    with pytest.raises(PrepareError, match="other settings"):
        prepare_videos(raw_videos, dst, EncodeSettings(fps=5.0), progress=False)


def test_failures_are_reported_or_copied(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    write_test_video(src / "good.mp4", 20, 10.0, size=(64, 48))
    (src / "broken.avi").write_bytes(b"RIFF" + os.urandom(2000))
    write_test_video(src / "twin.mp4", 10, 10.0, size=(64, 48))
    write_test_video(src / "twin.mkv", 10, 10.0, size=(64, 48))
    (src / "notes.txt").write_text("not a video")

    result = CliRunner().invoke(app, ["prepare", "videos", str(src), str(tmp_path / "out"), "-j", "2"])
    assert result.exit_code == 1, result.output
    assert "broken.avi" in result.output and "twin.mp4" in result.output
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    status = {e["source"]: e["status"] for e in report["files"]}
    assert status == {"broken.avi": "failed", "good.mp4": "encoded", "twin.mkv": "encoded", "twin.mp4": "failed"}
    errors = {e["source"]: e["error"] for e in report["files"] if e["status"] == "failed"}
    assert "taken by twin.mkv" in errors["twin.mp4"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "good.mp4",
        "prepare_manifest.json",
        "prepare_report.json",
        "twin.mp4",
    ]

    copied = prepare_videos(src, tmp_path / "copied", copy_on_failure=True, workers=1, progress=False)
    entry = next(e for e in copied["files"] if e["source"] == "broken.avi")
    assert entry["status"] == "copied" and "error" in entry
    assert (tmp_path / "copied" / "broken.avi").read_bytes() == (src / "broken.avi").read_bytes()
    again = prepare_videos(src, tmp_path / "copied", copy_on_failure=True, workers=1, progress=False)
    rerun = next(e for e in again["files"] if e["source"] == "broken.avi")
    assert rerun["status"] == "copied" and "earlier run" in rerun["error"]  # a copy, still: not "skipped"
    assert next(e for e in again["files"] if e["source"] == "good.mp4")["status"] == "skipped"

    with pytest.raises(PrepareError, match="source folder"):
        prepare_videos(src, src, progress=False)
    (src / "sub").mkdir()
    write_test_video(src / "sub" / "good.mp4", 10, 10.0, size=(64, 48))
    write_test_video(src / "sub" / "deep.mp4", 10, 10.0, size=(64, 48))
    flat = prepare_videos(src, tmp_path / "flat", workers=1, progress=False, flat=True)
    flat_status = {e["source"]: e["status"] for e in flat["files"]}
    assert flat_status["sub/deep.mp4"] == "encoded" and flat_status["sub/good.mp4"] == "failed"  # clash with good
    assert (tmp_path / "flat" / "deep.mp4").is_file() and not (tmp_path / "flat" / "sub").exists()
    (src / "sub" / "good.mp4").unlink()
    (src / "sub" / "deep.mp4").unlink()
    inside = prepare_videos(src, src / "prepared", workers=1, progress=False)  # DST inside SRC is not re-read
    assert {e["source"] for e in inside["files"]} == {"broken.avi", "good.mp4", "twin.mkv", "twin.mp4"}


@pytest.mark.parametrize("sampling", ["clip4clip", "clipvip"])
def test_frame_cache_reproduces_load_clip(tmp_path: Path, sampling: str) -> None:
    src = tmp_path / "videos"
    src.mkdir()
    write_test_video(src / "short.mp4", 9, 3.0, size=(64, 48))  # 3 s: fewer frames than max_frames
    write_test_video(src / "long.mp4", 90, 3.0, size=(48, 64), pattern="moving_square")
    settings = FrameSettings(max_frames=6, frame_rate=1.0, image_size=32, sampling=sampling)
    report = extract_frames(src, tmp_path / "cache", settings, workers=2, progress=False)
    assert report["summary"]["extracted"] == 2
    assert read_frame_settings(tmp_path / "cache") == settings
    for name in ("short", "long"):
        want_pixels, want_mask = load_clip(src / f"{name}.mp4", 6, 1.0, 32, sampling=sampling)
        pixels, mask = load_cached_clip(tmp_path / "cache" / f"{name}.npy", 6, 32, resize=settings.resize)
        assert torch.equal(pixels, want_pixels) and torch.equal(mask, want_mask)
    cached = np.load(tmp_path / "cache" / "short.npy", mmap_mode="r")
    assert cached.dtype == np.uint8 and cached.shape[0] == (3 if sampling == "clip4clip" else 6)
    again = extract_frames(src, tmp_path / "cache", settings, progress=False)
    assert again["summary"]["skipped"] == 2
    with pytest.raises(PrepareError, match="other settings"):
        extract_frames(src, tmp_path / "cache", FrameSettings(max_frames=8, sampling=sampling), progress=False)


def test_a_copied_mp4_is_reported_as_copied_on_rerun(tmp_path: Path) -> None:
    """A broken .mp4 copied unchanged lands under the very name an encoded output would have: the rerun must
    still call it a copy."""
    src = tmp_path / "raw"
    src.mkdir()
    write_test_video(src / "good.mp4", 10, 10.0, size=(64, 48))
    (src / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(3000))
    result = CliRunner().invoke(
        app, ["prepare", "videos", str(src), str(tmp_path / "out"), "-j", "1", "--copy-on-failure"]
    )
    assert "1 file(s) could not be re-encoded and were copied unchanged" in result.output
    result = CliRunner().invoke(
        app, ["prepare", "videos", str(src), str(tmp_path / "out"), "-j", "1", "--copy-on-failure"]
    )
    assert "1 copied" in result.output and "1 skipped" in result.output
    assert "1 file(s) could not be re-encoded and were copied unchanged" in result.output


def test_a_truncated_source_is_reported_not_encoded_shorter(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    write_test_video(src / "whole.mp4", 60, 10.0, size=(64, 48))
    data = (src / "whole.mp4").read_bytes()
    (src / "cut.mp4").write_bytes(data[: int(len(data) * 0.6)])  # index at the front: it opens and decodes
    report = prepare_videos(src, tmp_path / "out", workers=1, progress=False)
    entries = {e["source"]: e for e in report["files"]}
    assert entries["whole.mp4"]["status"] == "encoded"
    assert entries["cut.mp4"]["status"] == "failed"
    assert "truncated" in entries["cut.mp4"]["error"] and "of the 60 frames" in entries["cut.mp4"]["error"]
    assert not (tmp_path / "out" / "cut.mp4").exists()


def test_symlinked_folders_are_walked_and_loops_reported(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    (src / "real").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_test_video(src / "real" / "a.mp4", 6, 10.0, size=(64, 48))
    write_test_video(elsewhere / "b.mp4", 6, 10.0, size=(64, 48))
    (src / "linked").symlink_to(elsewhere, target_is_directory=True)
    (src / "real" / "loop").symlink_to(src, target_is_directory=True)
    report = prepare_videos(src, tmp_path / "out", workers=1, progress=False)
    status = {e["source"]: e["status"] for e in report["files"]}
    assert status == {"linked/b.mp4": "encoded", "real/a.mp4": "encoded", "real/loop": "ignored"}
    assert "symlink loop" in next(e["error"] for e in report["files"] if e["source"] == "real/loop")
    assert (tmp_path / "out" / "linked" / "b.mp4").is_file()


def test_a_fifo_is_reported_and_never_opened(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    write_test_video(src / "good.mp4", 6, 10.0, size=(64, 48))
    os.mkfifo(src / "pipe.mp4")  # opening it for reading would block forever
    (src / "dangling.mp4").symlink_to(tmp_path / "nowhere.mp4")
    report = prepare_videos(src, tmp_path / "out", workers=1, progress=False)
    errors = {e["source"]: e.get("error") for e in report["files"] if e["status"] == "failed"}
    assert set(errors) == {"pipe.mp4", "dangling.mp4"}
    assert "a FIFO, not a regular file" in errors["pipe.mp4"] and "broken" in errors["dangling.mp4"]


def test_empty_source_bad_preset_and_damaged_manifest_are_errors_before_writing(tmp_path: Path) -> None:
    runner = CliRunner()
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "notes.txt").write_text("no videos here")
    result = runner.invoke(app, ["prepare", "videos", str(empty), str(tmp_path / "out")])
    assert result.exit_code == 2 and "no video files under" in result.output
    assert not (tmp_path / "out").exists()

    src = tmp_path / "raw"
    src.mkdir()
    write_test_video(src / "good.mp4", 6, 10.0, size=(64, 48))
    result = runner.invoke(app, ["prepare", "videos", str(src), str(tmp_path / "out"), "--preset", "bogus"])
    assert result.exit_code == 2 and "preset 'bogus': expected one of" in result.output
    assert not (tmp_path / "out").exists()
    result = runner.invoke(app, ["prepare", "videos", str(src), str(tmp_path / "out"), "--preset", "ultrafast"])
    assert result.exit_code == 0, result.output

    (tmp_path / "out" / "prepare_manifest.json").write_text("[1, 2")
    result = runner.invoke(app, ["prepare", "videos", str(src), str(tmp_path / "out")])
    assert result.exit_code == 2 and "prepare_manifest.json: damaged" in result.output
    assert "Traceback" not in result.output
    (tmp_path / "frames").mkdir()
    (tmp_path / "frames" / "frames_manifest.json").write_text('{"settings": {"max_frames": 4}}')
    with pytest.raises(FrameCacheError, match=r"frames_manifest.json: damaged \(KeyError"):
        read_frame_settings(tmp_path / "frames")


def test_a_second_job_on_the_destination_is_refused(tmp_path: Path) -> None:
    from tvr.utils.lock import FolderBusyError, folder_lock

    src = tmp_path / "raw"
    src.mkdir()
    write_test_video(src / "good.mp4", 6, 10.0, size=(64, 48))
    with folder_lock(tmp_path / "out"), pytest.raises(FolderBusyError, match="prepare destination .* in use"):
        prepare_videos(src, tmp_path / "out", workers=1, progress=False)
    with folder_lock(tmp_path / "frames"), pytest.raises(FolderBusyError, match="frame cache .* in use"):
        extract_frames(src, tmp_path / "frames", workers=1, progress=False)


def test_a_frame_cache_entry_never_resolves_outside_the_cache(tmp_path: Path) -> None:
    """With data.allow_outside_video_dir, a video id may be ``../outside/x.mp4``: the cache is not asked for it
    (``absolute()`` keeps ``..``, so it used to map to ``CACHE/../outside/x.npy``)."""
    from tvr.data.frame_cache import FrameCacheReader

    src = tmp_path / "videos"
    src.mkdir()
    write_test_video(src / "clip.mp4", 9, 3.0, size=(64, 48))
    settings = FrameSettings(max_frames=4, frame_rate=1.0, image_size=32)
    extract_frames(src, tmp_path / "cache", settings, workers=1, progress=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    np.save(outside / "x.npy", np.zeros((1, 32, 32, 3), dtype=np.uint8))  # CACHE/../outside/x.npy exists
    reader = FrameCacheReader(tmp_path / "cache", src, settings)
    assert reader.entry(src / "clip.mp4", None, None, train=False) == tmp_path / "cache" / "clip.npy"
    assert reader.entry(src / ".." / "outside" / "x.mp4", None, None, train=False) is None
    assert reader.entry(src / "sub" / ".." / "clip.mp4", None, None, train=False) == tmp_path / "cache" / "clip.npy"


def test_a_manifest_of_the_wrong_kind_is_named_in_words(tmp_path: Path) -> None:
    """ "settings is a int" read like a bug; the message says what the JSON holds instead."""
    src = tmp_path / "raw"
    src.mkdir()
    write_test_video(src / "good.mp4", 6, 10.0, size=(64, 48))
    out = tmp_path / "out"
    out.mkdir()
    for content, said in (
        ('{"settings": 5}', '"settings" is a number, not an object'),
        ("[1, 2]", "the file is a list"),
    ):
        (out / "prepare_manifest.json").write_text(content)
        result = CliRunner().invoke(app, ["prepare", "videos", str(src), str(out)])
        assert result.exit_code == 2 and said in result.output, result.output
        assert "a int" not in result.output
