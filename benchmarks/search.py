"""Search at scale: 1,000,000 synthetic 512-d windows with a modality gap, and ``tvr index`` on the real clips.

Synthetic part (the index's own code: ``tvr.search.ann`` for FAISS, ``write_shard`` / ``ShardReader`` /
``gather_state`` for the memory-mapped rerank state, ``head.rerank_state`` / ``head.score_rerank`` for the exact
scores):

* gallery: every window v = norm(g·u_v + s), a text query for window j is t = norm(g·u_t + s_j + noise), with s a
  topic centre plus an item part and u_v ⟂ u_t: the two modalities sit on opposite sides of a gap, as CLIP's do;
* the shortlist index ``tvr index`` builds for that many windows (``--ann auto``: HNSW above 50k windows), its
  build time and memory,
  recall@10 of its top 10 against exhaustive exact inner product, measured with text queries;
* the rerank state of GARE (the factorised scorer's per-window ψ state) and TV-ProxyNet (folded rounds) for
  ``--state-windows`` windows, written as shards (float16 by default) and memory-mapped; bytes per window; the
  float16 scores against float32 ones;
* p50 / p95 latency of one text query for the top 10: the shortlist alone, and the shortlist of 100 reranked
  exactly by GARE and by TV-ProxyNet (state read from the mapped shards; candidate rows beyond the stored windows
  are mapped onto them, the cost depends on K only). Text encoding is not included (the real-clip part times it);
* recall@10 of shortlist-100 (the timed index) + exact GARE rerank against exhaustive exact GARE scoring of every
  window (each window's state computed shard by shard, as the stored state is; the result says when the shortlist
  is a flat index, below ``--ann auto``'s threshold).

Real-clip part: ``tvr index`` (the default encoder, or ``--checkpoint``) on ``../shared/data/real-scenes``:
windows per second, against this machine's decoding throughput (``decode_windows``, one process) and encoding
throughput (``encode_windows`` on decoded windows).

    python benchmarks/search.py                      # full: 1M windows, 100k windows of state (≈ 10 GB scratch)
    python benchmarks/search.py --windows 20000 --state-windows 5000 --queries 50   # quick check
    python benchmarks/search.py --skip-real --shortlist-only --out benchmarks/results/search_shortlist.json

Writes benchmarks/results/search.json; scratch files go to a temporary folder (``--scratch``) removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tvr.config import HeadConfig  # noqa: E402
from tvr.models.heads.base import LN_100  # noqa: E402
from tvr.models.heads.registry import build_head  # noqa: E402
from tvr.search import ann  # noqa: E402
from tvr.search.defaults import ANN_KINDS  # noqa: E402
from tvr.search.index import exact_scores  # noqa: E402
from tvr.search.store import ShardReader, gather_state, write_shard  # noqa: E402
from tvr.types import TextFeatures, VideoFeatures  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "search.json"
#: rows per generated chunk of synthetic windows
CHUNK = 50_000
SHARED = Path(os.environ.get("TVR_SHARED_DATA", ROOT.parent / "shared" / "data"))


def rss_gib() -> float:
    return psutil.Process().memory_info().rss / 2**30


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p95_ms": round(float(np.percentile(a, 95)), 3),
        "mean_ms": round(float(a.mean()), 3),
    }


# --------------------------------------------------------------------------------------------- synthetic data


class Synthetic:
    """Window and query embeddings with a modality gap (see the module docstring), generated chunk by chunk."""

    def __init__(self, dim: int, topics: int = 4096, gap: float = 1.2, seed: int = 0, decay: float = 1.0) -> None:
        g = torch.Generator().manual_seed(seed)
        basis, _ = torch.linalg.qr(torch.randn(dim, 2, generator=g))
        self.u_v, self.u_t = basis[:, 0], basis[:, 1]
        # variance of the k-th direction ∝ k^-decay (0: isotropic), total 1: learned embeddings concentrate their
        # variance in few directions (a power-law spectrum), which is what makes them indexable at all
        spectrum = torch.arange(1, dim + 1, dtype=torch.float32) ** -decay
        self.scale = (spectrum / spectrum.sum()).sqrt()
        self.centres = torch.randn(topics, dim, generator=g) * self.scale
        self.dim, self.gap, self.seed = dim, gap, seed

    def chunk(self, c: int) -> torch.Tensor:
        """s for rows [c·CHUNK, (c+1)·CHUNK): 0.8·centre(topic) + 0.6·item part, from a seed of the chunk."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + c + 1)
        topics = torch.randint(len(self.centres), (CHUNK,), generator=g)
        return 0.8 * self.centres[topics] + 0.6 * torch.randn(CHUNK, self.dim, generator=g) * self.scale

    def semantic(self, rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(len(rows), self.dim)
        chunks = rows // CHUNK
        for c in torch.unique(chunks).tolist():
            sel = chunks == c
            out[sel] = self.chunk(c)[rows[sel] - c * CHUNK]
        return out

    def windows(self, start: int, stop: int) -> torch.Tensor:
        return F.normalize(self.gap * self.u_v + self.semantic(torch.arange(start, stop)), dim=-1)

    def queries(self, targets: torch.Tensor, seed: int = 1) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        noise = 0.5 * torch.randn(len(targets), self.dim, generator=g) * self.scale
        return F.normalize(self.gap * self.u_t + self.semantic(targets) + noise, dim=-1)


def frames_for(v: torch.Tensor, frames: int, seed: int) -> torch.Tensor:
    """F frame features per window whose mean is exactly v (so the shortlist embedding norm(mean) is v): [n, F, D]."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(v.shape[0], frames, v.shape[1], generator=g) / math.sqrt(v.shape[1])
    noise = noise - noise.mean(dim=1, keepdim=True)
    return v[:, None, :] + 0.7 * noise


# --------------------------------------------------------------------------------------------- parts


def build_gallery(synth: Synthetic, n: int, scratch: Path, chunk: int = CHUNK) -> np.ndarray:
    path = scratch / "gallery.npy"
    gallery = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, synth.dim))
    for a in range(0, n, chunk):
        gallery[a : a + chunk] = synth.windows(a, min(n, a + chunk)).numpy()
    gallery.flush()
    return np.load(path, mmap_mode="r")


def exact_top(gallery: np.ndarray, queries: np.ndarray, k: int, chunk: int = 100_000) -> np.ndarray:
    """Exhaustive exact inner-product top-k rows per query."""
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), 0), dtype=np.int64)
    for a in range(0, len(gallery), chunk):
        s = queries @ np.asarray(gallery[a : a + chunk]).T
        s = np.concatenate([best_s, s], axis=1)
        fresh = s.shape[1] - best_i.shape[1]
        i = np.concatenate([best_i, np.broadcast_to(np.arange(a, a + fresh), (len(queries), fresh))], axis=1)
        top = np.argpartition(-s, k - 1, axis=1)[:, :k]
        best_s = np.take_along_axis(s, top, axis=1)
        best_i = np.take_along_axis(i, top, axis=1)
    order = np.argsort(-best_s, axis=1, kind="stable")
    return np.take_along_axis(best_i, order, axis=1)


def recall_at(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]))


def timed_top10(index, queries: np.ndarray, truth: np.ndarray) -> dict:
    """Latency percentiles of the shortlist's top 10, one query at a time, and its recall@10 against ``truth``."""
    lat, found = [], []
    for q in queries:
        t = time.perf_counter()
        _, rows = ann.search(index, q[None], 10)
        lat.append(1000 * (time.perf_counter() - t))
        found.append(rows[0])
    return {**percentiles(lat), "recall_at_10": round(recall_at(np.array(found), truth), 4)}


def build_state(
    head, gallery: np.ndarray, n: int, frames: int, folder: Path, half: bool, kind: str, shard: int = 5000
) -> tuple[list[ShardReader], float, int]:
    """Rerank state of windows [0, n) as shards of ``shard`` windows; returns (readers, seconds, bytes on disk)."""
    start = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for a in range(0, n, shard):
        v = torch.from_numpy(np.asarray(gallery[a : a + shard]))
        x = frames_for(v, frames, seed=10_000 + a)
        if kind == "gare":
            state = head.rerank_state(head.encode_videos(VideoFeatures(x, torch.ones(len(v), frames))))
        else:
            proxies = x[:, :4]  # M = 4 proxies per window
            state = head.rerank_state(head.encode_videos(VideoFeatures(x, torch.ones(len(v), frames), proxies)))
        name = f"{a:09d}"
        write_shard(folder, name, v, state, [], half=half)
        names.append(name)
    seconds = time.perf_counter() - start
    readers = [ShardReader(folder / name) for name in names]
    size = sum(p.stat().st_size for p in folder.rglob("state*.npy"))
    return readers, seconds, size


@torch.no_grad()
def scale_psi(head, synth: Synthetic, gallery: np.ndarray, frames: int, ratio: float) -> dict:
    """Scale ψ's output layer so that ‖Δ_ij‖ ≈ ratio·‖t_i‖ on average: ψ keeps its random reference
    initialisation otherwise. A trained GARE's increments are small corrections (its trust-region term bounds them);
    a random ψ's are not, and would make the exact score unrelated to any shortlist."""
    from tvr.methods.gare.psi import gare_delta

    v = torch.from_numpy(np.asarray(gallery[:64]))
    video = head.encode_videos(VideoFeatures(frames_for(v, frames, seed=5), torch.ones(64, frames)))
    text = head.encode_texts(TextFeatures(synth.queries(torch.arange(64)).float()))
    before = float(gare_delta(head.psi, text, video, head.options).norm(dim=-1).mean())
    factor = ratio / before  # ‖t‖ = 1
    head.psi.delta_proj.weight.mul_(factor)
    head.psi.delta_proj.bias.mul_(factor)
    after = float(gare_delta(head.psi, text, video, head.options).norm(dim=-1).mean())
    return {
        "mean_delta_norm_random_init": round(before, 4),
        "output_scale": round(factor, 4),
        "mean_delta_norm": round(after, 4),
        "mean_text_norm": 1.0,
    }


def state_lookup(n_state: int, shard: int):
    def lookup(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mapped = rows % n_state
        return mapped // shard, mapped % shard

    return lookup


def text_state(head, kind: str, q: torch.Tensor):
    return head.encode_texts(TextFeatures(q))


def rerank_once(head, readers, cls, lookup, q: np.ndarray, rows: np.ndarray) -> tuple[float, float, np.ndarray]:
    """One query's exact rerank of the shortlisted ``rows``, as ``tvr.search.index.exact_scores`` does it: (gather
    ms, score ms, the scores in the order of ``rows``)."""
    t1 = time.perf_counter()
    shard, local = lookup(rows)
    stored = np.lexsort((local, shard))  # what exact_scores does: read in storage order
    state = gather_state(readers, shard[stored], local[stored], cls, torch.float32)
    t2 = time.perf_counter()
    scores = np.empty(len(stored))
    with torch.inference_mode():
        ts = text_state(head, "", torch.from_numpy(q[None]))
        scores[stored] = head.score_rerank(ts, state)[0].numpy()
    return 1000 * (t2 - t1), 1000 * (time.perf_counter() - t2), scores


#: programs for the other CPU while the rerank is timed (``rerank_conditions``)
NEIGHBOURS = {
    "cpu_bound": "while True: pass",
    "memory_bound": "import numpy as np\na = np.ones(2**25); b = np.empty_like(a)\nwhile True: np.copyto(b, a)",
}


def rerank_conditions(head, readers, cls, lookup, index, queries: np.ndarray, state_folder: Path) -> dict:
    """Gather and score of the same shortlisted rows per query under controlled conditions (issue 35: they took
    2.4× longer in one run than in another): right after the query's shortlist search at the index's beam, after
    one at beam 64, with no search before, after sweeping 64 MiB of unrelated memory (CPU caches flushed), with a
    CPU-bound or a memory-bound program on the other CPU (this process pinned to the first), and with the state
    files dropped from the page cache (``posix_fadvise(DONTNEED)``: the first pass reads from the disk, the second
    from the cache again)."""
    import subprocess

    graph = ann.hnsw_graph(index)
    graph = graph if hasattr(graph, "hnsw") else None  # a flat or IVF index has no beam
    beam = graph.hnsw.efSearch if graph is not None else 0
    rows = [ann.search(index, q[None], 100)[1][0] for q in queries]
    junk = np.ones(64 * 2**20 // 8)

    def search_at(ef: int):
        def run(q: np.ndarray) -> None:
            graph.hnsw.efSearch = ef
            ann.search(index, q[None], 100)
            graph.hnsw.efSearch = beam

        return run

    def measure(before) -> dict:
        timed: dict[str, list[float]] = {"before": [], "gather": [], "score": []}
        for q, r in zip(queries, rows, strict=True):
            t = time.perf_counter()
            before(q)
            timed["before"].append(1000 * (time.perf_counter() - t))
            gather_ms, score_ms, _ = rerank_once(head, readers, cls, lookup, q, r)
            timed["gather"].append(gather_ms)
            timed["score"].append(score_ms)
        return {name: percentiles(v) for name, v in timed.items()}

    conditions = {"no_search": lambda q: None, "after_64mib_memory_sweep": lambda q: float(junk.sum())}
    if graph is not None:
        conditions = {f"after_search_ef{beam}": search_at(beam), "after_search_ef64": search_at(64), **conditions}
    out: dict = {"queries": len(queries), "load_average_before": [round(x, 2) for x in os.getloadavg()]}
    for repeat in (1, 2):
        for name, before in conditions.items():
            out[f"{name}_{repeat}"] = measure(before)
            print("gather/score", name, repeat, out[f"{name}_{repeat}"], flush=True)
    pinned = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2
    if pinned:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0]})
        try:
            for name, code in NEIGHBOURS.items():
                other = subprocess.Popen(
                    [sys.executable, "-c", code], preexec_fn=lambda: os.sched_setaffinity(0, {cpus[1]})
                )
                try:
                    time.sleep(1.0)
                    out[f"{name}_neighbour_no_search"] = measure(conditions["no_search"])
                    print("gather/score", name, "neighbour", out[f"{name}_neighbour_no_search"], flush=True)
                finally:
                    other.kill()
                    other.wait()
            time.sleep(1.0)
            out["idle_neighbour_no_search"] = measure(conditions["no_search"])
        finally:
            os.sched_setaffinity(0, set(cpus))
    for path in sorted(state_folder.rglob("state*.npy")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    out["state_evicted_first_pass"] = measure(conditions["no_search"])
    out["state_evicted_second_pass"] = measure(conditions["no_search"])
    print("gather/score evicted:", out["state_evicted_first_pass"], out["state_evicted_second_pass"], flush=True)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


@torch.no_grad()
def pipeline_recall(
    head, index, settings: ann.AnnSettings, gallery: np.ndarray, queries: np.ndarray, frames: int, shard: int = 5000
) -> dict:
    """Recall@10 of what a query gets — the timed shortlist index's top 100, reranked by GARE's exact score — against
    exhaustive exact GARE scoring of every window of the gallery. Each window's frames are those ``build_state``
    gives it (the same seed per shard of 5000), its state is computed in float32 shard by shard, and every query's
    exhaustive top 10 and the exact scores of its shortlisted windows come from the same pass."""
    start = time.perf_counter()
    _, shortlist = ann.search(index, queries, 100)
    texts = text_state(head, "gare", torch.from_numpy(queries))
    best_s = torch.full((len(queries), 10), -torch.inf)
    best_i = torch.zeros((len(queries), 10), dtype=torch.long)
    exact = np.full(shortlist.shape, -np.inf)
    for a in range(0, len(gallery), shard):
        v = torch.from_numpy(np.asarray(gallery[a : a + shard]))
        x = frames_for(v, frames, seed=10_000 + a)
        state = head.rerank_state(head.encode_videos(VideoFeatures(x, torch.ones(len(v), frames))))
        scores = head.score_rerank(texts, state).float()  # [queries, shard]
        merged_s = torch.cat([best_s, scores], dim=1)
        merged_i = torch.cat([best_i, torch.arange(a, a + len(v)).expand(len(queries), -1)], dim=1)
        top = merged_s.topk(10, dim=1)
        best_s, best_i = top.values, merged_i.gather(1, top.indices)
        inside = (shortlist >= a) & (shortlist < a + len(v))
        q, j = np.nonzero(inside)
        exact[q, j] = scores[q, shortlist[q, j] - a].numpy()
    found = np.take_along_axis(shortlist, np.argsort(-exact, axis=1, kind="stable")[:, :10], axis=1)
    return {
        "windows": len(gallery),
        "queries": len(queries),
        "shortlist": settings.to_dict(),
        "shortlist_is_the_timed_index": True,
        "note": (
            "flat (exact) shortlist: below the auto threshold no graph is built, so this checks no ANN index"
            if settings.kind == "flat"
            else f"{settings.kind} shortlist, the index timed above"
        ),
        "recall_at_10": round(recall_at(found, best_i.numpy()), 4),
        "seconds": round(time.perf_counter() - start, 1),
    }


def shortlist_index(args: argparse.Namespace, settings: ann.AnnSettings, gallery: np.ndarray, scratch: Path):
    """The shortlist index ``tvr index`` builds for the gallery, and its build figures. With ``--ann-cache`` a graph
    built before for the same gallery and settings is loaded from there (its recorded build figures reported, with
    ``"loaded_from_cache": true``), and a new one is saved there: search settings can be measured again on the same
    graph without building it again (a 1M graph takes minutes on one thread)."""
    key = f"{args.windows}x{args.dim}-decay{args.decay:g}-" + "-".join(
        f"{k}{v}" for k, v in settings.to_dict().items() if k not in ("rows", "dim", "ef_search", "nprobe")
    )
    cached = Path(args.ann_cache) / f"{key}.faiss" if args.ann_cache else None
    if cached is not None and cached.exists() and cached.with_suffix(".json").exists():
        t0 = time.perf_counter()
        index = ann.load(cached, settings.to_dict())
        figures = json.loads(cached.with_suffix(".json").read_text())
        return index, {
            **figures,
            **settings.to_dict(),
            "loaded_from_cache": True,
            "load_seconds": round(time.perf_counter() - t0, 1),
        }
    rss0 = rss_gib()
    t0, c0 = time.perf_counter(), time.process_time()
    training = np.asarray(gallery[ann.training_rows(args.windows, settings)])
    t_train = time.perf_counter()
    index = ann.build(
        settings, training, (np.asarray(gallery[a : a + ann.ADD_BLOCK]) for a in range(0, args.windows, ann.ADD_BLOCK))
    )
    del training
    build_seconds, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    ann.save(index, scratch / "ann.faiss")
    figures = {
        "build_seconds": round(build_seconds, 1),
        "build_cpu_seconds": round(build_cpu, 1),
        "build_load_average_after": [round(x, 2) for x in os.getloadavg()],
        "sample_seconds": round(t_train - t0, 1),
        "save_seconds": round(time.perf_counter() - t0 - build_seconds, 1),
        "rss_gib_after_build": round(rss_gib(), 2),
        "rss_gib_before": round(rss0, 2),
        "file_gib": round((scratch / "ann.faiss").stat().st_size / 2**30, 2),
    }
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(scratch / "ann.faiss", cached)
        cached.with_suffix(".json").write_text(json.dumps(figures) + "\n")
    return index, {**settings.to_dict(), **figures}


# --------------------------------------------------------------------------------------------- the benchmark


def synthetic_part(args: argparse.Namespace, scratch: Path) -> dict:
    torch.set_num_threads(args.threads)
    out: dict = {
        "windows": args.windows,
        "dim": args.dim,
        "decay": args.decay,
        "frames": args.frames,
        "queries": args.queries,
        "threads": args.threads,
        "query_threads": args.query_threads,
        "state_windows": args.state_windows,
        "state_dtype": args.state_dtype,
    }
    synth = Synthetic(args.dim, decay=args.decay)
    t0 = time.perf_counter()
    gallery = build_gallery(synth, args.windows, scratch)
    out["generate_seconds"] = round(time.perf_counter() - t0, 1)
    rng = np.random.default_rng(7)
    targets = torch.from_numpy(np.sort(rng.choice(args.state_windows, size=args.queries, replace=False)))
    queries = synth.queries(targets).numpy()
    # within-modality vs cross-modality similarity: the gap
    sample = np.asarray(gallery[:2000])
    target_rows = np.asarray(gallery[targets.numpy()])
    out["gap"] = {
        "mean_cos_video_video": round(float((sample[:1000] * sample[1000:2000]).sum(1).mean()), 3),
        "mean_cos_query_target": round(float((queries * target_rows).sum(1).mean()), 3),
        "mean_cos_query_random": round(float((queries @ sample[:1000].T).mean()), 3),
    }
    print("gap:", out["gap"], flush=True)

    # ---- the shortlist index, as tvr index builds it
    settings = ann.choose(args.ann, args.windows, args.dim)
    if args.nprobe:
        settings.nprobe = args.nprobe
    if settings.kind == "hnsw":  # another graph than the default, e.g. the one before issue 35 item 7 to compare
        settings.storage = args.hnsw_storage or settings.storage
        settings.hnsw_m = args.hnsw_m or settings.hnsw_m
        settings.ef_construction = args.ef_construction or settings.ef_construction
    index, out["ann"] = shortlist_index(args, settings, gallery, scratch)
    print("ann:", out["ann"], flush=True)
    truth = exact_top(gallery, queries, 10)
    out["target_recall_at_10_exhaustive"] = round(
        float(np.mean([t in row for t, row in zip(targets.numpy(), truth, strict=True)])), 3
    )
    out["shortlist_top10"] = timed_top10(index, queries, truth)
    # recall against cost: IVF cells probed, or the HNSW search beam
    sweep = {}
    faiss = ann._faiss()
    if settings.kind in ("ivf", "hnsw"):
        ivf = faiss.extract_index_ivf(index) if settings.kind == "ivf" else None
        values = (
            sorted({max(1, settings.nlist // d) for d in (128, 64, 32, 16, 8)})
            if ivf is not None
            else sorted({64, 128, 256, 320, 384, 448, 512, 640, 768, 1024, 1536, settings.ef_search})
        )
        for value in values:
            if ivf is not None:
                ivf.nprobe = value
            else:
                ann.hnsw_graph(index).hnsw.efSearch = value
            sweep[value] = timed_top10(index, queries, truth)
        if ivf is not None:
            ivf.nprobe = settings.nprobe
        else:
            ann.hnsw_graph(index).hnsw.efSearch = settings.ef_search
        out["nprobe_sweep" if ivf is not None else "ef_search_sweep"] = sweep
        print("sweep:", sweep, flush=True)
    if args.shortlist_only:
        out["peak_rss_gib"] = round(rss_gib(), 2)
        return out

    # ---- rerank state: GARE and TV-ProxyNet
    half = args.state_dtype == "float16"
    heads = {}
    for kind in ("gare", "proxy"):
        torch.manual_seed(0)
        head = build_head(HeadConfig(name=kind), args.dim, LN_100).eval()
        if kind == "gare":
            out["gare_delta"] = scale_psi(head, synth, gallery, args.frames, args.delta_ratio)
        readers, seconds, size = build_state(head, gallery, args.state_windows, args.frames, scratch / kind, half, kind)
        heads[kind] = (head, readers)
        out[kind] = {
            "state_build_seconds": round(seconds, 1),
            "state_gib_on_disk": round(size / 2**30, 2),
            "bytes_per_window": int(size // args.state_windows),
            "fields": {k: v for k, v in readers[0].meta["fields"].items() if v is not None},
        }
        print(kind, "state:", {k: v for k, v in out[kind].items() if k != "fields"}, flush=True)

    # float16 against float32 on the first windows
    for kind, (head, readers) in heads.items():
        n = min(2000, args.state_windows)
        v = torch.from_numpy(np.asarray(gallery[:n]))
        x = frames_for(v, args.frames, seed=10_000)
        feats = VideoFeatures(x, torch.ones(n, args.frames), x[:, :4] if kind == "proxy" else None)
        exact32 = head.rerank_state(head.encode_videos(feats))
        stored = gather_state(readers, np.arange(n) // 5000, np.arange(n) % 5000, type(exact32))
        ts = text_state(head, kind, torch.from_numpy(queries[:50]))
        s32 = head.score_rerank(ts, exact32)
        s16 = head.score_rerank(ts, stored)
        top32 = s32.topk(10, dim=1).indices.numpy()
        top16 = s16.topk(10, dim=1).indices.numpy()
        out[kind]["stored_vs_float32"] = {
            "windows": n,
            "queries": 50,
            "max_abs_score_difference": float((s32 - s16).abs().max()),
            "top10_overlap": round(recall_at(top16, top32), 4),
            "top1_agreement": round(float((top16[:, 0] == top32[:, 0]).mean()), 4),
        }
        print(kind, "stored vs float32:", out[kind]["stored_vs_float32"], flush=True)

    # ---- latency of one query: shortlist 100 + exact rerank, top 10, on --query-threads torch threads (one query's
    # products are small: a second thread's synchronisation costs more than it saves, badly so on a busy machine)
    torch.set_num_threads(args.query_threads)
    lookup = state_lookup(args.state_windows, 5000)
    for kind, (head, readers) in heads.items():
        cls = type(
            head.rerank_state(
                head.encode_videos(
                    VideoFeatures(
                        torch.randn(1, args.frames, args.dim),
                        torch.ones(1, args.frames),
                        torch.randn(1, 4, args.dim) if kind == "proxy" else None,
                    )
                )
            )
        )
        lat, parts = [], {"shortlist": [], "gather": [], "score": []}
        for q in queries:
            t = time.perf_counter()
            _, rows = ann.search(index, q[None], 100)
            shortlist_ms = 1000 * (time.perf_counter() - t)
            gather_ms, score_ms, scores = rerank_once(head, readers, cls, lookup, q, rows[0])
            np.argpartition(-scores, 10)[:10]
            lat.append(1000 * (time.perf_counter() - t))
            for name, ms in (("shortlist", shortlist_ms), ("gather", gather_ms), ("score", score_ms)):
                parts[name].append(ms)
            # the timed path is tvr.search.index.exact_scores split in two: it must give the same scores
            if len(lat) == 1:
                shard, local = lookup(rows[0])
                same = exact_scores(head, text_state(head, kind, torch.from_numpy(q[None])), readers, shard, local, cls)
                assert np.array_equal(same, scores), "the benchmark's rerank differs from the index's"
        out[kind]["query_top10_rerank100"] = {
            **percentiles(lat),
            **{f"{k}_p50_ms": percentiles(v)["p50_ms"] for k, v in parts.items()},
            **{f"{k}_p95_ms": percentiles(v)["p95_ms"] for k, v in parts.items()},
        }
        if kind == "gare" and args.rerank_conditions:
            out[kind]["gather_score_conditions"] = rerank_conditions(
                head, readers, cls, lookup, index, queries, scratch / kind
            )
        print(kind, "query:", out[kind]["query_top10_rerank100"], flush=True)

    # ---- recall@10 of shortlist-100 + exact GARE rerank on the timed index, against exhaustive GARE over every window
    head, _ = heads["gare"]
    out["gare"]["rerank_recall_at_10_vs_exhaustive"] = pipeline_recall(
        head, index, settings, gallery, queries[: min(args.queries, args.recall_queries)], args.frames
    )
    print("gare rerank recall:", out["gare"]["rerank_recall_at_10_vs_exhaustive"], flush=True)
    out["peak_rss_gib"] = round(rss_gib(), 2)
    return out


def real_clips_part(args: argparse.Namespace, scratch: Path) -> dict:
    """tvr index on the real clips against decode-only and encode-only throughput."""
    from tvr.search.build import IndexOptions, build_index
    from tvr.search.encoders import embed_video, load_encoder
    from tvr.search.windows import decode_windows

    clips = SHARED / "real-scenes"
    if not clips.is_dir():
        return {"skipped": f"{clips} not found"}
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    encoder = load_encoder(args.checkpoint, None if args.checkpoint else args.config)
    load_seconds = time.perf_counter() - t0
    files = sorted(clips.glob("*.mp4"))
    # decode only (one process), then encode only (the decoded windows, this process)
    t0 = time.perf_counter()
    decoded = [decode_windows(f, encoder.spec, args.window, args.stride) for f in files]
    decode_seconds = time.perf_counter() - t0
    windows = sum(len(d.windows) for d in decoded)
    t0 = time.perf_counter()
    for d in decoded:
        embed_video(encoder, d)
    encode_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    query = encoder.encode_texts(["a dog runs on the beach"])  # noqa: F841 - warm
    t0 = time.perf_counter()
    for _ in range(20):
        encoder.encode_texts(["a brown bear walking on the rock"])
    text_ms = 1000 * (time.perf_counter() - t0) / 20
    results = {}
    for workers in (1, 2):
        out = scratch / f"real-j{workers}"
        t0 = time.perf_counter()
        report = build_index(
            clips, out, encoder, IndexOptions(window=args.window, stride=args.stride, workers=workers, progress=False)
        )
        seconds = time.perf_counter() - t0
        results[f"j{workers}"] = {
            "seconds": round(seconds, 2),
            "windows_per_second": round(windows / seconds, 2),
            "report_decode_seconds": report["decode_seconds"],
            "report_encode_seconds": report["encode_seconds"],
        }
    return {
        "encoder": encoder.stamp().get("name") or encoder.stamp().get("path"),
        "clips": len(files),
        "windows": windows,
        "window": args.window,
        "stride": args.stride,
        "model_load_seconds": round(load_seconds, 2),
        "decode_only_windows_per_second": round(windows / decode_seconds, 2),
        "encode_only_windows_per_second": round(windows / encode_seconds, 2),
        "text_query_encode_ms": round(text_ms, 2),
        "tvr_index": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=1_000_000)
    parser.add_argument("--state-windows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument(
        "--decay",
        type=float,
        default=1.0,
        help="spectrum of the embeddings: variance ∝ k^-decay (0 = isotropic, the hardest case for any ANN index)",
    )
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--recall-queries", type=int, default=50)
    parser.add_argument("--state-dtype", default="float16", choices=("float16", "float32"))
    parser.add_argument("--ann", default="auto", choices=ANN_KINDS, help="the shortlist index (as tvr index --ann)")
    parser.add_argument("--nprobe", type=int, default=0, help="IVF: override the default nprobe")
    parser.add_argument(
        "--hnsw-storage", default=None, choices=ann.HNSW_STORAGES, help="HNSW: how the graph keeps its vectors"
    )
    parser.add_argument(
        "--rerank-conditions",
        action="store_true",
        help="also time GARE's gather and score of the same rows under controlled conditions (caches, page cache, "
        "the other CPU busy)",
    )
    parser.add_argument("--hnsw-m", type=int, default=0, help="HNSW: the graph's degree instead of the default")
    parser.add_argument("--ef-construction", type=int, default=0, help="HNSW: the construction beam instead")
    parser.add_argument(
        "--ann-cache",
        default=None,
        help="folder where the shortlist index is saved after building and loaded from when it was built before "
        "for the same gallery and settings (measure search settings again without building the graph again)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads for building")
    parser.add_argument("--query-threads", type=int, default=1, help="torch threads for the per-query latency")
    parser.add_argument("--delta-ratio", type=float, default=0.1, help="GARE: mean ‖Δ‖ / ‖t‖ (ψ's output scaled)")
    parser.add_argument("--scratch", default=None, help="folder for scratch files (default: a temporary folder)")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument(
        "--shortlist-only",
        action="store_true",
        help="stop after the shortlist index's recall and search-beam sweep (no rerank state, no rerank timings)",
    )
    parser.add_argument("--checkpoint", default=None, help="real clips: a tvr checkpoint instead of the default")
    parser.add_argument("--config", default=None, help="real clips: a config instead of the default encoder")
    parser.add_argument("--window", type=float, default=2.0, help="real clips: window seconds (clips are 2-8 s)")
    parser.add_argument("--stride", type=float, default=1.0)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if args.state_windows % 5000 and args.state_windows > 5000:
        parser.error("--state-windows: a multiple of 5000 (the benchmark's shard size)")
    scratch = Path(tempfile.mkdtemp(prefix="tvr-search-bench-", dir=args.scratch))
    results: dict = {
        "command": "python benchmarks/search.py " + " ".join(sys.argv[1:]),
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
    }
    try:
        print(f"scratch: {scratch} ({shutil.disk_usage(scratch).free / 2**30:.0f} GiB free)", flush=True)
        if not args.skip_synthetic:
            results["synthetic"] = synthetic_part(args, scratch)
        if not args.skip_real:
            results["real_clips"] = real_clips_part(args, scratch)
            print("real clips:", results["real_clips"], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
