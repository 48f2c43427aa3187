"""The GPU path, proven in one command (issue 26, item 5). Needs a CUDA GPU; nothing is downloaded.

    .venv/bin/python benchmarks/gpu_proof.py            # everything below → benchmarks/results/gpu_proof.json
    .venv/bin/python benchmarks/gpu_proof.py --parts steps --presets gare/msrvtt,proxy/msrvtt_b16

Parts (``--parts``, default all):

* ``steps`` — one AMP training step of every shipped preset (ablations and the CPU recipe excepted) at full size
  with random weights: the preset's model and head with CLIP ViT-B/32 or ViT-B/16 dimensions (the preset's
  ``model.clip`` decides the patch size; a CLIP-ViP checkpoint is not loaded), the two-tower presets on their
  installed real weights; synthetic raw batches of ``--batch`` items (default 16 = the papers' global batch of 128
  on 8 GPUs) at the preset's frames, words and resolution. Through the trainer's own step (autocast, the fp16 grad
  scaler, clipping, AdamW): the warm step's time, the peak allocated GPU memory, the loss. ``--amp-dtypes``
  (default ``auto,fp16``: bf16 on a GPU that has it, and the fp16 + scaler path) and, with
  ``--checkpointing``, the same step with ``model.gradient_checkpointing`` for the memory it saves.
* ``nccl`` — the two-process gradient equivalence of ``tests/test_distributed_heads.py`` over NCCL, one GPU per
  process (every registered head and variant: loss, gradients and buffers equal one process on the global batch;
  the reference is computed in each process before it joins the group). With one GPU: one process joins an NCCL
  group of one and runs the same DDP step.
* ``scoring`` — test-time all-pairs scoring of GARE, TV-ProxyNet and GraviAlign (``s_align`` mode) through each
  head's ``score`` on 1000 texts × 1000 videos, D = 512 (MSR-VTT 1k-A), against its GPU floor:

  - GARE: the factorised scorer's unavoidable arithmetic, three [N_t, D] × [D, N_v·F] products (3·F·D
    multiply-adds per pair), timed as plain GEMMs;
  - TV-ProxyNet: the 5·D² multiply-adds per pair of the CPU benchmark's floor (query projection and two FFN layers
    per round folded as in benchmarks/proxy_scoring.py), timed as plain [P, D] × [D, D] GEMMs;
  - GraviAlign: the elementwise passes S_align cannot avoid over the N_t·N_v·D (pair, dimension) grid (s = σ_v² +
    σ_t², δ = μ_v − μ_t, δ²/s, log s, two reductions over D), each timed alone on a resident block of the GPU
    and scaled to all pairs (the GPU analogue of benchmarks/gravialign_scoring.py's floor).

  efficiency = floor / scorer (1 = at the floor), in the GPU's default precision (float32, TF32 off).

Nothing here has been run by the project yet: the figures in docs/benchmarks.md and docs/scaling.md are pending a
machine with a GPU (record them there, naming the GPU).
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
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "tests"):  # tests/test_distributed_heads.py holds the equivalence check
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_proof.json"
EOT = 49407
VIT = {  # OpenAI CLIP ViT-B: text 512 wide × 12 layers × 8 heads, vision 768 × 12 × 12, projection 512
    "embed_dim": 512, "text_width": 512, "text_layers": 12, "text_heads": 8, "vision_width": 768,
    "vision_layers": 12, "vision_heads": 12, "image_size": 224, "context_length": 77, "vocab_size": 49408,
}  # fmt: skip


def presets() -> list[str]:
    root = REPO / "tvr" / "configs"
    return sorted(
        str(p.relative_to(root).with_suffix(""))
        for p in root.glob("*/*.yaml")
        if p.parent.name not in ("cpu", "ablations")
    )


#: ``--cpu-smoke`` runs every part on the CPU at toy sizes (gloo instead of NCCL) to check the script itself
SMOKE = {"on": False}
SMOKE_VIT = {
    "embed_dim": 32, "text_width": 32, "text_layers": 4, "text_heads": 2, "vision_width": 32, "vision_layers": 1,
    "vision_heads": 2, "image_size": 32, "context_length": 77, "vocab_size": 49408,
}  # fmt: skip
SMOKE_PRESETS = "clip4clip/msrvtt,gare/msrvtt,proxy/msrvtt_b16,gravialign/msrvtt"


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

    return None if SMOKE["on"] else round(torch.cuda.max_memory_allocated() / 2**30, 2)


# --------------------------------------------------------------------------------------------- training steps


def full_size_config(preset: str, batch: int, amp_dtype: str, checkpointing: bool):  # noqa: ANN201
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
    return resolve_config(load_config(preset, overrides)), base


class _OneBatch:
    """TrainData of one synthetic batch (the trainer's step is all this part runs)."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def len_epoch(self) -> int:
        return 1

    def batches(self, epoch: int, start_batch: int = 0):  # noqa: ANN201
        yield self.batch


def synthetic_batch(cfg, n: int, work: Path) -> dict:  # noqa: ANN001
    import torch

    from tvr.data.tokenizer import build_tokenizer

    g = torch.Generator().manual_seed(0)
    words = cfg.data.max_words
    if cfg.model.backbone == "two_tower":
        tokenizer = build_tokenizer(cfg, work)
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


def training_step(preset: str, batch: int, amp_dtype: str, checkpointing: bool) -> dict:
    import torch

    from tvr.models.build import build_model
    from tvr.train.distributed import DistInfo
    from tvr.train.trainer import Trainer

    cfg, base = full_size_config(preset, batch, amp_dtype, checkpointing)
    device = _device()
    with tempfile.TemporaryDirectory() as tmp:
        data = _OneBatch(synthetic_batch(cfg, batch, Path(tmp)))
        torch.manual_seed(0)
        model = build_model(cfg)
        trainer = Trainer(model, cfg, data, Path(tmp) / "run", dist_info=DistInfo(0, 1, 0, device))
        params = sum(p.numel() for p in model.parameters())
        trainer._train_step(data.batch)  # warm-up: cuDNN/cuBLAS autotuning, allocator growth
        # fp16: the scaler starts at 2^16 and halves the scale, skipping the step, while the gradients overflow;
        # warm up until it has found its scale (a skipped step would time no optimizer update)
        for _ in range(24):
            if trainer.scaler is None:
                break
            before = trainer.scaler.get_scale()
            trainer._train_step(data.batch)
            if trainer.scaler.get_scale() >= before:
                break
        _sync()
        _reset_peak()
        scale_before = trainer.scaler.get_scale() if trainer.scaler is not None else None
        start = time.perf_counter()
        losses, grad_norm = trainer._train_step(data.batch)
        _sync()
        seconds = time.perf_counter() - start
        scale_after = trainer.scaler.get_scale() if trainer.scaler is not None else None
    return {
        "preset": preset,
        "clip": str(base.model.clip),
        "backbone": cfg.model.backbone,
        "head": cfg.head.name,
        "batch_per_gpu": batch,
        "frames": cfg.data.max_frames,
        "image_size": cfg.data.image_size,
        "amp_dtype": str(trainer.amp_dtype).replace("torch.", ""),
        "grad_scaler": trainer.scaler is not None,
        "gradient_checkpointing": checkpointing,
        "parameters_m": round(params / 1e6, 1),
        "step_seconds": round(seconds, 4),
        "peak_allocated_gib": _peak_gib(),
        "loss": float(losses["loss"]),
        "loss_finite": bool(torch.isfinite(losses["loss"]).item()),
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "grad_scale": scale_after,
        "step_skipped_by_scaler": None if scale_before is None else scale_after < scale_before,
    }


def part_steps(args: argparse.Namespace) -> list[dict]:
    import torch

    rows = []
    chosen = args.presets.split(",") if args.presets else presets()
    for preset in chosen:
        settings = [(dtype, False) for dtype in args.amp_dtypes.split(",")]
        if args.checkpointing:
            settings.append((args.amp_dtypes.split(",")[0], True))
        for amp_dtype, checkpointing in settings:
            try:
                row = training_step(preset, args.batch, amp_dtype, checkpointing)
            except torch.OutOfMemoryError as exc:
                row = {
                    "preset": preset,
                    "amp_dtype": amp_dtype,
                    "gradient_checkpointing": checkpointing,
                    "error": f"out of memory: {str(exc).splitlines()[0]}",
                }
            except Exception as exc:  # noqa: BLE001 - recorded, the other presets still run
                row = {
                    "preset": preset,
                    "amp_dtype": amp_dtype,
                    "gradient_checkpointing": checkpointing,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:],
                }
            if not SMOKE["on"]:
                torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# --------------------------------------------------------------------------------------------- NCCL


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nccl_worker(rank: int, world: int, port: int, out: str, smoke: bool) -> None:
    import gc

    import torch
    from test_distributed_heads import SIZES, VARIANTS, _assert_close, _rows, build_model, global_batch

    from tvr.train.distributed import init_distributed, wrap_model

    SMOKE["on"] = smoke
    torch.set_num_threads(1)
    device = torch.device("cpu") if SMOKE["on"] else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    batch = {k: v.to(device) for k, v in global_batch().items()}
    sizes = SIZES if world == 2 else (sum(SIZES),)
    rows = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
    # references first: before this process joins the group, the model does not gather
    references = []
    for name, options in VARIANTS:
        ref = build_model(name, options).to(device)
        out_ref = ref(batch)
        out_ref["loss"].backward()
        references.append((ref, out_ref["loss"].detach()))
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    info = init_distributed(device.type)
    assert torch.distributed.get_backend() == ("gloo" if smoke else "nccl")
    checked, failures = [], []
    for (name, options), (ref, ref_loss) in zip(VARIANTS, references, strict=True):
        try:
            model = build_model(name, options).to(device)
            ddp = wrap_model(model, info) if world > 1 else model
            out_local = ddp(_rows(batch, rows))
            out_local["loss"].backward()
            _assert_close(f"{name} {options}: loss", out_local["loss"].detach(), ref_loss)
            for (key, p), ref_p in zip(model.named_parameters(), ref.parameters(), strict=True):
                if p.requires_grad:
                    _assert_close(f"{name} {options}: grad {key}", p.grad, ref_p.grad)
            checked.append(f"{name} {options}")
            del ddp
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{name} {options}: {exc}")
    if rank == 0:
        Path(out).write_text(json.dumps({"world_size": world, "checked": checked, "failures": failures}))
    gc.collect()
    torch.distributed.destroy_process_group()


def part_nccl(args: argparse.Namespace) -> dict:
    import torch
    import torch.multiprocessing as mp

    world = 2 if SMOKE["on"] or torch.cuda.device_count() >= 2 else 1
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "nccl.json")
        worker_args = (world, _free_port(), out, SMOKE["on"])
        mp.start_processes(nccl_worker, args=worker_args, nprocs=world, join=True, start_method="spawn")
        record = json.loads(Path(out).read_text())
    print(json.dumps(record), flush=True)
    return record


# --------------------------------------------------------------------------------------------- scoring


def _cuda_time(fn, repeats: int = 3) -> float:  # noqa: ANN001
    fn()
    _sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync()
        best = min(best, time.perf_counter() - start)
    return best


def _features(n_t: int, n_v: int, dim: int, frames: int, proxies: int):  # noqa: ANN201
    import torch

    from tvr.types import TextFeatures, VideoFeatures

    g = torch.Generator().manual_seed(0)
    base = torch.randn(n_v, dim, generator=g)
    text = TextFeatures(base[torch.randint(0, n_v, (n_t,), generator=g)] + 0.5 * torch.randn(n_t, dim, generator=g))
    video = VideoFeatures(
        base[:, None] + torch.randn(n_v, frames, dim, generator=g),
        torch.ones(n_v, frames, dtype=torch.long),
        base[:, None] + torch.randn(n_v, proxies, dim, generator=g) if proxies else None,
    )
    return text.to(_device()), video.to(_device())


def _gemm_floor(rows: int, inner: int, cols: int, count: int) -> float:
    """Time of ``count`` plain [rows, inner] × [inner, cols] products on the GPU."""
    import torch

    a = torch.randn(rows, inner, device=_device())
    b = torch.randn(inner, cols, device=_device())
    return count * _cuda_time(lambda: torch.mm(a, b))


def _gravialign_floor(n_t: int, n_v: int, dim: int, block_texts: int = 64) -> float:
    """The elementwise passes S_align cannot avoid, each timed alone on a [T, N_v, D] block, scaled to N_t texts."""
    import torch

    device = _device()
    mu_t, mu_v = torch.randn(block_texts, 1, dim, device=device), torch.randn(1, n_v, dim, device=device)
    var_t, var_v = torch.rand(block_texts, 1, dim, device=device), torch.rand(1, n_v, dim, device=device)
    s = torch.empty(block_texts, n_v, dim, device=device)
    d = torch.empty_like(s)
    steps = [
        lambda: torch.add(var_t, var_v, out=s),  # s = σ_t² + σ_v²
        lambda: torch.sub(mu_t, mu_v, out=d),  # δ
        lambda: d.mul_(d).div_(s),  # δ²/s (one pass in a fused kernel; two here)
        lambda: d.sum(dim=-1),  # q
        lambda: s.log_(),  # log s
        lambda: s.sum(dim=-1),  # Σ log s
    ]
    per_block = sum(_cuda_time(step) for step in steps)
    return per_block * n_t / block_texts


def part_scoring(args: argparse.Namespace) -> list[dict]:
    import torch

    from tvr.config import HeadConfig
    from tvr.models.heads.registry import build_head

    torch.backends.cuda.matmul.allow_tf32 = False
    n_t, n_v, dim, frames, proxies = args.texts, args.videos, 512, 12, 4
    rows = []
    for name, options, setting in [
        ("gare", {}, None),
        ("proxy", {}, {"gamma": 1.0}),
        ("gravialign", {"inference_mode": "s_align", "select_modes": ""}, None),
    ]:
        torch.manual_seed(0)
        head = build_head(HeadConfig(name=name, options=options), dim, 4.6).to(_device()).eval()
        if setting:
            head.set_inference_setting(setting)
        text, video = _features(n_t, n_v, dim, frames if name == "gare" else 1, proxies if name == "proxy" else 0)
        with torch.no_grad():
            text_state, video_state = head.encode_texts(text), head.encode_videos(video)
            seconds = _cuda_time(lambda: head.score(text_state, video_state))  # noqa: B023
        if name == "gare":
            floor = _gemm_floor(n_t, dim, n_v * frames, 3)
            floor_text = "3 GEMMs [N_t, D] × [D, N_v·F] (3·F·D multiply-adds per pair)"
        elif name == "proxy":
            pairs, block = n_t * n_v, 32768
            floor = _gemm_floor(block, dim, dim, 5) * pairs / block
            floor_text = "5·D² multiply-adds per pair as [32768, D] × [D, D] GEMMs"
        else:
            floor = _gravialign_floor(n_t, n_v, dim)
            floor_text = "6 elementwise passes over the N_t·N_v·D grid, each at the GPU's rate"
        row = {
            "head": name,
            "texts": n_t,
            "videos": n_v,
            "dim": dim,
            "seconds": round(seconds, 5),
            "floor_seconds": round(floor, 5),
            "efficiency": round(floor / seconds, 3),
            "floor": floor_text,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# --------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="steps,nccl,scoring")
    parser.add_argument("--presets", default="", help="comma-separated preset names (default: every preset)")
    parser.add_argument("--batch", type=int, default=16, help="items per GPU in the training steps")
    parser.add_argument("--amp-dtypes", default="auto,fp16")
    parser.add_argument("--checkpointing", action="store_true", help="also a step with gradient checkpointing")
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--videos", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cpu-smoke", action="store_true", help="check the script on the CPU at toy sizes (no file)")
    args = parser.parse_args()
    import torch

    if args.cpu_smoke:
        SMOKE["on"] = True
        args.presets, args.batch, args.texts, args.videos = args.presets or SMOKE_PRESETS, 2, 64, 64
        args.amp_dtypes = "bf16,fp16"
    elif not torch.cuda.is_available():
        sys.exit("gpu_proof: no CUDA GPU is visible to torch (this script proves the GPU path; run it on a GPU)")
    record = {
        "benchmark": "gpu_proof",
        "command": " ".join(["benchmarks/gpu_proof.py", *sys.argv[1:]]),
        "gpus": [] if SMOKE["on"] else [torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }
    parts = args.parts.split(",")
    if "steps" in parts:
        record["training_steps"] = part_steps(args)
    if "nccl" in parts:
        record["nccl_equivalence"] = part_nccl(args)
    if "scoring" in parts:
        record["scoring"] = part_scoring(args)
    if SMOKE["on"]:
        print("cpu smoke run: every part ran; nothing written")
        return
    from tvr.utils.io import atomic_write_json

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
