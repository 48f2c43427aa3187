"""GARE test-time scoring: the reference-style direct path against the factorised scorer (spec §3.3a, §3.7).

Part 1 — 1000 texts × 1000 videos, D = 512, F = 12 (MSR-VTT 1k-A shape): the reference-style path (ψ on
16 × 16 blocks, as the released code) and ``gare_pairwise_scores`` (the factorised scorer), each timed in its own
subprocess (so peak RSS is per method), alternated and repeated; the minimum time of each is reported (the
machine is shared and noisy), with peak RSS, the RSS increase over the process's state before the call, and the
maximum absolute difference of the two score matrices.

Part 2 — the factorised scorer alone on 1000 texts × {10k, 30k, 100k} videos, to show the cost grows linearly
with the gallery while the working memory stays bounded (the inputs themselves, 100k × 12 × 512 float32 =
2.4 GB, and the 1k × 100k output are not working memory).

ψ has random weights drawn like the reference initialisation (N(0, 0.02)) plus random biases and non-trivial
LayerNorm affine parameters (γ ~ N(1, 0.2), β ~ N(0, 0.2)), so every term of the algebra is exercised.

    .venv/bin/python benchmarks/pairwise_scoring.py            # writes benchmarks/results/pairwise_scoring.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "tests"):  # tests/gare_oracle.py holds the reference-style path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
from benchmarks.measure import (  # noqa: E402
    peak_rss_mib,
    report_worker_call,
    rss_mib,
    run_worker_process,
    summarize_runs,
)

DEFAULT_OUT = REPO / "benchmarks" / "results" / "pairwise_scoring.json"


def make_psi(dim: int, seed: int):  # noqa: ANN201 - torch imported lazily
    import torch

    from tvr.methods.gare.psi import Psi

    torch.manual_seed(seed)
    psi = Psi(dim).eval()
    with torch.no_grad():
        for module in psi.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
            elif isinstance(module, torch.nn.Linear):
                module.bias.normal_(0.0, 0.02)
    return psi


def make_features(n_texts: int, n_videos: int, dim: int, frames: int, seed: int):  # noqa: ANN201
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    text = torch.randn(n_texts, dim, generator=g)
    video = torch.empty(n_videos, frames, dim)
    for b in range(0, n_videos, 10000):  # chunked so generation never needs a second gallery-sized buffer
        video[b : b + 10000].normal_(generator=g)
    return text, video


def worker(args: argparse.Namespace) -> None:
    """One timed call in this (fresh) process; prints a JSON line."""
    import torch
    from gare_oracle import gare_reference_scores

    from tvr.methods.gare.algebra import clear_cache
    from tvr.methods.gare.psi import GareOptions
    from tvr.methods.gare.scoring import gare_pairwise_scores
    from tvr.types import TextFeatures, VideoFeatures

    psi = make_psi(args.dim, args.seed)
    text, video = make_features(args.n_texts, args.n_videos, args.dim, args.frames, args.seed)
    options = GareOptions()  # the released MSR-VTT variant; the reference never masks frames
    mask = torch.ones(video.shape[:2], dtype=torch.long)

    def call(t, v):  # noqa: ANN001, ANN202
        feats = TextFeatures(t), VideoFeatures(v, mask[: len(v)])
        if args.method == "reference":
            return gare_reference_scores(psi, *feats, options, text_chunk=16, video_chunk=16)
        return gare_pairwise_scores(psi, *feats, options)

    with torch.no_grad():
        call(text[:16], video[:16])  # warm-up: thread pool, BLAS initialisation
        clear_cache()  # the timed call folds ψ's weights itself
        rss_before = rss_mib()
        start = time.perf_counter()
        scores = call(text, video)
        seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    if args.save_scores:
        torch.save(scores, args.save_scores)
    report_worker_call(args.method, seconds, rss_before, peak)


def run_worker(method: str, n_texts: int, n_videos: int, args: argparse.Namespace, save: str | None) -> dict:
    arguments = [
        "--worker",
        method,
        "--n-texts",
        str(n_texts),
        "--n-videos",
        str(n_videos),
        "--dim",
        str(args.dim),
        "--frames",
        str(args.frames),
        "--seed",
        str(args.seed),
    ]
    if save:
        arguments += ["--save-scores", save]
    return run_worker_process(__file__, arguments)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-texts", type=int, default=1000)
    parser.add_argument("--n-videos", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=3, help="alternated repetitions of each method (minimum kept)")
    parser.add_argument("--scaling", default="10000,30000,100000", help="gallery sizes for part 2 ('' = skip)")
    parser.add_argument("--scaling-reps", type=int, default=2)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--worker", choices=["reference", "fast"], help=argparse.SUPPRESS)
    parser.add_argument("--save-scores", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.method = args.worker
        worker(args)
        return

    import torch

    from tvr.utils.io import atomic_write_json

    command = "cd " + str(REPO) + " && .venv/bin/python benchmarks/pairwise_scoring.py " + " ".join(sys.argv[1:])
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {"reference": [], "fast": []}
    max_diff = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = ["reference", "fast"] if rep % 2 == 0 else ["fast", "reference"]
            paths = {}
            for method in order:
                paths[method] = os.path.join(tmp, f"{method}.pt")
                result = run_worker(method, args.n_texts, args.n_videos, args, paths[method])
                runs[method].append(result)
                print(
                    f"[rep {rep + 1}/{args.reps}] {method:9s} {result['seconds']:8.3f} s  "
                    f"peak RSS {result['peak_rss_mib']:7.1f} MiB (+{result['rss_increase_mib']:.1f})",
                    flush=True,
                )
            ref, fast = torch.load(paths["reference"]), torch.load(paths["fast"])
            max_diff = max(max_diff, float((ref - fast).abs().max()))

    pairwise = {
        "n_texts": args.n_texts,
        "n_videos": args.n_videos,
        "dim": args.dim,
        "frames": args.frames,
        "reference": {
            "path": "tests/gare_oracle.py, 16 x 16 blocks (ψ per block)",
            **summarize_runs(runs["reference"]),
        },
        "fast": {"path": "gare_pairwise_scores (factorised)", **summarize_runs(runs["fast"])},
        "max_abs_diff": max_diff,
    }
    pairwise["speedup"] = round(pairwise["reference"]["seconds_min"] / pairwise["fast"]["seconds_min"], 2)
    print(f"speedup {pairwise['speedup']}x, max |diff| {max_diff:.3g}", flush=True)

    scaling = []
    for n_videos in [int(s) for s in args.scaling.split(",") if s.strip()]:
        rs = [run_worker("fast", args.n_texts, n_videos, args, None) for _ in range(args.scaling_reps)]
        pairs = args.n_texts * n_videos
        entry = {"n_texts": args.n_texts, "n_videos": n_videos, **summarize_runs(rs, digits=3)}
        entry["us_per_pair"] = round(min(r["seconds"] for r in rs) / pairs * 1e6, 4)
        entry["output_mib"] = round(pairs * 4 / 2**20, 1)
        scaling.append(entry)
        print(
            f"fast {args.n_texts} x {n_videos}: {entry['seconds_min']} s ({entry['us_per_pair']} µs/pair), peak RSS "
            f"{entry['peak_rss_mib']} MiB (+{entry['rss_increase_mib_max']} MiB, output {entry['output_mib']} MiB)",
            flush=True,
        )

    result = {
        "benchmark": "GARE pairwise scoring: reference-style direct path vs factorised scorer",
        "command": command,
        "machine": {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "psi": "random: Linear N(0, 0.02) weights, N(0, 0.02) biases; LayerNorm gamma N(1, 0.2), beta N(0, 0.2)",
        "features": "i.i.d. N(0, 1) text and frame features, no frame mask, pool = text_softmax (temp 3), text side",
        "pairwise": pairwise,
        "scaling": scaling,
    }
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
