"""GraviAlign ``s_align`` scoring of every (text, video) pair: a plain broadcast against ``sgi_align_pairwise``.

S_align (spec §5.2) needs Σ_k (μ_vk − μ_tk)²/(s_vk + s_tk) and Σ_k log(s_vk + s_tk) for every pair; neither
factorises into a matrix product, so both contenders do O(N_t·N_v·D) elementwise work:

* ``broadcast`` (the baseline): for each chunk of 16 texts, the [16, N_v, D] broadcasts of s and δ and their
  reductions, straight from the formulas (``sgi_align_terms`` on broadcast views; the per-item qualities are not
  recomputed per pair);
* ``ours``: ``tvr.losses.sgi_align_pairwise`` (one single-threaded worker per torch thread on its own text stripes,
  cache-sized blocks in two reused buffers per worker, in-place ops, variances multiplied over groups of dimensions
  before one log per group).

Part 1 — 1000 texts × 1000 videos, D = 512 (MSR-VTT 1k-A): each contender timed in its own subprocess (peak RSS is
its own) after a small warm-up call, alternated and repeated, minimum kept; max |difference| of each against a
float64 broadcast reference. Part 2 (in one process) — variants of ours, to show where the time goes: one log per
dimension (``max_group=1``), other block sizes, one worker, and the time of each step of one block (one thread)
scaled to all pairs.

Inputs: μ unit-norm Gaussian directions; log σ² ~ N(−4, 1) clamped to [−10, 5] (the head's init and clamp).

    .venv/bin/python benchmarks/gravialign_scoring.py            # writes benchmarks/results/gravialign_scoring.json
    .venv/bin/python benchmarks/gravialign_scoring.py --quick    # seconds: small sizes, one repetition, no file
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from benchmarks.measure import peak_rss_mib, rss_mib, run_worker_process, summarize_runs  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gravialign_scoring.json"
SGI = {"G": 1.0, "T": 1.0, "lam": 1.0}  # the spec's ★ defaults; per_dim_mean, softplus quality, ε = 1e-6
BROADCAST_CHUNK = 16


def make_gaussians(n: int, dim: int, seed: int):  # noqa: ANN201 - torch imported lazily
    import torch

    g = torch.Generator().manual_seed(seed)
    mu = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=-1)
    logvar = (-4.0 + torch.randn(n, dim, generator=g)).clamp(-10.0, 5.0)
    return mu, logvar


def inputs(args: argparse.Namespace):  # noqa: ANN201
    mu_v, lv_v = make_gaussians(args.n_videos, args.dim, args.seed)
    mu_t, lv_t = make_gaussians(args.n_texts, args.dim, args.seed + 1)
    return mu_v, lv_v, mu_t, lv_t


def broadcast_scores(mu_v, lv_v, mu_t, lv_t, chunk: int = BROADCAST_CHUNK):  # noqa: ANN001, ANN201
    """The baseline: [chunk, N_v, D] broadcasts per chunk of texts, reduced straight from the formulas."""
    import torch

    from tvr.losses import sgi_align_terms

    rows = []
    for a in range(0, mu_t.shape[0], chunk):
        terms = sgi_align_terms(mu_v[None], lv_v[None], mu_t[a : a + chunk, None], lv_t[a : a + chunk, None], **SGI)
        rows.append(terms["A"] + terms["B"] + terms["C"])
    return torch.cat(rows, dim=0)


def ours_scores(mu_v, lv_v, mu_t, lv_t, **kwargs):  # noqa: ANN001, ANN003, ANN201
    from tvr.losses import sgi_align_pairwise

    return sgi_align_pairwise(mu_v, lv_v, mu_t, lv_t, **SGI, **kwargs)


def worker(args: argparse.Namespace) -> None:
    """One timed call in this (fresh) process; prints a JSON line."""
    import torch

    mu_v, lv_v, mu_t, lv_t = inputs(args)
    call = broadcast_scores if args.method == "broadcast" else ours_scores
    with torch.no_grad():
        call(mu_v[:64], lv_v[:64], mu_t[:32], lv_t[:32])  # warm-up: thread pool, allocator
        rss_before = rss_mib()
        start = time.perf_counter()
        scores = call(mu_v, lv_v, mu_t, lv_t)
        seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    if args.save_scores:
        torch.save(scores, args.save_scores)
    print(json.dumps({"method": args.method, "seconds": seconds, "peak_rss_mib": round(peak, 1),
                      "rss_before_call_mib": round(rss_before, 1), "rss_increase_mib": round(peak - rss_before, 1),
                      "threads": torch.get_num_threads()}))


def run_worker(method: str, args: argparse.Namespace, save: str) -> dict:
    return run_worker_process(__file__, ["--worker", method, "--n-texts", str(args.n_texts), "--n-videos",
                                         str(args.n_videos), "--dim", str(args.dim), "--seed", str(args.seed),
                                         "--save-scores", save])


def best_of(fn, reps: int) -> tuple[float, list[float]]:  # noqa: ANN001
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), times


def where_the_time_goes(args: argparse.Namespace, reps: int) -> dict:
    """In one process: variants of ours, and each step of one default block scaled to every pair."""
    import torch

    from tvr.losses import SGI_BLOCK_ELEMENTS, SGI_TEXT_CHUNK, sgi_product_group

    mu_v, lv_v, mu_t, lv_t = inputs(args)
    variants = {}
    with torch.no_grad():
        for name, kwargs in (
            ("default (8 texts x 256 videos, grouped logs)", {}),
            ("one log per dimension (max_group=1)", {"max_group": 1}),
            ("groups of at most 8 (max_group=8)", {"max_group": 8}),
            ("4 texts x 64 videos", {"text_chunk": 4, "video_chunk": 64}),
            ("16 texts x 512 videos", {"text_chunk": 16, "video_chunk": 512}),
            ("1 text x all videos", {"text_chunk": 1, "video_chunk": args.n_videos}),
            ("one worker (torch threads = 1)", {"threads": 1}),
        ):
            kwargs = dict(kwargs)
            threads = kwargs.pop("threads", torch.get_num_threads())
            previous = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                seconds, times = best_of(lambda kw=kwargs: ours_scores(mu_v, lv_v, mu_t, lv_t, **kw), reps)
            finally:
                torch.set_num_threads(previous)
            variants[name] = {"seconds_min": round(seconds, 4), "seconds_all": [round(t, 4) for t in times]}
            print(f"  {name:48s} {seconds:7.3f} s", flush=True)

        # the steps run single-threaded, as each worker runs them (the workers split the text stripes)
        torch.set_num_threads(1)

        # one block of the default shape, step by step (the same operations sgi_align_pairwise runs)
        tc = min(SGI_TEXT_CHUNK, args.n_texts)
        vc = min(args.n_videos, max(1, SGI_BLOCK_ELEMENTS // (tc * args.dim)))
        g, k = sgi_product_group(lv_v, lv_t)
        var_v, var_t = lv_v.exp() * 2.0**-k, lv_t.exp() * 2.0**-k
        s = torch.empty(tc, vc, args.dim)
        d = torch.empty(tc, vc, args.dim)
        q = torch.empty(tc, vc)
        blocks = -(-args.n_texts // tc) * -(-args.n_videos // vc)
        groups = args.dim // g

        def tree() -> None:
            view = s[..., : groups * g].view(tc, vc, g, groups)
            h = g
            while h > 1:
                h //= 2
                view[:, :, :h].mul_(view[:, :, h : 2 * h])

        fresh = s.clone()
        steps = {
            "s = var_t + var_v (broadcast add)": lambda: torch.add(var_t[:tc, None], var_v[None, :vc], out=s),
            "delta = mu_t - mu_v (broadcast sub)": lambda: torch.sub(mu_t[:tc, None], mu_v[None, :vc], out=d),
            "delta^2 (in place)": lambda: d.mul_(d),
            "/= s (in place)": lambda: d.div_(s),
            "sum over D -> q": lambda: torch.sum(d, dim=-1, out=q),
            f"product tree over groups of {g} (in place)": lambda: (s.copy_(fresh), tree()),
            f"log of D/{g} products + sum": lambda: s[..., :groups].log().sum(-1),
            "(for comparison) log of all D + sum": lambda: s.log().sum(-1),
        }
        torch.add(var_t[:tc, None], var_v[None, :vc], out=fresh)
        breakdown = {}
        for name, step in steps.items():
            if name.startswith("log of"):
                s.copy_(fresh)
                tree()
            elif name.startswith("(for comparison)"):
                s.copy_(fresh)
            seconds, _ = best_of(step, max(3, reps * 3))
            if name.startswith("product tree"):
                copy_seconds, _ = best_of(lambda: s.copy_(fresh), max(3, reps * 3))
                seconds = max(0.0, seconds - copy_seconds)
            breakdown[name] = round(seconds * blocks, 4)
            print(f"  {name:48s} {seconds * blocks:7.3f} s for all pairs, one thread", flush=True)
    return {"variants": variants, "block": {"texts": tc, "videos": vc, "group": g, "blocks": blocks},
            "steps_seconds_all_pairs": breakdown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-texts", type=int, default=1000)
    parser.add_argument("--n-videos", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=5, help="alternated repetitions of each method (minimum kept)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 x 200, D = 64, one repetition")
    parser.add_argument("--out", default=None, help=f"result file (default {DEFAULT_OUT.relative_to(REPO)}; "
                        "--quick writes none unless given)")
    parser.add_argument("--worker", choices=["broadcast", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--save-scores", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.method = args.worker
        worker(args)
        return
    if args.quick:
        args.n_texts, args.n_videos, args.dim, args.reps = 200, 200, 64, 1

    import torch

    from tvr.losses import sgi_product_group
    from tvr.utils.io import atomic_write_json

    command = "cd " + str(REPO) + " && .venv/bin/python benchmarks/gravialign_scoring.py " + " ".join(sys.argv[1:])
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {"broadcast": [], "ours": []}
    diffs = {"broadcast": 0.0, "ours": 0.0}
    rel = {"broadcast": 0.0, "ours": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = ["broadcast", "ours"] if rep % 2 == 0 else ["ours", "broadcast"]
            for method in order:
                result = run_worker(method, args, os.path.join(tmp, f"{method}{rep}.pt"))
                runs[method].append(result)
                print(f"[rep {rep + 1}/{args.reps}] {method:9s} {result['seconds']:8.3f} s  "
                      f"peak RSS {result['peak_rss_mib']:7.1f} MiB (+{result['rss_increase_mib']:.1f})", flush=True)
        # the reference only now: a child's peak RSS counts the parent's RSS at fork, so the parent stays small above
        mu_v, lv_v, mu_t, lv_t = inputs(args)
        reference = broadcast_scores(mu_v.double(), lv_v.double(), mu_t.double(), lv_t.double())
        for rep in range(args.reps):
            for method in ("broadcast", "ours"):
                diff = (torch.load(os.path.join(tmp, f"{method}{rep}.pt")).double() - reference).abs()
                diffs[method] = max(diffs[method], float(diff.max()))
                rel[method] = max(rel[method], float((diff / reference.abs().clamp_min(1.0)).max()))

    def summary(method: str) -> dict:
        return {**summarize_runs(runs[method]), "max_abs_diff_vs_float64": diffs[method],
                "max_rel_diff_vs_float64": rel[method]}

    g, k = sgi_product_group(lv_v, lv_t)
    pairwise = {
        "n_texts": args.n_texts, "n_videos": args.n_videos, "dim": args.dim, "product_group": g, "scale_exponent": k,
        "broadcast": {"path": f"sgi_align_terms on [{BROADCAST_CHUNK}, N_v, D] broadcasts", **summary("broadcast")},
        "ours": {"path": "tvr.losses.sgi_align_pairwise (defaults)", **summary("ours")},
        "output_mib": round(args.n_texts * args.n_videos * 4 / 2**20, 2),
    }
    pairwise["speedup"] = round(pairwise["broadcast"]["seconds_min"] / pairwise["ours"]["seconds_min"], 2)
    print(f"speed-up {pairwise['speedup']}x; max |diff| vs float64: broadcast {diffs['broadcast']:.3g}, "
          f"ours {diffs['ours']:.3g}", flush=True)
    print("where the time goes (in one process):", flush=True)
    breakdown = where_the_time_goes(args, max(1, args.reps // 2))

    result = {
        "benchmark": "GraviAlign s_align over all pairs: chunked broadcast vs sgi_align_pairwise",
        "command": command,
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "torch": torch.__version__, "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
        "inputs": "mu: normalised N(0, 1) vectors; logvar: N(-4, 1) clamped to [-10, 5]; G = T = lam = 1, "
                  "per_dim_mean, softplus quality, eps 1e-6",
        "pairwise": pairwise,
        "where_the_time_goes": breakdown,
    }
    out = args.out or (None if args.quick else str(DEFAULT_OUT))
    if out:
        atomic_write_json(out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
