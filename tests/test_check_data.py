"""``tvr check-data``: every unusable video named with its reason, statistics of the usable ones, caption lengths,
duplicates and split overlaps; on the real annotation files (no videos) it reports the missing videos."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from annotation_fixtures import write_didemo
from typer.testing import CliRunner
from videos import write_test_video

from tvr.cli import app
from tvr.config import Config, config_from_dict, config_to_dict
from tvr.data.check import check_data, probe_file
from tvr.data.tokenizer import ClipTokenizer, build_tiny_tokenizer_files, read_clip_merges, vocabulary_from_merges
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config


def _zero_frame_mkv(path: Path) -> None:
    """A Matroska file whose video stream holds no frame (an audio packet keeps the muxer writing)."""
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=Fraction(5))
        video.width, video.height, video.pix_fmt = 32, 24, "yuv420p"
        audio = container.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*audio.encode(frame), *audio.encode(), *video.encode()]:
            container.mux(packet)


@pytest.fixture
def bad_set(tmp_path: Path) -> Path:
    """A generic dataset whose test split holds one video of every kind of trouble, and a healthy train split."""
    root = tmp_path / "data"
    videos = root / "videos"
    videos.mkdir(parents=True)
    for k in range(4):
        write_test_video(videos / f"good{k}.mp4", 10 + 5 * k, 5.0, size=(32, 24))
    write_test_video(videos / "fine.mp4", 12, 4.0, size=(32, 24))
    (videos / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8)
    (videos / "empty.mp4").write_bytes(b"")
    _zero_frame_mkv(videos / "hollow.mkv")
    write_test_video(videos / "cut.mp4", 60, 10.0, size=(64, 48))
    data = (videos / "cut.mp4").read_bytes()
    (videos / "cut.mp4").write_bytes(data[: len(data) * 2 // 3])
    write_test_video(root / "elsewhere.mp4", 10, 5.0, size=(32, 24))
    rows = [f"good{k}.mp4,a clip number {k} with colours,train" for k in range(4)]
    rows += [
        "fine.mp4,a fine clip,test",
        "corrupt.mp4,random bytes,test",
        "empty.mp4,nothing at all,test",
        "hollow.mkv,a stream without frames,test",
        "cut.mp4,a file cut short,test",
        "ghost.mp4,never downloaded,test",
        "../elsewhere.mp4,outside the folder,test",
    ]
    (root / "captions.csv").write_text("video,caption,split\n" + "\n".join(rows) + "\n")
    return root


def _cfg(root: Path, **data) -> Config:
    values = {
        "dataset": "generic",
        "annotations": str(root),
        "video_dir": str(root / "videos"),
        "video_pattern": "{video_id}",
        "val_fraction": 0.25,
        "max_words": 8,
        "max_frames": 4,
    }
    values.update(data)
    return resolve_config(config_from_dict({"data": values, "train": {"batch_size": 2}}))


def checked(cfg: Config, **options: object) -> dict:
    """``tvr check-data``'s report of ``cfg``, with the tokenizer its backbone names."""
    return check_data(cfg, resolve_run(cfg).tokenizer, **options)


def test_every_unusable_video_is_named_with_its_reason(bad_set: Path) -> None:
    report = checked(_cfg(bad_set), workers=2, progress=False)
    reasons = {p["id"]: p["reason"] for p in report["videos"]["problems"]}
    assert reasons == {
        "ghost.mp4": "missing",
        "../elsewhere.mp4": "outside video_dir",
        "empty.mp4": "empty",
        "corrupt.mp4": "unreadable",
        "hollow.mkv": "zero frames",
    }
    assert not report["ok"]
    assert report["videos"]["referenced"] == 11 and report["videos"]["usable"] == 6  # cut.mp4 opens and decodes
    assert report["splits"]["test"]["usable_videos"] == 2
    assert any("5 of 11 videos are unusable" in e for e in report["errors"])

    full = checked(_cfg(bad_set), full=True, workers=1, progress=False)
    cut = next(p for p in full["videos"]["problems"] if p["id"] == "cut.mp4")
    assert cut["reason"] == "truncated" and "of the 60 frames" in cut["detail"]
    assert full["videos"]["usable"] == 5


def test_statistics_of_usable_videos_are_exact(bad_set: Path) -> None:
    report = checked(_cfg(bad_set, video_pattern="{video_id}"), full=True, workers=1, progress=False)
    stats = report["video_stats"]
    # good0..3: 10, 15, 20, 25 frames at 5 fps; fine: 12 frames at 4 fps
    assert stats["num_frames"]["min"] == 10 and stats["num_frames"]["max"] == 25
    assert stats["num_frames"]["median"] == 15 and stats["num_frames"]["count"] == 5
    assert stats["fps"]["min"] == pytest.approx(4.0) and stats["fps"]["max"] == pytest.approx(5.0)
    assert stats["duration"]["min"] == pytest.approx(2.0) and stats["duration"]["max"] == pytest.approx(5.0)
    # 1-fps candidates (max_frames 4): good0..3 give 2, 3, 4, 4 (5 thinned to 4), fine gives 3 → three padded
    assert stats["sampled_frames"]["min"] == 2 and stats["padded_videos"] == 3


def test_probe_file_directly(tmp_path: Path) -> None:
    write_test_video(tmp_path / "a.mp4", 9, 3.0, size=(32, 24))
    info = probe_file(str(tmp_path / "a.mp4"))
    assert info["ok"] and info["num_frames"] == 9 and info["fps"] == pytest.approx(3.0)
    assert (info["width"], info["height"]) == (32, 24) and info["duration"] == pytest.approx(3.0)
    assert probe_file(str(tmp_path / "nope.mp4"))["reason"] == "missing"


def test_a_clean_dataset_passes_and_the_cli_exit_codes(bad_set: Path, tmp_path: Path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"data": config_to_dict(_cfg(bad_set).data), "train": {"batch_size": 2}}))
    json_path = tmp_path / "out" / "report.json"
    result = CliRunner().invoke(app, ["check-data", "-c", str(config), "--json", str(json_path), "-j", "2"])
    assert result.exit_code == 1, result.output
    for vid in ("ghost.mp4", "../elsewhere.mp4", "empty.mp4", "corrupt.mp4", "hollow.mkv"):
        assert vid in result.output
    for reason in ("missing", "outside video_dir", "empty", "unreadable", "zero frames"):
        assert reason in result.output
    saved = json.loads(json_path.read_text())
    assert saved["ok"] is False and len(saved["videos"]["problems"]) == 5

    rows = [f"good{k}.mp4,a clip number {k},train" for k in range(3)] + ["good3.mp4,the test clip,test"]
    (bad_set / "captions.csv").write_text("video,caption,split\n" + "\n".join(rows) + "\n")
    result = CliRunner().invoke(app, ["check-data", "-c", str(config), "--set", "data.val_fraction=0.34"])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output

    missing = CliRunner().invoke(app, ["check-data", "-c", str(config), "--tokenizer", str(tmp_path / "nope.gz")])
    assert missing.exit_code == 2 and "nope.gz" in missing.output


def test_caption_truncation_duplicates_and_overlaps(tmp_path: Path) -> None:
    long = "a very long caption " * 6
    write_didemo(
        tmp_path,
        {"train": ["a", "b", "c"], "val": ["d"], "test": ["c", "e"]},
        captions={"a": ["x one", "x one"], "b": [long], "c": ["c"], "d": ["same words"], "e": ["same words"]},
    )
    (tmp_path / "videos").mkdir()
    cfg = _cfg(tmp_path, dataset="didemo", video_pattern="{video_id}.mp4", max_words=8)
    report = checked(cfg, progress=False)
    assert report["videos_in_several_splits"] == [{"id": "c", "splits": ["train", "test"]}]
    assert any("more than one split" in e for e in report["errors"])
    assert report["videos"]["by_reason"] == {"missing": 5}
    # model.clip tiny: lengths are counted with the tiny model's tokenizer, as the run would tokenize
    tokenizer = ClipTokenizer.from_dir(build_tiny_tokenizer_files(tmp_path / "tok"))
    lengths = [len(tokenizer.encode(t)) for t in ("x one x one", long.strip(), "c")]  # DiDeMo joins sentences
    assert lengths[1] > 6 >= max(lengths[0], lengths[2])
    train = report["splits"]["train"]
    assert train["caption_tokens"]["max"] == lengths[1] and train["truncated_captions"] == 1
    (example,) = train["truncated_examples"]
    assert example["id"] == "b" and example["tokens"] == lengths[1] and example["caption"].endswith("…")
    assert any("val split: none of its 1 videos" in e for e in report["errors"])


def test_count_tokens_equals_encode_lengths(shared_data: Path, tmp_path: Path) -> None:
    merges = read_clip_merges(shared_data / "clip_bpe" / "bpe_simple_vocab_16e6.txt.gz")
    tok = ClipTokenizer({t: i for i, t in enumerate(vocabulary_from_merges(merges))}, merges, backend="python")
    texts = [
        "A man is cooking pasta.",
        "  spaces   everywhere\tand\ttabs\n",
        "it's a dog's life, isn't it?!",
        "Café über-fast naïve résumé",
        "fish &amp; chips &lt;b&gt;",
        "emoji 🐶🐱 and 中文字符",
        "numbers 12345 x2",
        "mojibake Ã©tÃ© here",
        "",
        "   ",
        "A&B",
        "UPPER lower MiXeD",
    ]
    assert tok.count_tokens(texts) == [len(tok.encode(t)) for t in texts]


def test_real_annotation_files_without_videos(shared_data: Path, tmp_path: Path) -> None:
    """The brief's acceptance case: MSR-VTT, DiDeMo and ActivityNet as distributed, an empty video folder."""
    videos = tmp_path / "videos"
    videos.mkdir()
    bpe = shared_data / "clip_bpe" / "bpe_simple_vocab_16e6.txt.gz"
    config = tmp_path / "msrvtt.yaml"
    config.write_text(
        yaml.safe_dump(
            {"data": {"dataset": "msrvtt", "annotations": str(shared_data / "msrvtt"), "video_dir": str(videos)}}
        )
    )
    json_path = tmp_path / "msrvtt.json"
    result = CliRunner().invoke(
        app, ["check-data", "-c", str(config), "--tokenizer", str(bpe), "--json", str(json_path)]
    )
    assert result.exit_code == 1
    assert "10000 missing" in result.output and "video0" in result.output and "more (every one" in result.output
    report = json.loads(json_path.read_text())
    assert report["videos"]["by_reason"] == {"missing": 10000}
    assert {p["id"] for p in report["videos"]["problems"]} == {f"video{k}" for k in range(10000)}
    assert [report["splits"][s]["num_texts"] for s in ("train", "val", "test")] == [171000, 450, 1000]
    assert report["splits"]["train"]["truncated_captions"] > 0

    for dataset, referenced in (("didemo", 8394 + 1065 + 1002), ("activitynet", 10006 + 4917)):
        cfg = resolve_config(
            config_from_dict(
                {
                    "data": {
                        "dataset": dataset,
                        "annotations": str(shared_data / dataset),
                        "video_dir": str(videos),
                        "max_words": 64,
                    }
                }
            )
        )
        report = checked(cfg, tokenizer=bpe, progress=False)
        assert report["videos"]["referenced"] == referenced
        assert report["videos"]["by_reason"] == {"missing": referenced} and not report["ok"]
        assert all(report["splits"][s]["status"] == "ok" for s in ("train", "val", "test"))

    cfg = resolve_config(
        config_from_dict(
            {
                "data": {
                    "dataset": "didemo",
                    "annotations": str(shared_data / "didemo"),
                    "video_dir": str(tmp_path / "not_there"),
                }
            }
        )
    )
    report = checked(cfg, progress=False)
    assert any("video folder not found" in e for e in report["errors"])
    assert report["videos"]["by_reason"] == {"missing": 8394 + 1065 + 1002}


def test_a_caption_with_a_huge_word_is_reported_not_tokenized(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "videos").mkdir(parents=True)
    for k in range(4):
        write_test_video(root / "videos" / f"v{k}.mp4", 4, 2.0, size=(32, 24))
    word = "qwertyuiop" * 100_000  # 1 MB without a space: CLIP's BPE is quadratic in it
    rows = [
        ("v0.mp4", "a dog runs", "train"),
        ("v1.mp4", "a cat sits", "train"),
        ("v2.mp4", f"look {word}", "train"),
        ("v3.mp4", "a car", "test"),
    ]
    (root / "captions.jsonl").write_text(
        "".join(json.dumps({"video": v, "caption": c, "split": s}) + "\n" for v, c, s in rows)
    )
    report = checked(_cfg(root, generic_file="captions.jsonl"), workers=1, progress=False)
    assert report["splits"]["train"]["status"] == "ok", report["errors"]
    assert report["splits"]["train"]["long_word_captions"] == 1
    assert any(
        "1 caption(s) hold a word longer than 20,000 bytes (e.g. on video 'v2.mp4'" in w for w in report["warnings"]
    )
    assert report["splits"]["train"]["caption_tokens"]["max"] >= 1_000_000 // 32
