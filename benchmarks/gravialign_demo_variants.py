"""GraviAlign training behaviour on the demo set: which head options keep the positive-only L_SGI from collapsing.

Each variant trains the demo's model (a random tiny CLIP of the real architecture from scratch, seqTransf, lr 1e-3,
batch 32, grad clip 1.0; `tvr.bench.demo.demo_config`, whose head options the variant's replace — "default" is the
head's defaults, not its ``demo_options``) on the demo's synthetic data for ``--epochs`` epochs, one thread,
then evaluates the test split (30 videos, chance R@1 3.3, R@10 33.3) with the validation-selected checkpoint. What
matters is the last training InfoNCE (ln 32 = 3.466 means every similarity is equal: the features collapsed), the
terms of S_align, and the gradient norm before clipping; 30 test videos are too few to rank methods.

    .venv/bin/python benchmarks/gravialign_demo_variants.py          # ~2 min per variant; writes
                                                                     # benchmarks/results/gravialign_demo_variants.json
    .venv/bin/python benchmarks/gravialign_demo_variants.py --variants default,guarded --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gravialign_demo_variants.json"

VARIANTS: dict[str, tuple[str, dict]] = {
    "clip4clip": ("clip4clip", {}),
    "default": ("gravialign", {}),
    "infonce_both": ("gravialign", {"infonce_on": "both"}),
    "alpha_0.01": ("gravialign", {"alpha": 0.01}),
    "eps_1e-2": ("gravialign", {"eps": 1e-2}),
    "eps_1e-1": ("gravialign", {"eps": 1e-1}),
    "alpha_0.01+eps_1e-2": ("gravialign", {"alpha": 0.01, "eps": 1e-2}),
    "alpha_0.01+eps_1e-1": ("gravialign", {"alpha": 0.01, "eps": 1e-1}),
    "no_sgi_to_backbone": ("gravialign", {"sgi_to_backbone": False}),
    # tvr/methods/gravialign/presets/ablations/guarded.yaml
    "guarded": ("gravialign", {"sgi_to_backbone": False, "eps": 1e-2}),
    "guarded+infonce_both": ("gravialign", {"sgi_to_backbone": False, "eps": 1e-2, "infonce_on": "both"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated among {list(VARIANTS)}")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--data", default="", help="demo data folder to reuse (default: render one in a temp dir)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose among {list(VARIANTS)}")

    import torch

    from tvr.bench.demo import demo_config
    from tvr.bench.synthetic import SynthConfig, generate_synthetic_dataset
    from tvr.pipeline import resolve_config, run_train
    from tvr.utils.io import atomic_write_json

    command = f"cd {REPO} && .venv/bin/python benchmarks/gravialign_demo_variants.py " + " ".join(sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "data"
        if not (data / "MSRVTT_data.json").is_file():
            generate_synthetic_dataset(data, SynthConfig(num_videos=240, num_test=30))
        for name in names:
            method, options = VARIANTS[name]
            cfg = demo_config(data, method=method)
            cfg.train.epochs = args.epochs
            cfg.head.options = dict(options)
            cfg = resolve_config(cfg)
            run = Path(tmp) / name
            start = time.perf_counter()
            run_train(cfg, run, overwrite=True)
            seconds = time.perf_counter() - start
            metrics = json.loads((run / "test_best" / "metrics.json").read_text())
            train = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
            train = [r for r in train if r.get("kind") == "train"]
            last = train[-1]
            keys = ("loss", "infonce", "sgi", "term_A", "term_B", "term_C", "logvar_text", "logvar_video", "grad_norm")
            row = {
                "variant": name,
                "head": method,
                "options": options,
                "seconds": round(seconds, 1),
                "test_t2v": metrics["t2v"],
                "test_t2v@cos_f": metrics.get("t2v@cos_f"),
                "inference_setting": metrics.get("inference_setting"),
                "last_train_step": {k: last[k] for k in keys if k in last},
                "grad_norm_max": max(r.get("grad_norm", 0.0) for r in train),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    atomic_write_json(
        args.out,
        {
            "benchmark": "GraviAlign option variants on the demo set",
            "command": command,
            "epochs": args.epochs,
            "torch": torch.__version__,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "variants": results,
        },
    )


if __name__ == "__main__":
    main()
