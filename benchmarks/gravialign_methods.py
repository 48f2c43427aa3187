"""Does GraviAlign help retrieval? Every inference mode of trained GraviAlign variants on a synthetic test set ten
times the demo's, against controls, over several seeds.

Each variant trains the demo's model (a random tiny CLIP of the real architecture from scratch, seqTransf, lr 1e-3,
batch 32, grad clip 1.0, one compute thread; ``tvr.bench.demo.demo_config``, whose head options the variant's replace:
"alpha_0" is the head's defaults with α = 0, and so on) on a synthetic set of ``--videos`` videos of which ``--test``
form the test split (default 540 / 300: the demo trains on ~210 and tests on 30). The last checkpoint of each run is
then scored on the test split under every mode at once, from one encoding:

* ``cos_f`` (the CLIP score), ``cos_mu``, ``s_align``, ``mixed`` at every ``mixed_weights`` value;
* ``ln_control``: cos(norm(LN(f_t)), norm(LN(f_v))) — a parameter-free LayerNorm of the same features, the starting
  point of μ (W_μ = I, b_μ = 0), to tell what the μ heads learned from what the LayerNorm alone does;
* ``B+C``, ``A``: S_align with only those terms, on the learned Gaussians;

plus how often the exact S_align top-1 of a text lies in the top-10 of a cosine shortlist, by μ and by f (two-stage
scoring's recall). Results per run; per variant and mode the mean ± std over seeds and, since a seed moves every mode
of a run together, the paired difference to ``cos_f`` of the same run (mean, min, max over seeds).

    .venv/bin/python benchmarks/gravialign_methods.py                        # writes
        benchmarks/results/gravialign_methods.json (hours on a busy 2-core machine: 15 epochs per run)
    .venv/bin/python benchmarks/gravialign_methods.py --variants alpha_0,contrastive --seeds 0 --epochs 1  # smoke
    .venv/bin/python benchmarks/gravialign_methods.py --summarise benchmarks/results/gravialign_methods.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gravialign_methods.json"

#: head options per variant (on top of the head's defaults: α = 0.1, ε = 1e-6, positive objective, centre A)
VARIANTS: dict[str, dict] = {
    # no L_SGI at all: the Gaussian heads never learn (zero gradient); μ = norm(LN(f)) up to the init
    "alpha_0": {"alpha": 0.0},
    # the demo's options: the spec's objective with α and ε chosen so it trains from scratch
    "demo": {"alpha": 0.01, "eps": 1e-2},
    # tvr/methods/gravialign/presets/ablations/guarded.yaml
    "guarded": {"eps": 1e-2, "sgi_to_backbone": False},
    # tvr/methods/gravialign/presets/ablations/soft_a.yaml (A at the expected whitened sample distance)
    "soft_a": {"a_distance": "expected"},
    # tvr/methods/gravialign/presets/ablations/contrastive.yaml (L_SGI-NCE)
    "contrastive": {"sgi_objective": "contrastive"},
    "contrastive+soft_a": {"sgi_objective": "contrastive", "a_distance": "expected"},
    "contrastive_bc": {"sgi_objective": "contrastive", "terms": "BC"},
}
METRICS = ("R1", "R5", "R10", "MnR")


def ranks(sim, text_video) -> dict:  # noqa: ANN001
    from tvr.eval.protocol import evaluate

    return {k: round(float(v), 3) for k, v in evaluate(sim, text_video, "one_to_one")["t2v"].items() if k in METRICS}


def score_every_mode(run: Path) -> dict:
    """Every mode (and the controls) of ``run``'s last checkpoint on the test split."""
    import torch
    import torch.nn.functional as F

    from tvr.data.annotations import load_split
    from tvr.data.tokenizer import build_tokenizer
    from tvr.eval.runner import encode_split_raw
    from tvr.methods.gravialign.scoring import s_align_scores
    from tvr.models.checkpoint import load_model
    from tvr.models.run_spec import resolve_run

    model, cfg = load_model(run / "last.pt")
    model.eval()
    tokenizer = build_tokenizer(resolve_run(cfg).tokenizer, run)
    encoded = encode_split_raw(model, load_split(cfg.data, "test"), tokenizer, cfg, torch.device("cpu"))
    head = model.head
    with torch.no_grad():
        ts, vs = head.encode_texts(encoded.text), head.encode_videos(encoded.video)
        components = head.score_components(ts, vs)  # cos_f, cos_mu, s_align (every candidate's)
        out = {
            "cos_f": ranks(components["cos_f"], encoded.text_video),
            "cos_mu": ranks(components["cos_mu"], encoded.text_video),
            "s_align": ranks(components["s_align"], encoded.text_video),
        }
        for w in dict.fromkeys(head.options.mixed_weights):
            out[f"mixed_{w:g}"] = ranks(head.combine_scores(components, {"mode": "mixed", "w": w}), encoded.text_video)
        dim = ts.f.shape[1]
        ln_t = F.normalize(F.layer_norm(ts.f, (dim,)), dim=-1)
        ln_v = F.normalize(F.layer_norm(vs.f, (dim,)), dim=-1)
        out["ln_control"] = ranks(ln_t @ ln_v.T, encoded.text_video)
        kwargs = head.sgi_kwargs()
        for terms in ("BC", "A"):
            part = s_align_scores(vs.mu, vs.logvar, ts.mu, ts.logvar, **{**kwargs, "terms": terms})
            out[terms.replace("BC", "B+C")] = ranks(part, encoded.text_video)
        exact_top1 = components["s_align"].argmax(dim=1, keepdim=True)
        shortlist = {}
        for name in ("cos_mu", "cos_f"):
            top10 = components[name].topk(min(10, components[name].shape[1]), dim=1).indices
            shortlist[name.replace("cos_", "")] = round(float((top10 == exact_top1).any(dim=1).float().mean()), 4)
    logvar = {"text": round(float(ts.logvar.mean()), 3), "video": round(float(vs.logvar.mean()), 3)}
    return {
        "modes": out,
        "shortlist_top10_holds_exact_top1": shortlist,
        "mean_logvar": logvar,
        "test_texts": len(encoded.text),
        "test_videos": len(encoded.video),
    }


def summarise(runs: list[dict]) -> dict:
    """Per variant and mode: mean ± std over seeds of R@1 and MnR, and — the comparison that matters, since the seed
    moves every mode of a run together — the paired difference to ``cos_f`` of the same run (mean, min, max over
    seeds; MnR: negative is better than cos_f, R@1: positive is better); plus the shortlist rates."""
    table: dict[str, dict] = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == variant and "modes" in r]
        if not mine:
            continue
        modes = {}
        for mode in mine[0]["modes"]:
            modes[mode] = {}
            for metric in ("R1", "MnR"):
                values = [r["modes"][mode][metric] for r in mine]
                diffs = [r["modes"][mode][metric] - r["modes"]["cos_f"][metric] for r in mine]
                modes[mode][metric] = {
                    "mean": round(statistics.fmean(values), 2),
                    "std": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
                    "minus_cos_f": {
                        "mean": round(statistics.fmean(diffs), 2),
                        "min": round(min(diffs), 2),
                        "max": round(max(diffs), 2),
                    },
                }
        rates = {
            k: round(statistics.fmean(r["shortlist_top10_holds_exact_top1"][k] for r in mine), 4) for k in ("mu", "f")
        }
        table[variant] = {"seeds": [r["seed"] for r in mine], "modes": modes, "shortlist_top10_holds_exact_top1": rates}
        # the backbone each variant trained, against no L_SGI at all: cos_f MnR minus alpha_0's at the same seed
        reference = {r["seed"]: r["modes"]["cos_f"]["MnR"] for r in runs if r["variant"] == "alpha_0" and "modes" in r}
        paired = [r["modes"]["cos_f"]["MnR"] - reference[r["seed"]] for r in mine if r["seed"] in reference]
        if paired:
            table[variant]["cos_f_MnR_minus_alpha_0"] = {
                "mean": round(statistics.fmean(paired), 2),
                "min": round(min(paired), 2),
                "max": round(max(paired), 2),
            }
    return table


def print_table(summary: dict) -> None:
    """MnR of every mode minus cos_f's (mean over seeds, [min, max]) and cos_f's own MnR, per variant."""
    modes = [m for m in next(iter(summary.values()))["modes"] if m != "cos_f"] if summary else []
    print("variant".ljust(20) + "cos_f MnR".rjust(12) + "vs alpha_0".rjust(20) + "".join(m.rjust(20) for m in modes))
    for variant, row in summary.items():
        line = variant.ljust(20) + f"{row['modes']['cos_f']['MnR']['mean']:12.1f}"
        ref = row.get("cos_f_MnR_minus_alpha_0")
        line += (f"{ref['mean']:+8.1f} [{ref['min']:+.1f},{ref['max']:+.1f}]" if ref else "").rjust(20)
        for m in modes:
            d = row["modes"][m]["MnR"]["minus_cos_f"]
            line += f"{d['mean']:+8.1f} [{d['min']:+.1f},{d['max']:+.1f}]".rjust(20)
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated among {list(VARIANTS)}")
    parser.add_argument("--seeds", default="0,1,2", help="train.seed values, comma-separated")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--videos", type=int, default=540)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--data", default="", help="synthetic data folder to reuse or create (default: a temp dir)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--summarise", metavar="JSON", help="recompute the summary of an earlier result file (no runs)")
    args = parser.parse_args()
    if args.summarise:
        from tvr.utils.io import atomic_write_json

        result = json.loads(Path(args.summarise).read_text())
        result["summary"] = summarise(result["runs"])
        atomic_write_json(args.summarise, result)
        print_table(result["summary"])
        return
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose among {list(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]

    import torch

    from tvr.bench.demo import demo_config
    from tvr.bench.synthetic import SynthConfig, generate_synthetic_dataset
    from tvr.pipeline import resolve_config, run_train
    from tvr.utils.io import atomic_write_json

    command = f"cd {REPO} && .venv/bin/python benchmarks/gravialign_methods.py " + " ".join(sys.argv[1:])
    load_start = os.getloadavg()
    runs: list[dict] = []

    def write() -> None:
        atomic_write_json(
            args.out,
            {
                "benchmark": "GraviAlign variants: every inference mode on a synthetic test set, several seeds",
                "command": command,
                "epochs": args.epochs,
                "videos": args.videos,
                "test_videos": args.test,
                "torch": torch.__version__,
                "loadavg_start": [round(x, 2) for x in load_start],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                "variants": {n: VARIANTS[n] for n in names},
                "summary": summarise(runs),
                "runs": runs,
            },
        )

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "data"
        if not (data / "MSRVTT_data.json").is_file():
            generate_synthetic_dataset(data, SynthConfig(num_videos=args.videos, num_test=args.test))
        for seed in seeds:
            for name in names:
                cfg = demo_config(data, method="gravialign")
                cfg.train.epochs = args.epochs
                cfg.train.seed = seed
                cfg.head.options = dict(VARIANTS[name])
                cfg = resolve_config(cfg)
                run = Path(tmp) / f"{name}_{seed}"
                start = time.perf_counter()
                run_train(cfg, run, overwrite=True, final_test=False)
                train = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
                last = ([r for r in train if r.get("kind") == "train"] or [{}])[-1]
                row = {
                    "variant": name,
                    "seed": seed,
                    "train_seconds": round(time.perf_counter() - start, 1),
                    "last_train_step": {
                        k: last[k]
                        for k in ("loss", "infonce", "sgi", "term_A", "term_B", "term_C", "logvar_text", "logvar_video")
                        if k in last
                    },
                }
                row.update(score_every_mode(run))
                runs.append(row)
                print(json.dumps(row), flush=True)
                write()
    write()
    print_table(summarise(runs))


if __name__ == "__main__":
    main()
