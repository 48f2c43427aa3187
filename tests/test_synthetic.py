"""Synthetic MSR-VTT-style set: real decodable mp4s, exact MSR-VTT file formats, determinism, caption/attribute
agreement, temporal twins and rendered motion that matches the motion label."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import av
import numpy as np
import pytest

from tvr.bench.synthetic import (
    COLOUR_WORDS,
    COLOURS,
    SHAPE_WORDS,
    ObjectSpec,
    SynthConfig,
    VideoSpec,
    encode_mp4,
    generate_synthetic_dataset,
    make_video_specs,
    render_video_frames,
    resolve_codec,
)
from tvr.config import ConfigError

SMALL = SynthConfig(num_videos=14, num_test=4, captions_per_video=3, fps=4, seconds=2.0, size=32, seed=3)
ANNOTATION_FILES = (
    "MSRVTT_data.json",
    "MSRVTT_train.9k.csv",
    "MSRVTT_train.7k.csv",
    "MSRVTT_JSFUSION_test.csv",
    "MSRVTT_test1ka.jsonl",
    "synth_meta.json",
    "README.md",
)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth")
    return out, generate_synthetic_dataset(out, SMALL)


@pytest.fixture(scope="module")
def default_specs() -> list[VideoSpec]:
    return make_video_specs(SynthConfig())


def _decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def _colour_mask(frames: np.ndarray, colour: str) -> np.ndarray:
    """Pixels within 60 RGB levels of a shape colour (backgrounds are grey-scale, so never match)."""
    diff = frames.astype(np.float64) - np.asarray(COLOURS[colour], np.float64)
    return np.sqrt((diff**2).sum(-1)) < 60


def _centroids(mask: np.ndarray) -> np.ndarray:
    """[T, 2] (x, y) centre of mass of a [T, H, W] mask; NaN for empty frames."""
    out = np.full((mask.shape[0], 2), np.nan)
    for t, m in enumerate(mask):
        ys, xs = np.nonzero(m)
        if len(xs):
            out[t] = xs.mean(), ys.mean()
    return out


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    return any(re.search(rf"\b{re.escape(w)}\b", text) for w in words)


# -------------------------------------------------------------------------------------------------------- files


def test_summary_and_files_exist(small_set: tuple[Path, dict]) -> None:
    out, summary = small_set
    assert summary["num_videos"] == 14 and summary["num_test"] == 4
    assert summary["num_train"] + summary["num_validate"] == 10
    assert summary["num_sentences"] == 14 * 3 and summary["num_frames"] == 8
    assert summary["codec"] in ("libx264", "mpeg4")
    for name in ANNOTATION_FILES:
        assert (out / name).is_file(), name
    assert sorted(p.name for p in (out / "videos").iterdir()) == sorted(f"video{i}.mp4" for i in range(14))
    assert not list(out.rglob("*.tmp")), "temporary files left behind"


def test_videos_decode_with_right_frames(small_set: tuple[Path, dict]) -> None:
    out, _ = small_set
    specs = make_video_specs(SMALL)
    for i in range(SMALL.num_videos):
        frames = _decode(out / "videos" / f"video{i}.mp4")
        assert frames.shape == (8, 32, 32, 3)
        rendered = render_video_frames(specs[i], SMALL).astype(np.float64)
        # lossy yuv420p: close to the rendered frames on average, far closer than to another video
        assert np.abs(frames - rendered).mean() < 8.0
    with av.open(str(out / "videos" / "video0.mp4")) as container:
        stream = container.streams.video[0]
        assert float(stream.average_rate) == pytest.approx(4.0)


def test_msrvtt_data_json_structure(small_set: tuple[Path, dict]) -> None:
    out, _ = small_set
    data = json.loads((out / "MSRVTT_data.json").read_text())
    assert set(data) == {"info", "videos", "sentences"}
    videos, sentences = data["videos"], data["sentences"]
    assert len(videos) == 14 and len(sentences) == 14 * 3
    for i, v in enumerate(videos):
        assert set(v) == {"video_id", "category", "url", "start time", "end time", "split", "id"}
        assert v["video_id"] == f"video{i}" and v["id"] == i
        assert isinstance(v["category"], int) and isinstance(v["url"], str)
        assert v["start time"] == 0.0 and v["end time"] == pytest.approx(2.0)
        assert v["split"] in ("train", "validate", "test")
    ids = {v["video_id"] for v in videos}
    assert [s["sen_id"] for s in sentences] == list(range(len(sentences)))
    for s in sentences:
        assert set(s) == {"sen_id", "video_id", "caption"}
        assert s["video_id"] in ids and s["caption"] and s["caption"] == s["caption"].lower()
        assert "," not in s["caption"] and '"' not in s["caption"]
    per_video = {vid: sum(s["video_id"] == vid for s in sentences) for vid in ids}
    assert set(per_video.values()) == {3}
    # test videos carry the highest ids, as in MSR-VTT
    splits = [v["split"] for v in videos]
    assert splits == sorted(splits, key=["train", "validate", "test"].index)


def test_split_lists(small_set: tuple[Path, dict]) -> None:
    out, _ = small_set
    data = json.loads((out / "MSRVTT_data.json").read_text())
    split_of = {v["video_id"]: v["split"] for v in data["videos"]}
    captions = {}
    for s in data["sentences"]:
        captions.setdefault(s["video_id"], []).append(s["caption"])

    header9, rows9 = _read_csv(out / "MSRVTT_train.9k.csv")
    header7, rows7 = _read_csv(out / "MSRVTT_train.7k.csv")
    header_t, rows_t = _read_csv(out / "MSRVTT_JSFUSION_test.csv")
    assert header9 == header7 == ["video_id"]
    assert header_t == ["key", "vid_key", "video_id", "sentence"]
    nine = [r["video_id"] for r in rows9]
    seven = [r["video_id"] for r in rows7]
    test = [r["video_id"] for r in rows_t]
    assert set(nine) == {v for v, s in split_of.items() if s in ("train", "validate")}
    assert set(seven) == {v for v, s in split_of.items() if s == "train"} and set(seven) < set(nine)
    assert set(test) == {v for v, s in split_of.items() if s == "test"} and len(test) == 4
    assert set(nine).isdisjoint(test) and set(nine) | set(test) == set(split_of)
    assert len(set(nine)) == len(nine) and len(set(test)) == len(test)
    for k, row in enumerate(rows_t):
        assert row["key"] == f"ret{k}"
        assert row["vid_key"] == "msr" + row["video_id"].removeprefix("video")
        assert row["sentence"] in captions[row["video_id"]]
    lines = (out / "MSRVTT_test1ka.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["clip_id"] for r in records] == test
    assert all(r["text"] == captions[r["clip_id"]] for r in records)


def test_headers_match_real_msrvtt(small_set: tuple[Path, dict], shared_data: Path) -> None:
    out, _ = small_set
    real = shared_data / "msrvtt"
    for name in ("MSRVTT_train.9k.csv", "MSRVTT_train.7k.csv", "MSRVTT_JSFUSION_test.csv"):
        if not (real / name).is_file():
            pytest.skip(f"{real / name} not present")
        real_head = (real / name).read_bytes().split(b"\n")[:2]
        ours_head = (out / name).read_bytes().split(b"\n")[:2]
        assert ours_head[0] == real_head[0], name
        assert ours_head[1].count(b",") == real_head[1].count(b","), name


def test_meta_matches_annotations(small_set: tuple[Path, dict]) -> None:
    out, _ = small_set
    meta = json.loads((out / "synth_meta.json").read_text())
    data = json.loads((out / "MSRVTT_data.json").read_text())
    assert [m["video_id"] for m in meta["videos"]] == [v["video_id"] for v in data["videos"]]
    assert [m["split"] for m in meta["videos"]] == [v["split"] for v in data["videos"]]
    assert meta["num_frames"] == 8 and meta["config"]["seed"] == 3
    for m in meta["videos"]:
        assert m["shape"] in SHAPE_WORDS and m["colour"] in COLOURS
        if m["twin"] is not None:
            twin = meta["videos"][int(m["twin"].removeprefix("video"))]
            assert twin["twin"] == m["video_id"] and twin["twin_kind"] == m["twin_kind"]


# -------------------------------------------------------------------------------------------------- determinism


def test_lossless_renders_in_two_processes_are_identical_and_decode_to_the_frames(tmp_path: Path) -> None:
    """lossless: two fresh processes write byte-identical files (clips included), every clip decodes to exactly its
    rendered frames, and synth_meta.json records their SHA-256."""
    import hashlib
    import subprocess
    import sys

    cfg = SynthConfig(**{**SMALL.__dict__, "lossless": True, "val_like_test": True, "val_fraction": 0.3})
    script = (
        "import sys; from tvr.bench.synthetic import SynthConfig, generate_synthetic_dataset; "
        f"generate_synthetic_dataset(sys.argv[1], SynthConfig(**{cfg.__dict__!r}))"
    )
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], check=True, timeout=120)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len([f for f in files if f.suffix == ".mp4"]) == cfg.num_videos and Path("MSRVTT_val.csv") in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    meta = json.loads((tmp_path / "a" / "synth_meta.json").read_text())
    assert meta["codec"] == "libx264rgb"
    for i, spec in enumerate(make_video_specs(cfg)):
        frames = render_video_frames(spec, cfg)
        assert np.array_equal(_decode(tmp_path / "a" / "videos" / f"video{i}.mp4"), frames)
        assert meta["videos"][i]["frames_sha256"] == hashlib.sha256(frames.tobytes()).hexdigest()


def test_same_seed_same_bytes_and_frames(tmp_path: Path) -> None:
    """Two fresh processes (as two ``tvr synth`` runs would be) write byte-identical annotations and videos.

    Each run is its own process on purpose: late in a long test session, in-process re-encodes were seen to differ
    by a pixel level (numpy/libav SIMD paths depend on memory state); the guarantee users rely on is per run.
    """
    import subprocess
    import sys

    script = (
        "import sys; from tvr.bench.synthetic import SynthConfig, generate_synthetic_dataset; "
        f"generate_synthetic_dataset(sys.argv[1], SynthConfig(**{SMALL.__dict__!r}))"
    )
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], check=True, timeout=120)
    for name in ANNOTATION_FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    videos = sorted(p.name for p in (tmp_path / "a" / "videos").glob("*.mp4"))
    assert len(videos) == SMALL.num_videos
    for name in videos:
        assert (tmp_path / "a" / "videos" / name).read_bytes() == (tmp_path / "b" / "videos" / name).read_bytes(), name
    first = _decode(tmp_path / "a" / "videos" / videos[0])[0]
    assert np.array_equal(first, _decode(tmp_path / "b" / "videos" / videos[0])[0])


def test_other_seed_differs() -> None:
    a = make_video_specs(SMALL)
    b = make_video_specs(SynthConfig(**{**SMALL.__dict__, "seed": 4}))
    assert [s.captions for s in a] != [s.captions for s in b]


def test_bad_config_names_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size"):
        generate_synthetic_dataset(tmp_path, SynthConfig(size=33))
    with pytest.raises(ValueError, match="num_test"):
        make_video_specs(SynthConfig(num_videos=5, num_test=5))


def test_missing_codec_falls_back_to_mpeg4(tmp_path: Path) -> None:
    assert resolve_codec("no_such_encoder_xyz") == "mpeg4"
    cfg = SynthConfig(fps=4, seconds=1.5, size=32)
    spec = make_video_specs(SMALL)[0]
    encode_mp4(render_video_frames(spec, cfg), tmp_path / "v.mp4", cfg.fps, "mpeg4")
    assert _decode(tmp_path / "v.mp4").shape == (6, 32, 32, 3)


# ----------------------------------------------------------------------------------------------------- captions


def test_captions_mention_attributes(default_specs: list[VideoSpec]) -> None:
    colour_hits = 0
    total = 0
    for spec in default_specs:
        assert len(spec.captions) == 5 and len(set(spec.captions)) == 5
        full = spec.captions[spec.full_caption]
        for obj in spec.event_order():
            # the full caption names the canonical colour and shape of every acting shape
            assert re.search(rf"\b{obj.colour} {SHAPE_WORDS[obj.shape][0]}\b", full), (full, obj)
        primary = spec.event_order()[0]
        for caption in spec.captions:
            total += 1
            colour_hits += _mentions(caption, COLOUR_WORDS[primary.colour])
            assert _mentions(caption, COLOUR_WORDS[primary.colour] + SHAPE_WORDS[primary.shape]), caption
    assert colour_hits / total > 0.7


def test_caption_words_follow_motion(default_specs: list[VideoSpec]) -> None:
    cue = {
        "move_right": "right",
        "move_left": "left",
        "rotate_cw": r"\bclockwise",
        "rotate_ccw": "counter|anti",
        "appear_order": "appear|show|pops into",
        "disappear_order": "disappear|vanish|goes away",
    }
    for spec in default_specs:
        if spec.motion in cue:
            for caption in spec.captions:
                assert re.search(cue[spec.motion], caption), (spec.motion, caption)


# ---------------------------------------------------------------------------------------------- temporal pairs


def test_reverse_twins_are_exact_time_reversals(default_specs: list[VideoSpec]) -> None:
    cfg = SynthConfig()
    reverse = [(i, s.twin) for i, s in enumerate(default_specs) if s.twin_kind == "reverse" and i < s.twin]
    families = {default_specs[i].family for i, _ in reverse}
    assert len(reverse) >= 10 and {"horizontal", "vertical"} & families
    for i, j in reverse:
        a, b = default_specs[i], default_specs[j]
        assert a.motion != b.motion and a.family == b.family
        assert (a.background, a.bg_seed) == (b.background, b.bg_seed)
        assert [(o.shape, o.colour) for o in a.objects] == [(o.shape, o.colour) for o in b.objects]
        fa, fb = render_video_frames(a, cfg), render_video_frames(b, cfg)
        assert np.array_equal(fa, fb[::-1])
        assert not np.array_equal(fa, fb)


def test_order_twins_swap_event_order(default_specs: list[VideoSpec]) -> None:
    cfg = SynthConfig()
    order = [(i, s.twin) for i, s in enumerate(default_specs) if s.twin_kind == "order" and i < s.twin]
    assert order
    for i, j in order:
        a, b = default_specs[i], default_specs[j]
        assert a.motion == b.motion and a.background == b.background
        assert {(o.shape, o.colour) for o in a.objects} == {(o.shape, o.colour) for o in b.objects}
        first_a, first_b = a.event_order()[0], b.event_order()[0]
        assert (first_a.shape, first_a.colour) != (first_b.shape, first_b.colour)
        # pooled over time the twins are nearly the same; frame by frame they are not
        fa, fb = render_video_frames(a, cfg), render_video_frames(b, cfg)
        assert not np.array_equal(fa, fb)
        edge = 0 if a.motion == "disappear_order" else -1  # both shapes are visible at this end
        assert np.array_equal(fa[edge], fb[edge])


def test_twins_share_split(default_specs: list[VideoSpec]) -> None:
    for spec in default_specs:
        if spec.twin is not None:
            assert default_specs[spec.twin].split == spec.split


@pytest.mark.parametrize(
    "dials",
    [
        dict(num_videos=300, num_test=80, val_fraction=0.2, shared_attributes=0.4, pair_prob=0.6, seed=1),
        dict(num_videos=301, num_test=61, val_fraction=0.3, shared_attributes=0.1, pair_prob=0.9, seed=2),
        dict(num_videos=500, num_test=200, val_fraction=0.25, shared_attributes=0.5, pair_prob=0.5, seed=3),
    ],
)
def test_validation_like_test_never_separates_a_group(dials: dict) -> None:
    """val_like_test: twins and videos sharing caption attributes never straddle train / validate / test, the split
    sizes are exact, and validation holds the test's shares of twins and false negatives (within the tolerance the
    bench enforces)."""
    from tvr.bench.composition import TOLERANCE

    cfg = SynthConfig(val_like_test=True, **dials)
    specs = make_video_specs(cfg)
    by_key: dict[tuple[str, ...], set[str]] = {}
    for spec in specs:
        by_key.setdefault(spec.caption_key(), set()).add(spec.split)
        if spec.twin is not None:
            assert specs[spec.twin].split == spec.split and specs[spec.twin].twin == specs.index(spec)
    assert all(len(splits) == 1 for splits in by_key.values())
    counts = {name: sum(s.split == name for s in specs) for name in ("train", "validate", "test")}
    assert counts["test"] == cfg.num_test
    assert counts["validate"] == round(cfg.val_fraction * (cfg.num_videos - cfg.num_test))

    def shares(split: str) -> tuple[float, float]:
        chosen = [s for s in specs if s.split == split]
        keys = [s.caption_key() for s in chosen]
        twin = sum(s.twin is not None for s in chosen) / len(chosen)
        return twin, sum(keys.count(k) > 1 for k in keys) / len(chosen)

    (val_twins, val_fn), (test_twins, test_fn) = shares("validate"), shares("test")
    assert abs(val_twins - test_twins) <= TOLERANCE + 1e-12 and abs(val_fn - test_fn) <= TOLERANCE + 1e-12
    assert test_fn > 0 and test_twins > 0.3


def test_validation_like_test_writes_one_full_caption_per_video(tmp_path: Path, small_set: tuple[Path, dict]) -> None:
    cfg = SynthConfig(**{**SMALL.__dict__, "val_like_test": True, "val_fraction": 0.3})
    generate_synthetic_dataset(tmp_path, cfg)
    specs = make_video_specs(cfg)
    header, rows = _read_csv(tmp_path / "MSRVTT_val.csv")
    assert header == ["key", "vid_key", "video_id", "sentence"]
    validate = [(f"video{i}", s) for i, s in enumerate(specs) if s.split == "validate"]
    assert [r["video_id"] for r in rows] == [v for v, _ in validate] and len(rows) == 3
    assert [r["sentence"] for r in rows] == [s.captions[s.full_caption] for _, s in validate]
    assert not (small_set[0] / "MSRVTT_val.csv").exists()  # without val_like_test: no official validation


def test_a_group_too_large_for_the_split_is_refused() -> None:
    # every video a twin: an odd test split cannot be filled from whole pairs
    with pytest.raises(ConfigError, match="test split cannot hold exactly 5 videos"):
        make_video_specs(SynthConfig(num_videos=20, num_test=5, pair_prob=1.0, val_like_test=True))


# ------------------------------------------------------------------------------------------------------- motion


def _check_motion(spec: VideoSpec, frames: np.ndarray, size: int) -> None:
    """The primary shape's colour mask behaves as the motion label says."""
    mask = _colour_mask(frames, spec.event_order()[0].colour)
    area = mask.sum(axis=(1, 2))
    cxy = _centroids(mask)
    m = spec.motion
    if m in ("move_right", "move_left", "move_up", "move_down"):
        axis, sign = {"move_right": (0, 1), "move_left": (0, -1), "move_up": (1, -1), "move_down": (1, 1)}[m]
        track = cxy[:, axis] * sign
        assert track[-1] - track[0] > 0.45 * size, (m, track)
        assert np.all(np.diff(track) > -0.5), (m, track)  # never goes backwards
        other = cxy[:, 1 - axis]
        assert other.max() - other.min() < 1.0  # and does not drift sideways
    elif m in ("grow", "shrink"):
        change = area[-1] / area[0]
        assert (change > 4) if m == "grow" else (change < 0.25), (m, area)
    elif m == "bounce":
        y = cxy[:, 1]
        assert abs(y[0] - y[-1]) < 1.0 and y.min() < y[0] - 0.2 * size, y
    elif m in ("appear", "disappear"):
        visible = area > 0
        assert visible[-1] != visible[0] and (visible[-1] if m == "appear" else visible[0])
        switches = np.flatnonzero(np.diff(visible.astype(int)) != 0)
        assert len(switches) == 1 and 0.2 * len(area) < switches[0] < 0.8 * len(area), visible  # part-way through
    elif m in ("appear_order", "disappear_order"):
        first, second = spec.event_order()
        onset = [np.flatnonzero(_colour_mask(frames, o.colour).sum(axis=(1, 2)) > 0) for o in (first, second)]
        if m == "appear_order":
            assert onset[0][0] < onset[1][0]
        else:
            assert onset[0][-1] < onset[1][-1]
    elif m in ("rotate_cw", "rotate_ccw"):
        assert abs(area[-1] - area[0]) < 0.35 * area[0]  # rotation keeps size
        assert np.all(np.nanstd(cxy, axis=0) < 1.0)  # and position


def test_rendered_motion_matches_label(default_specs: list[VideoSpec]) -> None:
    cfg = SynthConfig()
    seen = set()
    for spec in default_specs:
        frames = render_video_frames(spec, cfg)
        assert frames.shape == (24, 64, 64, 3) and frames.dtype == np.uint8
        _check_motion(spec, frames, cfg.size)
        seen.add(spec.motion)
    assert {"move_right", "move_left", "grow", "appear_order", "bounce"} <= seen


def test_decoded_video_moves_right(tmp_path: Path) -> None:
    cfg = SynthConfig(fps=8, seconds=2.0, size=48)
    spec = VideoSpec("move_right", "noisy", 7, [ObjectSpec("circle", "red", 0.2, 0.5, 0.8, 0.5, 0.12, 0.12)])
    encode_mp4(render_video_frames(spec, cfg), tmp_path / "v.mp4", cfg.fps, resolve_codec(cfg.codec))
    x = _centroids(_colour_mask(_decode(tmp_path / "v.mp4"), "red"))[:, 0]
    # the centre goes from 0.2 * 48 to 0.8 * 48 (pixel centres sit at +0.5) in equal steps
    expected = np.linspace(0.2, 0.8, 16) * 48 - 0.5
    assert np.abs(x - expected).max() < 1.0


def test_rotation_direction_is_clockwise_on_screen() -> None:
    cfg = SynthConfig(fps=4, seconds=1.0, size=64)
    tri = ObjectSpec("triangle", "blue", 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, a0=0.0, a1=30.0)
    frames = render_video_frames(VideoSpec("rotate_cw", "black", 0, [tri]), cfg)
    apex_x = []
    for mask in _colour_mask(frames, "blue"):
        ys, xs = np.nonzero(mask)
        apex_x.append(xs[ys <= ys.min() + 2].mean())  # the apex stays the topmost point for angles in [0, 30]
    # the true apex goes to x = 32 + R sin(30 deg) = 41.6 (R = 1.2 * 16 px): it swings right, i.e. clockwise with
    # y pointing down (the top rows also catch some of the left edge, so the measured shift is a bit smaller)
    assert apex_x[0] == pytest.approx(31.5, abs=0.6)
    assert np.all(np.diff(apex_x) > 1.0) and apex_x[-1] > 37.0, apex_x
    ccw = render_video_frames(VideoSpec("rotate_ccw", "black", 0, [tri.reversed_in_time()]), cfg)
    assert np.array_equal(ccw, frames[::-1])


def test_shapes_render_distinct_masks() -> None:
    cfg = SynthConfig(fps=2, seconds=1.0, size=48)
    masks = {}
    for shape in SHAPE_WORDS:
        obj = ObjectSpec(shape, "green", 0.5, 0.5, 0.5, 0.5, 0.3, 0.3)
        masks[shape] = _colour_mask(render_video_frames(VideoSpec("appear", "grey", 0, [obj]), cfg)[0], "green")
    names = list(masks)
    for a in range(len(names)):
        assert masks[names[a]].sum() > 50
        for b in range(a + 1, len(names)):
            assert (masks[names[a]] != masks[names[b]]).sum() > 20, (names[a], names[b])
