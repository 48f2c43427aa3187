"""Where a Qdrant index keeps the exact rerank state (issue 48, item 2): (a) inside Qdrant, one named vector per
state field (float16 where the index stores float16, float32 for the fields kept at full precision; no HNSW graph
on them), fetched with the shortlist's points, or (b) in tvr's shards on storage every query node sees, read by
position (``preadv``) from the window's (video, window number) — what the Qdrant store does.

On ``--windows`` windows of GARE state (``benchmarks/search.py``'s synthetic 512-d windows, 12 frames, ψ scaled as
there; float16 with ``full_precision`` fields float32, as ``--state-dtype float16`` stores it):

* bytes per window: (b) the shards' ``state.npy``; (a) Qdrant Edge's folder and the local mode's SQLite file with the
  state vectors, less the same store holding the shortlist vector alone;
* bytes per window a Qdrant server would send for (a) (none for (b)): the records of a retrieve with the state
  vectors, as REST JSON and as gRPC protobuf (``qdrant-client``'s own models and conversion), and the time to decode
  100 windows' REST answer into the client's models (a lower bound on what a remote fetch costs a query node);
* fetch time of 100 random windows' state, turned into the state tensors the head scores (p50 / p95 over
  ``--queries`` draws; the three placements alternate draw by draw in one process), and that every placement's
  scores are (b)'s exactly.

    .venv/bin/python benchmarks/rerank_state_placement.py --windows 10000 --queries 200

Writes benchmarks/results/rerank_state_placement.json; scratch in a temporary folder (``--scratch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
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
from tvr.search.store import ShardReader, gather_state  # noqa: E402
from tvr.types import TextFeatures  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

RESULTS = HERE / "results" / "rerank_state_placement.json"
FRAMES, DIM, SHARD, FETCH = 12, 512, 5000, 100


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def state_fields(readers: list[ShardReader]) -> dict[str, dict]:
    """The stored fields (name → dtype, per-window shape) of the shards' state."""
    return {name: info for name, info in readers[0].fields.items() if info is not None}


def field_rows(readers: list[ShardReader], cls: type, windows: int) -> dict[str, np.ndarray]:
    """Every window's stored state, one flat row per window and field, in the dtype the shards keep it in."""
    state = gather_state(readers, np.arange(windows) // SHARD, np.arange(windows) % SHARD, cls)
    return {
        f.name: getattr(state, f.name).numpy().reshape(windows, -1)
        for f in dataclasses.fields(state)
        if getattr(state, f.name) is not None
    }


def point_id(row: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"window-{row}"))


class ClientPlacement:
    """(a) in ``qdrant-client``'s local mode: a collection whose points carry the shortlist vector and, with
    ``state``, one named vector per state field."""

    def __init__(self, folder: Path, gallery: np.ndarray, rows: dict[str, np.ndarray] | None) -> None:
        from qdrant_client import QdrantClient, models

        self.models = models
        self.client = QdrantClient(path=str(folder))
        vectors = {"window": models.VectorParams(size=DIM, distance=models.Distance.DOT)}
        for name, array in (rows or {}).items():
            vectors[name] = models.VectorParams(
                size=array.shape[1],
                distance=models.Distance.DOT,
                datatype=models.Datatype.FLOAT16 if array.dtype == np.float16 else models.Datatype.FLOAT32,
                hnsw_config=models.HnswConfigDiff(m=0),
            )
        self.client.create_collection("c", vectors_config=vectors)
        self.names = list(rows or {})
        for a in range(0, len(gallery), 256):
            batch = {"window": gallery[a : a + 256].tolist()}
            batch.update({name: array[a : a + 256].astype(np.float32).tolist() for name, array in (rows or {}).items()})
            ids = [point_id(r) for r in range(a, min(len(gallery), a + 256))]
            self.client.upsert("c", self.models.Batch(ids=ids, vectors=batch), wait=True)

    def fetch(self, rows: np.ndarray) -> list:
        return self.client.retrieve("c", [point_id(int(r)) for r in rows], with_vectors=self.names)

    def close(self) -> None:
        self.client.close()


class EdgePlacement:
    """(a) in a Qdrant Edge shard (Qdrant's engine in-process), the state vectors in their own datatypes."""

    def __init__(self, folder: Path, gallery: np.ndarray, rows: dict[str, np.ndarray] | None) -> None:
        import qdrant_edge as q

        self.q = q
        no_graph = q.HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000)
        vectors = {"window": q.EdgeVectorParams(size=DIM, distance=q.Distance.Dot)}
        for name, array in (rows or {}).items():
            datatype = q.VectorStorageDatatype.Float16 if array.dtype == np.float16 else q.VectorStorageDatatype.Float32
            vectors[name] = q.EdgeVectorParams(
                size=array.shape[1], distance=q.Distance.Dot, datatype=datatype, hnsw_config=no_graph
            )
        self.shard = q.EdgeShard.create(str(folder), q.EdgeConfig(vectors=vectors))
        self.names = list(rows or {})
        for a in range(0, len(gallery), 256):
            points = []
            for r in range(a, min(len(gallery), a + 256)):
                vector = {"window": gallery[r].tolist()}
                vector.update({name: array[r].astype(np.float32).tolist() for name, array in (rows or {}).items()})
                points.append(q.Point(point_id(r), vector, {}))
            self.shard.update(q.UpdateOperation.upsert_points(points))
        self.shard.optimize()
        self.shard.flush()

    def fetch(self, rows: np.ndarray) -> list:
        return self.shard.retrieve([point_id(int(r)) for r in rows], with_payload=False, with_vector=self.names)

    def close(self) -> None:
        self.shard.close()


def to_state(records: list, rows: np.ndarray, fields: dict[str, dict], cls: type):  # noqa: ANN201
    """The state tensors of ``rows`` from fetched records (in any order), as the head scores them."""
    by_id = {str(record.id): record.vector for record in records}
    values = {}
    for name, info in fields.items():
        shape = (len(rows), *info["shape"][1:])
        flat = np.asarray([by_id[point_id(int(r))][name] for r in rows], dtype=np.float32)
        values[name] = torch.from_numpy(flat.reshape(shape))
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**values, **{name: None for name in names - set(values)})


def wire(records: list) -> dict:
    """Bytes a server would send per window for these records (REST JSON, gRPC protobuf) and the client's REST decode
    time for them."""
    from pydantic import TypeAdapter
    from qdrant_client.conversions.conversion import RestToGrpc
    from qdrant_client.http import models

    rest = [record.model_dump_json() for record in records]
    body = "[" + ",".join(rest) + "]"
    adapter = TypeAdapter(list[models.Record])
    t = time.perf_counter()
    adapter.validate_json(body)
    decode_ms = 1000 * (time.perf_counter() - t)
    grpc = sum(RestToGrpc.convert_record(record).ByteSize() for record in records)
    return {
        "rest_json_bytes_per_window": round(len(body) / len(records)),
        "grpc_bytes_per_window": round(grpc / len(records)),
        f"rest_decode_ms_for_{len(records)}_windows": round(decode_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="tvr-placement-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        out = run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    atomic_write_json(Path(args.out), out)
    print(json.dumps(out, indent=2))


def run(args: argparse.Namespace, scratch: Path) -> dict:
    out: dict = {"windows": args.windows, "queries": args.queries, "fetched_per_query": FETCH, "dim": DIM}
    out["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    synth = bench.Synthetic(DIM)
    gallery = np.concatenate([synth.windows(a, a + bench.CHUNK).numpy() for a in range(0, args.windows, bench.CHUNK)])
    gallery = np.ascontiguousarray(gallery[: args.windows])
    torch.manual_seed(0)
    head = build_head(HeadConfig(name="gare"), DIM, LN_100).eval()
    bench.scale_psi(head, synth, gallery, FRAMES, 0.1)
    # (b): the shards, as tvr index --state-dtype float16 writes them
    readers, seconds, size = bench.build_state(head, gallery, args.windows, FRAMES, scratch / "shards", True, "gare")
    cls = bench_state_class(head)
    fields = state_fields(readers)
    out["state_fields"] = {name: [info["dtype"], info["shape"][1:]] for name, info in fields.items()}
    out["shards"] = {"bytes_per_window": int(size // args.windows), "build_seconds": round(seconds, 1)}
    rows = field_rows(readers, cls, args.windows)
    print("shards:", out["shards"], flush=True)

    placements = {}
    for name, kind in (("qdrant_local", ClientPlacement), ("qdrant_edge", EdgePlacement)):
        t = time.perf_counter()
        placements[name] = kind(scratch / name, gallery, rows)
        build = time.perf_counter() - t
        bare = kind(scratch / f"{name}-bare", gallery, None)
        with_state, without = folder_bytes(scratch / name), folder_bytes(scratch / f"{name}-bare")
        bare.close()
        shutil.rmtree(scratch / f"{name}-bare", ignore_errors=True)
        out[name] = {
            "bytes_per_window": int((with_state - without) // args.windows),
            "build_seconds": round(build, 1),
        }
        print(name, out[name], flush=True)

    rng = np.random.default_rng(11)
    draws = [np.sort(rng.choice(args.windows, size=FETCH, replace=False)) for _ in range(args.queries)]
    texts = head.encode_texts(TextFeatures(synth.queries(torch.arange(4)).float()))[:1]
    timed: dict[str, list[float]] = {"shards": [], **{name: [] for name in placements}}
    order = ["shards", *placements]
    for i, draw in enumerate(draws):
        for name in order[i % len(order) :] + order[: i % len(order)]:  # who goes first turns round
            t = time.perf_counter()
            if name == "shards":
                state = gather_state(readers, draw // SHARD, draw % SHARD, cls, torch.float32)
            else:
                state = to_state(placements[name].fetch(draw), draw, fields, cls)
            timed[name].append(1000 * (time.perf_counter() - t))
            if i == 0:
                with torch.inference_mode():
                    scores = head.score_rerank(texts, state)[0].numpy()
                if name == "shards":
                    reference = scores
                else:
                    out[name]["scores_equal_the_shards"] = bool(np.array_equal(scores, reference))
    for name, ms in timed.items():
        out.setdefault(name, {})[f"fetch_{FETCH}_windows_ms"] = bench.percentiles(ms)
    out["qdrant_server_would_send"] = wire(placements["qdrant_local"].fetch(draws[0]))
    for placement in placements.values():
        placement.close()
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    out["state_float_values_per_window"] = int(sum(math.prod(info["shape"][1:]) for info in fields.values()))
    return out


def bench_state_class(head) -> type:  # noqa: ANN001
    """The head's rerank-state dataclass."""
    from tvr.types import VideoFeatures

    one = VideoFeatures(torch.randn(1, FRAMES, DIM), torch.ones(1, FRAMES))
    return type(head.rerank_state(head.encode_videos(one)))


if __name__ == "__main__":
    main()
