"""Loading speed of one training epoch's clips: decoding the mp4 every epoch vs. reading the frame cache.

Clips: the 19 real clips of ``../shared/data/real-scenes`` (448 × 448 or portrait 250/252 × 448, 4–30 fps,
8–240 frames, H.264). Three ways to get each clip's model input (12 frames, clip4clip sampling at 1 fps, 224 crop,
CLIP-normalised float32 [12, 3, 224, 224] + mask), all in this one process with one torch thread:

* ``raw_mp4``: ``load_clip`` on the original files (decode up to the last sampled frame, resize, crop);
* ``prepared_mp4``: ``load_clip`` on the same clips after ``tvr prepare videos`` (3 fps, shorter side 224);
* ``frame_cache``: ``load_cached_clip`` on ``tvr prepare frames`` of the prepared clips (a memory-mapped uint8
  ``.npy`` per clip holding the 12 sampled frames already resized; crop + normalise only).

The three alternate within each repetition (``--reps``); the minimum per method is kept and the ratios are taken
between minima of the same run. The cache is checked to give exactly the tensors ``load_clip`` gives on the prepared
clips. One-off costs (preparing the videos, building the cache) and the bytes on disk are reported too.

    .venv/bin/python benchmarks/frame_cache.py          # writes benchmarks/results/frame_cache.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.data.frame_cache import FrameSettings, load_cached_clip  # noqa: E402
from tvr.data.prepare import extract_frames, prepare_videos  # noqa: E402
from tvr.data.video import load_clip  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "frame_cache.json"
DEFAULT_CLIPS = Path(os.environ.get("TVR_SHARED_DATA", REPO.parent / "shared" / "data")) / "real-scenes"


def _bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=Path, default=DEFAULT_CLIPS, help="folder of .mp4 clips")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-frames", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw = sorted(args.clips.glob("*.mp4"))
    if not raw:
        raise SystemExit(f"no .mp4 clips in {args.clips}")
    load_start = os.getloadavg()
    settings = FrameSettings(max_frames=args.max_frames, frame_rate=1.0, image_size=args.image_size)
    with tempfile.TemporaryDirectory(prefix="tvr-frame-cache-bench-") as work:
        work_dir = Path(work)
        start = time.perf_counter()
        prepared_report = prepare_videos(args.clips, work_dir / "prepared", workers=1, progress=False)
        prepare_seconds = time.perf_counter() - start
        start = time.perf_counter()
        cache_report = extract_frames(work_dir / "prepared", work_dir / "cache", settings, workers=1, progress=False)
        cache_seconds = time.perf_counter() - start
        prepared = [work_dir / "prepared" / p.name for p in raw]
        cached = [work_dir / "cache" / (p.stem + ".npy") for p in raw]

        def epoch_raw() -> None:
            for p in raw:
                load_clip(p, args.max_frames, 1.0, args.image_size)

        def epoch_prepared() -> None:
            for p in prepared:
                load_clip(p, args.max_frames, 1.0, args.image_size)

        def epoch_cache() -> None:
            for p in cached:
                load_cached_clip(p, args.max_frames, args.image_size)

        identical = all(
            all(
                torch.equal(a, b)
                for a, b in zip(
                    load_clip(p, args.max_frames, 1.0, args.image_size),
                    load_cached_clip(c, args.max_frames, args.image_size),
                    strict=True,
                )
            )
            for p, c in zip(prepared, cached, strict=True)
        )
        methods = {"raw_mp4": epoch_raw, "prepared_mp4": epoch_prepared, "frame_cache": epoch_cache}
        for fn in methods.values():  # warm-up: page cache, lazy imports
            fn()
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(args.reps):
            for name, fn in methods.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        sizes = {"raw_mp4": _bytes(raw), "prepared_mp4": _bytes(prepared), "frame_cache": _bytes(cached)}
    best = {name: min(t) for name, t in times.items()}
    result = {
        "clips": len(raw),
        "clip_folder": str(args.clips),
        "settings": {
            "max_frames": args.max_frames,
            "frame_rate": 1.0,
            "image_size": args.image_size,
            "torch_threads": 1,
            "reps": args.reps,
        },
        "epoch_seconds_min": {k: round(v, 4) for k, v in best.items()},
        "per_clip_ms_min": {k: round(1000 * v / len(raw), 2) for k, v in best.items()},
        "all_runs_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "speedup_cache_vs_raw": round(best["raw_mp4"] / best["frame_cache"], 2),
        "speedup_cache_vs_prepared": round(best["prepared_mp4"] / best["frame_cache"], 2),
        "speedup_prepared_vs_raw": round(best["raw_mp4"] / best["prepared_mp4"], 2),
        "bytes_on_disk": sizes,
        "cache_equals_load_clip_on_prepared": identical,
        "one_off_seconds": {"prepare_videos": round(prepare_seconds, 2), "extract_frames": round(cache_seconds, 2)},
        "prepare_summary": prepared_report["summary"],
        "cache_summary": cache_report["summary"],
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(
        f"{len(raw)} clips, min of {args.reps} epochs (1 torch thread): raw mp4 {best['raw_mp4']:.3f} s, prepared mp4 "
        f"{best['prepared_mp4']:.3f} s, frame cache {best['frame_cache']:.3f} s → cache "
        f"{result['speedup_cache_vs_raw']}× faster than raw, {result['speedup_cache_vs_prepared']}× than prepared; "
        f"bytes {sizes}; cache == load_clip: "
        f"{identical}; load average {result['loadavg_start']} → {result['loadavg_end']}"
    )
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
