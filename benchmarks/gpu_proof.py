"""The GPU path, proven in one command, on one GPU or several. Nothing is downloaded.

    .venv/bin/python benchmarks/gpu_proof.py                  # → benchmarks/results/gpu_proof.json
    .venv/bin/python benchmarks/gpu_proof.py --parts steps --presets gare/msrvtt,proxy/msrvtt_b16
    .venv/bin/python benchmarks/gpu_proof.py --cpu-smoke      # the script itself, on the CPU at toy sizes

The JSON is written whatever part fails: each failure is recorded where its figures would be (and listed under
``failures``), the file is rewritten after every part, and the exit code is 1 when anything failed.

Parts (``--parts``, default all):

* ``environment`` (always): torch, ``torch.version.cuda``, cuDNN and NCCL versions, the device count and every
  device's name, memory and compute capability.
* ``steps`` — one GPU: a full-size AMP training step of every shipped preset (the CPU recipe and ablations
  excepted), through the trainer's own step (autocast, the fp16 grad scaler, clipping, AdamW): the preset's model and
  head with CLIP ViT-B/32 or B/16 dimensions and random weights (the preset's ``model.clip`` decides the patch size;
  no CLIP-ViP checkpoint is loaded), the two-tower presets on their installed weights, a synthetic raw batch of
  ``--batch`` items (default 16 = the papers' global 128 on 8 GPUs) at the preset's frames, words and resolution.
  Per ``--amp-dtypes`` (default bf16 and fp16 + scaler): one warm-up step, fp16 steps until the scaler has found its
  scale (each a skipped step), then the measured step: every loss finite, the skipped steps, the measured step's time
  and peak allocated memory. ``--checkpointing`` adds the same step with ``model.gradient_checkpointing``.
* ``distributed`` — every GPU under ``torchrun`` (NCCL, one process per GPU), each rank ``--batch`` items of one
  global batch, so the heads' per-rank loss runs (each rank's pairwise work for its own texts, :mod:`tvr.train.
  distributed`): the same AMP steps, each rank's peak memory (its own pairs, not one process's) and time, and the
  loss and gradient norm against one GPU training the same global batch from the same weights (dropout off in both,
  the reference with gradient checkpointing for memory). First the float32 equivalence check of
  ``tests/test_distributed_heads.py`` over NCCL (every head and variant: loss and gradients of one process). With
  one device this part is recorded as not run (it needs two).
* ``learning`` — one GPU: does training learn? For one preset per head (``--learning-presets``), the model at the
  preset's dimensions with random weights trains ``--learning-steps`` (≥ 20) trainer steps (AMP in the first of
  ``--amp-dtypes``) on one fixed synthetic batch of ``--learning-batch`` items at a constant learning rate
  ``--learning-lr`` (1e-4, no warm-up, every parameter at it: random weights have nothing to protect, and the CLIP-ViP
  presets' 1e-6 moves a random model too little in 20 steps): every loss, and ``learned`` — the mean of the last
  five losses below 0.9 × the mean of the first five.
* ``agreement`` — every test-time scorer (the ``scoring`` list: CLIP4Clip both poolings, GARE, TV-ProxyNet,
  GraviAlign's cos_f, s_align and mixed) on the same weights and the same ``--agreement-size`` × ``--agreement-size``
  inputs, on the GPU against the CPU in float32. Evaluation scores in float32 (no autocast), so the dtypes compared
  are the two a GPU may run that in: float32 with TF32 off, and float32 with TF32 matrix products on (10-bit
  mantissa inputs). Per dtype the largest |GPU − CPU| relative to the largest |CPU| score, and whether it is within
  the stated tolerance (:data:`SCORE_TOLERANCE`).
* ``steps`` rows also give ``clips_per_second``: the batch over the measured step's time (at ``--batch 128`` the
  papers' global batch on one GPU).
* ``scoring`` — every exact test-time scorer (CLIP4Clip mean and text-conditioned pooling, GARE, TV-ProxyNet,
  GraviAlign's cos_f, s_align and mixed) through the head's ``score`` on ``--texts`` × ``--videos`` at D = 512, in
  float32 (TF32 off), timed with the L2 cache flushed before each call, against a roofline that is a true lower
  bound: the scorer's minimal arithmetic (:func:`minimal_cost`: only work no exact method can skip, each operation
  counted as one FLOP, a multiply-add as two) over the device's peak FP32 rate, or its compulsory input bytes over
  the peak memory bandwidth, whichever is longer. Peaks come from the datasheet table :data:`PEAKS` by device name
  (the largest of the variants a name may stand for); a device not in it gets no roofline. efficiency = roofline /
  measured ≤ 1; ``bound_holds`` records that it is.

``--cpu-smoke`` runs every part on the CPU at toy sizes: the one-device path (``--devices 1``: no distributed part)
or the several-device path (``--devices 2``, the default: two gloo processes under torchrun), writing
``benchmarks/results/gpu_proof_cpu_smoke.json``. Its CPU roofline takes 6 GHz and the widest vector unit the CPU
reports (AVX-512: 64 FP32 FLOPs per cycle and core), no memory term: a loose but true bound.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "tests"):  # tests/test_distributed_heads.py holds the equivalence check
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_proof.json"
SMOKE_OUT = REPO / "benchmarks" / "results" / "gpu_proof_cpu_smoke.json"
EOT = 49407
VIT = {  # OpenAI CLIP ViT-B: text 512 wide × 12 layers × 8 heads, vision 768 × 12 × 12, projection 512
    "embed_dim": 512, "text_width": 512, "text_layers": 12, "text_heads": 8, "vision_width": 768,
    "vision_layers": 12, "vision_heads": 12, "image_size": 224, "context_length": 77, "vocab_size": 49408,
}  # fmt: skip
SMOKE_VIT = {
    "embed_dim": 32, "text_width": 32, "text_layers": 4, "text_heads": 2, "vision_width": 32, "vision_layers": 1,
    "vision_heads": 2, "image_size": 32, "context_length": 77, "vocab_size": 49408,
}  # fmt: skip
SMOKE_PRESETS = "clip4clip/msrvtt,gare/msrvtt,proxy/msrvtt_b16,gravialign/msrvtt"
#: fp16 warm-up: steps the scaler may skip (halving its scale from 2^16) before the measured step
MAX_SCALER_STEPS = 24
#: relative difference of loss / gradient norm between the ranks and one GPU that rounding in each AMP dtype
#: explains (bf16 keeps 8 significant bits, fp16 11; the global batch is reduced in another order)
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}
#: GPU against CPU scores on the same weights and inputs, relative to the largest |score|: float32 (TF32 off) differs
#: only in summation order; TF32 rounds the matrix products' inputs to 11 significant bits (relative 5e-4 each,
#: accumulated over D = 512 and GARE's several products)
SCORE_TOLERANCE = {"float32": 1e-5, "tf32": 1e-2}
#: one preset per head: the learning part, and the throughput steps of the prepared issue-49 run
HEAD_PRESETS = "clip4clip/msrvtt,gare/msrvtt,proxy/msrvtt,gravialign/msrvtt"
LEARNING_WINDOW = 5

#: datasheet peaks (dense FP32 without tensor cores, TFLOP/s; memory bandwidth, TB/s) by device-name pattern, checked
#: in order; where one name may stand for several variants the largest figures are taken, so the bound stays a bound
PEAKS = [
    ("H200", 67.0, 4.8, "NVIDIA H200 SXM / NVL datasheet: 67 / 60 TFLOP/s FP32, 4.8 TB/s HBM3e"),
    ("GH200", 67.0, 4.9, "NVIDIA GH200 datasheet: 67 TFLOP/s FP32, up to 4.9 TB/s HBM3e"),
    ("H100 NVL", 60.0, 3.9, "NVIDIA H100 NVL datasheet: 60 TFLOP/s FP32, 3.9 TB/s"),
    ("H100 PCIe", 51.0, 2.0, "NVIDIA H100 PCIe datasheet: 51 TFLOP/s FP32, 2.0 TB/s"),
    ("H100", 67.0, 3.9, "NVIDIA H100 SXM5 datasheet: 67 TFLOP/s FP32, 3.35 TB/s (3.9: the NVL's, any H100)"),
    ("A100", 19.5, 2.039, "NVIDIA A100 datasheet: 19.5 TFLOP/s FP32, up to 2.039 TB/s (80 GB SXM4)"),
    ("L40S", 91.6, 0.864, "NVIDIA L40S datasheet: 91.6 TFLOP/s FP32, 864 GB/s"),
    ("L40", 90.5, 0.864, "NVIDIA L40 datasheet: 90.5 TFLOP/s FP32, 864 GB/s"),
    ("L4", 30.3, 0.3, "NVIDIA L4 datasheet: 30.3 TFLOP/s FP32, 300 GB/s"),
    ("A10", 31.2, 0.6, "NVIDIA A10 datasheet: 31.2 TFLOP/s FP32, 600 GB/s"),
    ("V100", 15.7, 0.9, "NVIDIA V100 SXM2 datasheet: 15.7 TFLOP/s FP32, 900 GB/s"),
    ("T4", 8.1, 0.32, "NVIDIA T4 datasheet: 8.1 TFLOP/s FP32, 320 GB/s"),
    ("RTX 4090", 82.6, 1.008, "GeForce RTX 4090 specifications: 82.6 TFLOP/s FP32, 1008 GB/s"),
]
#: the CPU smoke's clock: above any x86 core's sustained clock, so the CPU roofline stays a lower bound
CPU_BOUND_HZ = 6.0e9

SMOKE = {"on": False}


def _device():  # noqa: ANN202
    import torch

    return torch.device("cpu") if SMOKE["on"] else torch.device("cuda", 0)


def _sync() -> None:
    import torch

    if not SMOKE["on"]:
        torch.cuda.synchronize()


def _reset_peak() -> None:
    import torch

    if not SMOKE["on"]:
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    import torch

    return None if SMOKE["on"] else round(torch.cuda.max_memory_allocated() / 2**30, 3)


def _failure(exc: BaseException) -> dict:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return {"error": f"out of memory: {str(exc).splitlines()[0]}"}
    return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}


def presets() -> list[str]:
    """Every shipped run preset but the CPU recipe and the ablations."""
    from tvr.config import available_presets

    return [name for name in available_presets() if not name.startswith("cpu/") and "/ablations/" not in name]


# --------------------------------------------------------------------------------------------- environment


def environment(devices: int) -> dict:
    import torch

    record: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_smoke": SMOKE["on"],
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "devices_used": devices,
        "devices": [],
    }
    if torch.cuda.is_available():
        record["nccl"] = (
            ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else None
        )
        for k in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(k)
            record["devices"].append(
                {
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                    "multiprocessors": props.multi_processor_count,
                }
            )
    return record


# --------------------------------------------------------------------------------------------- training steps


def full_size_config(preset: str, batch: int, amp_dtype: str, checkpointing: bool, extra: tuple[str, ...] = ()):  # noqa: ANN201
    from tvr.config import load_config
    from tvr.pipeline import resolve_config

    base = load_config(preset)
    overrides = [
        f"train.batch_size={batch}",
        f"train.device={_device().type}",
        "train.amp=true",
        f"train.amp_dtype={amp_dtype}",
        f"model.gradient_checkpointing={str(checkpointing).lower()}",
    ]
    if base.model.backbone != "two_tower":
        patch = 16 if "16" in str(base.model.clip) else 32
        overrides += ["model.clip=tiny", "model.clipvip.checkpoint="]
        if SMOKE["on"]:
            patch //= 4
            overrides += ["data.image_size=32", "data.max_frames=2", "data.max_words=8"]
        overrides += [f"model.tiny.{k}={v}" for k, v in (SMOKE_VIT if SMOKE["on"] else VIT).items()]
        overrides.append(f"model.tiny.patch_size={patch}")
    return resolve_config(load_config(preset, [*overrides, *extra])), base


class _OneBatch:
    """TrainData of one synthetic batch (the trainer's step is all these parts run)."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def len_epoch(self) -> int:
        return 1

    def batches(self, epoch: int, start_batch: int = 0):  # noqa: ANN201
        yield self.batch


def synthetic_batch(cfg, n: int, work: Path) -> dict:  # noqa: ANN001
    """``n`` raw items (token ids, frames) from a fixed seed: every rank builds the same global batch."""
    import torch

    from tvr.data.tokenizer import build_tokenizer
    from tvr.models.run_spec import resolve_run

    g = torch.Generator().manual_seed(0)
    words = cfg.data.max_words
    if cfg.model.backbone == "two_tower":
        tokenizer = build_tokenizer(resolve_run(cfg).tokenizer, work)
        ids, mask = tokenizer([f"a person does thing number {k} in a room" for k in range(n)], words)
    else:  # CLIP ids: start, words, end-of-text (the largest id) at a random length
        ids = torch.randint(1, EOT - 1, (n, words), generator=g)
        lengths = torch.randint(4, words + 1, (n,), generator=g)
        mask = (torch.arange(words)[None] < lengths[:, None]).long()
        ids = ids * mask
        ids[torch.arange(n), lengths - 1] = EOT
    size, frames = cfg.data.image_size, cfg.data.max_frames
    return {
        "text_ids": ids,
        "text_mask": mask,
        "video": torch.randn(n, frames, 3, size, size, generator=g),
        "video_mask": torch.ones(n, frames, dtype=torch.long),
    }


def train_steps(cfg, batch: dict, dist_info, no_dropout: bool = False) -> dict:  # noqa: ANN001
    """The trainer's own step on ``batch`` from seeded weights: a warm-up step (cuDNN/cuBLAS autotuning, allocator
    growth), fp16 steps until the scaler stops skipping, then the measured step (its time and peak memory)."""
    import torch
    from torch import nn

    from tvr.models.build import build_model
    from tvr.models.run_spec import resolve_run
    from tvr.train.trainer import Trainer

    torch.manual_seed(0)
    model = build_model(resolve_run(cfg))
    if no_dropout:
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0  # a pair's dropout draw on a rank is not one process's draw
    steps: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, cfg, _OneBatch(batch), Path(tmp) / "run", dist_info=dist_info)

        def step() -> None:
            scale = trainer.scaler.get_scale() if trainer.scaler is not None else None
            _sync()
            _reset_peak()
            start = time.perf_counter()
            losses, grad_norm = trainer._train_step(batch)
            _sync()
            seconds = time.perf_counter() - start
            after = trainer.scaler.get_scale() if trainer.scaler is not None else None
            steps.append(
                {
                    "loss": float(losses["loss"]),
                    "grad_norm": None if grad_norm is None else float(grad_norm),
                    "skipped": scale is not None and after < scale,
                    "grad_scale": after,
                    "seconds": round(seconds, 4),
                }
            )

        step()
        while trainer.scaler is not None and steps[-1]["skipped"] and len(steps) <= MAX_SCALER_STEPS:
            step()
        step()
        peak = _peak_gib()
        amp = str(trainer.amp_dtype).replace("torch.", "")
    return {
        "autocast_dtype": amp,
        "grad_scaler": trainer.scaler is not None,
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "loss_finite": all(math.isfinite(s["loss"]) for s in steps),
        "skipped_steps": sum(s["skipped"] for s in steps),
        "step_seconds": steps[-1]["seconds"],
        "clips_per_second": round(len(batch["video"]) / steps[-1]["seconds"], 2),
        "peak_allocated_gib": peak,
        "steps": steps,
    }


def _step_settings(args: argparse.Namespace) -> list[tuple[str, str, bool]]:
    chosen = args.presets.split(",") if args.presets else presets()
    dtypes = args.amp_dtypes.split(",")
    settings = [(preset, dtype, False) for preset in chosen for dtype in dtypes]
    if args.checkpointing:
        settings += [(preset, dtypes[0], True) for preset in chosen]
    return settings


def measured_rows(rows: list[dict], measure, hidden: str) -> list[dict]:  # noqa: ANN001
    """Each row updated with ``measure(row)``, or with the failure it raised (the other rows still run); the device's
    cache emptied between rows; every row printed as it ends (without its ``hidden`` list and traceback)."""
    import torch

    for row in rows:
        try:
            row.update(measure(row))
        except Exception as exc:  # noqa: BLE001 - recorded; the other rows still run
            row.update(_failure(exc))
        if not SMOKE["on"]:
            torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in row.items() if k not in (hidden, "traceback")}), flush=True)
    return rows


def _batch_for(cfg, n: int) -> dict:  # noqa: ANN001
    with tempfile.TemporaryDirectory() as tmp:
        return synthetic_batch(cfg, n, Path(tmp))


def part_steps(args: argparse.Namespace) -> dict:
    from tvr.utils.process_group import DistInfo

    def measure(row: dict) -> dict:
        cfg, base = full_size_config(row["preset"], args.batch, row["amp_dtype"], row["gradient_checkpointing"])
        row.update(clip=str(base.model.clip), backbone=cfg.model.backbone, head=cfg.head.name)
        row.update(batch=args.batch, frames=cfg.data.max_frames, image_size=cfg.data.image_size)
        return train_steps(cfg, _batch_for(cfg, args.batch), DistInfo(0, 1, 0, _device()))

    rows = [{"preset": preset, "amp_dtype": amp_dtype, "gradient_checkpointing": checkpointing}
            for preset, amp_dtype, checkpointing in _step_settings(args)]  # fmt: skip
    return {"rows": measured_rows(rows, measure, "steps")}


# --------------------------------------------------------------------------------------------- distributed


def _equivalence_references(batch: dict, device) -> list:  # noqa: ANN001
    """One process's loss and gradients of every head variant of tests/test_distributed_heads.py on ``batch``
    (float32), computed before this process joins the group (a model under a process group gathers)."""
    from test_distributed_heads import VARIANTS, build_model

    references = []
    for name, options in VARIANTS:
        model = build_model(name, options).to(device)
        out = model(batch)
        out["loss"].backward()
        references.append((name, options, model, out["loss"].detach()))
    return references


def _equivalence(info, batch: dict, references: list) -> dict:  # noqa: ANN001
    """tests/test_distributed_heads.py's check over this process group: each rank's unequal share of ``batch``
    through DDP and the per-rank loss gives one process's loss and gradients."""
    from test_distributed_heads import _assert_close, _rows, build_model

    from tvr.train.distributed import wrap_model
    from tvr.utils.distributed import RowShard

    sizes = RowShard.split(len(batch["text_eot"]), info.rank, info.world_size).sizes
    rows = slice(sum(sizes[: info.rank]), sum(sizes[: info.rank + 1]))
    checked, failures = [], []
    for name, options, ref, ref_loss in references:
        try:
            model = build_model(name, options).to(info.device)
            ddp = wrap_model(model, info)
            out = ddp(_rows(batch, rows))
            out["loss"].backward()
            _assert_close(f"{name} {options}: loss", out["loss"].detach(), ref_loss)
            for (key, p), ref_p in zip(model.named_parameters(), ref.parameters(), strict=True):
                if p.requires_grad:
                    _assert_close(f"{name} {options}: grad {key}", p.grad, ref_p.grad)
            checked.append(f"{name} {options}")
            del ddp
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{name} {options}: {exc}")
    return {"checked": checked, "failures": failures, "rows_per_rank": list(sizes)}


def distributed_worker(args: argparse.Namespace) -> None:
    """One torchrun rank of the ``distributed`` part; rank 0 writes ``args.worker_out`` after every row."""
    import torch
    from test_distributed_heads import global_batch

    from tvr.utils.distributed import all_gather_object
    from tvr.utils.io import atomic_write_json
    from tvr.utils.process_group import init_distributed

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cpu") if SMOKE["on"] else torch.device("cuda", local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # unequal shares, at least 2 items per rank
    batch = {k: v.to(device) for k, v in global_batch(max(7, 2 * world + 1)).items()}
    references = _equivalence_references(batch, device)
    info = init_distributed(device.type)
    record: dict[str, Any] = {
        "world_size": info.world_size,
        "backend": torch.distributed.get_backend(),
        "batch_per_rank": args.batch,
        "global_batch": args.batch * info.world_size,
    }

    def save() -> None:
        if info.is_main:
            atomic_write_json(args.worker_out, record)

    parts = all_gather_object(_equivalence(info, batch, references))
    del references
    record["equivalence_float32"] = {
        "checked": len(parts[0]["checked"]),
        "failures": [f for part in parts for f in part["failures"]],
        "rows_per_rank": parts[0]["rows_per_rank"],
    }
    save()
    record["rows"] = []
    for preset, amp_dtype, checkpointing in _step_settings(args):
        row: dict[str, Any] = {"preset": preset, "amp_dtype": amp_dtype, "gradient_checkpointing": checkpointing}
        result: dict[str, Any]
        try:
            cfg, _ = full_size_config(preset, args.batch * info.world_size, amp_dtype, checkpointing)
            with tempfile.TemporaryDirectory() as tmp:
                batch = synthetic_batch(cfg, args.batch * info.world_size, Path(tmp))
            mine = {k: v[info.rank * args.batch : (info.rank + 1) * args.batch] for k, v in batch.items()}
            result = train_steps(cfg, mine, info, no_dropout=True)
        except Exception as exc:  # noqa: BLE001 - recorded; every rank goes on to the next row together
            result = _failure(exc)
        gathered = all_gather_object(
            {k: result.get(k) for k in ("peak_allocated_gib", "step_seconds", "error", "skipped_steps")}
        )
        row.update(result)
        row["per_rank_peak_allocated_gib"] = [g["peak_allocated_gib"] for g in gathered]
        row["per_rank_step_seconds"] = [g["step_seconds"] for g in gathered]
        errors = [f"rank {r}: {g['error']}" for r, g in enumerate(gathered) if g["error"]]
        if errors:
            row["error"] = "; ".join(errors)
        record["rows"].append(row)
        save()
        if not SMOKE["on"]:
            torch.cuda.empty_cache()


def _worker_command(args: argparse.Namespace, world: int, out: Path) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world)]
    command += [str(Path(__file__).resolve()), "--worker-out", str(out), "--batch", str(args.batch)]
    command += ["--amp-dtypes", args.amp_dtypes, "--presets", args.presets or ",".join(presets())]
    if args.checkpointing:
        command.append("--checkpointing")
    if SMOKE["on"]:
        command.append("--cpu-smoke")
    return command


def _relative(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return abs(a - b) / max(abs(b), 1e-12)


def compare_with_one_device(row: dict, reference: dict) -> dict:
    """Step 1's loss, and the gradient norm of each run's first step its fp16 scaler did not skip: both from the
    same weights and batch (a skipped step leaves the weights as they were)."""
    ours, ref = row.get("steps") or [], reference.get("steps") or []
    loss = _relative(ours[0]["loss"], ref[0]["loss"]) if ours and ref else None
    first = [next((s["grad_norm"] for s in steps if not s["skipped"]), None) for steps in (ours, ref)]
    norm = _relative(*first)
    tolerance = TOLERANCE.get(str(row.get("autocast_dtype")), TOLERANCE["float32"])
    return {
        "loss_step1": [ours[0]["loss"] if ours else None, ref[0]["loss"] if ref else None],
        "loss_relative_difference": loss,
        "grad_norm_first_unskipped": first,
        "grad_norm_relative_difference": norm,
        "skipped_steps": [sum(s["skipped"] for s in steps) for steps in (ours, ref)],
        "tolerance": tolerance,
        "within_tolerance": loss is not None and norm is not None and max(loss, norm) <= tolerance,
    }


def part_distributed(args: argparse.Namespace) -> dict:
    import torch

    from tvr.utils.process_group import DistInfo

    world = args.devices
    if world < 2:
        have = "the CPU smoke's one device" if SMOKE["on"] else f"{world} GPU"
        return {"not_run": f"needs two or more devices; this run uses {have} (--devices)"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "worker.json"
        env = {**os.environ, "TVR_DIST_TIMEOUT_MIN": str(args.collective_timeout_min)}
        if SMOKE["on"]:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        else:
            env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(k) for k in range(world)))
        started = time.perf_counter()
        try:
            run = subprocess.run(
                _worker_command(args, world, out),
                capture_output=True,
                text=True,
                env=env,
                cwd=REPO,
                timeout=args.distributed_timeout,
            )
            code, tail = run.returncode, (run.stdout + run.stderr)[-3000:]
        except subprocess.TimeoutExpired as exc:
            code, tail = None, f"torchrun did not finish within {args.distributed_timeout} s: {str(exc)[-500:]}"
        record = json.loads(out.read_text()) if out.is_file() else {}
    record["torchrun_seconds"] = round(time.perf_counter() - started, 1)
    if code != 0:
        record["error"] = f"torchrun exit code {code}" if code is not None else "torchrun timed out"
        record["log_tail"] = tail
    for row in record.get("rows", []):
        if row.get("error"):
            continue
        try:  # one device, the same global batch, the same starting weights
            cfg, _ = full_size_config(row["preset"], args.batch * world, row["amp_dtype"], True)
            with tempfile.TemporaryDirectory() as tmp:
                batch = synthetic_batch(cfg, args.batch * world, Path(tmp))
            reference = train_steps(cfg, batch, DistInfo(0, 1, 0, _device()), no_dropout=True)
            row["one_device"] = {
                "gradient_checkpointing": True,
                "peak_allocated_gib": reference["peak_allocated_gib"],
                "step_seconds": reference["step_seconds"],
                "steps": reference["steps"],
            }
            row["comparison"] = compare_with_one_device(row, reference)
        except Exception as exc:  # noqa: BLE001
            row["one_device"] = _failure(exc)
        if not SMOKE["on"]:
            torch.cuda.empty_cache()
        shown = {k: row.get(k) for k in ("preset", "amp_dtype", "per_rank_peak_allocated_gib", "comparison")}
        print(json.dumps(shown), flush=True)
    return record


# --------------------------------------------------------------------------------------------- scoring


#: (head, options, inference setting) of every exact scorer timed; frames and proxies as on MSR-VTT (12, 4)
SCORERS: list[tuple[str, dict, dict | None]] = [
    ("clip4clip", {"video_pool": "mean"}, None),
    ("clip4clip", {"video_pool": "text_softmax"}, None),
    ("gare", {}, None),
    ("proxy", {}, {"gamma": 1.0}),
    ("gravialign", {"inference_mode": "cos_f", "select_modes": ""}, None),
    ("gravialign", {"inference_mode": "s_align", "select_modes": ""}, None),
    ("gravialign", {"inference_mode": "mixed", "select_modes": ""}, None),
]
FRAMES, PROXIES = 12, 4


def minimal_cost(name: str, options: Any, n_t: int, n_v: int, dim: int, frames: int, proxies: int) -> dict:
    """FLOPs and input bytes that any exact computation of the scorer's all-pairs matrix needs (float32), with the
    formula. Only per-pair work counts (per-text and per-video preparation is left out, which only lowers the bound),
    each operation is one FLOP and a multiply-add two (the way peak rates count them)."""
    pairs, f32 = n_t * n_v, 4
    if name == "clip4clip" and options.video_pool == "mean":
        flops, text_b, video_b = 2 * dim * pairs, n_t * dim, n_v * dim
        formula = "2·D per pair (one dot product of the pooled embeddings)"
    elif name == "clip4clip":
        flops = 2 * frames * (dim + frames) * pairs
        text_b, video_b = n_t * dim, n_v * (frames * dim + frames * frames + frames)
        formula = "2·F·(D + F) per pair: the F text-frame logits and the pooled norm wᵀGw"
    elif name == "gare":
        flops, text_b, video_b = 6 * frames * dim * pairs, n_t * dim, n_v * (frames * dim + frames)
        formula = "6·F·D per pair: three text × (video·frame) products of inner size D (the factorised scorer)"
    elif name == "proxy":
        flops = 4 * dim * options.ffn_dim * options.layers * pairs
        text_b, video_b = n_t * dim, n_v * (dim + proxies * dim)
        formula = "4·D·ffn_dim per pair and round: each round's FFN, whose input depends on the pair"
    elif name == "gravialign" and options.inference_mode in ("cos_f", "cos_mu"):
        flops, text_b, video_b = 2 * dim * pairs, n_t * dim, n_v * dim
        formula = "2·D per pair (one dot product)"
    elif name == "gravialign":
        # S_align per (pair, dimension): σ_v² + σ_t², μ_v − μ_t, the square, the division, the sum over D, and with
        # the log-determinant term one product (or log) more
        s_align = 6 if "C" in options.terms else 5
        mixed = options.inference_mode == "mixed"
        flops = (s_align + 2 * mixed) * dim * pairs
        text_b, video_b = (2 + mixed) * n_t * dim, (2 + mixed) * n_v * dim  # μ and log σ² (and f for the cosine)
        formula = f"{s_align}·D per pair for S_align" + (" + 2·D for the cosine" if mixed else "")
    else:
        raise ValueError(f"no cost model for {name}")
    return {"flops": flops, "input_bytes": f32 * (text_b + video_b), "formula": formula}


def device_peaks() -> dict:
    """Peak FP32 FLOP/s and memory bandwidth of the scoring device (None where no bound is known)."""
    if SMOKE["on"]:
        flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
        per_cycle = 64 if " avx512f" in flags else (32 if " avx2" in flags else 16)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return {
            "device": platform.processor() or "cpu",
            "flops_per_second": cores * CPU_BOUND_HZ * per_cycle,
            "bytes_per_second": None,
            "source": f"{cores} cores × 6 GHz × {per_cycle} FP32 FLOPs per cycle (widest vector unit reported); "
            "no memory term",
        }
    import torch

    name = torch.cuda.get_device_name(0)
    for pattern, tflops, tbps, source in PEAKS:
        if pattern in name:
            return {
                "device": name,
                "flops_per_second": tflops * 1e12,
                "bytes_per_second": tbps * 1e12,
                "source": source,
            }
    return {"device": name, "flops_per_second": None, "bytes_per_second": None, "source": "not in the table"}


def _time_cold(fn, flush) -> float:  # noqa: ANN001
    """Best of three calls after a warm-up, each after the L2 cache was overwritten (inputs come from memory)."""
    fn()
    best = float("inf")
    for _ in range(3):
        if flush is not None:
            flush.zero_()
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        best = min(best, time.perf_counter() - start)
    return best


def _features(n_t: int, n_v: int, dim: int):  # noqa: ANN202
    import torch

    from tvr.types import TextFeatures, VideoFeatures

    g = torch.Generator().manual_seed(0)
    base = torch.randn(n_v, dim, generator=g)
    text = TextFeatures(base[torch.randint(0, n_v, (n_t,), generator=g)] + 0.5 * torch.randn(n_t, dim, generator=g))
    video = VideoFeatures(
        base[:, None] + torch.randn(n_v, FRAMES, dim, generator=g),
        torch.ones(n_v, FRAMES, dtype=torch.long),
        base[:, None] + torch.randn(n_v, PROXIES, dim, generator=g),
    )
    return text.to(_device()), video.to(_device())


def part_scoring(args: argparse.Namespace) -> dict:
    import torch

    from tvr.config import HeadConfig
    from tvr.models.heads.registry import build_head

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    n_t, n_v, dim = args.texts, args.videos, 512
    peaks = device_peaks()
    flush = None
    if not SMOKE["on"]:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 256 * 2**20
        flush = torch.empty(2 * l2 // 4, device=_device())
    text, video = _features(n_t, n_v, dim)
    rows = []
    for name, options, setting in SCORERS:
        row: dict[str, Any] = {"head": name, "options": options, "texts": n_t, "videos": n_v, "dim": dim}
        try:
            torch.manual_seed(0)
            head = build_head(HeadConfig(name=name, options=dict(options)), dim, 4.6).to(_device()).eval()
            if setting:
                head.set_inference_setting(setting)
            row["setting"] = head.inference_setting() if hasattr(head, "inference_setting") else None
            with torch.no_grad():
                text_state, video_state = head.encode_texts(text), head.encode_videos(video)
                seconds = _time_cold(lambda: head.score(text_state, video_state), flush)  # noqa: B023
            cost = minimal_cost(name, head.options, n_t, n_v, dim, FRAMES, PROXIES)
            row.update(cost, seconds=round(seconds, 6))
            terms = []
            if peaks["flops_per_second"]:
                terms.append(cost["flops"] / peaks["flops_per_second"])
            if peaks["bytes_per_second"]:
                terms.append(cost["input_bytes"] / peaks["bytes_per_second"])
            if terms:
                bound = max(terms)
                row.update(
                    roofline_seconds=bound, efficiency=float(f"{bound / seconds:.3g}"), bound_holds=bound <= seconds
                )
            else:
                row.update(roofline_seconds=None, efficiency=None, bound_holds=None)
        except Exception as exc:  # noqa: BLE001 - recorded; the other scorers still run
            row.update(_failure(exc))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
    return {"peaks": peaks, "tf32": False, "l2_flushed": flush is not None, "rows": rows}


# --------------------------------------------------------------------------------------------- learning


def learning_run(cfg, batch: dict, steps: int) -> dict:  # noqa: ANN001
    """``steps`` trainer steps on one fixed batch from seeded weights: the losses and whether they fell."""
    import torch

    from tvr.models.build import build_model
    from tvr.models.run_spec import resolve_run
    from tvr.train.trainer import Trainer
    from tvr.utils.process_group import DistInfo

    torch.manual_seed(0)
    model = build_model(resolve_run(cfg))
    losses: list[float] = []
    skipped = 0
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, cfg, _OneBatch(batch), Path(tmp) / "run", dist_info=DistInfo(0, 1, 0, _device()))
        _sync()
        start = time.perf_counter()
        for _ in range(steps):
            scale = trainer.scaler.get_scale() if trainer.scaler is not None else None
            step_losses, _ = trainer._train_step(batch)
            losses.append(float(step_losses["loss"]))
            skipped += scale is not None and trainer.scaler.get_scale() < scale
        _sync()
        seconds = time.perf_counter() - start
    first = sum(losses[:LEARNING_WINDOW]) / LEARNING_WINDOW
    last = sum(losses[-LEARNING_WINDOW:]) / LEARNING_WINDOW
    return {
        "losses": [round(v, 5) for v in losses],
        "first_mean": first,
        "last_mean": last,
        "relative_drop": 1.0 - last / first if first else None,
        "learned": all(math.isfinite(v) for v in losses) and last < 0.9 * first,
        "skipped_steps": skipped,
        "seconds": round(seconds, 2),
    }


def part_learning(args: argparse.Namespace) -> dict:
    if args.learning_steps < 2 * LEARNING_WINDOW:
        raise ValueError(f"--learning-steps {args.learning_steps}: need at least {2 * LEARNING_WINDOW}")
    # constant learning rate, no warm-up, every parameter at the head's rate: random weights, one batch
    constant = (
        "train.schedule=constant",
        "train.warmup=0.0",
        "train.backbone_lr_coef=1.0",
        f"train.lr={args.learning_lr}",
    )

    def measure(row: dict) -> dict:
        cfg, _ = full_size_config(row["preset"], args.learning_batch, args.amp_dtypes.split(",")[0], False, constant)
        row.update(head=cfg.head.name, lr=cfg.train.lr, amp_dtype=cfg.train.amp_dtype)
        return learning_run(cfg, _batch_for(cfg, args.learning_batch), args.learning_steps)

    rows = [{"preset": p, "steps": args.learning_steps, "batch": args.learning_batch}
            for p in args.learning_presets.split(",")]  # fmt: skip
    criterion = f"mean of the last {LEARNING_WINDOW} losses < 0.9 × mean of the first {LEARNING_WINDOW}"
    return {"rows": measured_rows(rows, measure, "losses"), "criterion": criterion}


# --------------------------------------------------------------------------------------------- agreement


def part_agreement(args: argparse.Namespace) -> dict:
    """Every scorer's scores on the device against the CPU, same weights and inputs, per dtype."""
    import copy

    import torch

    from tvr.config import HeadConfig
    from tvr.models.heads.registry import build_head

    n = args.agreement_size
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = _device()
    text, video = _features(n, n, 512)
    text, video = text.to("cpu"), video.to("cpu")
    rows = []
    for name, options, setting in SCORERS:
        row: dict[str, Any] = {"head": name, "options": options, "texts": n, "videos": n, "dtypes": {}}
        try:
            torch.manual_seed(0)
            head = build_head(HeadConfig(name=name, options=dict(options)), 512, 4.6).eval()
            if setting:
                head.set_inference_setting(setting)
            with torch.no_grad():
                reference = head.score(head.encode_texts(text), head.encode_videos(video)).float()
                on_device = copy.deepcopy(head).to(device).eval()
                t_state = on_device.encode_texts(text.to(device))
                v_state = on_device.encode_videos(video.to(device))
                scale = reference.abs().max().item() or 1.0
                for dtype, tolerance in SCORE_TOLERANCE.items():
                    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = dtype == "tf32"
                    scores = on_device.score(t_state, v_state)
                    difference = (scores.float().cpu() - reference).abs().max().item() / scale
                    row["dtypes"][dtype] = {"max_relative_difference": difference, "tolerance": tolerance,
                                            "within_tolerance": bool(difference <= tolerance)}  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - recorded; the other scorers still run
            row.update(_failure(exc))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return {"device": str(device), "reference": "cpu float32", "tolerances": SCORE_TOLERANCE, "rows": rows}


# --------------------------------------------------------------------------------------------- main


PARTS = {
    "learning": part_learning,
    "agreement": part_agreement,
    "steps": part_steps,
    "distributed": part_distributed,
    "scoring": part_scoring,
}


def failures_of(record: dict) -> list[str]:
    """Every failure the record holds, one line each."""
    found = []
    for part, result in record["parts"].items():
        if result.get("error"):
            found.append(f"{part}: {result['error']}")
        for failure in (result.get("equivalence_float32") or {}).get("failures", []):
            found.append(f"{part}: equivalence: {failure}")
        for row in result.get("rows", []):
            label = " ".join(str(row.get(k)) for k in ("preset", "head", "amp_dtype") if row.get(k) is not None)
            if row.get("error"):
                found.append(f"{part}: {label}: {row['error']}")
            if isinstance(row.get("one_device"), dict) and row["one_device"].get("error"):
                found.append(f"{part}: {label}: one device: {row['one_device']['error']}")
            if row.get("bound_holds") is False:
                found.append(f"{part}: {label}: measured below the roofline (a peak in the table is too low)")
            if row.get("loss_finite") is False:
                found.append(f"{part}: {label}: a non-finite loss")
            if row.get("learned") is False:
                found.append(
                    f"{part}: {label}: the loss did not fall ({row.get('first_mean')} → {row.get('last_mean')})"
                )
            for dtype, check in (row.get("dtypes") or {}).items():
                if not check["within_tolerance"]:
                    found.append(f"{part}: {label} {dtype}: GPU and CPU scores differ by "
                                 f"{check['max_relative_difference']:.2g} > {check['tolerance']}")  # fmt: skip
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="steps,distributed,scoring")
    parser.add_argument("--presets", default="", help="comma-separated preset names (default: every preset)")
    parser.add_argument("--batch", type=int, default=16, help="items per GPU in the training steps")
    parser.add_argument("--amp-dtypes", default="bf16,fp16")
    parser.add_argument("--checkpointing", action="store_true", help="also a step with gradient checkpointing")
    parser.add_argument("--devices", type=int, default=0, help="devices to use (0: every GPU; the CPU smoke: 2)")
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--videos", type=int, default=1000)
    parser.add_argument("--distributed-timeout", type=int, default=3600, help="seconds torchrun may take")
    parser.add_argument("--collective-timeout-min", type=float, default=5.0, help="TVR_DIST_TIMEOUT_MIN of the ranks")
    parser.add_argument("--learning-presets", default=HEAD_PRESETS, help="one preset per head (the learning part)")
    parser.add_argument("--learning-steps", type=int, default=20)
    parser.add_argument("--learning-batch", type=int, default=16)
    parser.add_argument("--learning-lr", type=float, default=1e-4)
    parser.add_argument("--agreement-size", type=int, default=64, help="texts and videos scored on GPU and CPU")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cpu-smoke", action="store_true", help="every part on the CPU at toy sizes")
    parser.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)  # a torchrun rank
    args = parser.parse_args()
    import torch

    if args.cpu_smoke:
        SMOKE["on"] = True
        args.presets, args.texts, args.videos = args.presets or SMOKE_PRESETS, min(args.texts, 64), min(args.videos, 64)
        args.batch = min(args.batch, 2)
        args.learning_batch, args.agreement_size = min(args.learning_batch, 4), min(args.agreement_size, 16)
        if args.learning_presets == HEAD_PRESETS:
            args.learning_presets = SMOKE_PRESETS
        args.devices = args.devices or 2
    elif not torch.cuda.is_available():
        print("gpu_proof: no CUDA GPU is visible to torch (this script proves the GPU path; --cpu-smoke checks it)")
        return 2
    else:
        args.devices = min(args.devices or torch.cuda.device_count(), torch.cuda.device_count())
    if args.worker_out is not None:
        distributed_worker(args)
        return 0
    from tvr.utils.io import atomic_write_json

    out = args.out or (SMOKE_OUT if SMOKE["on"] else DEFAULT_OUT)
    record: dict[str, Any] = {
        "benchmark": "gpu_proof",
        "command": " ".join(["benchmarks/gpu_proof.py", *sys.argv[1:]]),
        "environment": environment(args.devices),
        "parts": {},
    }
    chosen = [p for p in args.parts.split(",") if p]
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        record["parts"]["arguments"] = {"error": f"unknown part(s) {unknown}; expected some of {list(PARTS)}"}
    try:
        for part in (p for p in chosen if p in PARTS):
            started = time.perf_counter()
            try:
                record["parts"][part] = PARTS[part](args)
            except Exception as exc:  # noqa: BLE001 - recorded; the next part still runs
                record["parts"][part] = _failure(exc)
            record["parts"][part]["part_seconds"] = round(time.perf_counter() - started, 1)
            record["failures"] = failures_of(record)
            atomic_write_json(out, record)
    finally:
        record["failures"] = failures_of(record)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, record)
        print(f"wrote {out}; {len(record['failures'])} failure(s)", flush=True)
    return 1 if record["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
