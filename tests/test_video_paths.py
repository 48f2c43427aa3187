"""Video paths must stay inside data.video_dir (after ``..`` and symlinks) unless the config allows otherwise."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from videos import write_test_video

from tvr.config import DataConfig
from tvr.data.annotations import load_split
from tvr.data.datasets import VideoDataset, VideoNotFoundError, VideoOutsideDirError, VideoResolver, collate_videos
from tvr.data.transforms import CLIP_MEAN, CLIP_STD
from tvr.data.video import VideoDecodeError


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """videos/inside.mp4, a secret.mp4 beside the video folder, and a symlink in the folder pointing at it."""
    videos = tmp_path / "videos"
    videos.mkdir()
    write_test_video(videos / "inside.mp4", 4, 2.0, size=(32, 24))
    secret = tmp_path / "secret.mp4"
    write_test_video(secret, 4, 2.0, size=(32, 24))
    (videos / "link.mp4").symlink_to(secret)
    return {"root": tmp_path, "videos": videos, "secret": secret}


def _cfg(layout: dict[str, Path], **kw) -> DataConfig:
    base = dict(
        dataset="generic",
        annotations=str(layout["root"]),
        generic_file="captions.csv",
        video_dir=str(layout["videos"]),
        video_pattern="{video_id}",
        max_frames=2,
        image_size=16,
        sampling="clip4clip",
        pixel_mean=CLIP_MEAN,
        pixel_std=CLIP_STD,
    )
    base.update(kw)
    return DataConfig(**base)


@pytest.mark.parametrize("video_id", ["../secret.mp4", "sub/../../secret.mp4", "link.mp4", "ABSOLUTE"])
def test_paths_escaping_the_folder_are_refused(layout: dict[str, Path], video_id: str) -> None:
    video_id = str(layout["secret"]) if video_id == "ABSOLUTE" else video_id
    resolver = VideoResolver(layout["videos"], "{video_id}")
    with pytest.raises(VideoOutsideDirError) as info:
        resolver(video_id)
    err = info.value
    assert isinstance(err, VideoDecodeError) and err.reason == "outside video_dir"
    assert err.real == str(layout["secret"].resolve())
    assert "allow_outside_video_dir" in str(err)
    again = pickle.loads(pickle.dumps(err))  # crosses DataLoader worker boundaries intact
    assert type(again) is VideoOutsideDirError and again.reason == err.reason and str(again) == str(err)


def test_a_sibling_folder_sharing_the_name_prefix_is_outside(layout: dict[str, Path]) -> None:
    """videos_evil/ next to videos/ starts with the same characters but is another folder: confinement compares
    path components, not string prefixes."""
    evil = layout["root"] / "videos_evil"
    evil.mkdir()
    write_test_video(evil / "x.mp4", 4, 2.0, size=(32, 24))
    (layout["videos"] / "evil_link.mp4").symlink_to(evil / "x.mp4")
    resolver = VideoResolver(layout["videos"], "{video_id}")
    for video_id in ("../videos_evil/x.mp4", str(evil / "x.mp4"), "evil_link.mp4"):
        with pytest.raises(VideoOutsideDirError):
            resolver(video_id)
    assert resolver("inside.mp4") == layout["videos"] / "inside.mp4"


def test_missing_file_outside_is_reported_as_outside(layout: dict[str, Path]) -> None:
    resolver = VideoResolver(layout["videos"], "{video_id}.mp4")
    with pytest.raises(VideoOutsideDirError):
        resolver("../nothing_here")
    with pytest.raises(VideoNotFoundError):
        resolver("nothing_here")


def test_inside_paths_and_allowed_outside(layout: dict[str, Path]) -> None:
    videos = layout["videos"]
    (videos / "sub").mkdir()
    assert VideoResolver(videos, "{video_id}")("inside.mp4") == videos / "inside.mp4"
    assert VideoResolver(videos, "{video_id}")("sub/../inside.mp4") == videos / "sub/../inside.mp4"
    # the video folder itself may be a symlink
    linked = layout["root"] / "linked_videos"
    linked.symlink_to(videos)
    assert VideoResolver(linked, "{video_id}")("inside.mp4") == linked / "inside.mp4"
    allowed = VideoResolver.from_config(_cfg(layout, allow_outside_video_dir=True))
    assert allowed("../secret.mp4") == videos / "../secret.mp4"
    assert allowed("link.mp4") == videos / "link.mp4"


def test_generic_csv_paths_are_skipped_and_listed(layout: dict[str, Path]) -> None:
    """The user-facing defect: a generic CSV naming ../x.mp4 or an absolute path was decoded silently."""
    secret = layout["secret"]
    (layout["root"] / "captions.csv").write_text(
        "video,caption,split\n"
        "inside.mp4,a colour sweep,test\n"
        f"../secret.mp4,a stolen video,test\n"
        f"{secret},an absolute path,test\n"
        "link.mp4,a symlink out,test\n"
    )
    cfg = _cfg(layout)
    split = load_split(cfg, "test")
    dataset = VideoDataset(split.videos, split.video_spans, VideoResolver.from_config(cfg), cfg)
    batch = collate_videos([dataset[k] for k in range(len(dataset))])
    assert batch["video_ids"] == ["inside.mp4"]
    assert batch["skipped"] == ["../secret.mp4", str(secret), "link.mp4"]
    assert all("outside video_dir" in e for e in batch["errors"])

    allowed = _cfg(layout, allow_outside_video_dir=True)
    dataset = VideoDataset(split.videos, split.video_spans, VideoResolver.from_config(allowed), allowed)
    assert collate_videos([dataset[k] for k in range(len(dataset))])["skipped"] == []


def test_video_stem_pattern(layout: dict[str, Path]) -> None:
    resolver = VideoResolver(layout["videos"], "{video_stem}.mp4")
    assert resolver("inside.mov") == layout["videos"] / "inside.mp4"
    assert resolver("inside") == layout["videos"] / "inside.mp4"
    with pytest.raises(VideoOutsideDirError):
        resolver("../secret.avi")
    with pytest.raises(ValueError, match="video_stem"):
        VideoResolver(layout["videos"], "clip.mp4")


def test_ids_that_cannot_name_a_file_are_skipped_everywhere(tmp_path: Path) -> None:
    """A NUL byte, a name over 255 bytes and a symlink loop: check-data names each, training skips them."""
    from annotation_fixtures import write_generic
    from test_end_to_end import tiny_config

    from tvr.config import config_from_dict
    from tvr.data.check import check_data
    from tvr.data.datasets import VideoNameError
    from tvr.models.run_spec import resolve_run
    from tvr.pipeline import resolve_config, run_train

    root = tmp_path / "data"
    (root / "videos").mkdir(parents=True)
    rows = []
    for k in range(10):
        write_test_video(root / "videos" / f"clip{k}.mp4", 5, 4.0, size=(32, 32))
        rows.append(
            {
                "video": f"clip{k}.mp4",
                "caption": f"clip {k} shows thing {k % 3}",
                "split": "test" if k >= 8 else "train",
            }
        )
    (root / "videos" / "loop_a.mp4").symlink_to(root / "videos" / "loop_b.mp4")
    (root / "videos" / "loop_b.mp4").symlink_to(root / "videos" / "loop_a.mp4")
    bad = {
        "nul\x00byte.mp4": "NUL byte",
        "x" * 300 + ".mp4": "longer than the file system allows",
        "loop_a.mp4": "symbolic link loop",
    }
    rows += [{"video": vid, "caption": f"bad video {k}", "split": "train"} for k, vid in enumerate(bad)]
    write_generic(root, rows, fmt="jsonl")
    values = tiny_config("generic", root, generic_file="captions.jsonl", video_pattern="{video_id}", val_fraction=0.2)
    values["train"]["batch_size"] = 2
    cfg = resolve_config(config_from_dict(values))  # the backbone's frame settings, as every job resolves them

    resolver = VideoResolver(root / "videos", "{video_id}")
    for vid, what in bad.items():
        with pytest.raises(VideoNameError, match=what) as info:
            resolver(vid)
        assert info.value.reason == "invalid name" and pickle.loads(pickle.dumps(info.value)).reason == "invalid name"

    report = check_data(cfg, resolve_run(cfg).tokenizer, workers=1, progress=False)
    problems = {p["id"]: p for p in report["videos"]["problems"]}
    assert {vid for vid, p in problems.items() if p["reason"] == "invalid name"} == set(bad)

    held_out = set(load_split(cfg.data, "val").videos)
    summary = run_train(cfg, tmp_path / "run", final_test=False)
    assert summary["steps"] >= 1
    skipped = {v["id"] for v in json.loads((tmp_path / "run" / "skipped_videos.json").read_text())["videos"]}
    assert skipped == set(bad) - held_out
