"""Synthetic captioned videos in MSR-VTT layout: a small, fully controlled set on which retrieval is learnable.

Why it exists: the real benchmarks are large and slow; this generator makes real mp4 files plus annotations in
exactly the MSR-VTT file formats, so every loader, trainer and evaluator can be run end to end in seconds, and
so analyses can relate errors to known ground-truth attributes.

What a video shows
    One primary shape (circle, square, triangle, diamond, cross, star) in a named colour (red, green, blue, yellow,
    orange, purple, pink, cyan) on a neutral background (plain grey / black / white, or a grey checkered,
    striped, noisy or gradient texture; shape colours are saturated and backgrounds grey-scale, so colour words
    are never ambiguous). The primary shape performs one motion:

    * move_right / move_left, move_up / move_down   (direction)
    * grow / shrink                                 (scale over time)
    * rotate_cw / rotate_ccw                        (never circles: a rotating circle looks static)
    * bounce                                        (vertical hops; symmetric in time, so it has no twin)
    * appear / disappear                            (pops in or out of view part-way through)
    * appear_order / disappear_order                (two shapes; "A appears and then B appears")

    Single-shape motions sometimes get a second, static distractor shape of another colour and shape, placed
    away from the primary's path.

Why it is learnable but not trivial
    * Temporal twins: about half of the videos come in pairs that differ *only* in time: a video and its exact
      time reversal (right<->left, up<->down, grow<->shrink, cw<->ccw, appear<->disappear; same shapes, colours,
      background and positions, so its frames are the first one's frames in reverse order), or the same two
      shapes with the order of their events swapped. A model that pools frames without order cannot tell twins
      apart; one that models time can. Twins always share a split.
    * False negatives: 8 colours x 6 shapes are shared by many videos, so a query such as "a red circle moves"
      loosely matches several videos; only colour + shape + motion (+ background) pin one down.
    * Paraphrase: captions (default 5 per video) come from several sentence frames, verb phrases and synonyms
      ("a red circle slides to the right", "there is a crimson disk moving from left to right", "the scarlet ball
      travels rightwards on a grey background"). Every caption names the motion and at least one of colour /
      shape; at least one caption per video names every attribute of every shape it mentions. Captions are
      lower case with no punctuation, like MSR-VTT's, so the CSV files need no quoting.

Dials (``SynthConfig`` fields, recorded in ``synth_meta.json`` under ``config`` and, as they came out, ``dials``)
    * ``content``: "shapes" (the above) or "objects": real photographs that ship with installed packages
      (scikit-image's bundled sample images, Debian opencv-doc's examples; :mod:`tvr.bench.photos`) drawn as
      squares that move, grow, rotate, bounce, appear and disappear like the shapes, plus one more family:
      ``sequence``, one full-frame photograph (panning, zooming) then another ("a cat then a cup of coffee").
      Photographs are named by their nouns ("cup of coffee", "coffee cup"); they have no colour words.
    * ``pair_prob`` (temporal order): the share of videos with a twin that differs only in time.
    * ``shared_attributes`` (false negatives): the chance that a new group repeats an earlier video's caption
      attributes (motion and acting objects in event order) with a fresh layout and background.
    * ``paraphrase`` (diversity, 0..1): how many synonyms, verb phrases and sentence frames captions draw from.
    * ``seconds`` / ``fps`` (clip length), ``distractor_prob`` and ``distractor_motion`` (a distractor that
      drifts across its half of the frame; captions then say it moves around).
    The defaults render exactly the frames and annotation files the generator made before the dials existed
    (``tests/test_synthetic_dials.py`` pins them): a dial at its default draws no random number.

Files written into ``out_dir``
    ``videos/video{i}.mp4`` (H.264 yuv420p, mpeg4 when libx264 is missing), ``MSRVTT_data.json`` (``videos[]`` and
    ``sentences[]``; split train / validate / test), ``MSRVTT_train.9k.csv`` (train + validate ids),
    ``MSRVTT_train.7k.csv`` (train-split ids only: the smaller list), ``MSRVTT_JSFUSION_test.csv`` (one caption per
    test video; columns key, vid_key, video_id, sentence), ``MSRVTT_test1ka.jsonl`` (all captions of each test video,
    CLIP-ViP layout), ``synth_meta.json`` (per-video attributes and twin links), ``README.md``.
    Test videos get the highest ids, as in MSR-VTT.

Determinism: everything is drawn from one ``numpy.random.Generator`` seeded by ``SynthConfig.seed``; the same
config gives byte-identical annotation files and identical frames. Rendering is pure numpy: each shape is an
inside-test evaluated at antialias x antialias sub-pixel positions and averaged (coverage
anti-aliasing), only inside the box the shape can reach.
Per-frame parameters interpolate endpoints with weights ``(T-1-t)/(T-1)`` and ``t/(T-1)``, so swapping the
endpoints renders exactly the reversed frame sequence (used by the twins and checked by the tests).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from tvr.config import ConfigError
from tvr.utils.io import atomic_write_text, create_temporary, remove_stale_temporaries
from tvr.utils.progress import progress_bar

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------------
# Vocabulary. The first word of every synonym tuple is the canonical one (used in meta data and in the caption
# that names every attribute).

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 175, 50),
    "blue": (40, 70, 230),
    "yellow": (240, 220, 30),
    "orange": (250, 135, 15),
    "purple": (140, 45, 200),
    "pink": (250, 120, 190),
    "cyan": (30, 210, 220),
}
COLOUR_WORDS: dict[str, tuple[str, ...]] = {
    "red": ("red", "crimson", "scarlet"),
    "green": ("green", "emerald"),
    "blue": ("blue", "azure", "cobalt"),
    "yellow": ("yellow", "golden", "lemon"),
    "orange": ("orange", "tangerine"),
    "purple": ("purple", "violet"),
    "pink": ("pink", "rose"),
    "cyan": ("cyan", "turquoise", "aqua"),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "cross", "star")
SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disk", "ball"),
    "square": ("square", "box", "block"),
    "triangle": ("triangle", "triangular shape"),
    "diamond": ("diamond", "rhombus", "lozenge"),
    "cross": ("cross", "plus sign", "plus shape"),
    "star": ("star", "star shape"),
}
#: nouns used when a caption leaves the shape out
GENERIC_NOUNS: tuple[str, ...] = ("shape", "object", "thing")
#: what a vague caption (``vague_captions``) calls every object: nothing that tells one video's objects from another's
VAGUE_NOUNS: tuple[str, ...] = ("object", "thing")
#: the random stream the vague captions are drawn from (beside ``SynthConfig.seed``)
VAGUE_STREAM = 0x76616775
#: shapes whose rotation is visible (a circle has no orientation; a diamond is a rotated square)
ROTATABLE: tuple[str, ...] = ("square", "triangle", "cross", "star")

BACKGROUNDS: tuple[str, ...] = ("grey", "black", "white", "checkered", "striped", "noisy", "gradient")
BACKGROUND_WORDS: dict[str, tuple[str, ...]] = {
    "grey": ("a grey background", "a gray background", "a plain grey backdrop"),
    "black": ("a black background", "a dark background"),
    "white": ("a white background", "a light background"),
    "checkered": ("a checkered background", "a checkerboard pattern"),
    "striped": ("a striped background", "a background of stripes"),
    "noisy": ("a noisy background", "a speckled background", "a grainy backdrop"),
    "gradient": ("a gradient background", "a shaded backdrop"),
}

#: motion -> (family, twin motion or None). Order families keep their name in the twin (the objects swap).
MOTIONS: dict[str, tuple[str, str | None]] = {
    "move_right": ("horizontal", "move_left"),
    "move_left": ("horizontal", "move_right"),
    "move_up": ("vertical", "move_down"),
    "move_down": ("vertical", "move_up"),
    "grow": ("scale", "shrink"),
    "shrink": ("scale", "grow"),
    "rotate_cw": ("rotation", "rotate_ccw"),
    "rotate_ccw": ("rotation", "rotate_cw"),
    "bounce": ("bounce", None),
    "appear": ("visibility", "disappear"),
    "disappear": ("visibility", "appear"),
    "appear_order": ("order_appear", "appear_order"),
    "disappear_order": ("order_disappear", "disappear_order"),
    # objects content only: one full-frame photograph, then another ("a cat then a cup of coffee")
    "sequence": ("sequence", "sequence"),
}
#: family -> the motion generated first (its twin / alternative is derived from it)
FAMILIES: dict[str, str] = {
    "horizontal": "move_right",
    "vertical": "move_up",
    "scale": "grow",
    "rotation": "rotate_cw",
    "bounce": "bounce",
    "visibility": "appear",
    "order_appear": "appear_order",
    "order_disappear": "disappear_order",
}
#: the families of ``content: objects``: the shapes' families plus the full-frame sequence of two photographs
OBJECT_FAMILIES: dict[str, str] = {**FAMILIES, "sequence": "sequence"}
#: families whose two acting objects differ only in the order of their events (twins swap the order)
ORDER_FAMILIES: tuple[str, ...] = ("order_appear", "order_disappear", "sequence")
#: MSR-VTT-style integer category per family (the real set has 20 categories, 0..19)
CATEGORY: dict[str, int] = {name: i for i, name in enumerate(OBJECT_FAMILIES)}
CONTENTS: tuple[str, ...] = ("shapes", "objects")

# (third person, -ing form) verb phrases per single-object motion
VERBS: dict[str, tuple[tuple[str, str], ...]] = {
    "move_right": (
        ("moves to the right", "moving to the right"),
        ("slides to the right", "sliding to the right"),
        ("moves from left to right", "moving from left to right"),
        ("travels rightwards", "travelling rightwards"),
        ("drifts right", "drifting right"),
        ("glides from the left side to the right side", "gliding from the left side to the right side"),
    ),
    "move_left": (
        ("moves to the left", "moving to the left"),
        ("slides to the left", "sliding to the left"),
        ("moves from right to left", "moving from right to left"),
        ("travels leftwards", "travelling leftwards"),
        ("drifts left", "drifting left"),
        ("glides from the right side to the left side", "gliding from the right side to the left side"),
    ),
    "move_up": (
        ("moves up", "moving up"),
        ("rises", "rising"),
        ("floats upward", "floating upward"),
        ("moves from the bottom to the top", "moving from the bottom to the top"),
        ("climbs upwards", "climbing upwards"),
    ),
    "move_down": (
        ("moves down", "moving down"),
        ("falls", "falling"),
        ("sinks", "sinking"),
        ("moves from the top to the bottom", "moving from the top to the bottom"),
        ("drops downward", "dropping downward"),
    ),
    "grow": (
        ("grows", "growing"),
        ("gets bigger", "getting bigger"),
        ("expands", "expanding"),
        ("increases in size", "increasing in size"),
        ("swells up", "swelling up"),
    ),
    "shrink": (
        ("shrinks", "shrinking"),
        ("gets smaller", "getting smaller"),
        ("contracts", "contracting"),
        ("decreases in size", "decreasing in size"),
        ("dwindles", "dwindling"),
    ),
    "rotate_cw": (
        ("rotates clockwise", "rotating clockwise"),
        ("spins clockwise", "spinning clockwise"),
        ("turns clockwise", "turning clockwise"),
        ("twirls in a clockwise direction", "twirling in a clockwise direction"),
    ),
    "rotate_ccw": (
        ("rotates counterclockwise", "rotating counterclockwise"),
        ("spins anticlockwise", "spinning anticlockwise"),
        ("turns counter clockwise", "turning counter clockwise"),
        ("twirls in an anticlockwise direction", "twirling in an anticlockwise direction"),
    ),
    "bounce": (
        ("bounces", "bouncing"),
        ("bounces up and down", "bouncing up and down"),
        ("hops", "hopping"),
        ("jumps up and down", "jumping up and down"),
    ),
    "appear": (
        ("appears", "appearing"),
        ("shows up", "showing up"),
        ("pops into view", "popping into view"),
        ("becomes visible", "becoming visible"),
        ("materializes", "materializing"),
    ),
    "disappear": (
        ("disappears", "disappearing"),
        ("vanishes", "vanishing"),
        ("goes out of view", "going out of view"),
        ("becomes invisible", "becoming invisible"),
        ("pops out of view", "popping out of view"),
    ),
}
# sentence frames for one moving shape: {a} = indefinite noun phrase, {np} = bare noun phrase
SINGLE_FRAMES: tuple[str, ...] = (
    "{a} {vp}",
    "the {np} {vp}",
    "{a} is {ing}",
    "there is {a} {ing}",
    "we see {a} {ing}",
    "a video of {a} {ing}",
)
# two-event frames: {A} happens first, {B} second
ORDER_FRAMES: dict[str, tuple[str, ...]] = {
    "appear_order": (
        "{A} appears and then {B} appears",
        "first {A} appears then {B} appears",
        "{A} shows up before {B}",
        "{B} shows up after {A}",
        "{A} pops into view followed by {B}",
        "{A} appears first and {B} appears second",
        "{B} appears after {A} has appeared",
    ),
    "disappear_order": (
        "{A} disappears and then {B} disappears",
        "first {A} vanishes then {B} vanishes",
        "{A} disappears before {B}",
        "{B} disappears after {A}",
        "{A} vanishes followed by {B}",
        "{A} goes away first and then {B} goes away",
        "{B} vanishes after {A} has vanished",
    ),
    "sequence": (
        "{A} then {B}",
        "first {A} and then {B}",
        "{A} followed by {B}",
        "we see {A} and after that {B}",
        "{B} comes after {A}",
        "a video of {A} and then {B}",
        "{A} first and {B} second",
    ),
}
STILL_CLAUSES: tuple[str, ...] = (" while {a} stays still", " while {a} does not move", " while {a} remains in place")
MOVING_CLAUSES: tuple[str, ...] = (" while {a} drifts about", " while {a} also moves around", " as {a} wanders around")
BACKGROUND_CLAUSES: tuple[str, ...] = (" on {bg}", " against {bg}", " in front of {bg}")


# --------------------------------------------------------------------------------------------------------------
# Configuration and specs


@dataclass
class SynthConfig:
    """Generation parameters; every field is recorded in the output's README.md and synth_meta.json."""

    num_videos: int = 120
    #: videos in the test split (= MSRVTT_JSFUSION_test.csv); the rest is train + validate (= 9k list)
    num_test: int = 30
    captions_per_video: int = 5
    fps: float = 8
    seconds: float = 3.0
    #: frame width = height in pixels (even, as yuv420p needs)
    size: int = 64
    seed: int = 0
    #: libx264 (H.264); falls back to mpeg4 when this FFmpeg build cannot encode it
    codec: str = "libx264"
    #: fraction of the non-test videos given split "validate" (kept out of the 7k list, inside the 9k list)
    val_fraction: float = 0.1
    #: temporal-order dial: probability that a newly drawn group is a temporal twin pair rather than a single video
    #: (twins differ only in time, so only the order words of their captions tell them apart)
    pair_prob: float = 0.5
    #: probability that a single-object video also shows a distractor (another shape / photograph)
    distractor_prob: float = 0.3
    #: sub-pixel samples per axis for anti-aliasing (1 = hard edges)
    antialias: int = 2
    #: x264 constant rate factor (lower = better quality); ignored for mpeg4
    crf: int = 18
    #: what the videos show: "shapes" (coloured polygons) | "objects" (real photographs shipped with installed
    #: packages, tvr.bench.photos, moving and in order: "a cat then a cup of coffee")
    content: str = "shapes"
    #: false-negative dial: probability that a newly drawn group repeats the caption attributes (motion and its
    #: objects' colour / shape / photograph, in event order) of an earlier video with a fresh layout and background,
    #: so the captions of one describe the other as well
    shared_attributes: float = 0.0
    #: paraphrase diversity in [0, 1]: 1 = every synonym, verb phrase and sentence frame; lower keeps the first
    #: fraction of each list and names things by their canonical word more often; 0 = one wording per motion
    paraphrase: float = 1.0
    #: probability that a distractor drifts across its half of the frame instead of standing still
    distractor_motion: float = 0.0
    #: ambiguity dial: probability that a caption other than the full one is replaced by one that names none of
    #: its objects ("an object moves to the right"), so it fits every video with that motion (one-to-many); the
    #: set is otherwise that of vague_captions 0 (same videos, splits and full captions)
    vague_captions: float = 0.0
    #: encode losslessly (libx264rgb, qp 0, in the same .mp4 files): every clip decodes to exactly its rendered
    #: frames and the same dials give byte-identical files (benchmarks/synth_encoding.py; ``codec`` and ``crf`` are
    #: then unused). False keeps the lossy H.264 of earlier sets, whose bytes libx264 does not always reproduce
    lossless: bool = False
    #: build validation like the test: splits are drawn from whole groups (temporal twins and videos sharing caption
    #: attributes never straddle train / validate / test), stratified so validation has the test's share of twins
    #: and of false negatives, and the validation split is written as MSRVTT_val.csv, one full caption per video,
    #: which the MSR-VTT reader then uses instead of holding videos out of the training list
    val_like_test: bool = False

    @property
    def num_frames(self) -> int:
        return int(round(self.fps * self.seconds))

    def validate(self) -> None:
        """Raise ValueError naming the first field that cannot work."""
        checks = [
            ("num_videos", self.num_videos >= 2, "at least 2"),
            ("num_test", 1 <= self.num_test < self.num_videos, f"between 1 and num_videos - 1 = {self.num_videos - 1}"),
            ("captions_per_video", self.captions_per_video >= 1, "at least 1"),
            ("fps", self.fps > 0, "positive"),
            ("seconds", self.seconds > 0, "positive"),
            ("fps * seconds", self.num_frames >= 2, "at least 2 frames"),
            ("size", self.size >= 16 and self.size % 2 == 0, "an even number >= 16"),
            ("val_fraction", 0 <= self.val_fraction < 1, "in [0, 1)"),
            ("pair_prob", 0 <= self.pair_prob <= 1, "in [0, 1]"),
            ("distractor_prob", 0 <= self.distractor_prob <= 1, "in [0, 1]"),
            ("antialias", self.antialias >= 1, "at least 1"),
            ("content", self.content in CONTENTS, f"one of {list(CONTENTS)}"),
            ("shared_attributes", 0 <= self.shared_attributes <= 1, "in [0, 1]"),
            ("paraphrase", 0 <= self.paraphrase <= 1, "in [0, 1]"),
            ("distractor_motion", 0 <= self.distractor_motion <= 1, "in [0, 1]"),
            ("vague_captions", 0 <= self.vague_captions <= 1, "in [0, 1]"),
            ("val_like_test", not self.val_like_test or self.val_fraction > 0, "used with val_fraction > 0"),
        ]
        for name, ok, expected in checks:
            if not ok:
                got = ", ".join(f"{field}={getattr(self, field)!r}" for field in name.split(" * "))
                raise ConfigError(f"SynthConfig.{name} must be {expected}; got {got}")


@dataclass
class ObjectSpec:
    """One shape. Positions are fractions of the frame (x right, y down), radii fractions of the frame size,
    angles in degrees (positive = clockwise on screen). Each quantity goes linearly from its ``*0`` value at the
    first frame to its ``*1`` value at the last. The shape is hidden while ``t/(T-1) < start_gap`` and while
    ``(T-1-t)/(T-1) < end_gap``."""

    shape: str
    colour: str
    x0: float
    y0: float
    x1: float
    y1: float
    r0: float
    r1: float
    a0: float = 0.0
    a1: float = 0.0
    start_gap: float = 0.0
    end_gap: float = 0.0
    #: vertical hop height (fraction of frame) and number of hops, for "bounce"
    bounce_amp: float = 0.0
    bounces: int = 0
    #: content "objects": the photograph (tvr.bench.photos name) drawn as a square of half-side r instead of a shape
    photo: str = ""

    @property
    def label(self) -> str:
        """What captions call it: ``"red circle"``, or the photograph's name."""
        return self.photo or f"{self.colour} {self.shape}"

    @property
    def moves(self) -> bool:
        return (self.x0, self.y0) != (self.x1, self.y1)

    def reversed_in_time(self) -> ObjectSpec:
        return replace(
            self, x0=self.x1, x1=self.x0, y0=self.y1, y1=self.y0, r0=self.r1, r1=self.r0,
            a0=self.a1, a1=self.a0, start_gap=self.end_gap, end_gap=self.start_gap,
        )  # fmt: skip


@dataclass
class VideoSpec:
    """Everything needed to render and caption one video. ``objects[0]`` is the moving shape of single-shape
    motions (``objects[1]``, if any, a static distractor); order motions have two acting shapes."""

    motion: str
    background: str
    bg_seed: int
    objects: list[ObjectSpec]
    #: index into the spec list of the temporal twin, and how it differs ("reverse" or "order")
    twin: int | None = None
    twin_kind: str | None = None
    split: str = "train"
    captions: list[str] = field(default_factory=list)
    #: index in ``captions`` of a caption naming colour and shape of every shape it mentions
    full_caption: int = 0

    @property
    def family(self) -> str:
        return MOTIONS[self.motion][0]

    def event_order(self) -> list[ObjectSpec]:
        """The acting shapes in the order their events happen (first to appear / first to disappear)."""
        if self.motion in ("appear_order", "sequence"):
            return sorted(self.objects, key=lambda o: o.start_gap)
        if self.motion == "disappear_order":
            return sorted(self.objects, key=lambda o: -o.end_gap)
        return [self.objects[0]]

    def caption_key(self) -> tuple[str, ...]:
        """What every caption of this video may name: the motion and its acting objects in event order. Videos
        with the same key are false negatives of each other's captions."""
        return (self.motion, *(o.label for o in self.event_order()))


# --------------------------------------------------------------------------------------------------------------
# Specs: what each video shows


def _pick(rng: np.random.Generator, options: tuple | list) -> Any:
    return options[int(rng.integers(len(options)))]


def _two_distinct(rng: np.random.Generator, options: tuple[str, ...], first: str | None = None) -> tuple[str, str]:
    a = first if first is not None else _pick(rng, options)
    b = _pick(rng, tuple(o for o in options if o != a))
    return a, b


def _photo_object(name: str, x: float, y: float, r: float) -> ObjectSpec:
    return ObjectSpec("", "", x, y, x, y, r, r, photo=name)


def _sequence_spec(rng: np.random.Generator, photos: tuple[str, ...]) -> VideoSpec:
    """Content "objects": photograph A fills the frame (slowly panning and zooming in), then photograph B does."""
    name_a, name_b = _two_distinct(rng, photos)
    u = rng.uniform
    objects = []
    for name in (name_a, name_b):
        # a square of half-side >= 0.55 frames centred within 0.04 of the middle always covers the whole frame
        drift = u(-0.04, 0.04)
        r0 = u(0.55, 0.6)
        obj = _photo_object(name, 0.5 - drift, 0.5, r0)
        obj.x1, obj.r1 = 0.5 + drift, r0 + u(0.03, 0.08)
        objects.append(obj)
    cut = u(0.4, 0.6)
    objects[0].end_gap = 1.0 - cut  # A shows while t/(T-1) <= cut
    objects[1].start_gap = cut  # B from there on
    return VideoSpec("sequence", "grey", 0, objects)


def _base_spec(rng: np.random.Generator, family: str, cfg: SynthConfig, photos: tuple[str, ...] = ()) -> VideoSpec:
    """A video of ``family``'s first motion (e.g. move_right), with random attributes and layout. ``photos``: the
    photographs content "objects" draws from (shapes ignore it)."""
    if family == "sequence":
        return _sequence_spec(rng, photos)
    motion = OBJECT_FAMILIES[family]
    background = _pick(rng, BACKGROUNDS)
    bg_seed = int(rng.integers(2**31))
    u = rng.uniform
    objects_content = cfg.content == "objects"
    # photographs are drawn larger than shapes: an image tower needs to see what they show
    k = 1.7 if objects_content else 1.0
    if family in ("order_appear", "order_disappear"):
        return VideoSpec(motion, background, bg_seed, _order_objects(rng, family, photos, objects_content))

    if objects_content:
        photo, shape, colour = _pick(rng, photos), "", ""
    else:
        photo = ""
        shape = _pick(rng, ROTATABLE if family == "rotation" else SHAPES)
        colour = _pick(rng, tuple(COLOURS))
    with_distractor = rng.random() < cfg.distractor_prob
    r = u(0.10, 0.14) * k
    # the primary uses one half of the frame across its motion axis when a distractor takes the other half
    side = 1 if rng.random() < 0.5 else -1
    lane = 0.5 + side * u(0.17, 0.23) if with_distractor else u(0.35, 0.65)
    other = 1.0 - lane if with_distractor else 0.0
    obj = ObjectSpec(shape, colour, 0, 0, 0, 0, r, r, photo=photo)
    still_x, still_y = u(0.3, 0.7), other  # distractor position for horizontal motion
    if family == "horizontal":
        obj.x0, obj.x1, obj.y0 = u(0.15, 0.22), u(0.78, 0.85), lane
        obj.y1 = obj.y0
    elif family in ("vertical", "bounce"):
        obj.x0 = obj.x1 = lane
        if family == "vertical":
            obj.y0, obj.y1 = u(0.78, 0.85), u(0.15, 0.22)
        else:
            obj.y0 = obj.y1 = u(0.75, 0.82)
            obj.bounce_amp, obj.bounces = u(0.3, 0.45), int(rng.integers(2, 4))
        still_x, still_y = other, u(0.3, 0.7)
    else:  # scale, rotation, visibility: stationary centre
        obj.x0 = obj.x1 = lane
        obj.y0 = obj.y1 = u(0.35, 0.65)
        still_x, still_y = other, u(0.3, 0.7)
        if family == "scale":
            obj.r0, obj.r1 = u(0.05, 0.07) * k, u(0.18, 0.22) * k
        elif family == "rotation":
            obj.a0 = u(0, 90)
            obj.a1 = obj.a0 + u(120, 200)
        else:
            obj.start_gap = u(0.3, 0.5)
    objects = [obj]
    if with_distractor:
        objects.append(_distractor(rng, family, cfg, obj, (still_x, still_y), k, photos))
    return VideoSpec(motion, background, bg_seed, objects)


def _order_objects(
    rng: np.random.Generator, family: str, photos: tuple[str, ...], objects_content: bool
) -> list[ObjectSpec]:
    """The two still objects of an order family, side by side: the first to appear (``order_appear``) or to
    disappear (``order_disappear``) is the first of the list."""
    u = rng.uniform
    if objects_content:
        name_a, name_b = _two_distinct(rng, photos)
        shape_a = shape_b = colour_a = colour_b = ""
    else:
        shape_a, shape_b = _two_distinct(rng, SHAPES)
        colour_a, colour_b = _two_distinct(rng, tuple(COLOURS))
        name_a = name_b = ""
    # side by side, at slightly different heights
    xa, xb = (0.28, 0.72) if rng.random() < 0.5 else (0.72, 0.28)
    r = u(0.11, 0.14) * (1.5 if objects_content else 1.0)
    a = ObjectSpec(shape_a, colour_a, xa, u(0.35, 0.65), 0, 0, r, r, photo=name_a)
    b = ObjectSpec(shape_b, colour_b, xb, u(0.35, 0.65), 0, 0, r, r, photo=name_b)
    a.x1, a.y1, b.x1, b.y1 = a.x0, a.y0, b.x0, b.y0
    early, late = u(0.1, 0.25), u(0.5, 0.65)
    if family == "order_appear":  # a appears first
        a.start_gap, b.start_gap = early, late
    else:  # a disappears first: it is hidden over a longer tail
        a.end_gap, b.end_gap = late, early
    return [a, b]


def _distractor(
    rng: np.random.Generator,
    family: str,
    cfg: SynthConfig,
    primary: ObjectSpec,
    position: tuple[float, float],
    k: float,
    photos: tuple[str, ...],
) -> ObjectSpec:
    """Another shape (or photograph) than ``primary``, at ``position`` in the other half of the frame; it drifts
    with probability ``cfg.distractor_motion``. ``k`` scales its size as the primary's."""
    u = rng.uniform
    if cfg.content == "objects":
        shape2 = colour2 = ""
        photo2 = _pick(rng, tuple(p for p in photos if p != primary.photo))
    else:
        shape2 = _pick(rng, tuple(s for s in SHAPES if s != primary.shape))
        colour2 = _pick(rng, tuple(c for c in COLOURS if c != primary.colour))
        photo2 = ""
    r2 = u(0.08, 0.11) * k
    still_x, still_y = position
    distractor = ObjectSpec(shape2, colour2, still_x, still_y, still_x, still_y, r2, r2, photo=photo2)
    # a drifting distractor moves along the coordinate its position was drawn in, staying in its half
    # (by at least a fifth of the frame)
    if cfg.distractor_motion > 0 and rng.random() < cfg.distractor_motion:
        start = distractor.x0 if family == "horizontal" else distractor.y0
        end = u(0.2, 0.8)
        if abs(end - start) < 0.2:
            end = start + 0.25 if start < 0.5 else start - 0.25
        if family == "horizontal":
            distractor.x1 = end
        else:
            distractor.y1 = end
    return distractor


def _twin_of(spec: VideoSpec) -> tuple[VideoSpec, str]:
    """The video that differs from ``spec`` only in time: reversed, or with its two events swapped."""
    if spec.family in ORDER_FAMILIES:
        a, b = spec.objects
        swapped = [
            replace(a, start_gap=b.start_gap, end_gap=b.end_gap),
            replace(b, start_gap=a.start_gap, end_gap=a.end_gap),
        ]
        return VideoSpec(spec.motion, spec.background, spec.bg_seed, swapped), "order"
    twin_motion = MOTIONS[spec.motion][1]
    if twin_motion is None:
        raise ValueError(f"motion {spec.motion!r} has no temporal twin")
    objects = [o.reversed_in_time() for o in spec.objects]
    return VideoSpec(twin_motion, spec.background, spec.bg_seed, objects), "reverse"


def _with_attributes(
    spec: VideoSpec, source: VideoSpec, rng: np.random.Generator, photos: tuple[str, ...]
) -> VideoSpec:
    """``spec`` (a fresh layout of ``source``'s family) showing ``source``'s motion and acting objects, so both
    videos have the same :meth:`VideoSpec.caption_key`."""
    if spec.motion != source.motion:
        spec = _twin_of(spec)[0]  # the family's other direction
    for target, model in zip(spec.event_order(), source.event_order(), strict=True):
        target.shape, target.colour, target.photo = model.shape, model.colour, model.photo
    if len(spec.objects) > 1 and spec.family not in ORDER_FAMILIES:
        primary, distractor = spec.objects
        if distractor.label == primary.label or (not primary.photo and distractor.shape == primary.shape):
            # a distractor must look unlike the shape the captions name
            if primary.photo:
                distractor.photo = _pick(rng, tuple(p for p in photos if p != primary.photo))
            else:
                distractor.shape = _pick(rng, tuple(s for s in SHAPES if s != primary.shape))
                distractor.colour = _pick(rng, tuple(c for c in COLOURS if c != primary.colour))
    return spec


def _split_sizes(cfg: SynthConfig) -> dict[str, int]:
    return {"test": cfg.num_test, "validate": int(round(cfg.val_fraction * (cfg.num_videos - cfg.num_test)))}


def _twin_splits(groups: list[list[VideoSpec]], cfg: SynthConfig, rng: np.random.Generator) -> dict[str, list]:
    """Splits at twin-group level, test filled exactly (one pair split only if unavoidable): the sets made before
    ``val_like_test`` existed."""
    order = rng.permutation(len(groups))
    sizes = _split_sizes(cfg)
    need_test, need_val = sizes["test"], sizes["validate"]
    by_split: dict[str, list[VideoSpec]] = {"train": [], "validate": [], "test": []}
    for gi in order:
        group = groups[gi]
        for split, need in (("test", need_test), ("validate", need_val)):
            if len(by_split[split]) + len(group) <= need:
                by_split[split].extend(group)
                break
        else:
            by_split["train"].extend(group)
    for split, need in (("test", need_test), ("validate", need_val)):
        while len(by_split[split]) < need:  # only pairs were left: move one video of a train pair over
            train = by_split["train"]
            donor = next((s for s in reversed(train) if s.twin_kind is not None), train[-1])
            by_split["train"].remove(donor)
            by_split[split].append(donor)
    return by_split


def split_groups(groups: list[list[VideoSpec]]) -> list[list[VideoSpec]]:
    """What must share a split: twin groups joined when any of their videos share caption attributes (a false
    negative of one is a false negative of the other, so apart they would leak across splits)."""
    parent = list(range(len(groups)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_with_key: dict[tuple[str, ...], int] = {}
    for gi, group in enumerate(groups):
        for spec in group:
            other = first_with_key.setdefault(spec.caption_key(), gi)
            parent[root(gi)] = root(other)
    members: dict[int, list[VideoSpec]] = {}
    for gi, group in enumerate(groups):
        members.setdefault(root(gi), []).extend(group)
    return list(members.values())


def group_counts(group: list[VideoSpec]) -> tuple[int, int, int]:
    """(videos, videos with their twin, videos whose caption attributes another one shares): what a gallery's
    composition counts. A group is closed under both relations, so its counts are the same in any split."""
    keys = [s.caption_key() for s in group]
    return len(group), sum(s.twin_kind is not None for s in group), sum(keys.count(k) > 1 for k in keys)


def _grouped_splits(groups: list[list[VideoSpec]], cfg: SynthConfig, rng: np.random.Generator) -> dict[str, list]:
    """Whole :func:`split_groups` per split, so that test and validation hold the same shares of twins and of false
    negatives as the whole set. Stratified systematic allocation: the groups are walked in order of their kind (with
    false negatives or not, with twins or not, size; in random order within a kind), and each goes to the test or
    validation split when that split is behind its share of the videos walked so far by at least half the group,
    else to train, so every kind of group is shared out in proportion. The split sizes are then made exact by moving
    groups between train and the split that is off, each time the one that leaves the split's shares nearest the
    whole set's (a split too large with no group small enough first gives its smallest group back)."""
    sizes = _split_sizes(cfg)
    if sizes["validate"] < 1:
        raise ConfigError(f"SynthConfig.val_fraction {cfg.val_fraction} leaves no validation video; raise it")
    members = split_groups(groups)
    counts = [group_counts(g) for g in members]
    totals = np.maximum(np.sum(counts, axis=0), 1).astype(np.float64)
    shuffled = [int(k) for k in rng.permutation(len(members))]
    order = sorted(shuffled, key=lambda k: (counts[k][2] > 0, counts[k][1] / counts[k][0], counts[k][0]))  # stable
    placed: dict[str, list[list[VideoSpec]]] = {"train": [], "validate": [], "test": []}
    walked, held = 0, {"test": 0, "validate": 0}
    for k in order:
        size = counts[k][0]
        walked += size
        behind = {split: sizes[split] / cfg.num_videos * walked - held[split] for split in held}
        split = max(behind, key=lambda name: behind[name])
        if behind[split] >= size / 2:
            held[split] += size
        else:
            split = "train"
        placed[split].append(members[k])
    target = totals[1:] / cfg.num_videos  # the shares of twins and of false negatives over the whole set

    def miss(held_now: np.ndarray, change: np.ndarray) -> float:
        after = held_now + change
        return float(np.sum((after[1:] / max(after[0], 1.0) - target) ** 2))

    for split in ("test", "validate"):
        held_now = np.sum([group_counts(g) for g in placed[split]] or [np.zeros(3)], axis=0).astype(np.float64)
        while (excess := int(held_now[0]) - sizes[split]) != 0:
            source, sign = (split, -1.0) if excess > 0 else ("train", 1.0)
            fits = [g for g in placed[source] if len(g) <= abs(excess)]
            if not fits and excess > 0:  # only larger groups to give back: give the smallest, then fill up again
                fits = [min(placed[source], key=len)]
            if not fits:
                raise ConfigError(
                    f"SynthConfig: the {split} split cannot hold exactly {sizes[split]} videos made of whole groups "
                    "(twin pairs and videos sharing caption attributes stay together); change num_test, "
                    "val_fraction or num_videos by one"
                )
            # the move that leaves the split's shares nearest the set's (a plain single video changes only its size)
            change = {id(g): sign * np.asarray(group_counts(g), np.float64) for g in fits}
            group = min(fits, key=lambda g: miss(held_now, change[id(g)]))
            placed[source].remove(group)
            placed["train" if source == split else split].append(group)
            held_now += change[id(group)]
    return {split: [spec for group in groups_ for spec in group] for split, groups_ in placed.items()}


#: photographs content "objects" needs at the least (two per order video, plus a distractor)
MIN_PHOTOS = 4


def make_video_specs(cfg: SynthConfig) -> list[VideoSpec]:
    """All video specs in video-id order (train, then validate, then test), with splits, twins and captions."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    photos: tuple[str, ...] = ()
    if cfg.content == "objects":
        from tvr.bench.photos import require_photos

        photos = tuple(require_photos(MIN_PHOTOS))
        family_map = OBJECT_FAMILIES
    else:
        family_map = FAMILIES
    families = tuple(family_map)
    pairable = tuple(f for f in families if MOTIONS[family_map[f]][1] is not None)
    history: list[VideoSpec] = []

    def draw(allowed: tuple[str, ...]) -> tuple[VideoSpec, bool]:
        """A new base spec of one of the ``allowed`` families; True when it copies an earlier video's attributes."""
        if cfg.shared_attributes > 0 and history and rng.random() < cfg.shared_attributes:
            sources = [s for s in history if s.family in allowed]
            if sources:
                source = _pick(rng, sources)
                return _with_attributes(_base_spec(rng, source.family, cfg, photos), source, rng, photos), True
        return _base_spec(rng, _pick(rng, allowed), cfg, photos), False

    groups: list[list[VideoSpec]] = []
    remaining = cfg.num_videos
    while remaining > 0:
        if remaining >= 2 and rng.random() < cfg.pair_prob:
            base, _ = draw(pairable)
            twin, kind = _twin_of(base)
            base.twin_kind = twin.twin_kind = kind
            groups.append([base, twin])
        else:
            base, copied = draw(families)
            if not copied and MOTIONS[base.motion][1] is not None and rng.random() < 0.5:
                base = _twin_of(base)[0]  # the other member of the family, so both directions occur alone too
            groups.append([base])
        history.extend(groups[-1])
        remaining -= len(groups[-1])

    by_split = _grouped_splits(groups, cfg, rng) if cfg.val_like_test else _twin_splits(groups, cfg, rng)
    specs: list[VideoSpec] = []
    for split in ("train", "validate", "test"):
        for spec in by_split[split]:
            spec.split = split
            specs.append(spec)

    # twin links as indices; a twin split across splits (rare, see above) keeps its kind but is still linked
    for group in groups:
        if len(group) == 2:
            i, j = (next(k for k, s in enumerate(specs) if s is g) for g in group)
            specs[i].twin, specs[j].twin = j, i
    for spec in specs:
        spec.captions, spec.full_caption = _captions(spec, rng, cfg.captions_per_video, cfg.paraphrase)
    if cfg.vague_captions > 0:
        # from a stream of its own, after everything else: the videos, splits, full captions (the queries of
        # validation and test) and the other captions are those of the same set without vague captions
        vague_rng = np.random.default_rng([cfg.seed, VAGUE_STREAM])
        for spec in specs:
            for k in range(len(spec.captions)):
                if k != spec.full_caption and vague_rng.random() < cfg.vague_captions:
                    spec.captions[k] = _one_caption(spec, vague_rng, full=False, diversity=cfg.paraphrase, vague=True)
    return specs


# --------------------------------------------------------------------------------------------------------------
# Captions


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _pool(options: tuple, diversity: float) -> tuple:
    """The wordings a caption may use at paraphrase ``diversity``: the first ceil(diversity × n), at least one."""
    if diversity >= 1.0:
        return options
    return options[: max(1, math.ceil(diversity * len(options)))]


def _noun_phrase(
    rng: np.random.Generator, obj: ObjectSpec, colour: bool, shape: bool, canonical: bool, diversity: float = 1.0
) -> str:
    """Bare noun phrase ("crimson disk", "red shape", "ball"); at least one of ``colour`` / ``shape`` is True. A
    photograph is named by one of its nouns ("cup of coffee")."""

    def word(options: tuple[str, ...]) -> str:
        # the canonical word is the most frequent, synonyms share the rest
        if diversity >= 1.0:
            return options[0] if canonical or len(options) == 1 or rng.random() < 0.55 else _pick(rng, options[1:])
        synonyms = _pool(options, diversity)[1:]
        if canonical or not synonyms or rng.random() < 1.0 - 0.45 * diversity:
            return options[0]
        return _pick(rng, synonyms)

    if obj.photo:
        from tvr.bench.photos import PHOTOS_BY_NAME

        return word(PHOTOS_BY_NAME[obj.photo].nouns)
    noun = word(SHAPE_WORDS[obj.shape]) if shape else _pick(rng, GENERIC_NOUNS)
    return f"{word(COLOUR_WORDS[obj.colour])} {noun}" if colour else noun


def _mentions(rng: np.random.Generator, full: bool) -> tuple[bool, bool]:
    """Which of (colour, shape) a noun phrase names: both for the full caption, else each with p=0.8, never none."""
    if full:
        return True, True
    colour, shape = rng.random() < 0.8, rng.random() < 0.8
    if not (colour or shape):
        colour, shape = (True, False) if rng.random() < 0.5 else (False, True)
    return colour, shape


def _one_caption(
    spec: VideoSpec, rng: np.random.Generator, full: bool, diversity: float = 1.0, vague: bool = False
) -> str:
    """One caption; ``vague``: every object it mentions is a generic noun ("an object appears and then a thing
    appears"), and a distractor is not mentioned."""
    d = diversity

    def noun(obj: ObjectSpec) -> str:
        if vague:
            return _pick(rng, VAGUE_NOUNS)
        return _noun_phrase(rng, obj, *_mentions(rng, full), canonical=full, diversity=d)

    if spec.motion in ORDER_FRAMES:
        first, second = spec.event_order()
        phrase_a, phrase_b = _article(noun(first)), _article(noun(second))
        text = _pick(rng, _pool(ORDER_FRAMES[spec.motion], d)).format(A=phrase_a, B=phrase_b)
    else:
        np_ = noun(spec.objects[0])
        vp, ing = _pick(rng, _pool(VERBS[spec.motion], d))
        text = _pick(rng, _pool(SINGLE_FRAMES, d)).format(a=_article(np_), np=np_, vp=vp, ing=ing)
    # a full-frame sequence hides its background
    if spec.motion != "sequence" and rng.random() < 0.35:
        clause = _pick(rng, _pool(BACKGROUND_CLAUSES, d))  # drawn before the words, as it always was
        text += clause.format(bg=_pick(rng, _pool(BACKGROUND_WORDS[spec.background], d)))
    if not vague and len(spec.objects) > 1 and spec.motion not in ORDER_FRAMES and rng.random() < 0.5:
        other = spec.objects[1]
        clauses = MOVING_CLAUSES if other.moves else STILL_CLAUSES
        phrase = _noun_phrase(rng, other, *_mentions(rng, full), canonical=full, diversity=d)
        text += _pick(rng, _pool(clauses, d)).format(a=_article(phrase))
    return text


def _captions(spec: VideoSpec, rng: np.random.Generator, count: int, diversity: float = 1.0) -> tuple[list[str], int]:
    """``count`` distinct captions (duplicates only if the templates run out) in random order, plus the index of
    the one that names every attribute."""
    captions = [_one_caption(spec, rng, full=True, diversity=diversity)]
    attempts = 0
    while len(captions) < count:
        text = _one_caption(spec, rng, full=False, diversity=diversity)
        attempts += 1
        if text not in captions or attempts > 50 * count:
            captions.append(text)
    perm = rng.permutation(count)
    shuffled = [captions[int(i)] for i in perm]
    return shuffled, int(np.flatnonzero(perm == 0)[0])


# --------------------------------------------------------------------------------------------------------------
# Rendering


def _background(name: str, seed: int, size: int) -> np.ndarray:
    """Static grey-scale background, float32 [H, W, 3] in 0..255."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    cell = max(2, size // 8)
    if name == "grey":
        grey = np.full((size, size), 128.0, np.float32)
    elif name == "black":
        grey = np.full((size, size), 20.0, np.float32)
    elif name == "white":
        grey = np.full((size, size), 235.0, np.float32)
    elif name == "checkered":
        grey = np.where(((yy // cell) + (xx // cell)) % 2 == 0, 95.0, 155.0).astype(np.float32)
    elif name == "striped":
        grey = np.where((yy // max(1, cell // 2)) % 2 == 0, 80.0, 150.0).astype(np.float32)
    elif name == "noisy":
        noise = np.random.default_rng(seed).normal(125.0, 22.0, (size, size))
        grey = np.clip(noise, 40, 210).astype(np.float32)
    elif name == "gradient":
        grey = (40.0 + 170.0 * (xx + yy) / (2 * (size - 1))).astype(np.float32)
    else:
        raise ValueError(f"unknown background {name!r}; expected one of {BACKGROUNDS}")
    return np.repeat(grey[:, :, None], 3, axis=2)


def _inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inside test in shape coordinates (unit radius, v pointing down). Only exact arithmetic (no per-pixel
    transcendental functions), so identical inputs give identical masks wherever they sit in the array."""
    if shape == "circle":
        return u * u + v * v <= 1.0
    if shape == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.82
    if shape == "diamond":
        return np.abs(u) + np.abs(v) <= 1.15
    if shape == "triangle":  # equilateral, apex up, circumradius 1.2
        u, v = u / 1.2, v / 1.2
        s3 = math.sqrt(3.0)
        return (v <= 0.5) & (s3 * u - v <= 1.0) & (-s3 * u - v <= 1.0)
    if shape == "cross":
        au, av_ = np.abs(u), np.abs(v)
        return ((au <= 1.0) & (av_ <= 0.36)) | ((av_ <= 1.0) & (au <= 0.36))
    if shape == "star":  # five points, one up: radius follows cos(5 (phi - phi_up)) written as a polynomial
        rho2 = u * u + v * v
        rho5 = rho2 * rho2 * np.sqrt(rho2) + 1e-12
        u2, v2 = u * u, v * v
        c = -v * (5 * u2 * u2 - 10 * u2 * v2 + v2 * v2) / rho5
        outline = 0.45 + 0.75 * ((1.0 + c) / 2.0) ** 2
        return rho2 <= outline * outline
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def _photo_texture(name: str) -> np.ndarray:
    from tvr.bench.photos import load_texture

    return load_texture(name)


def _span(lo: np.ndarray, hi: np.ndarray, size: int) -> tuple[int, int]:
    """Pixel index range [start, stop) covering every frame's [lo, hi] interval, clipped to the frame."""
    return max(0, int(math.floor(lo.min()))), min(size, int(math.ceil(hi.max())) + 1)


def render_video_frames(spec: VideoSpec, cfg: SynthConfig) -> np.ndarray:
    """Render ``spec`` as uint8 [T, H, W, 3] RGB frames (T = ``cfg.num_frames``, H = W = ``cfg.size``)."""
    T, size, ss = cfg.num_frames, cfg.size, cfg.antialias
    frames = np.repeat(_background(spec.background, spec.bg_seed, size)[None], T, axis=0)
    t = np.arange(T)
    w1 = t / (T - 1)  # weight of the last-frame value
    w0 = (T - 1 - t) / (T - 1)  # weight of the first-frame value; w0[T-1-t] == w1[t] exactly
    pix = np.arange(size, dtype=np.float64)
    for obj in spec.objects:
        cx = (obj.x0 * w0 + obj.x1 * w1) * size
        cy = (obj.y0 * w0 + obj.y1 * w1) * size
        if obj.bounces:
            cy = cy - obj.bounce_amp * size * np.abs(np.sin(np.pi * obj.bounces * w1))
        radius = (obj.r0 * w0 + obj.r1 * w1) * size
        angle = np.radians(obj.a0 * w0 + obj.a1 * w1)
        # per-frame trig in Python floats: the same angle always gives the same value (array trig may not)
        cos = np.array([math.cos(a) for a in angle])[:, None, None]
        sin = np.array([math.sin(a) for a in angle])[:, None, None]
        visible = (w1 >= obj.start_gap) & (w0 >= obj.end_gap)
        if not visible.any():
            continue
        texture = _photo_texture(obj.photo) if obj.photo else None
        # only the pixels the shape can touch in any frame (every shape lies within 1.25 radii of its centre, a
        # photograph's square within sqrt(2)); a time-reversed twin has the same set of frame parameters, hence the
        # same crop and identical pixels
        reach = (1.42 if texture is not None else 1.25) * radius + 1.0
        x_lo, x_hi = _span(cx - reach, cx + reach, size)
        y_lo, y_hi = _span(cy - reach, cy + reach, size)
        if x_lo >= x_hi or y_lo >= y_hi:
            continue
        px, py = pix[x_lo:x_hi], pix[y_lo:y_hi]
        coverage = np.zeros((T, y_hi - y_lo, x_hi - x_lo), np.float64)
        paint = None if texture is None else np.zeros((T, y_hi - y_lo, x_hi - x_lo, 3), np.float64)
        for oy in range(ss):
            for ox in range(ss):
                dx = (px + (ox + 0.5) / ss)[None, None, :] - cx[:, None, None]
                dy = (py + (oy + 0.5) / ss)[None, :, None] - cy[:, None, None]
                # rotate the pixel offset by -angle into the shape's own frame, then scale to unit radius
                u = (dx * cos + dy * sin) / radius[:, None, None]
                v = (dy * cos - dx * sin) / radius[:, None, None]
                if texture is None:
                    coverage += _inside(obj.shape, u, v)
                    continue
                # the photograph fills the square |u|, |v| <= 1: nearest texel of each sub-pixel sample
                inside = np.maximum(np.abs(u), np.abs(v)) <= 1.0
                coverage += inside
                n = texture.shape[0]
                col = np.clip(np.floor((u + 1.0) * (0.5 * n)), 0, n - 1).astype(np.intp)
                row = np.clip(np.floor((v + 1.0) * (0.5 * n)), 0, n - 1).astype(np.intp)
                paint += texture[row, col] * inside[..., None]
        alpha = (coverage / (ss * ss) * visible[:, None, None]).astype(np.float32)[..., None]
        crop = frames[:, y_lo:y_hi, x_lo:x_hi]
        if paint is None:
            colour = np.asarray(COLOURS[obj.colour], np.float32)
            frames[:, y_lo:y_hi, x_lo:x_hi] = crop * (1.0 - alpha) + colour * alpha
        else:  # paint is the texture already weighted by coverage (premultiplied)
            painted = (paint / (ss * ss) * visible[:, None, None, None]).astype(np.float32)
            frames[:, y_lo:y_hi, x_lo:x_hi] = crop * (1.0 - alpha) + painted
    return np.clip(np.rint(frames), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------------------------------------------
# Encoding


def resolve_codec(requested: str, fallback: bool = True) -> str:
    """``requested`` if this FFmpeg build can encode it, else mpeg4 (with a warning; ``fallback=False``: an error)."""
    import av

    try:
        av.codec.Codec(requested, "w")
        return requested
    except Exception:  # noqa: BLE001 - PyAV raises different types across versions for an unknown encoder
        if not fallback:
            raise ValueError(f"this PyAV/FFmpeg build cannot encode {requested}") from None
        if requested == "mpeg4":
            raise ValueError("this PyAV/FFmpeg build has neither the requested codec nor mpeg4") from None
        log.warning("encoder %r is not available in this PyAV build; using mpeg4", requested)
        av.codec.Codec("mpeg4", "w")
        return "mpeg4"


#: the lossless encoding (``SynthConfig.lossless``): H.264 of the RGB planes at quantiser 0, in the usual .mp4
LOSSLESS_CODEC = "libx264rgb"


def encode_mp4(
    frames: np.ndarray, path: str | os.PathLike, fps: float, codec: str, crf: int = 18, lossless: bool = False
) -> Path:
    """Encode uint8 [T, H, W, 3] RGB frames as a yuv420p mp4 (``lossless``: RGB at quantiser 0, which decodes to
    exactly ``frames``), written to a temporary file beside ``path`` and renamed into place so a crash never leaves
    a truncated video under the final name."""
    import av

    path = Path(path)
    fd, tmp = create_temporary(path)  # honours the umask, and remove_stale_temporaries knows the name
    os.close(fd)
    try:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream(
                LOSSLESS_CODEC if lossless else codec, rate=Fraction(fps).limit_denominator(1001)
            )
            stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
            stream.pix_fmt = "rgb24" if lossless else "yuv420p"
            # one thread: tiny frames gain nothing from threads, and the output is then machine-independent
            stream.codec_context.thread_count = 1
            if lossless:
                stream.options = {"qp": "0", "preset": "medium"}
            elif codec == "libx264":
                stream.options = {"crf": str(crf), "preset": "medium"}
            else:
                stream.bit_rate = 2_000_000
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
            container.mux(stream.encode(None))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


# --------------------------------------------------------------------------------------------------------------
# Annotation files


def _video_id(index: int) -> str:
    return f"video{index}"


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def _object_meta(obj: ObjectSpec) -> dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(obj).items()}


#: the validation split of a ``val_like_test`` set: one full caption per video, the 1k-A test's columns
VAL_CSV = "MSRVTT_val.csv"


def build_annotations(
    specs: list[VideoSpec], cfg: SynthConfig, codec: str, frame_hashes: list[str] | None = None
) -> dict[str, str]:
    """The text of every annotation file, keyed by file name (README.md excluded). ``frame_hashes``: each clip's
    SHA-256 of its decoded frames, recorded in ``synth_meta.json``."""
    data = _msrvtt_data(specs, cfg)
    train = [_video_id(i) for i, s in enumerate(specs) if s.split == "train"]
    nine_k = [_video_id(i) for i, s in enumerate(specs) if s.split in ("train", "validate")]
    test_idx = [i for i, s in enumerate(specs) if s.split == "test"]

    def one_full_caption(split: str, key: str) -> list[list[str]]:
        chosen = [i for i, s in enumerate(specs) if s.split == split]
        return [[f"{key}{k}", f"msr{i}", _video_id(i), specs[i].captions[specs[i].full_caption]] for k, i in
                enumerate(chosen)]  # fmt: skip

    jsfusion = one_full_caption("test", "ret")
    test1ka = "".join(json.dumps({"clip_id": _video_id(i), "text": specs[i].captions}) + "\n" for i in test_idx)
    meta = _synth_meta(specs, cfg, codec, frame_hashes)
    columns = ["key", "vid_key", "video_id", "sentence"]
    files = {
        "MSRVTT_data.json": json.dumps(data) + "\n",
        "MSRVTT_train.9k.csv": _csv_text(["video_id"], [[v] for v in nine_k]),
        "MSRVTT_train.7k.csv": _csv_text(["video_id"], [[v] for v in train]),
        "MSRVTT_JSFUSION_test.csv": _csv_text(columns, jsfusion),
        "MSRVTT_test1ka.jsonl": test1ka,
    }
    if cfg.val_like_test:
        files[VAL_CSV] = _csv_text(columns, one_full_caption("validate", "val"))
    files["synth_meta.json"] = json.dumps(meta, indent=2) + "\n"
    return files


def _msrvtt_data(specs: list[VideoSpec], cfg: SynthConfig) -> dict[str, Any]:
    """MSRVTT_data.json: the videos, every caption, and what made them."""
    videos, sentences = [], []
    for i, spec in enumerate(specs):
        vid = _video_id(i)
        videos.append({
            "category": CATEGORY[spec.family],
            "url": f"synthetic://tvr/{vid}",
            "video_id": vid,
            "start time": 0.0,
            "end time": float(cfg.num_frames / cfg.fps),
            "split": spec.split,
            "id": i,
        })  # fmt: skip
        for caption in spec.captions:
            if "," in caption or '"' in caption:
                raise AssertionError(f"caption template produced CSV-unsafe text: {caption!r}")
            sentences.append({"caption": caption, "video_id": vid, "sen_id": len(sentences)})
    info = {
        "contributor": "tvr synthetic generator",
        "data_created": f"deterministic (seed {cfg.seed})",
        "version": "1.0",
        # the module's name when these files were first pinned: the text is data (the bench's data digest reads it)
        "description": "Synthetic shapes-and-motions videos in MSR-VTT layout (tvr.data.synthetic)."
        if cfg.content == "shapes"
        else "Synthetic videos of real photographs in motion and in order, MSR-VTT layout (tvr.data.synthetic).",
        "year": "synthetic",
    }
    return {"info": info, "videos": videos, "sentences": sentences}


def _synth_meta(specs: list[VideoSpec], cfg: SynthConfig, codec: str, frame_hashes: list[str] | None) -> dict[str, Any]:
    """synth_meta.json: the generation settings, the dials as they came out, the vocabulary, and what each video
    shows (with its twin, the videos its captions also describe, and its frames' hash)."""
    same_key: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i, spec in enumerate(specs):
        same_key.setdefault((spec.split, spec.caption_key()), []).append(i)
    meta_videos = []
    for i, spec in enumerate(specs):
        acting = spec.event_order()
        sharing = [j for j in same_key[(spec.split, spec.caption_key())] if j != i]
        meta_videos.append({
            "video_id": _video_id(i),
            "split": spec.split,
            "motion": spec.motion,
            "family": spec.family,
            "category": CATEGORY[spec.family],
            "background": spec.background,
            "shape": acting[0].shape,
            "colour": acting[0].colour,
            "num_objects": len(spec.objects),
            "photo": acting[0].photo or None,
            "event_order": [o.label for o in acting],
            "caption_key": list(spec.caption_key()),
            # videos of the same split whose captions name the same things: false negatives of this one's captions
            "same_caption_attributes": [_video_id(j) for j in sharing],
            "twin": None if spec.twin is None else _video_id(spec.twin),
            "twin_kind": spec.twin_kind if spec.twin is not None else None,
            "full_caption": spec.full_caption,
            "bg_seed": spec.bg_seed,
            "objects": [_object_meta(o) for o in spec.objects],
            **({"frames_sha256": frame_hashes[i]} if frame_hashes is not None else {}),
        })  # fmt: skip
    return {
        "config": asdict(cfg),
        "codec": codec,
        "num_frames": cfg.num_frames,
        # what each video's frames_sha256 hashes: the clip as the data readers decode it
        "frames_sha256_of": "the decoded frames, uint8 RGB [frames, size, size, 3] in C order (tvr.data.video)",
        "dials": dials_summary(specs, cfg),
        "vocabulary": {
            "colours": COLOUR_WORDS,
            "shapes": SHAPE_WORDS,
            "backgrounds": list(BACKGROUNDS),
            "motions": {m: {"family": f, "twin": t} for m, (f, t) in MOTIONS.items()},
            "categories": CATEGORY,
        },
        "videos": meta_videos,
    }


def dials_summary(specs: list[VideoSpec], cfg: SynthConfig) -> dict[str, Any]:
    """The dials of a set as asked for and as they came out (recorded in ``synth_meta.json``)."""
    captions = [c for s in specs for c in s.captions]
    sharing = {}
    for split in ("train", "validate", "test"):
        keys = [s.caption_key() for s in specs if s.split == split]
        counts: dict[tuple[str, ...], int] = {}
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        sharing[split] = sum(1 for key in keys if counts[key] > 1)
    with_distractor = [s for s in specs if len(s.objects) > 1 and s.family not in ORDER_FAMILIES]
    distractor_captions = [c for s in with_distractor for c in s.captions]
    with_twin = sum(s.twin is not None for s in specs)
    summary: dict[str, Any] = {
        "content": cfg.content,
        "temporal_order": {
            "pair_prob": cfg.pair_prob,
            "videos_with_twin": with_twin,
            "share_with_twin": round(with_twin / max(len(specs), 1), 4),
        },
        "false_negatives": {
            "shared_attributes": cfg.shared_attributes,
            "videos_sharing_caption_attributes_within_split": sharing,
        },
        "paraphrase": {
            "diversity": cfg.paraphrase,
            "distinct_caption_fraction": round(len(set(captions)) / max(len(captions), 1), 4),
            "vocabulary_size": len({w for c in captions for w in c.split()}),
        },
        "clip_length": {"seconds": cfg.seconds, "fps": cfg.fps, "frames": cfg.num_frames, "size": cfg.size},
        "distractors": {
            "distractor_prob": cfg.distractor_prob,
            "distractor_motion": cfg.distractor_motion,
            "videos_with_distractor": len(with_distractor),
            "moving_distractors": sum(s.objects[1].moves for s in with_distractor),
            # the share of those videos' captions that name the distractor (in a "while ..." / "as ..." clause)
            "captions_naming_the_distractor": round(
                sum(" while " in c or " as " in c for c in distractor_captions) / max(len(distractor_captions), 1), 4
            ),
        },
    }
    if cfg.vague_captions > 0:
        summary["ambiguity"] = {
            "vague_captions": cfg.vague_captions,
            "vague_caption_share": round(
                sum(_is_vague(c, s) for s in specs for c in s.captions) / max(len(captions), 1), 4
            ),
        }
    if cfg.content == "objects":
        summary["photos"] = _photo_sources(sorted({o.photo for s in specs for o in s.objects if o.photo}))
    return summary


def _is_vague(caption: str, spec: VideoSpec) -> bool:
    """A caption that names none of its video's acting objects (only generic nouns)."""
    if spec.objects[0].photo:
        from tvr.bench.photos import PHOTOS_BY_NAME

        nouns = [n for o in spec.event_order() for n in PHOTOS_BY_NAME[o.photo].nouns]
    else:
        nouns = [w for o in spec.event_order() for w in (*SHAPE_WORDS[o.shape], *COLOUR_WORDS[o.colour])]
    return not any(noun in caption for noun in nouns)


def _photo_sources(names: list[str]) -> dict[str, dict[str, str]]:
    """Where each photograph used came from, with the file's SHA-256 (packages may change their images)."""
    from tvr.bench.photos import PHOTOS_BY_NAME, photo_path

    out = {}
    for name in names:
        photo = PHOTOS_BY_NAME[name]
        path = photo_path(photo)
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else ""
        out[name] = {"source": photo.source, "file": str(path), "sha256": digest}
    return out


def _readme(cfg: SynthConfig, codec: str, specs: list[VideoSpec]) -> str:
    counts = {s: sum(spec.split == s for spec in specs) for s in ("train", "validate", "test")}
    motions = {m: sum(spec.motion == m for spec in specs) for m in MOTIONS}
    pairs = sum(spec.twin is not None for spec in specs) // 2
    lines = [
        "# Synthetic MSR-VTT-style video set (tvr synth)",
        "",
        "Generated by `tvr.bench.synthetic.generate_synthetic_dataset`; regenerate with the same parameters to get",
        "identical annotation files and frames. See the module docstring for the design.",
        "",
        "## Parameters",
        "",
        *[f"- `{k}`: {v!r}" for k, v in asdict(cfg).items()],
        f"- frames per video: {cfg.num_frames} ({cfg.size}x{cfg.size}, {cfg.fps} fps)",
        f"- codec used: {codec} ({'lossless RGB' if cfg.lossless else 'yuv420p'})",
        "",
        "## Contents",
        "",
        f"- videos: {len(specs)} (train {counts['train']}, validate {counts['validate']}, test {counts['test']})",
        f"- captions: {cfg.captions_per_video} per video, {cfg.captions_per_video * len(specs)} in all",
        f"- temporal twin pairs: {pairs} (a video and its time reversal, or the same two events in swapped order)",
        "- videos whose caption attributes another video of their split shares (false negatives): "
        + str(
            sum(dials_summary(specs, cfg)["false_negatives"]["videos_sharing_caption_attributes_within_split"].values())
        ),
        "- motions: " + ", ".join(f"{m} {n}" for m, n in motions.items()),
        "",
        "## Files",
        "",
        "- `videos/video{i}.mp4`: the clips",
        "- `MSRVTT_data.json`: `videos[]` (video_id, category, url, start time, end time, split, id) and",
        "  `sentences[]` (sen_id, video_id, caption), as the merged MSR-VTT release",
        "- `MSRVTT_train.9k.csv`: train + validate video ids (header `video_id`)",
        "- `MSRVTT_train.7k.csv`: train-split video ids only (the smaller training list)",
        "- `MSRVTT_JSFUSION_test.csv`: one caption per test video (`key,vid_key,video_id,sentence`); the caption",
        "  chosen is one that names colour and shape of every shape it mentions",
        "- `MSRVTT_test1ka.jsonl`: all captions of each test video (`clip_id`, `text[]`)",
        *(
            [f"- `{VAL_CSV}`: one full caption per validation video (the test file's columns); the validation split"]
            if cfg.val_like_test
            else []
        ),
        "- `synth_meta.json`: per-video ground truth (motion, shapes, colours, background, twin, trajectories)",
        "  and the SHA-256 of each clip's decoded frames",
        "",
    ]
    return "\n".join(lines)


def frames_sha256(frames: np.ndarray) -> str:
    """The SHA-256 of uint8 frames [T, H, W, 3] in C order: what ``synth_meta.json`` records per clip."""
    return hashlib.sha256(np.ascontiguousarray(frames).data).hexdigest()


def decoded_sha256(path: Path, num_frames: int) -> str:
    """:func:`frames_sha256` of a clip as the data readers decode it."""
    from tvr.data.video import decode_frames

    return frames_sha256(decode_frames(path, np.arange(num_frames)))


def generate_synthetic_dataset(
    out_dir: str | os.PathLike, cfg: SynthConfig | None = None, progress: bool = False
) -> dict[str, Any]:
    """Render, encode and annotate a synthetic set into ``out_dir``; returns counts and paths."""
    cfg = cfg or SynthConfig()
    cfg.validate()
    out = Path(out_dir)
    video_dir = out / "videos"
    video_dir.mkdir(parents=True, exist_ok=True)
    for leftover in remove_stale_temporaries(video_dir):  # a killed render's half-written clip
        log.info("removed a leftover temporary of an interrupted render: %s", leftover)
    codec = resolve_codec(LOSSLESS_CODEC if cfg.lossless else cfg.codec, fallback=not cfg.lossless)
    specs = make_video_specs(cfg)

    paths = [video_dir / f"{_video_id(i)}.mp4" for i in range(len(specs))]
    rendered = []
    for i in progress_bar(range(len(specs)), "synth: rendering videos", enabled=progress):
        frames = render_video_frames(specs[i], cfg)
        rendered.append(frames_sha256(frames) if cfg.lossless else "")
        encode_mp4(frames, paths[i], cfg.fps, codec, cfg.crf, lossless=cfg.lossless)
    # decoded only once every clip is encoded: a decoder run between two encodes was seen to change what libx264
    # writes (benchmarks/synth_encoding.py), and the lossy clips of earlier sets must stay as they were
    frame_hashes = [decoded_sha256(path, cfg.num_frames) for path in paths]
    for path, made, decoded in zip(paths, rendered, frame_hashes, strict=True):
        if cfg.lossless and made != decoded:  # so a set never silently depends on an encoder
            raise RuntimeError(f"{path}: {codec} at quantiser 0 did not decode to the rendered frames (not lossless)")

    written: dict[str, str] = {"videos": str(video_dir)}
    for name, text in build_annotations(specs, cfg, codec, frame_hashes).items():
        # already serialised (compact MSRVTT_data.json like the real release), so written as text
        atomic_write_text(out / name, text)
        written[name] = str(out / name)
    atomic_write_text(out / "README.md", _readme(cfg, codec, specs))
    written["README.md"] = str(out / "README.md")
    return {
        "out_dir": str(out),
        "num_videos": len(specs),
        "num_train": sum(s.split == "train" for s in specs),
        "num_validate": sum(s.split == "validate" for s in specs),
        "num_test": sum(s.split == "test" for s in specs),
        "num_sentences": sum(len(s.captions) for s in specs),
        "num_frames": cfg.num_frames,
        "num_twin_pairs": sum(s.twin is not None for s in specs) // 2,
        "codec": codec,
        "paths": written,
    }


__all__ = [
    "SynthConfig",
    "ObjectSpec",
    "VideoSpec",
    "make_video_specs",
    "render_video_frames",
    "encode_mp4",
    "resolve_codec",
    "build_annotations",
    "generate_synthetic_dataset",
]
