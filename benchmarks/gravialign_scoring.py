"""GraviAlign ``s_align`` scoring of every (text, video) pair: a plain broadcast against the head's scorer.

S_align (spec §5.2) needs Σ_k (μ_vk − μ_tk)²/(s_vk + s_tk) and Σ_k log(s_vk + s_tk) for every pair; neither
factorises into a matrix product, so both contenders do O(N_t·N_v·D) elementwise work:

* ``broadcast`` (the baseline): for each chunk of 16 texts, the [16, N_v, D] broadcasts of s and δ and their
  reductions, straight from the formulas (``sgi_align_terms`` on broadcast views; the per-item qualities are not
  recomputed per pair);
* ``pure``: ``gravialign.losses.sgi_align_pairwise``, the small pure function the losses use (chunks of up to 1 M
  elements, its own chunked backward; no threads of its own);
* ``ours``: ``tvr.methods.gravialign.scoring.s_align_scores``, the head's test-time scorer (the process's pool
  of single-threaded workers, one per torch thread, on their own text stripes; cache-sized blocks in two reused
  buffers per worker, in-place ops, variances multiplied over groups of dimensions before one log per group).

Part 1 — 1000 texts × 1000 videos, D = 512 (MSR-VTT 1k-A): each contender timed in its own subprocess (peak RSS is
its own) after a small warm-up call, alternated and repeated, minimum kept; max |difference| of each against a
float64 broadcast reference. Part 2 (in one process) — variants of ours, to show where the time goes: one log per
dimension (``max_group=1``), other block sizes, one worker, and the time of each step of one block (one thread)
scaled to all pairs. Part 3 — one thread against its own arithmetic floor: every step's elements costed at its
operation's rate on contiguous operands in the L2 cache with the call overhead removed; the scorer's one-thread
time over the sum of those floors is how far memory traffic, strides and per-op overhead put it above the
arithmetic.

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
from benchmarks.measure import (  # noqa: E402
    peak_rss_mib,
    report_worker_call,
    rss_mib,
    run_worker_process,
    summarize_runs,
)

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

    from tvr.methods.gravialign.losses import sgi_align_terms

    rows = []
    for a in range(0, mu_t.shape[0], chunk):
        terms = sgi_align_terms(mu_v[None], lv_v[None], mu_t[a : a + chunk, None], lv_t[a : a + chunk, None], **SGI)
        rows.append(terms["A"] + terms["B"] + terms["C"])
    return torch.cat(rows, dim=0)


def ours_scores(mu_v, lv_v, mu_t, lv_t, **kwargs):  # noqa: ANN001, ANN003, ANN201
    from tvr.methods.gravialign.scoring import s_align_scores

    return s_align_scores(mu_v, lv_v, mu_t, lv_t, **SGI, **kwargs)


def pure_scores(mu_v, lv_v, mu_t, lv_t):  # noqa: ANN001, ANN201
    from tvr.methods.gravialign.losses import sgi_align_pairwise

    return sgi_align_pairwise(mu_v, lv_v, mu_t, lv_t, **SGI)


CONTENDERS = {"broadcast": broadcast_scores, "pure": pure_scores, "ours": ours_scores}


def worker(args: argparse.Namespace) -> None:
    """One timed call in this (fresh) process; prints a JSON line."""
    import torch

    mu_v, lv_v, mu_t, lv_t = inputs(args)
    call = CONTENDERS[args.method]
    with torch.no_grad():
        call(mu_v[:64], lv_v[:64], mu_t[:32], lv_t[:32])  # warm-up: thread pool, allocator
        rss_before = rss_mib()
        start = time.perf_counter()
        scores = call(mu_v, lv_v, mu_t, lv_t)
        seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    if args.save_scores:
        torch.save(scores, args.save_scores)
    report_worker_call(args.method, seconds, rss_before, peak)


def run_worker(method: str, args: argparse.Namespace, save: str) -> dict:
    return run_worker_process(
        __file__,
        [
            "--worker",
            method,
            "--n-texts",
            str(args.n_texts),
            "--n-videos",
            str(args.n_videos),
            "--dim",
            str(args.dim),
            "--seed",
            str(args.seed),
            "--save-scores",
            save,
        ],
    )


def best_of(fn, reps: int, inner: int = 1) -> tuple[float, list[float]]:  # noqa: ANN001
    """Seconds per call of ``fn``: the minimum over ``reps`` timings of ``inner`` calls each (after one warm-up)."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return min(times), times


def step_elements(tc: int, vc: int, dim: int, group: int) -> dict[str, int]:
    """Elements each step of one [tc, vc, D] block of ``s_align_scores`` pushes through (the floor's counts)."""
    full = tc * vc * dim
    groups = dim // group
    return {
        "s = var_t + var_v (broadcast add)": full,
        "delta = mu_t - mu_v (broadcast sub)": full,
        "delta^2 (in place)": full,
        "/= s (in place)": full,
        "sum over D -> q": full,
        f"product over groups of {group} (strided prod)": tc * vc * groups * (group - 1),
        f"log of D/{group} products + sum": tc * vc * groups,
    }


def time_block_steps(tc: int, vc: int, tensors: tuple, group: int, reps: int, inner: int) -> dict[str, float]:
    """Seconds per call of each step of one [tc, vc, D] block (the operations ``s_align_scores`` runs, in the same
    order and in place), in the calling thread."""
    import torch

    mu_v, var_v, mu_t, var_t = tensors
    dim = mu_v.shape[1]
    s = torch.empty(tc, vc, dim)
    d = torch.empty(tc, vc, dim)
    q = torch.empty(tc, vc)
    groups = dim // group
    products = torch.empty(tc, vc, groups)
    fresh = torch.add(var_t[:tc, None], var_v[None, :vc])

    def product() -> None:
        torch.prod(s[..., : groups * group].view(tc, vc, group, groups), dim=2, out=products)

    steps = {
        "s = var_t + var_v (broadcast add)": lambda: torch.add(var_t[:tc, None], var_v[None, :vc], out=s),
        "delta = mu_t - mu_v (broadcast sub)": lambda: torch.sub(mu_t[:tc, None], mu_v[None, :vc], out=d),
        "delta^2 (in place)": lambda: d.mul_(d),
        "/= s (in place)": lambda: d.div_(s),
        "sum over D -> q": lambda: torch.sum(d, dim=-1, out=q),
        f"product over groups of {group} (strided prod)": product,
        f"log of D/{group} products + sum": lambda: products.log().sum(-1),
        "(for comparison) log of all D + sum": lambda: s.log().sum(-1),
    }
    out = {}
    for name, step in steps.items():
        s.copy_(fresh)
        if name.startswith("log of"):
            product()
        if name.startswith(("delta^2", "/=")):
            # repeated in place, δ² and δ/s would drift into denormals (slow) or zeros; 1 stays 1 (same speed)
            d.fill_(1.0)
            s.fill_(1.0)
        out[name], _ = best_of(step, reps, inner)
    return out


def scaled_tensors(args: argparse.Namespace):  # noqa: ANN201
    """μ and the variances pre-scaled by 2^−k as ``s_align_scores`` holds them, and the product group g."""
    from tvr.methods.gravialign.scoring import sgi_product_group

    mu_v, lv_v, mu_t, lv_t = inputs(args)
    g, k = sgi_product_group(lv_v, lv_t)
    return (mu_v, lv_v.exp() * 2.0**-k, mu_t, lv_t.exp() * 2.0**-k), g


def where_the_time_goes(args: argparse.Namespace, reps: int) -> dict:
    """In one process: variants of ours, and each step of one default block scaled to every pair."""
    import torch

    from tvr.methods.gravialign.scoring import SGI_BLOCK_ELEMENTS, SGI_TEXT_CHUNK

    mu_v, lv_v, mu_t, lv_t = inputs(args)
    variants = {}
    previous = torch.get_num_threads()
    with torch.no_grad():
        for name, kwargs in (
            ("default (8 texts x 256 videos, grouped logs)", {}),
            ("one log per dimension (max_group=1)", {"max_group": 1}),
            ("groups of at most 8 (max_group=8)", {"max_group": 8}),
            ("4 texts x 64 videos", {"text_chunk": 4, "video_chunk": 64}),
            ("16 texts x 512 videos", {"text_chunk": 16, "video_chunk": 512}),
            ("1 text x all videos", {"text_chunk": 1, "video_chunk": args.n_videos}),
            ("one worker (workers=1, torch threads = 1)", {"workers": 1, "threads": 1}),
        ):
            kwargs = dict(kwargs)
            torch.set_num_threads(kwargs.pop("threads", previous))
            try:
                seconds, times = best_of(lambda kw=kwargs: ours_scores(mu_v, lv_v, mu_t, lv_t, **kw), reps)
            finally:
                torch.set_num_threads(previous)
            variants[name] = {"seconds_min": round(seconds, 4), "seconds_all": [round(t, 4) for t in times]}
            print(f"  {name:48s} {seconds:7.3f} s", flush=True)

        # one block of the default shape, step by step, single-threaded as each worker runs it
        tc = min(SGI_TEXT_CHUNK, args.n_texts)
        vc = min(args.n_videos, max(1, SGI_BLOCK_ELEMENTS // (tc * args.dim)))
        blocks = -(-args.n_texts // tc) * -(-args.n_videos // vc)
        tensors, g = scaled_tensors(args)
        torch.set_num_threads(1)
        try:
            per_block = time_block_steps(tc, vc, tensors, g, max(3, reps * 3), 1)
        finally:
            torch.set_num_threads(previous)
    breakdown = {}
    for name, seconds in per_block.items():
        breakdown[name] = round(seconds * blocks, 4)
        print(f"  {name:48s} {seconds * blocks:7.3f} s for all pairs, one thread", flush=True)
    return {
        "variants": variants,
        "block": {"texts": tc, "videos": vc, "group": g, "blocks": blocks},
        "steps_seconds_all_pairs": breakdown,
    }


#: the in-cache probe: contiguous vectors of these two lengths (at the larger one, 256 KiB per operand: an op's
#: operands sit in the 1 MiB L2 of this machine's cores); their time difference is the marginal cost per element
#: with the per-call overhead cancelled
FLOOR_ELEMENTS = (1 << 15, 1 << 16)


def in_cache_rates(dim: int, reps: int) -> dict[str, float]:
    """Seconds per element of each elementwise operation the scorer uses, on contiguous operands in the L2 cache,
    without the per-call overhead (the difference of two lengths)."""
    import torch

    rates = {}
    for name in ("add", "sub", "square", "mul", "div", "sum over the last dim", "log"):
        times = []
        for n in FLOOR_ELEMENTS:
            a, b, c = torch.rand(n) + 0.5, torch.rand(n) + 0.5, torch.empty(n)
            ones, rows = torch.ones(n), a.view(-1, dim)
            q = torch.empty(rows.shape[0])
            call = {
                "add": lambda a=a, b=b, c=c: torch.add(a, b, out=c),
                "sub": lambda a=a, b=b, c=c: torch.sub(a, b, out=c),
                "square": lambda ones=ones: ones.mul_(ones),  # in place, as the scorer; 1·1 stays 1 (no denormals)
                "mul": lambda a=a, ones=ones: a.mul_(ones),  # two operands (the group products)
                "div": lambda ones=ones: ones.div_(ones),
                "sum over the last dim": lambda rows=rows, q=q: torch.sum(rows, dim=-1, out=q),
                "log": lambda a=a, c=c: torch.log(a, out=c),
            }[name]
            times.append(best_of(call, 12 * reps, 10)[0])  # short timings, many: the minimum dodges preemption
        rates[name] = max(0.0, times[1] - times[0]) / (FLOOR_ELEMENTS[1] - FLOOR_ELEMENTS[0])
    return rates


def one_thread_floor(args: argparse.Namespace, reps: int) -> dict:
    """The scorer on one thread (``workers=1``, torch threads 1) against its own arithmetic floor: every step's
    elements (:func:`step_elements` over all pairs) costed at its operation's rate on contiguous operands in the L2
    cache with the call overhead removed (:func:`in_cache_rates`) — the same arithmetic with no memory traffic beyond
    L2, no strides and no per-op overhead. Beside it, each step timed at the real block size (scaled to all pairs)
    and the whole call."""
    import torch

    from tvr.methods.gravialign.scoring import SGI_BLOCK_ELEMENTS, SGI_TEXT_CHUNK

    mu_v, lv_v, mu_t, lv_t = inputs(args)
    tensors, g = scaled_tensors(args)
    tc = min(SGI_TEXT_CHUNK, args.n_texts)
    vc = min(args.n_videos, max(1, SGI_BLOCK_ELEMENTS // (tc * args.dim)))
    blocks = -(-args.n_texts // tc) * -(-args.n_videos // vc)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            whole, whole_all = best_of(lambda: ours_scores(mu_v, lv_v, mu_t, lv_t, workers=1), reps)
            real = time_block_steps(tc, vc, tensors, g, 4 * reps, 1)
            rate = in_cache_rates(args.dim, reps)
    finally:
        torch.set_num_threads(previous)
    op_of = {
        "s = var_t + var_v (broadcast add)": ["add"],
        "delta = mu_t - mu_v (broadcast sub)": ["sub"],
        "delta^2 (in place)": ["square"],
        "/= s (in place)": ["div"],
        "sum over D -> q": ["sum over the last dim"],
        f"product over groups of {g} (strided prod)": ["mul"],
        f"log of D/{g} products + sum": ["log", "sum over the last dim"],
    }
    total = step_elements(args.n_texts, args.n_videos, args.dim, g)
    steps, floor_sum, real_sum = {}, 0.0, 0.0
    for name, count in total.items():
        floor = sum(rate[op] for op in op_of[name]) * count
        measured = real[name] * blocks
        floor_sum += floor
        real_sum += measured
        steps[name] = {
            "floor_seconds": round(floor, 4),
            "measured_seconds": round(measured, 4),
            "ratio": round(measured / floor, 2) if floor > 0 else None,
            "elements": count,
        }
        print(
            f"  {name:48s} floor {floor:6.3f} s  measured {measured:6.3f} s  ({measured / max(floor, 1e-12):.1f}x)",
            flush=True,
        )
    result = {
        "one_thread_seconds": round(whole, 4),
        "one_thread_seconds_all": [round(t, 4) for t in whole_all],
        "floor_seconds": round(floor_sum, 4),
        "ratio": round(whole / floor_sum, 2),
        "steps_sum_seconds": round(real_sum, 4),
        "steps_sum_ratio": round(real_sum / floor_sum, 2),
        "ns_per_element_in_cache": {k: round(v * 1e9, 4) for k, v in rate.items()},
        "in_cache_probe": f"contiguous vectors of {FLOOR_ELEMENTS[1]} minus {FLOOR_ELEMENTS[0]} elements",
        "steps": steps,
    }
    print(
        f"  whole call, one thread {whole:.3f} s; floor {floor_sum:.3f} s ({result['ratio']}x); steps at the real "
        f"block size sum to {real_sum:.3f} s ({result['steps_sum_ratio']}x)",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-texts", type=int, default=1000)
    parser.add_argument("--n-videos", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=5, help="alternated repetitions of each method (minimum kept)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 x 200, D = 64, one repetition")
    parser.add_argument(
        "--out",
        default=None,
        help=f"result file (default {DEFAULT_OUT.relative_to(REPO)}; --quick writes none unless given)",
    )
    parser.add_argument("--worker", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--save-scores", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.method = args.worker
        worker(args)
        return
    if args.quick:
        args.n_texts, args.n_videos, args.dim, args.reps = 200, 200, 64, 1

    import torch

    from tvr.methods.gravialign.scoring import sgi_product_group
    from tvr.utils.io import atomic_write_json

    command = "cd " + str(REPO) + " && .venv/bin/python benchmarks/gravialign_scoring.py " + " ".join(sys.argv[1:])
    load_start = os.getloadavg()
    names = list(CONTENDERS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    diffs = dict.fromkeys(names, 0.0)
    rel = dict.fromkeys(names, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = names if rep % 2 == 0 else names[::-1]
            for method in order:
                result = run_worker(method, args, os.path.join(tmp, f"{method}{rep}.pt"))
                runs[method].append(result)
                print(
                    f"[rep {rep + 1}/{args.reps}] {method:9s} {result['seconds']:8.3f} s  "
                    f"peak RSS {result['peak_rss_mib']:7.1f} MiB (+{result['rss_increase_mib']:.1f})",
                    flush=True,
                )
        # the reference only now: a child's peak RSS counts the parent's RSS at fork, so the parent stays small above
        mu_v, lv_v, mu_t, lv_t = inputs(args)
        reference = broadcast_scores(mu_v.double(), lv_v.double(), mu_t.double(), lv_t.double())
        for rep in range(args.reps):
            for method in names:
                diff = (torch.load(os.path.join(tmp, f"{method}{rep}.pt")).double() - reference).abs()
                diffs[method] = max(diffs[method], float(diff.max()))
                rel[method] = max(rel[method], float((diff / reference.abs().clamp_min(1.0)).max()))

    def summary(method: str) -> dict:
        return {
            **summarize_runs(runs[method]),
            "max_abs_diff_vs_float64": diffs[method],
            "max_rel_diff_vs_float64": rel[method],
        }

    g, k = sgi_product_group(lv_v, lv_t)
    pairwise = {
        "n_texts": args.n_texts,
        "n_videos": args.n_videos,
        "dim": args.dim,
        "product_group": g,
        "scale_exponent": k,
        "broadcast": {"path": f"sgi_align_terms on [{BROADCAST_CHUNK}, N_v, D] broadcasts", **summary("broadcast")},
        "pure": {"path": "tvr.methods.gravialign.losses.sgi_align_pairwise (defaults)", **summary("pure")},
        "ours": {"path": "tvr.methods.gravialign.scoring.s_align_scores (defaults)", **summary("ours")},
        "output_mib": round(args.n_texts * args.n_videos * 4 / 2**20, 2),
    }
    pairwise["speedup"] = round(pairwise["broadcast"]["seconds_min"] / pairwise["ours"]["seconds_min"], 2)
    pairwise["speedup_pure"] = round(pairwise["broadcast"]["seconds_min"] / pairwise["pure"]["seconds_min"], 2)
    print(
        f"speed-up {pairwise['speedup']}x (pure function {pairwise['speedup_pure']}x); max |diff| vs float64: "
        + ", ".join(f"{m} {diffs[m]:.3g}" for m in names),
        flush=True,
    )
    print("where the time goes (in one process):", flush=True)
    breakdown = where_the_time_goes(args, max(1, args.reps // 2))
    print("one thread against its arithmetic floor:", flush=True)
    floor = one_thread_floor(args, max(3, args.reps))

    result = {
        "benchmark": "GraviAlign s_align over all pairs: chunked broadcast vs sgi_align_pairwise vs s_align_scores",
        "command": command,
        "machine": {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "inputs": "mu: normalised N(0, 1) vectors; logvar: N(-4, 1) clamped to [-10, 5]; G = T = lam = 1, "
        "per_dim_mean, softplus quality, eps 1e-6",
        "pairwise": pairwise,
        "where_the_time_goes": breakdown,
        "one_thread_vs_floor": floor,
    }
    out = args.out or (None if args.quick else str(DEFAULT_OUT))
    if out:
        atomic_write_json(out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
