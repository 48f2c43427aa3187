"""Is the synthetic set's encoding deterministic? Which encoding makes the same frames give the same data every time?

The bench's data must be a pure function of its dials (docs/bench.md#reproducibility). Rendering is (its frames'
SHA-256 is pinned); the question is the encoder. This script renders ``--clips`` clips of the default bench's
synthetic set (photographs in motion, 96 px, 12 frames) and encodes each one ``--repeats`` times in each of
``--processes`` fresh interpreters, per encoding:

* ``x264_crf18``: libx264 yuv420p crf 18, preset medium, one thread: what ``tvr synth`` writes by default;
* ``x264_crf18_mbtree0``: the same with ``x264-params mbtree=0`` (earlier notes saw it remove the differences);
* ``x264_lossless``: libx264 yuv420p qp 0 (lossless for the 4:2:0 input; the RGB→YUV conversion still rounds);
* ``x264rgb_lossless``: libx264rgb qp 0 (lossless RGB: decodes to the rendered frames);
* ``ffv1``: FFV1 in Matroska, bgr0 (lossless RGB).

For each it records the distinct byte streams and the distinct decoded frame sets per clip over all encodings
(decoded as the data readers decode: PyAV, ``to_ndarray(format="rgb24")``), the largest difference between two
decodings of one clip, whether the decoded frames equal the rendered ones, the bytes per clip and the CPU seconds
to encode and to decode one clip.

    .venv/bin/python benchmarks/synth_encoding.py      # writes benchmarks/results/synth_encoding.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "synth_encoding.json"
#: name -> (codec, container format, file suffix, pixel format, codec options)
ENCODINGS: dict[str, tuple[str, str, str, str, dict[str, str]]] = {
    "x264_crf18": ("libx264", "mp4", ".mp4", "yuv420p", {"crf": "18", "preset": "medium"}),
    "x264_crf18_mbtree0": (
        "libx264", "mp4", ".mp4", "yuv420p", {"crf": "18", "preset": "medium", "x264-params": "mbtree=0"},
    ),
    "x264_lossless": ("libx264", "mp4", ".mp4", "yuv420p", {"qp": "0", "preset": "medium"}),
    "x264rgb_lossless": ("libx264rgb", "mp4", ".mp4", "rgb24", {"qp": "0", "preset": "medium"}),
    "ffv1": ("ffv1", "matroska", ".mkv", "bgr0", {}),
}  # fmt: skip
#: the default bench's synthetic set (tvr/configs/bench/default.yaml before issue 34), from which clips are taken
SYNTH = dict(content="objects", num_videos=400, num_test=100, size=96, fps=4, seconds=3.0, pair_prob=0.5,
             shared_attributes=0.1, distractor_prob=0.3, distractor_motion=0.3, seed=0)  # fmt: skip


def _encode(frames: np.ndarray, path: Path, name: str, fps: float) -> None:
    import av

    codec, fmt, _, pix_fmt, options = ENCODINGS[name]
    with av.open(str(path), mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = pix_fmt
        stream.codec_context.thread_count = 1
        stream.options = dict(options)
        for frame in frames:
            video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            container.mux(stream.encode(video_frame))
        container.mux(stream.encode(None))


def _decode(path: Path) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])])


def worker(name: str, clips: int, repeats: int) -> None:
    """Render the clips, encode each ``repeats`` times; print one JSON line of hashes and timings."""
    from tvr.bench.synthetic import SynthConfig, make_video_specs, render_video_frames

    cfg = SynthConfig(**SYNTH)
    specs = make_video_specs(cfg)
    picks = np.linspace(0, len(specs) - 1, clips).round().astype(int)
    out: dict = {"clips": []}
    encode_cpu = decode_cpu = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for index in picks:
            frames = render_video_frames(specs[int(index)], cfg)
            record = {"index": int(index), "bytes_sha": [], "frames_sha": [], "sizes": []}
            first = None
            max_diff = 0
            equal_to_rendered = True
            for rep in range(repeats):
                path = Path(tmp) / f"clip{index}_{rep}{ENCODINGS[name][2]}"
                start = time.process_time()
                _encode(frames, path, name, cfg.fps)
                encode_cpu += time.process_time() - start
                start = time.process_time()
                decoded = _decode(path)
                decode_cpu += time.process_time() - start
                record["bytes_sha"].append(hashlib.sha256(path.read_bytes()).hexdigest())
                record["frames_sha"].append(hashlib.sha256(decoded.tobytes()).hexdigest())
                record["sizes"].append(path.stat().st_size)
                equal_to_rendered &= decoded.shape == frames.shape and bool(np.array_equal(decoded, frames))
                if first is None:
                    first = decoded
                else:
                    max_diff = max(max_diff, int(np.abs(decoded.astype(int) - first.astype(int)).max()))
            record["max_level_difference_within_process"] = max_diff
            record["decoded_equals_rendered"] = equal_to_rendered
            out["clips"].append(record)
    encodings = clips * repeats
    out["encode_cpu_seconds_per_clip"] = encode_cpu / encodings
    out["decode_cpu_seconds_per_clip"] = decode_cpu / encodings
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="encodings of each clip per process")
    parser.add_argument("--processes", type=int, default=3, help="fresh interpreters per encoding")
    parser.add_argument("--encodings", default=",".join(ENCODINGS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.clips, args.repeats)
        return
    from tvr.utils.io import atomic_write_json

    load_start = os.getloadavg()
    results: dict = {}
    for name in args.encodings.split(","):
        runs = []
        for _ in range(args.processes):
            res = subprocess.run(
                [sys.executable, __file__, "--worker", name, "--clips", str(args.clips), "--repeats",
                 str(args.repeats)], check=True, capture_output=True, text=True, cwd=REPO,
            )  # fmt: skip
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        per_clip = []
        for k in range(args.clips):
            records = [run["clips"][k] for run in runs]
            per_clip.append({
                "index": records[0]["index"],
                "distinct_byte_streams": len({h for r in records for h in r["bytes_sha"]}),
                "distinct_decoded_frames": len({h for r in records for h in r["frames_sha"]}),
                "max_level_difference_within_process": max(r["max_level_difference_within_process"] for r in records),
                "decoded_equals_rendered": all(r["decoded_equals_rendered"] for r in records),
                "bytes": records[0]["sizes"][0],
            })  # fmt: skip
        results[name] = {
            "codec": ENCODINGS[name][0],
            "container": ENCODINGS[name][1],
            "pix_fmt": ENCODINGS[name][3],
            "options": ENCODINGS[name][4],
            "encodings_per_clip": args.processes * args.repeats,
            "clips_with_several_byte_streams": sum(c["distinct_byte_streams"] > 1 for c in per_clip),
            "clips_with_several_decodings": sum(c["distinct_decoded_frames"] > 1 for c in per_clip),
            "decoded_equals_rendered_all": all(c["decoded_equals_rendered"] for c in per_clip),
            "mean_bytes_per_clip": round(float(np.mean([c["bytes"] for c in per_clip])), 1),
            "encode_cpu_seconds_per_clip": round(float(np.mean([r["encode_cpu_seconds_per_clip"] for r in runs])), 4),
            "decode_cpu_seconds_per_clip": round(float(np.mean([r["decode_cpu_seconds_per_clip"] for r in runs])), 4),
            "per_clip": per_clip,
        }
        print(
            f"{name}: {results[name]['clips_with_several_byte_streams']} of {args.clips} clips with several byte "
            f"streams, {results[name]['clips_with_several_decodings']} with several decodings; decoded == rendered: "
            f"{results[name]['decoded_equals_rendered_all']}; {results[name]['mean_bytes_per_clip']:.0f} B/clip",
            flush=True,
        )
    record = {
        "command": "python benchmarks/synth_encoding.py " + " ".join(sys.argv[1:]),
        "clips": args.clips,
        "repeats_per_process": args.repeats,
        "processes": args.processes,
        "synth": SYNTH,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "encodings": results,
    }
    atomic_write_json(args.out, record)


if __name__ == "__main__":
    main()
