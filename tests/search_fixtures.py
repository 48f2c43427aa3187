"""A folder of small distinct videos and a tiny checkpoint that tells them apart, for the search tests.

Each video is one flat colour with a moving white square; a tiny random CLIP (clip4clip head, meanP) is trained to
overfit one caption per colour, so a query names the video it should find first. Built once per test session
(``search_setup`` in conftest.py) and copied where a test changes it.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from test_end_to_end import TINY  # the end-to-end tests' tiny CLIP, used by the search tests too

#: video name → (caption, RGB colour, seconds at 4 fps)
VIDEOS = {
    "red.mp4": ("a red screen", (220, 30, 30), 3.0),
    "green.mp4": ("a green screen", (30, 200, 40), 2.0),
    "blue.mp4": ("a blue screen", (30, 40, 220), 2.5),
    "sub/yellow.mp4": ("a yellow screen", (230, 220, 30), 9.0),
    "sub/magenta.mp4": ("a magenta screen", (210, 30, 200), 2.0),
}
FPS = 4
SIZE = 32


def write_colour_video(
    path: Path, colour: tuple[int, int, int], seconds: float, fps: int = FPS, size: int = SIZE
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = int(round(seconds * fps))
    with av.open(str(path), mode="w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=Fraction(fps))
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for k in range(frames):
            image = np.empty((size, size, 3), dtype=np.uint8)
            image[:] = colour
            left = (k * 4) % (size - 8)
            image[12:20, left : left + 8] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_videos(folder: Path) -> Path:
    for name, (_, colour, seconds) in VIDEOS.items():
        write_colour_video(folder / name, colour, seconds)
    return folder


def train_checkpoint(work: Path, videos: Path, head: str = "clip4clip", steps: int = 60) -> Path:
    """Overfit a tiny CLIP on one caption per video (a few paraphrases each); returns its best.pt."""
    from tvr.config import config_from_dict
    from tvr.pipeline import run_train

    clips = write_caption_set(work, videos)
    head_cfg = {"name": head, "logit_scale_init": 2.6592}
    values = {
        "data": {
            "dataset": "generic",
            "annotations": str(work),
            "video_dir": str(clips),
            "generic_file": "captions.jsonl",
            "video_pattern": "{video_id}",
            "max_words": 16,
            "max_frames": 4,
            "frame_rate": 1.0,
            "image_size": SIZE,
            "val_fraction": 0.0,
        },
        "model": {"clip": "tiny", "temporal": "meanP", "tiny": TINY},
        "head": head_cfg,
        "train": {
            "epochs": 1000,
            "max_steps": steps,
            "batch_size": 10,
            "lr": 2e-3,
            "backbone_lr_coef": 1.0,
            "weight_decay": 0.0,
            "warmup": 0.05,
            "log_every": 0,
            "device": "cpu",
            "num_threads": 1,
            "seed": 0,
        },
        "eval": {"batch_size": 16},
    }
    run_train(config_from_dict(values), work / "run", final_test=False, overwrite=True)
    return work / "run" / "last.pt"


def write_caption_set(work: Path, videos: Path) -> Path:
    """A generic-format set in ``work`` (``captions.jsonl``) over ``videos``: a few paraphrases of each video's
    caption to train on, and copies of the videos as the val and test splits; returns its video folder."""
    import shutil

    rows = []
    clips = work / "clips"  # the training folder: the videos, and copies held out as the val / test splits
    for name, (caption, _, _) in VIDEOS.items():
        colour = caption.split()[1]
        (clips / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(videos / name, clips / name)
        for text in (caption, f"the {colour} screen", f"{colour} video", f"a {colour} square"):
            rows.append({"video": name, "caption": text, "split": "train"})
        for split in ("val", "test"):
            shutil.copy(videos / name, clips / f"{split}_{colour}.mp4")
            rows.append({"video": f"{split}_{colour}.mp4", "caption": caption, "split": split})
    with open(work / "captions.jsonl", "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return clips


def index_args(videos: Path, out: Path, checkpoint: Path, *extra: str) -> list[str]:
    """``tvr index`` arguments; decoding in this process (-j 1) unless ``extra`` says otherwise."""
    workers = [] if "-j" in extra else ["-j", "1"]
    return [
        "index",
        str(videos),
        "--out",
        str(out),
        "--checkpoint",
        str(checkpoint),
        "--window",
        "4",
        "--stride",
        "2",
        *workers,
        *extra,
    ]


def cold_search(index: Path, query: str, k: int, cache: Path) -> tuple[Any, list[dict], list[str]]:
    """``tvr search INDEX QUERY -k K --json`` in a fresh process with ``TVR_CACHE_DIR=cache``: (the finished process,
    its parsed answer, the modules it had imported at the end); asserts it exited 0 with nothing on stderr."""
    import os
    import subprocess
    import sys

    modules = cache.parent / f"{cache.name}-modules.json"
    script = (
        "import json, sys, runpy\n"
        f"sys.argv = ['tvr', 'search', {str(index)!r}, {query!r}, '-k', '{k}', '--json']\n"
        "code = 0\n"
        "try:\n    runpy.run_module('tvr.cli', run_name='__main__')\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        f"json.dump([code, sorted(sys.modules)], open({str(modules)!r}, 'w'))\n"
    )
    env = {**os.environ, "TVR_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    code, loaded = json.loads(modules.read_text())
    assert code in (0, None)
    return done, json.loads(done.stdout), loaded


def exhaustive_video_state(videos: Path, index: Any, encoder: Any, window: float = 4.0, stride: float = 2.0) -> tuple:
    """Every window of the index's videos, decoded and encoded by ``encoder`` itself and turned into the head's video
    state (what exact scores are checked against), and each window's (video, start, end)."""
    from tvr.search.windows import decode_windows
    from tvr.types import VideoFeatures

    features, labels = [], []
    for entry in index.videos:
        decoded = decode_windows(videos / entry["video"], encoder.spec, window, stride)
        slots = decoded.slots
        features.append(encoder.encode_windows(decoded.frames[np.clip(slots, 0, None)], (slots >= 0).astype(np.int64)))
        labels += [(entry["video"], s, e) for s, e in decoded.windows]
    return encoder.head.encode_videos(VideoFeatures.cat(features)), labels
