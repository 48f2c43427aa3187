"""The synthetic generator's dials (false negatives, temporal order, paraphrase, distractor motion, clip length,
real-photograph content): each does what it says, is recorded in synth_meta.json, and the defaults still make
exactly the data they made before the dials existed."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import av
import numpy as np
import pytest
from typer.testing import CliRunner

from tvr.bench import photos as photos_mod
from tvr.bench.synthetic import (
    COLOUR_WORDS,
    COLOURS,
    MIN_PHOTOS,
    MOVING_CLAUSES,
    SHAPE_WORDS,
    SINGLE_FRAMES,
    STILL_CLAUSES,
    VERBS,
    SynthConfig,
    build_annotations,
    generate_synthetic_dataset,
    make_video_specs,
    render_video_frames,
)

# SHA-256 of the MSR-VTT annotation files and of every rendered frame, made by the generator before the dials
# existed (commit 3e73908): `tvr synth` / `tvr demo` defaults must keep giving exactly this data, because the
# recorded demo tables in docs/benchmarks.md were measured on it.
GOLDEN = {
    (120, 30): (
        "c955fe0218f8a917eaf64b0a42f41bedd3be267c2962ff208b76e656640be836",
        "b9ef44ca8ded60991e563924cc4a5e1c0e3c3ffd01aa9eb375b24432c1d2f71d",
    ),
    (240, 30): (
        "23a8fd26a69ff3fcf6501abdf3eea56b7f6bdc606eff3e76644ac608d963af56",
        "964edff51f9da1ab1f8e5bd7c352131baa330bf1833bb0667bcbd408072c8321",
    ),
}

SMALL = dict(num_videos=40, num_test=10, captions_per_video=4, fps=4, seconds=2.0, size=32, seed=5)


def _photos_installed() -> bool:
    return len(photos_mod.available_photos()) >= MIN_PHOTOS


needs_photos = pytest.mark.skipif(
    not _photos_installed(), reason="photographs not installed (pip install scikit-image; apt-get install opencv-doc)"
)


@pytest.mark.parametrize("sizes", sorted(GOLDEN))
def test_defaults_make_the_same_data_as_before_the_dials(sizes: tuple[int, int]) -> None:
    cfg = SynthConfig(num_videos=sizes[0], num_test=sizes[1])
    specs = make_video_specs(cfg)
    texts = build_annotations(specs, cfg, "libx264")
    annotations = hashlib.sha256()
    for name in sorted(texts):
        if name.startswith("MSRVTT"):
            annotations.update(name.encode())
            annotations.update(texts[name].encode())
    frames = hashlib.sha256()
    for spec in specs:
        frames.update(render_video_frames(spec, cfg).tobytes())
    assert (annotations.hexdigest(), frames.hexdigest()) == GOLDEN[sizes]


def test_shared_attributes_makes_false_negatives() -> None:
    def sharing(shared: float) -> tuple[int, list]:
        specs = make_video_specs(SynthConfig(**SMALL, shared_attributes=shared))
        keys = [s.caption_key() for s in specs]
        return sum(keys.count(k) > 1 for k in keys), specs

    none, _ = sharing(0.0)
    many, specs = sharing(0.8)
    assert many > none + 10
    # a repeated key means the same motion and the same acting objects in the same event order
    keys = [s.caption_key() for s in specs]
    twice = next(k for k in keys if keys.count(k) > 1)
    a, b = [s for s in specs if s.caption_key() == twice][:2]
    assert a.motion == b.motion and [o.label for o in a.event_order()] == [o.label for o in b.event_order()]
    # ... shown differently: another layout or background
    assert (a.background, a.bg_seed, a.objects[0].x0, a.objects[0].y0) != (
        b.background, b.bg_seed, b.objects[0].x0, b.objects[0].y0)  # fmt: skip
    cfg = SynthConfig(**SMALL, shared_attributes=0.8)
    meta = json.loads(build_annotations(specs, cfg, "libx264")["synth_meta.json"])
    recorded = meta["dials"]["false_negatives"]
    assert recorded["shared_attributes"] == 0.8
    within = {
        split: sum(
            1
            for s in specs
            if s.split == split and sum(t.caption_key() == s.caption_key() for t in specs if t.split == split) > 1
        )
        for split in ("train", "validate", "test")
    }
    assert recorded["videos_sharing_caption_attributes_within_split"] == within
    for video in meta["videos"]:
        for other in video["same_caption_attributes"]:
            twin = next(v for v in meta["videos"] if v["video_id"] == other)
            assert twin["caption_key"] == video["caption_key"] and twin["split"] == video["split"]


def test_pair_prob_sets_how_much_order_matters() -> None:
    without = make_video_specs(SynthConfig(**SMALL, pair_prob=0.0))
    assert all(s.twin is None for s in without)
    every = make_video_specs(SynthConfig(**SMALL, pair_prob=1.0))
    assert all(s.twin is not None for s in every)


def test_paraphrase_zero_uses_one_wording() -> None:
    rich = make_video_specs(SynthConfig(**SMALL))
    plain = make_video_specs(SynthConfig(**SMALL, paraphrase=0.0))
    vocab = lambda specs: {w for s in specs for c in s.captions for w in c.split()}  # noqa: E731
    assert len(vocab(plain)) < len(vocab(rich))
    first_frame = SINGLE_FRAMES[0]
    assert first_frame == "{a} {vp}"
    for spec in plain:
        if spec.motion in VERBS:
            verb = VERBS[spec.motion][0][0]
            for caption in spec.captions:
                assert re.match(rf"^an? [a-z ]+ {re.escape(verb)}\b", caption), caption
    meta_rich = json.loads(build_annotations(rich, SynthConfig(**SMALL), "x")["synth_meta.json"])
    meta_plain = json.loads(build_annotations(plain, SynthConfig(**SMALL, paraphrase=0.0), "x")["synth_meta.json"])
    assert (
        meta_plain["dials"]["paraphrase"]["distinct_caption_fraction"]
        < meta_rich["dials"]["paraphrase"]["distinct_caption_fraction"]
    )


def test_distractor_motion_moves_the_distractor_and_the_captions_say_so() -> None:
    cfg = SynthConfig(**SMALL, distractor_prob=1.0, distractor_motion=1.0, pair_prob=0.0)
    specs = [s for s in make_video_specs(cfg) if len(s.objects) > 1 and s.motion in VERBS]
    assert specs
    for spec in specs:
        distractor = spec.objects[1]
        assert distractor.moves
        frames = render_video_frames(spec, cfg)
        # the distractor's own colour: its centre of mass moves between the first and the last frame
        colour = np.asarray(COLOURS[distractor.colour])
        masks = np.sqrt(((frames.astype(float) - colour) ** 2).sum(-1)) < 60
        first, last = (np.argwhere(m).mean(0) for m in (masks[0], masks[-1]))
        assert np.abs(first - last).max() > 0.15 * cfg.size
        still = [c[c.index("}") + 1 :] for c in STILL_CLAUSES]
        assert not any(s in caption for caption in spec.captions for s in still)
    moving = [c[c.index("}") + 1 :] for c in MOVING_CLAUSES]
    assert any(m in caption for spec in specs for caption in spec.captions for m in moving)


def test_clip_length_dial_reaches_the_files(tmp_path: Path) -> None:
    cfg = SynthConfig(num_videos=4, num_test=1, captions_per_video=2, fps=5, seconds=1.6, size=32, seed=1)
    generate_synthetic_dataset(tmp_path, cfg)
    with av.open(str(tmp_path / "videos" / "video0.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == 8
    meta = json.loads((tmp_path / "synth_meta.json").read_text())
    assert meta["dials"]["clip_length"] == {"seconds": 1.6, "fps": 5, "frames": 8, "size": 32}
    assert meta["config"]["content"] == "shapes"


def test_vague_captions_name_no_object_and_change_nothing_else() -> None:
    """vague_captions replaces some non-full captions by ones naming no object ("an object moves to the right"):
    the videos, splits and full captions (the validation and test queries) stay those of the set without them."""
    plain_cfg = SynthConfig(**SMALL, shared_attributes=0.3)
    vague_cfg = SynthConfig(**SMALL, shared_attributes=0.3, vague_captions=0.5)
    plain, vague = make_video_specs(plain_cfg), make_video_specs(vague_cfg)
    replaced = 0
    for a, b in zip(plain, vague, strict=True):
        assert (a.split, a.motion, a.full_caption, a.captions[a.full_caption]) == (
            b.split, b.motion, b.full_caption, b.captions[b.full_caption])  # fmt: skip
        for k, (before, after) in enumerate(zip(a.captions, b.captions, strict=True)):
            if before == after:
                continue
            replaced += 1
            assert k != b.full_caption
            named = [w for o in b.event_order() for w in (*SHAPE_WORDS[o.shape], *COLOUR_WORDS[o.colour])]
            assert not any(re.search(rf"\b{word}\b", after) for word in named), after
            assert re.search(r"\b(object|thing)\b", after), after
    others = sum(len(s.captions) - 1 for s in vague)
    assert 0.35 * others < replaced < 0.65 * others  # about half of the non-full captions
    share = build_annotations(vague, vague_cfg, "libx264")["synth_meta.json"]
    assert json.loads(share)["dials"]["ambiguity"]["vague_caption_share"] == pytest.approx(
        replaced / sum(len(s.captions) for s in vague), abs=0.02)  # fmt: skip


def test_bad_dial_is_a_user_error(tmp_path: Path) -> None:
    from tvr.cli import app

    result = CliRunner().invoke(app, ["synth", "--out", str(tmp_path / "s"), "--content", "cartoons"])
    assert result.exit_code == 2
    assert "content" in result.output
    result = CliRunner().invoke(app, ["synth", "--out", str(tmp_path / "s"), "--paraphrase", "1.5"])
    assert result.exit_code == 2 and "paraphrase" in result.output


# ---------------------------------------------------------------------------------------------- photographs


def test_photos_come_only_from_installed_package_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    skimage_dir = photos_mod.skimage_data_dir()
    for photo in photos_mod.PHOTOS:
        path = photos_mod.photo_path(photo)
        if path is None:
            continue
        folder = skimage_dir if photo.source == "skimage" else photos_mod.opencv_data_dir()
        assert path.parent == folder
    # without opencv-doc only the scikit-image photographs remain, and asking for more names what to install
    monkeypatch.setenv("TVR_OPENCV_DATA", str(tmp_path / "absent"))
    found = photos_mod.available_photos()
    assert all(photos_mod.PHOTOS_BY_NAME[n].source == "skimage" for n in found)
    with pytest.raises(photos_mod.PhotoError, match="apt-get install opencv-doc"):
        photos_mod.require_photos(len(photos_mod.PHOTOS))


@needs_photos
def test_texture_is_the_centre_square_of_the_photo() -> None:
    name = photos_mod.available_photos()[0]
    texture = photos_mod.load_texture(name)
    assert texture.shape == (photos_mod.TEXTURE_SIZE, photos_mod.TEXTURE_SIZE, 3) and texture.dtype == np.float32
    assert 0 <= texture.min() and texture.max() <= 255 and texture.std() > 5
    assert not texture.flags.writeable


@needs_photos
def test_objects_content_shows_the_photographs_in_caption_order(tmp_path: Path) -> None:
    cfg = SynthConfig(num_videos=16, num_test=4, captions_per_video=3, fps=4, seconds=2.0, size=48, seed=2,
                      content="objects", pair_prob=1.0)  # fmt: skip
    summary = generate_synthetic_dataset(tmp_path, cfg)
    assert summary["num_videos"] == 16
    meta = json.loads((tmp_path / "synth_meta.json").read_text())
    specs = make_video_specs(cfg)
    used = {o.photo for s in specs for o in s.objects}
    assert set(meta["dials"]["photos"]) == used and all(meta["dials"]["photos"][n]["sha256"] for n in used)
    nouns = {name: photos_mod.PHOTOS_BY_NAME[name].nouns for name in used}
    for spec in specs:
        assert all(o.photo and not o.shape and not o.colour for o in spec.objects)
        for caption in spec.captions:
            # every caption names its acting photographs, in the order of their events
            spots = [min((caption.find(n) for n in nouns[o.photo] if n in caption), default=-1)
                     for o in spec.event_order()]  # fmt: skip
            assert all(s >= 0 for s in spots), (caption, [o.photo for o in spec.event_order()])
            if spec.motion in ("appear_order", "disappear_order", "sequence") and "after" not in caption:
                assert spots == sorted(spots), caption
    # a sequence fills the frame with its first photograph, then its second; its twin shows them swapped
    sequences = [i for i, s in enumerate(specs) if s.motion == "sequence"]
    if not sequences:
        pytest.skip("this seed drew no sequence video")
    i = sequences[0]
    spec = specs[i]
    frames = render_video_frames(spec, cfg).astype(np.float64)
    first, second = (photos_mod.load_texture(o.photo).mean((0, 1)) for o in spec.event_order())
    assert np.abs(frames[0].mean((0, 1)) - first).max() < np.abs(frames[0].mean((0, 1)) - second).max()
    assert np.abs(frames[-1].mean((0, 1)) - second).max() < np.abs(frames[-1].mean((0, 1)) - first).max()
    twin = specs[spec.twin]
    assert [o.photo for o in twin.event_order()] == [o.photo for o in reversed(spec.event_order())]
    with av.open(str(tmp_path / "videos" / f"video{i}.mp4")) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert decoded.shape == (cfg.num_frames, 48, 48, 3)
    assert np.abs(decoded.astype(np.float64) - frames).mean() < 12
