"""One GARE-reranked query on 100k windows, three stores (issue 48, item 6): the index folder (FAISS, the graph
``tvr index`` builds at this size), a Qdrant collection in ``qdrant-client``'s local mode, and one in Qdrant Edge
(Qdrant's engine in-process). The same windows (``benchmarks/search.py``'s synthetic 512-d windows with a modality
gap), the same rerank state (float16 shards, GARE with ψ scaled as there), written by the stores' own writers
(:mod:`tvr.search.stores`) and searched by their own ``shortlist`` + ``tvr.search.index.exact_scores``, as
``tvr search`` does: shortlist 100, exact rerank, top 10.

* build: seconds to write each store from the shards;
* recall@10 of the reranked top 10 against exhaustive exact GARE scoring of every window (float32 state);
* p50 / p95 of one query (the GARE text state, the shortlist, the rerank), the stores alternating query by query in
  one process, who goes first turning round;
* the same with a filter: ``--under`` a folder holding 5 % of the windows (FAISS: post-filter, the shortlist
  widening until 100 windows pass; Qdrant: pushed down), answers checked to lie in the folder.

    .venv/bin/python benchmarks/search_stores.py --windows 100000 --queries 200

The stores' writes are untimed work for the CPU lock's purposes (the local mode writes a point a transaction, about
20 ms each here): ``--phase build --scratch DIR`` writes everything once, ``--phase query --scratch DIR`` times
the queries on it (under the lock).

Writes benchmarks/results/search_stores.json; scratch in a temporary folder unless ``--scratch`` names one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(HERE))

import search as bench  # noqa: E402  (benchmarks/search.py: the scale benchmark's synthetic windows and helpers)

from tvr.config import HeadConfig  # noqa: E402
from tvr.models.heads.base import LN_100  # noqa: E402
from tvr.models.heads.registry import build_head  # noqa: E402
from tvr.search.filters import WindowFilter  # noqa: E402
from tvr.search.index import exact_scores  # noqa: E402
from tvr.search.store import ShardReader  # noqa: E402
from tvr.search.stores.faiss import FolderStore, FolderWriter  # noqa: E402
from tvr.search.stores.qdrant import QdrantStore, QdrantWriter, parse_address  # noqa: E402
from tvr.types import TextFeatures, VideoFeatures  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

RESULTS = HERE / "results" / "search_stores.json"
FRAMES, DIM, SHARD = 12, 512, 5000
#: windows per synthetic video, and videos per folder (a folder per shard: 5 % of 100k windows)
VIDEO_WINDOWS = 20
SHORTLIST, TOP = 100, 10


def entries(readers: list[ShardReader]) -> list[tuple[dict, ShardReader]]:
    """Synthetic videos over the shards' rows (``VIDEO_WINDOWS`` windows each, 10 s every 5 s), in path order, as
    ``tvr index`` hands them to a store."""
    found = []
    for reader in readers:
        for a in range(0, reader.rows, VIDEO_WINDOWS):
            b = min(reader.rows, a + VIDEO_WINDOWS)
            video = f"f{reader.path.name}/v{a // VIDEO_WINDOWS:04d}.mp4"
            windows = [[5.0 * w, 5.0 * w + 10.0] for w in range(b - a)]
            entry = {"video": video, "size": 1, "mtime_ns": 1, "duration": windows[-1][1], "windows": windows}
            found.append(({**entry, "rows": [a, b], "shard": reader.path.name}, reader))
    return found


def settings_of(head) -> dict:  # noqa: ANN001
    return {
        "format": "tvr-search-index",
        "version": 2,
        "model": {"encoder": "benchmark", "id": "synthetic-gare"},
        "frames": {"max_frames": FRAMES},
        "window": 10.0,
        "stride": 5.0,
        "state_dtype": "float16",
        "head": {"name": head.name, "indexable": False},
        "source": {"root": "/synthetic", "kind": "folder"},
    }


def write(writer, videos: list[tuple[dict, ShardReader]], settings: dict) -> float:  # noqa: ANN001
    """Seconds to write the videos into a store with its writer, as ``tvr index`` finalises."""
    t = time.perf_counter()
    writer.begin()
    writer.stored()
    for entry, reader in videos:
        writer.add(entry, reader)
    writer.commit(settings)
    writer.close()
    return time.perf_counter() - t


@torch.no_grad()
def exhaustive_top(head, gallery: np.ndarray, texts, windows: int) -> np.ndarray:  # noqa: ANN001
    """Every query's top 10 windows by exact GARE scoring of every window (float32 state, frames as the shards were
    built from)."""
    best_s = torch.full((len(texts), TOP), -torch.inf)
    best_i = torch.zeros((len(texts), TOP), dtype=torch.long)
    for a in range(0, windows, SHARD):
        v = torch.from_numpy(np.asarray(gallery[a : a + SHARD]))
        x = bench.frames_for(v, FRAMES, seed=10_000 + a)
        state = head.rerank_state(head.encode_videos(VideoFeatures(x, torch.ones(len(v), FRAMES))))
        scores = head.score_rerank(texts, state)
        merged_s = torch.cat([best_s, scores.float()], dim=1)
        merged_i = torch.cat([best_i, torch.arange(a, a + len(v)).expand(len(texts), -1)], dim=1)
        top = merged_s.topk(TOP, dim=1)
        best_s, best_i = top.values, merged_i.gather(1, top.indices)
    return best_i.numpy()


def query(store, head, cls, q: np.ndarray, where: WindowFilter | None) -> tuple[float, np.ndarray]:  # noqa: ANN001
    """One query, timed: (ms, the top 10 windows' index rows)."""
    t = time.perf_counter()
    with torch.inference_mode():
        text = head.encode_texts(TextFeatures(torch.from_numpy(q[None])))
        found = store.shortlist(q[None], SHORTLIST, where)
        scores = exact_scores(head, text, store.readers, found.shard, found.row, cls)
    best = np.lexsort((found.order, -scores))[:TOP]
    return 1000 * (time.perf_counter() - t), found.order[best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--filtered-queries", type=int, default=50)
    parser.add_argument("--stores", default="faiss,qdrant_local,qdrant_edge")
    parser.add_argument(
        "--scratch", default=None, help="keep the windows, shards and stores here (kept; default: a temporary folder)"
    )
    parser.add_argument(
        "--phase",
        default="all",
        choices=("all", "build", "query"),
        help="build: write the stores into --scratch and stop (untimed work, no CPU lock needed); query: time the "
        "queries on the stores --scratch holds",
    )
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="tvr-stores-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        built = build(args, scratch)
        if args.phase == "build":
            print(json.dumps(built, indent=2))
            return
        out = {**built, **measure(args, scratch)}
        for name, figures in built["stores"].items():
            out[name] = {**figures, **out.pop(f"timed_{name}")}
        del out["stores"]
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    atomic_write_json(Path(args.out), out)
    print(json.dumps(out, indent=2))


def workload(windows: int, scratch: Path):  # noqa: ANN201
    """The synthetic windows (kept in ``scratch``) and the GARE head, ψ scaled as ``benchmarks/search.py`` does."""
    synth = bench.Synthetic(DIM)
    path = scratch / "gallery.npy"
    gallery = np.load(path, mmap_mode="r") if path.exists() else bench.build_gallery(synth, windows, scratch)
    torch.manual_seed(0)
    head = build_head(HeadConfig(name="gare"), DIM, LN_100).eval()
    delta = bench.scale_psi(head, synth, gallery, FRAMES, 0.1)
    return synth, gallery, head, delta


def build(args: argparse.Namespace, scratch: Path) -> dict:
    """The shards and every store, written into ``scratch`` once (``built.json`` records the figures)."""
    record = scratch / "built.json"
    if record.exists():
        built = json.loads(record.read_text())
        if (built["windows"], built["queries"]) != (args.windows, args.queries) or set(built["stores"]) != set(
            args.stores.split(",")
        ):
            raise SystemExit(f"{scratch} holds another build ({built['windows']} windows, {sorted(built['stores'])})")
        return built
    torch.set_num_threads(2)
    out: dict = {"windows": args.windows, "dim": DIM, "frames": FRAMES, "queries": args.queries}
    out["build_load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    synth, gallery, head, out["gare_delta"] = workload(args.windows, scratch)
    t = time.perf_counter()
    texts = head.encode_texts(TextFeatures(torch.from_numpy(queries_of(synth, args))))
    np.save(scratch / "truth.npy", exhaustive_top(head, gallery, texts, args.windows))
    out["exhaustive_seconds"] = round(time.perf_counter() - t, 1)
    work = scratch / "work"  # the index folder: its shards are every store's rerank state
    readers, seconds, size = bench.build_state(head, gallery, args.windows, FRAMES, work / "shards", True, "gare")
    out["state"] = {"build_seconds": round(seconds, 1), "bytes_per_window": int(size // args.windows)}
    print("state:", out["state"], flush=True)
    videos, settings = entries(readers), settings_of(head)
    out["stores"] = {}
    for name in args.stores.split(","):
        if name == "faiss":
            seconds = write(FolderWriter(work, "auto", 50_000, 0), videos, settings)
        else:
            address = parse_address(f"qdrant+{name.removeprefix('qdrant_')}:{scratch / name}")
            seconds = write(QdrantWriter(address, work, settings, "auto", 50_000), videos, settings)
        out["stores"][name] = {"build_seconds": round(seconds, 1)}
        print(name, out["stores"][name], flush=True)
    out["build_load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(record, out)
    return out


def measure(args: argparse.Namespace, scratch: Path) -> dict:
    """Recall and latency of every store in ``scratch`` (see the module docstring)."""
    torch.set_num_threads(2)
    out: dict = {"filtered_queries": args.filtered_queries}
    out["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    synth, _, head, _ = workload(args.windows, scratch)
    work = scratch / "work"
    stores = {}
    for name in args.stores.split(","):
        if name == "faiss":
            stores[name] = FolderStore(work)
        else:
            address = parse_address(f"qdrant+{name.removeprefix('qdrant_')}:{scratch / name}")
            stores[name] = QdrantStore(address, state=work)
        out[f"timed_{name}"] = {"shortlist": stores[name].manifest["ann"]}
    readers = stores[next(iter(stores))].readers
    queries = queries_of(synth, args)
    truth = np.load(scratch / "truth.npy")  # the build's exhaustive top 10 of these queries
    cls = bench_state_class(head)
    torch.set_num_threads(1)  # one query runs on one torch thread, as tvr search does
    order = list(stores)
    folder = min(3, len(readers) - 1)  # one shard's videos: 5 % of 100k windows
    under = WindowFilter(under=f"f{readers[folder].path.name}")
    inside = set(range(folder * SHARD, folder * SHARD + readers[folder].rows))
    for label, where, count in (("query", None, args.queries), ("query_under_5_percent", under, args.filtered_queries)):
        timed: dict[str, list[float]] = {name: [] for name in stores}
        found: dict[str, list[np.ndarray]] = {name: [] for name in stores}
        for i, q in enumerate(queries[:count]):
            for name in order[i % len(order) :] + order[: i % len(order)]:
                ms, rows = query(stores[name], head, cls, q, where)
                timed[name].append(ms)
                found[name].append(rows)
                assert where is None or set(rows.tolist()) <= inside, f"{name}: a window outside the folder"
        for name in stores:
            figures = out[f"timed_{name}"][label] = bench.percentiles(timed[name])
            if where is None:
                figures["recall_at_10"] = round(bench.recall_at(np.array(found[name]), truth), 4)
            print(name, label, figures, flush=True)
    for store in stores.values():
        store.close()
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def queries_of(synth, args: argparse.Namespace) -> np.ndarray:  # noqa: ANN001
    """The text queries: one per a seeded sample of windows, across the modality gap."""
    rng = np.random.default_rng(7)
    targets = torch.from_numpy(np.sort(rng.choice(args.windows, size=args.queries, replace=False)))
    return synth.queries(targets).numpy()


def bench_state_class(head) -> type:  # noqa: ANN001
    """The head's rerank-state dataclass."""
    one = VideoFeatures(torch.randn(1, FRAMES, DIM), torch.ones(1, FRAMES))
    return type(head.rerank_state(head.encode_videos(one)))


if __name__ == "__main__":
    main()
