"""How differently scaled do the two modalities reach the heads, and does CLIP's ending of the towers equalise them?
The measurement behind the bench's regime (docs/bench.md, "Regime"; docs/benchmarks.md, "Modality norms").

On a bench's feature cache (``--bench-dir``: a folder ``tvr bench`` prepared; nothing is encoded again), for the
bench's first ``--seeds`` seeds:

* the towers' own feature norms on the validation split (the sentence embedding, every real token, every real
  frame) — what a projection starts from;
* per projection kind of the two-tower bridge (``linear``: the old regime; ``clip``: a LayerNorm over the tower's
  feature then a bias-free map) and per head (CLIP4Clip, GARE), the models ``tvr train`` starts from (seeded, before
  their first step): the norms of the features the head reads — the text feature, every real frame after the
  temporal module, each video's mean over its real frames — and their ratio;
* for GARE at initialisation: ‖Δ‖ / ‖t‖, the cosine of the gap query v̄_j − t_i with v̄_j (1: the query is the video
  alone), and the share of Δ's sum of squares that is a per-video offset (the mean of Δ_ij over texts; 1: nothing
  pair-specific), on the first 64 validation captions × 64 videos;
* with ``--results NAME=results.json`` (finished benches), the same norms at every run's validation-selected
  checkpoint, as the runs recorded them (``feature_norms``), per method and regime.

    .venv/bin/python benchmarks/modality_norms.py --bench-dir /work/bench-runs/default \
        [--results clip=bench/default/results.json --results linear=bench/gare_regime_linear/results.json] \
        --out benchmarks/results/modality_norms.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.bench.runs import (  # noqa: E402
    BenchMethod,
    initial_model,
    load_bench_config,
    method_config,
    prepare_data,
    validation_norms,
)
from tvr.bench.stats import t_interval  # noqa: E402
from tvr.data.feature_cache import load_cached_split  # noqa: E402
from tvr.methods.gare.psi import gare_delta, video_mean  # noqa: E402
from tvr.pipeline import SplitEvaluator  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

REGIMES = ("linear", "clip")
HEADS = {
    "clip4clip": BenchMethod("clip4clip", {"name": "clip4clip", "logit_scale_init": 2.6592}),
    "gare": BenchMethod("gare", {}, preset="gare/msrvtt"),
}
#: the captions × videos of the validation split GARE's increments are read on
GARE_BLOCK = 64


def tower_norms(cache_dir: Path) -> dict[str, Any]:
    """The towers' own features in the validation split of the cache."""
    split = load_cached_split(cache_dir, "val")
    words = split.words.float().norm(dim=-1)[split.word_mask.bool()]
    frames = split.frames.float().norm(dim=-1)[split.frame_mask.bool()]
    summary = {}
    for name, norms in (("sentence", split.eot.float().norm(dim=-1)), ("token", words), ("frame", frames)):
        summary[name] = {"mean": float(norms.mean()), "sd": float(norms.std()), "n": int(norms.numel())}
    return summary


@torch.no_grad()
def gare_geometry(model, cfg) -> dict[str, float]:  # noqa: ANN001
    """‖Δ‖/‖t‖, cos(v̄ − t, v̄) and the per-video offset's share of Δ on a validation block."""
    device = torch.device("cpu")
    encoded = SplitEvaluator(cfg, "val").encode(model.to(device).eval(), device)
    head = model.head
    text = head.encode_texts(encoded.text[:GARE_BLOCK])
    video = head.encode_videos(encoded.video[:GARE_BLOCK])
    delta = gare_delta(head.psi.eval(), text, video, head.options)  # [n_t, n_v, D]
    t = text.eot
    vbar = video_mean(video, head.options.mask_frames)
    query = vbar.unsqueeze(0) - t.unsqueeze(1)
    offset = delta.mean(dim=0, keepdim=True)
    return {
        "delta_to_text": float(delta.norm(dim=-1).mean() / t.norm(dim=-1).mean()),
        "query_cos_video_mean": float(torch.nn.functional.cosine_similarity(query, vbar.unsqueeze(0), dim=-1).mean()),
        "per_video_offset_share": float(offset.expand_as(delta).square().sum() / delta.square().sum()),
    }


def interval(values: list[float]) -> dict[str, Any]:
    i = t_interval(values)
    return {"mean": i.mean, "low": i.low, "high": i.high, "values": values}


def at_initialisation(bench, out_dir: Path, digest: str, seeds: list[int]) -> dict[str, Any]:  # noqa: ANN001
    """Norms (and GARE's geometry) of the models training starts from, per head and projection kind."""
    from tvr.bench.runs import feature_key
    from tvr.config import config_to_dict, load_config

    # the bench's own cache: it holds tower features, which no projection kind changes
    cache = out_dir / "features" / feature_key(method_config(bench, bench.methods[0], 42, out_dir), digest)
    rows: dict[str, Any] = {}
    for regime in REGIMES:
        for name, method in HEADS.items():
            method = copy.deepcopy(method)
            method.overrides = {"model.two_tower.projection": regime}
            if method.preset:  # a preset contributes its head section, as a bench method's does
                method.head = {**config_to_dict(load_config(method.preset).head), "logit_scale_init": 2.6592}
            norms, geometry = [], []
            for seed in seeds:
                cfg = method_config(bench, method, seed, out_dir, str(cache))
                model = initial_model(cfg).eval()
                norms.append(validation_norms(cfg, model, torch.device("cpu")))
                if name == "gare":
                    geometry.append(gare_geometry(model, cfg))
            entry = {key: interval([n[key]["mean"] for n in norms]) for key in ("text", "frame", "video_mean")}
            entry["video_to_text"] = interval([n["video_to_text"] for n in norms])
            if geometry:
                entry["gare"] = {k: interval([g[k] for g in geometry]) for k in geometry[0]}
            rows[f"{name}/{regime}"] = entry
            print(f"{name}/{regime}: video/text {entry['video_to_text']['mean']:.2f}", flush=True)
    return {"cache": str(cache), "rows": rows}


def after_training(named: dict[str, Path]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, path in named.items():
        results = json.loads(path.read_text())
        regime = results["config"]["run"]["model"].get("two_tower", {}).get("projection")
        methods: dict[str, Any] = {}
        for method in dict.fromkeys(r["method"] for r in results["runs"]):
            runs = [r for r in results["runs"] if r["method"] == method and "feature_norms" in r]
            if not runs:
                continue
            methods[method] = {
                when: {
                    **{key: interval([r["feature_norms"][when][key]["mean"] for r in runs])
                       for key in ("text", "frame", "video_mean")},
                    "video_to_text": interval([r["feature_norms"][when]["video_to_text"] for r in runs]),
                }
                for when in ("init", "best")
            }  # fmt: skip
        out[name] = {"bench": results["name"], "projection": regime, "results_sha256": results["results_sha256"],
                     "seeds": results["seeds"], "methods": methods}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, required=True, help="a folder tvr bench prepared (data, features)")
    parser.add_argument("--config", default="default", help="the bench config that folder was prepared with")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--results", action="append", default=[], help="NAME=results.json of a finished bench")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.process_time()
    bench = load_bench_config(args.config)
    data = prepare_data(bench, args.bench_dir, progress=False)  # reads the rendered set; renders nothing new
    report: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "bench": bench.name,
                              "data_digest": data["digest"], "seeds": bench.seeds[: args.seeds]}  # fmt: skip
    init = at_initialisation(bench, args.bench_dir, data["digest"], bench.seeds[: args.seeds])
    report["towers"] = tower_norms(Path(init["cache"]))
    report["initialisation"] = init["rows"]
    named = {name: Path(path) for name, _, path in (item.partition("=") for item in args.results)}
    if named:
        report["after_training"] = after_training(named)
    report["provenance"] = {"cpu_seconds": round(time.process_time() - started, 1), "torch": torch.__version__,
                            "machine": platform.platform()}  # fmt: skip
    atomic_write_json(args.out, report)
    print(json.dumps(report["towers"]))


if __name__ == "__main__":
    main()
