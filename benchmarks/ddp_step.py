"""Training steps per second of GARE, TV-ProxyNet and GraviAlign on cached features: one process against two gloo
processes at the same global batch, one torch thread per process (issue 26: two processes ≥ 1.7× one).

The step is what ``tvr train`` runs on a feature cache: the temporal module and the head of the preset
(``gare/msrvtt``, ``proxy/msrvtt``, ``gravialign/msrvtt`` and its contrastive ablation: D = 512, seqTransf 4 layers
with random weights, F = 12 frame slots for GARE, one pooled slot and M = 4 proxies for the CLIP-ViP presets;
dropout on, as in training), the feature all-gather, the head's loss, the backward
with DDP's gradient all-reduce, and an AdamW step. Three set-ups per head, each in fresh processes:

* ``1 process``: the global batch (default 128, the papers') in one process;
* ``2 processes, per-rank loss``: 64 items per rank; each rank computes the per-pair work (ψ, the proxy generator)
  for its own texts against all gathered videos and the logits are all-gathered (tvr's training path);
* ``2 processes, replicated``: the same, but each rank computes the whole loss on the gathered batch (what tvr did
  before the per-rank loss; the speed-up it leaves is the non-pairwise part's).

A step's time is the slowest rank's (every rank starts a step at a barrier); the set-ups alternate over
``--rounds`` and the minimum over all timed steps is kept, after a warm-up step. Beside the wall time, the busiest
rank's CPU time per step (its threads' user + system time): on a shared, loaded machine the scheduler gives a
2-process job twice the CPU share of a 1-process one, so wall-time ratios there say little, while the CPU time of
the busiest rank is its own work (it bounds the speed-up on a machine with a free core per process; the
communication's waiting is not in it). The gradient of all three set-ups is the same
(tests/test_distributed_heads.py).

    .venv/bin/python benchmarks/ddp_step.py             # writes benchmarks/results/ddp_step.json
    .venv/bin/python benchmarks/ddp_step.py --quick     # smoke run (D = 64, batch 16, one timed step)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "ddp_step.json"
PRESETS = {
    "gare": "gare/msrvtt",
    "proxy": "proxy/msrvtt",
    "gravialign": "gravialign/msrvtt",
    "gravialign-contrastive": "gravialign/ablations/contrastive",
}
FRAMES, PROXIES = 12, 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build(head: str, dim: int, seed: int = 0):  # noqa: ANN201 - torch imported in the worker
    import torch

    from tvr.config import load_config
    from tvr.models.heads.base import LN_100
    from tvr.models.heads.registry import build_head
    from tvr.models.model import RetrievalModel
    from tvr.models.temporal import build_temporal
    from tvr.pipeline import resolve_config

    cfg = resolve_config(load_config(PRESETS[head]))
    torch.manual_seed(seed)
    temporal = build_temporal(cfg.model.temporal, None, dim, cfg.model.temporal_layers)
    model = RetrievalModel(None, temporal, build_head(cfg.head, dim, LN_100))
    return model.train(), cfg


def global_batch(head: str, n: int, dim: int, seed: int = 0) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, dim, generator=g)
    batch = {"text_eot": base + 0.5 * torch.randn(n, dim, generator=g)}
    if head == "gare":
        batch["frame_feats"] = base[:, None] + torch.randn(n, FRAMES, dim, generator=g)
        batch["video_mask"] = torch.ones(n, FRAMES, dtype=torch.long)
    else:  # CLIP-ViP (TV-ProxyNet, GraviAlign): one pooled slot and M proxies
        batch["frame_feats"] = base[:, None] + 0.5 * torch.randn(n, 1, dim, generator=g)
        batch["video_mask"] = torch.ones(n, 1, dtype=torch.long)
        batch["video_proxies"] = base[:, None] + torch.randn(n, PROXIES, dim, generator=g)
    return batch


def worker(
    rank: int,
    world: int,
    port: int,
    head: str,
    batch_size: int,
    dim: int,
    warmup: int,
    steps: int,
    replicated: bool,
    out: str,
) -> None:
    import torch

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    import tvr.models.model as model_module
    from tvr.train.distributed import wrap_model
    from tvr.utils.distributed import all_reduce_max, barrier
    from tvr.utils.process_group import init_distributed

    if replicated:  # every rank computes the whole loss on the gathered batch (tvr before the per-rank loss)
        model_module._takes_shard = lambda head_type: False
    info = init_distributed("cpu")
    model, cfg = build(head, dim)
    train_model = wrap_model(model, info)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    local = batch_size // world
    batch = {k: v[rank * local : (rank + 1) * local] for k, v in global_batch(head, batch_size, dim).items()}
    times, cpu_times = [], []
    for _ in range(warmup + steps):
        barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = train_model(batch)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = torch.tensor([time.perf_counter() - start, time.process_time() - cpu_start], dtype=torch.float64)
        slowest = all_reduce_max(elapsed)
        times.append(float(slowest[0]))
        cpu_times.append(float(slowest[1]))
    if rank == 0:
        record = {"step_seconds": times[warmup:], "cpu_seconds": cpu_times[warmup:], "loss": float(loss.detach())}
        Path(out).write_text(json.dumps(record))
    del train_model
    if world > 1:
        import gc

        gc.collect()
        torch.distributed.destroy_process_group()


def run(head: str, world: int, replicated: bool, args: argparse.Namespace) -> dict:
    """One set-up in fresh processes: rank 0's record of the slowest rank's wall and CPU seconds per step."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        worker_args = (world, _free_port(), head, args.batch, args.dim, args.warmup, args.steps, replicated, out)
        mp.start_processes(worker, args=worker_args, nprocs=world, join=True, start_method="spawn")
        return json.loads(Path(out).read_text())


def summarize(world: int, replicated: bool, records: list[dict]) -> dict:
    steps = [t for r in records for t in r["step_seconds"]]
    cpu = [t for r in records for t in r["cpu_seconds"]]
    best = min(steps)
    return {
        "world_size": world,
        "replicated": replicated,
        "step_seconds_min": round(best, 4),
        "step_seconds_all": [round(t, 4) for t in steps],
        "steps_per_second": round(1 / best, 3),
        "cpu_seconds_min": round(min(cpu), 4),
        "cpu_seconds_all": [round(t, 4) for t in cpu],
    }


SETUPS = [(1, False), (2, False), (2, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", default="gare,proxy")
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three set-ups")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.dim, args.warmup, args.steps, args.rounds = 16, 64, 1, 1, 1
        if args.out == DEFAULT_OUT:
            args.out = DEFAULT_OUT.with_name("ddp_step_quick.json")
    load_before = os.getloadavg()
    results = {}
    for head in args.heads.split(","):
        records: dict[tuple[int, bool], list[dict]] = {setup: [] for setup in SETUPS}
        for _ in range(args.rounds):  # the set-ups alternate, so a change in the machine's load hits them all
            for world, replicated in SETUPS:
                records[(world, replicated)].append(run(head, world, replicated, args))
        rows = [summarize(world, replicated, records[(world, replicated)]) for world, replicated in SETUPS]
        one, one_cpu = rows[0]["step_seconds_min"], rows[0]["cpu_seconds_min"]
        for row in rows:
            row["speedup_vs_1_process"] = round(one / row["step_seconds_min"], 3)
            # the busiest rank's own work: the speed-up a machine with a free core per process allows
            row["cpu_speedup_vs_1_process"] = round(one_cpu / row["cpu_seconds_min"], 3)
        results[head] = {"preset": PRESETS[head], "rows": rows}
        for row in rows:
            mode = (
                "1 process"
                if row["world_size"] == 1
                else "2 processes, " + ("replicated" if row["replicated"] else "per-rank loss")
            )
            print(
                f"{head:6s} {mode:28s} {row['step_seconds_min']:8.3f} s/step ×{row['speedup_vs_1_process']:.2f}"
                f"   busiest rank's CPU {row['cpu_seconds_min']:8.3f} s/step ×{row['cpu_speedup_vs_1_process']:.2f}",
                flush=True,
            )
    record = {
        "benchmark": "ddp_step",
        "command": " ".join(["benchmarks/ddp_step.py", *sys.argv[1:]]),
        "global_batch": args.batch,
        "dim": args.dim,
        "warmup": args.warmup,
        "steps": args.steps,
        "rounds": args.rounds,
        "threads_per_process": 1,
        "backend": "gloo",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "results": results,
    }
    from tvr.utils.io import atomic_write_json

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
