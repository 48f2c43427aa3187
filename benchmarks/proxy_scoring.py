"""TV-ProxyNet test-time scoring: the factorised exact scorer against its hardware floor and the reference-style path.

For every pair the score is cos(t_i, v_j) + γ·cos(t^p_ij, v_j) with its own text proxy t^p_ij (spec §4.5). Per pair,
only layer 2's query projection and the two FFNs are unavoidable (≈ 5·D² multiply-adds at D = ffn_dim = 512); the
factorised scorer (``proxy_pairwise_scores``) even folds the query projection into per-video keys, leaving 4·D².

Part 1 — at D = 512, M = 4, N_t × N_v ∈ {250 × 1000, 1000 × 1000} (``--sizes``), three contenders, each call in its
own subprocess (so peak RSS is its own), alternated and repeated, minimum time kept:

* ``fast``: ``proxy_pairwise_scores(generator, text, video, proxies, γ = 1)`` in eval mode;
* ``gemm``: plain ``torch.mm`` of [2048, D] × [D, D] blocks doing exactly 5·D² multiply-adds per pair — the floor;
  efficiency = t_gemm / t_fast (target ≥ 0.65);
* ``block``: the reference-style path, ``ProxyGenerator.forward`` on 128 × 128 blocks (spec §4.5), and the max
  |difference| of its scores from the factorised ones.

Memory: each worker reports its peak RSS and the RSS increase during the call (the [N_t, N_v] output included).
Where the time goes: a torch.profiler breakdown of one factorised call (250 × 1000) by operator.

Part 2 — two-stage rerank recall: the exact top-10 (exhaustive scoring) inside a cos(t_i, v_j) shortlist of K videos
per text, K ∈ {50, 100, 200}, on clustered synthetic features (benchmarks/rerank_recall.py's generator: topics,
per-video offsets, per-proxy noise; text = topic + 0.4·offset + noise) with a random generator, at γ = 0.5 and 1.5.

The generator is random: default initialisation (nn.MultiheadAttention-style attention, nn.Linear FFN, θ ~ U(0, 1))
plus random biases N(0, 0.02) and LayerNorm affine parameters (γ ~ N(1, 0.2), β ~ N(0, 0.2)).

    .venv/bin/python benchmarks/proxy_scoring.py            # writes benchmarks/results/proxy_scoring.json
    .venv/bin/python benchmarks/proxy_scoring.py --quick    # smoke run (small sizes, one repetition)
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
for _path in (REPO, REPO / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
from benchmarks.measure import (  # noqa: E402
    peak_rss_mib,
    report_worker_call,
    rss_mib,
    run_worker_process,
    summarize_runs,
)

DEFAULT_OUT = REPO / "benchmarks" / "results" / "proxy_scoring.json"
GEMM_ROWS = 2048


def make_generator(dim: int, num_proxies: int, dash: str, seed: int):  # noqa: ANN201 - torch imported lazily
    import torch

    from tvr.methods.proxy import ProxyGenerator

    torch.manual_seed(seed)
    gen = ProxyGenerator(dim, ffn_dim=dim, dash=dash, num_proxies=num_proxies).eval()
    with torch.no_grad():
        for module in gen.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.02)
    return gen


def make_features(n_texts: int, n_videos: int, dim: int, num_proxies: int, seed: int):  # noqa: ANN201
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed + 1)
    text = F.normalize(torch.randn(n_texts, dim, generator=g), dim=-1)
    video = F.normalize(torch.randn(n_videos, dim, generator=g), dim=-1)
    proxies = torch.randn(n_videos, num_proxies, dim, generator=g)
    return text, video, proxies


def worker(args: argparse.Namespace) -> None:
    """One timed call in this (fresh) process; prints a JSON line."""
    import torch

    from tvr.methods.proxy import proxy_pairwise_scores

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dim = args.dim
    pairs = args.n_texts * args.n_videos
    if args.worker == "gemm":
        g = torch.Generator().manual_seed(args.seed)
        a = torch.randn(GEMM_ROWS, dim, generator=g)
        w = torch.randn(dim, dim, generator=g) / dim**0.5
        out = torch.empty(GEMM_ROWS, dim)
        rows = 5 * pairs  # 5·D² multiply-adds per pair = 5 rows of a [·, D] × [D, D] product

        def call():  # noqa: ANN202
            for _ in range(rows // GEMM_ROWS):
                torch.mm(a, w, out=out)
            rest = rows % GEMM_ROWS
            if rest:
                torch.mm(a[:rest], w, out=out[:rest])
            return None
    else:
        gen = make_generator(dim, args.proxies, args.dash, args.seed)
        text, video, proxies = make_features(args.n_texts, args.n_videos, dim, args.proxies, args.seed)

        def call():  # noqa: ANN202
            return proxy_pairwise_scores(gen, text, video, proxies, 1.0, method=args.worker)

    with torch.no_grad():
        if args.worker != "gemm":
            proxy_pairwise_scores(gen, text[:8], video[:16], proxies[:16], 1.0, method=args.worker)  # warm-up
        else:
            torch.mm(a, w, out=out)
        rss_before = rss_mib()
        start = time.perf_counter()
        scores = call()
        seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    if args.save_scores and scores is not None:
        torch.save(scores, args.save_scores)
    report_worker_call(args.worker, seconds, rss_before, peak)


def run_worker(method: str, n_texts: int, n_videos: int, dash: str, args: argparse.Namespace, save: str | None) -> dict:
    arguments = [
        "--worker",
        method,
        "--n-texts",
        str(n_texts),
        "--n-videos",
        str(n_videos),
        "--dim",
        str(args.dim),
        "--proxies",
        str(args.proxies),
        "--dash",
        dash,
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
    ]
    if save:
        arguments += ["--save-scores", save]
    return run_worker_process(__file__, arguments)


def profile_breakdown(args: argparse.Namespace, n_texts: int, n_videos: int) -> list[dict]:
    """Share of one factorised call's CPU time per operator (top entries)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tvr.methods.proxy import proxy_pairwise_scores

    gen = make_generator(args.dim, args.proxies, "theta", args.seed)
    text, video, proxies = make_features(n_texts, n_videos, args.dim, args.proxies, args.seed)
    with torch.no_grad():
        proxy_pairwise_scores(gen, text[:8], video[:16], proxies[:16], 1.0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            proxy_pairwise_scores(gen, text, video, proxies, 1.0)
    events = [(e.key, e.self_cpu_time_total) for e in prof.key_averages()]
    total = sum(t for _, t in events) or 1.0
    events.sort(key=lambda e: -e[1])
    return [{"op": k, "share": round(t / total, 4), "ms": round(t / 1e3, 1)} for k, t in events[:8]]


def rerank_part(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F
    from rerank_recall import gt_recalls, make_eval_set

    from tvr.methods.proxy import ProxyHead, ProxyOptions
    from tvr.models.heads.common import top_k_by_dot
    from tvr.types import TextFeatures, VideoFeatures

    n_t, n_v = args.rerank_texts, args.rerank_videos
    text, frames, truth = make_eval_set(n_t, n_v, args.clusters, args.dim, args.proxies, args.seed)
    # the M "frames" of rerank_recall's generator serve as the M projected proxies; v_j = their normalised mean
    video = F.normalize(frames.mean(1), dim=-1)
    head = ProxyHead(args.dim, ProxyOptions(ffn_dim=args.dim, num_proxies=args.proxies)).eval()
    head.generator = make_generator(args.dim, args.proxies, "theta", args.seed)
    ts = head.encode_texts(TextFeatures(text))
    vs = head.encode_videos(VideoFeatures(video[:, None], torch.ones(n_v, 1, dtype=torch.long), frames))
    ks = [k for k in (int(x) for x in args.ks.split(",")) if k <= n_v]
    out = {"n_texts": n_t, "n_videos": n_v, "clusters": args.clusters, "gammas": []}
    with torch.no_grad():
        start = time.perf_counter()
        components = head.score_components(ts, vs)  # exhaustive: S^r and S^p of every pair
        out["exhaustive_seconds"] = round(time.perf_counter() - start, 3)
        print(f"exhaustive {n_t} x {n_v}: {out['exhaustive_seconds']} s", flush=True)
        shortlist = top_k_by_dot(head.shortlist_texts(ts), head.shortlist_videos(vs), max(ks))[0]
        for gamma in (float(g) for g in args.rerank_gammas.split(",")):
            head.set_inference_setting({"gamma": gamma})
            exact = head.combine_scores(components, {"gamma": gamma})
            top10 = exact.topk(10, dim=1).indices
            rows = []
            for k in ks:
                start = time.perf_counter()
                idx, scores = head.rerank(ts, vs, k)
                seconds = time.perf_counter() - start
                inside = (idx.unsqueeze(2) == top10.unsqueeze(1)).any(1).float()
                assert torch.equal(idx.sort(1).values, shortlist[:, :k].sort(1).values)
                rows.append(
                    {
                        "k": k,
                        "recall_of_exact_top10": round(float(inside.mean()), 4),
                        "queries_with_full_top10": round(float((inside.sum(1) == 10).float().mean()), 4),
                        "top1_agreement": round(float((idx[:, 0] == top10[:, 0]).float().mean()), 4),
                        "max_abs_diff_vs_exact": float((scores - exact.gather(1, idx)).abs().max()),
                        "rerank_seconds": round(seconds, 3),
                    }
                )
                print(
                    f"gamma={gamma} K={k}: recall of exact top-10 {rows[-1]['recall_of_exact_top10']}, top-1 "
                    f"agreement {rows[-1]['top1_agreement']}, rerank {seconds:.2f} s",
                    flush=True,
                )
            out["gammas"].append({"gamma": gamma, "gt_exhaustive": gt_recalls(exact, truth), "rerank": rows})
        out["gt_gamma0"] = gt_recalls(components["regular"], truth)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="250x1000,1000x1000", help="N_t x N_v pairs")
    parser.add_argument("--dashes", default="theta,linear")
    parser.add_argument("--block-dashes", default="theta", help="dashes for which the block path is timed")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--proxies", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=3, help="alternated repetitions (minimum kept)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads in every measurement (0 = torch's default); 1 is the steadier measure "
        "on a machine shared with other jobs, where a descheduled thread stalls every parallel op",
    )
    parser.add_argument("--rerank-texts", type=int, default=500)
    parser.add_argument("--rerank-videos", type=int, default=5000)
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--ks", default="50,100,200")
    parser.add_argument("--rerank-gammas", default="0.5,1.5")
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, one repetition")
    parser.add_argument("--out", default=None, help=f"result JSON (default {DEFAULT_OUT}; --quick: not written)")
    parser.add_argument("--worker", choices=["fast", "gemm", "block"], help=argparse.SUPPRESS)
    parser.add_argument("--n-texts", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--n-videos", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dash", default="theta", help=argparse.SUPPRESS)
    parser.add_argument("--save-scores", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.sizes, args.reps, args.dim = "40x200", 1, 128
        args.rerank_texts, args.rerank_videos, args.clusters, args.ks = 50, 400, 20, "50,100"
    out_path = args.out or (None if args.quick else str(DEFAULT_OUT))

    import torch

    from tvr.utils.io import atomic_write_json

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    command = "cd " + str(REPO) + " && .venv/bin/python benchmarks/proxy_scoring.py " + " ".join(sys.argv[1:])
    load_start = os.getloadavg()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",") if s]
    dashes = [d for d in args.dashes.split(",") if d]
    block_dashes = set(d for d in args.block_dashes.split(",") if d)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n_t, n_v in sizes:
            for dash in dashes:
                methods = ["fast", "gemm"] + (["block"] if dash in block_dashes else [])
                runs: dict[str, list[dict]] = {m: [] for m in methods}
                max_diff = 0.0
                for rep in range(args.reps):
                    order = methods if rep % 2 == 0 else methods[::-1]
                    paths = {}
                    for method in order:
                        paths[method] = os.path.join(tmp, f"{method}.pt") if method != "gemm" else None
                        r = run_worker(method, n_t, n_v, dash, args, paths[method])
                        runs[method].append(r)
                        print(
                            f"[{n_t}x{n_v} {dash} rep {rep + 1}/{args.reps}] {method:5s} {r['seconds']:8.3f} s  "
                            f"peak RSS {r['peak_rss_mib']:7.1f} MiB (+{r['rss_increase_mib']:.1f})",
                            flush=True,
                        )
                    if "block" in paths:
                        diff = (torch.load(paths["fast"]) - torch.load(paths["block"])).abs().max()
                        max_diff = max(max_diff, float(diff))

                pairs = n_t * n_v
                entry = {
                    "n_texts": n_t,
                    "n_videos": n_v,
                    "dash": dash,
                    "pairs": pairs,
                    **{m: summarize_runs(runs[m]) for m in methods},
                }
                t_fast, t_gemm = entry["fast"]["seconds_min"], entry["gemm"]["seconds_min"]
                entry["gemm_gmac_per_s"] = round(5 * pairs * args.dim**2 / t_gemm / 1e9, 1)
                entry["efficiency_vs_5D2_gemm"] = round(t_gemm / t_fast, 3)
                entry["fast_us_per_pair"] = round(t_fast / pairs * 1e6, 3)
                if "block" in methods:
                    entry["block_over_fast"] = round(entry["block"]["seconds_min"] / t_fast, 2)
                    entry["max_abs_diff_fast_vs_block"] = max_diff
                results.append(entry)
                print(
                    f"{n_t}x{n_v} {dash}: efficiency {entry['efficiency_vs_5D2_gemm']} (gemm "
                    f"{entry['gemm_gmac_per_s']} GMAC/s), {entry['fast_us_per_pair']} µs/pair"
                    + (
                        f", block/fast {entry['block_over_fast']}x, max |diff| {max_diff:.2g}"
                        if "block" in methods
                        else ""
                    ),
                    flush=True,
                )

    breakdown = profile_breakdown(args, *sizes[0])
    print("where the factorised scorer's time goes:", json.dumps(breakdown), flush=True)
    rerank = rerank_part(args)
    result = {
        "benchmark": "TV-ProxyNet pairwise scoring: factorised exact scorer vs 5·D² GEMM floor vs reference-style "
        "block path; two-stage rerank recall",
        "command": command,
        "machine": {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "generator": "random: default init + Linear biases N(0, 0.02), LayerNorm gamma N(1, 0.2), beta N(0, 0.2); "
        f"D = ffn_dim = {args.dim}, M = {args.proxies}, 2 layers, 1 head, delta = eta = 1, gamma = 1",
        "scoring": results,
        "profile_fast": {"size": list(sizes[0]), "top_ops": breakdown},
        "rerank": rerank,
    }
    if out_path:
        atomic_write_json(out_path, result)
        print(f"wrote {out_path}")
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
