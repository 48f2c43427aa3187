"""How differently scaled do the two modalities reach the heads, and which bridge equalises them? Measured before the
bench's regime was chosen (docs/bench.md, "Regime").

Runs a small bench (the default bench's encoders, dials and recipe on fewer clips; 3 seeds) with CLIP4Clip and GARE
under each projection kind of the two-tower bridge (``linear``: the old default; ``clip``: CLIP's ending, a
LayerNorm over the tower's feature then a bias-free map), and reports:

* the towers' own feature norms, read from the feature cache (the sentence embedding, every real token, every real
  frame) — what a projection starts from;
* per regime and head, the norms of the features the head reads on the validation split (text feature, real frames
  after the temporal module, per-video mean of the real frames) at initialisation and at the validation-selected
  checkpoint, and their ratio (every bench run records these: ``feature_norms`` in results.json);
* for GARE, at initialisation and at the chosen checkpoint: ‖Δ‖ / ‖t‖, the cosine of the gap query v̄_j − t_i with
  v̄_j (1 = the query is the video alone), and the share of Δ's sum of squares that is a per-video offset (the mean
  of Δ_ij over texts; 1 = no pair-specific part), on the first 64 validation captions × 64 videos.

    .venv/bin/python benchmarks/modality_norms.py --bench-dir /work/bench-runs/norms \
        --out benchmarks/results/modality_norms.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.data.feature_cache import load_cached_split  # noqa: E402
from tvr.eval.stats import t_interval  # noqa: E402
from tvr.models.checkpoint import load_model  # noqa: E402
from tvr.models.heads.gare.psi import gare_delta, video_mean  # noqa: E402
from tvr.pipeline import SplitEvaluator  # noqa: E402
from tvr.pipeline.bench import initial_model, load_bench_config, method_config, run_bench  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

REGIMES = ("linear", "clip")
#: the captions × videos of the validation split GARE's increments are read on
GARE_BLOCK = 64


def bench_config(folder: Path, seeds: int) -> Path:
    """The default bench's file with fewer clips and seeds, and CLIP4Clip and GARE under each projection kind."""
    raw = yaml.safe_load((REPO / "tvr" / "configs" / "bench" / "default.yaml").read_text())
    raw["name"] = "modality_norms"
    raw["description"] = "feature norms of the two modalities under each two-tower projection kind"
    raw["synth"].update({"num_videos": 600, "num_test": 150})
    raw.pop("transfer", None)
    raw["seeds"] = seeds
    raw["methods"] = []
    for regime in REGIMES:
        overrides = {"model.two_tower.projection": regime}
        raw["methods"] += [
            {"name": f"clip4clip-{regime}", "head": {"name": "clip4clip", "logit_scale_init": 2.6592},
             "set": overrides},
            {"name": f"gare-{regime}", "preset": "gare/msrvtt", "head": {"logit_scale_init": 2.6592}, "set": overrides},
        ]  # fmt: skip
    raw["baseline"] = "clip4clip-linear"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "modality_norms.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


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
def gare_geometry(model, cfg) -> dict[str, float]:
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


def interval(values: list[float]) -> dict[str, float]:
    i = t_interval(values)
    return {"mean": i.mean, "low": i.low, "high": i.high, "values": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    bench = load_bench_config(bench_config(args.bench_dir, args.seeds))
    results = run_bench(bench, args.bench_dir, progress=False, echo=print,
                       command=" ".join(["python", *sys.argv]))  # fmt: skip
    cache = Path(results["runs"][0]["config"]["data"]["features_dir"].replace("$OUT", str(args.bench_dir)))
    report: dict[str, Any] = {
        "towers": tower_norms(cache),
        "bench": {key: results[key] for key in ("results_sha256", "seeds", "epochs", "composition")},
    }
    per_method: dict[str, Any] = {}
    for method in bench.methods:
        runs = [r for r in results["runs"] if r["method"] == method.name]
        entry: dict[str, Any] = {}
        for when in ("init", "best"):
            entry[when] = {
                key: interval([r["feature_norms"][when][key]["mean"] for r in runs])
                for key in ("text", "frame", "video_mean")
            }
            entry[when]["video_to_text"] = interval([r["feature_norms"][when]["video_to_text"] for r in runs])
        if method.name.startswith("gare"):
            geometry: dict[str, list[dict[str, float]]] = {"init": [], "best": []}
            for r in runs:
                cfg = method_config(bench, method, r["seed"], args.bench_dir, str(cache))
                geometry["init"].append(gare_geometry(initial_model(cfg), cfg))
                run_dir = args.bench_dir / "runs" / method.name / f"seed{r['seed']}"
                geometry["best"].append(gare_geometry(load_model(run_dir / "best.pt")[0], cfg))
            for when, rows in geometry.items():
                entry[when]["gare"] = {k: interval([row[k] for row in rows]) for k in rows[0]}
        entry["test_t2v_R1"] = interval([r["test"]["t2v"]["R1"] for r in runs])
        entry["test_v2t_R1"] = interval([r["test"]["v2t"]["R1"] for r in runs])
        per_method[method.name] = entry
    report["methods"] = per_method
    report["command"] = " ".join(["python", *sys.argv])
    report["provenance"] = copy.deepcopy(results["provenance"])
    atomic_write_json(args.out, report)
    print(json.dumps({m: {w: e[w]["video_to_text"]["mean"] for w in ("init", "best")} for m, e in per_method.items()}))


if __name__ == "__main__":
    main()
