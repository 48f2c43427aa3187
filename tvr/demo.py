"""``tvr demo``: synthesise a captioned video set, train a small CLIP4Clip on CPU, evaluate, print the table.

Everything is real except the scale: real mp4 files decoded with PyAV, the real CLIP architecture (randomly
initialised, small), the seqTransf temporal module, the paper's loss and metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tvr.config import Config, config_from_dict
from tvr.models.heads.registry import head_class

DEMO_CONFIG: dict[str, Any] = {
    "data": {
        "dataset": "msrvtt",
        "train_split": "9k",
        "max_words": 24,
        "max_frames": 8,
        "frame_rate": 4.0,
        "image_size": 32,
        "val_fraction": 0.1,
        # decode the next batch in a worker process while the main process trains
        "num_workers": 1,
    },
    "model": {
        "clip": "tiny",
        "temporal": "seqTransf",
        "temporal_layers": 2,
        "tiny": {
            "embed_dim": 64,
            "text_width": 64,
            "text_layers": 2,
            "text_heads": 4,
            "vision_width": 64,
            "vision_layers": 2,
            "vision_heads": 4,
            "image_size": 32,
            "patch_size": 8,
        },
    },
    # a random CLIP learns from scratch: the backbone gets the full lr and a CLIP-like starting temperature
    "head": {"name": "clip4clip", "logit_scale_init": 2.6592},
    "train": {
        "epochs": 15,
        "batch_size": 32,
        "lr": 1e-3,
        "backbone_lr_coef": 1.0,
        "weight_decay": 0.05,
        "warmup": 0.1,
        "log_every": 24,
        "device": "cpu",
        # a model this small gains nothing from a second intra-op thread; the data worker uses the other core
        "num_threads": 1,
        # R@1 on ~20 validation videos moves in steps of 5 points; R@5 is a steadier selection signal
        "select_metric": "t2v/R5",
    },
    "eval": {"batch_size": 64},
}

QUICK_OVERRIDES: dict[str, Any] = {"train": {"epochs": 1, "max_steps": 4, "log_every": 1}}


def demo_config(data_dir: Path, quick: bool = False, method: str = "clip4clip") -> Config:
    import copy

    values = copy.deepcopy(DEMO_CONFIG)
    values["data"]["annotations"] = str(data_dir)
    values["data"]["video_dir"] = str(data_dir / "videos")
    values["head"]["name"] = method
    head = head_class(method)
    values["head"]["options"] = dict(head.demo_options)
    if "proxies" in head.requires:
        # a head that reads per-video proxies runs on the CLIP-ViP tower (same tiny CLIP), which pools the video
        # itself: CLIP-ViP's frame sampling, no temporal module
        values["model"].update({"backbone": "clipvip", "temporal": "none",
                                "clipvip": {"num_proxies": 4, "temporal_slots": 12, "proxy_projection": True}})
        values["data"]["sampling"] = "clipvip"
    if quick:
        for section, entries in QUICK_OVERRIDES.items():
            values[section].update(entries)
    return config_from_dict(values)


def run_demo(out_dir: str | Path = "demo_out", quick: bool = False, method: str = "clip4clip") -> dict:
    from tvr.data.synthetic import SynthConfig, generate_synthetic_dataset
    from tvr.pipeline import run_train

    out_dir = Path(out_dir)
    data_dir = out_dir / "data"
    # more distinct videos generalise better than more epochs over fewer (measured: docs/benchmarks.md)
    synth = SynthConfig(num_videos=60, num_test=20) if quick else SynthConfig(num_videos=240, num_test=30)
    if not (data_dir / "MSRVTT_data.json").is_file():
        generate_synthetic_dataset(data_dir, synth, progress=True)
    cfg = demo_config(data_dir, quick=quick, method=method)
    # the demo always starts over (its data folder is reused; its run folder is not)
    return run_train(cfg, out_dir / "run", overwrite=True)
