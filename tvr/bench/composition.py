"""What an evaluation split of a synthetic set asks of a model: its gallery, its queries, its hard and false negatives.

A validation split chooses checkpoints and inference settings for the test split, so it must pose the test's task:
the same kind of query (the full caption, or a partial one), the same share of videos whose temporal twin — the hard
negative that differs only in time — is in the gallery, and the same share of queries whose caption also fits
another gallery video (a false negative). :func:`split_composition` measures these on the split exactly as the data
readers load it, from the ground truth ``tvr synth`` records in ``synth_meta.json``; :func:`composition_gaps` names
the measures on which two splits differ by more than a tolerance.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tvr.config import DataConfig
from tvr.utils.data_files import read_json

#: the shares compared between validation and test, and what each counts
SHARES: dict[str, str] = {
    "full_caption_share": "queries that are their video's full caption (naming every attribute)",
    "twin_share": "gallery videos whose temporal twin is in the same gallery",
    "false_negative_share": "queries whose caption attributes another gallery video shares",
}
#: the largest difference in any share between validation and test that a bench accepts without being asked
TOLERANCE = 0.05


def split_composition(cfg: DataConfig, split: str) -> dict[str, Any] | None:
    """Gallery size, query count and :data:`SHARES` of ``split`` as :func:`tvr.data.annotations.load_split` reads
    it; None when the annotation folder holds no ``synth_meta.json`` (not a synthetic set: no ground truth)."""
    from tvr.data.annotations import load_split

    folder = Path(cfg.annotations)
    meta_path = folder / "synth_meta.json"
    if not meta_path.is_file():
        return None
    meta = {v["video_id"]: v for v in read_json(meta_path)["videos"]}
    captions: dict[str, list[str]] = {}
    for sentence in read_json(folder / "MSRVTT_data.json")["sentences"]:
        captions.setdefault(sentence["video_id"], []).append(sentence["caption"])
    loaded = load_split(cfg, split)
    gallery = set(loaded.videos)
    keys = Counter(tuple(meta[v]["caption_key"]) for v in loaded.videos)
    queries = [(text, loaded.videos[k]) for text, k in zip(loaded.texts, loaded.text_video, strict=True)]
    twins = [meta[v]["twin"] for v in loaded.videos]
    n_videos, n_queries = len(loaded.videos), max(len(queries), 1)
    return {
        "videos": n_videos,
        "queries": len(queries),
        "full_caption_share": sum(text == captions[v][meta[v]["full_caption"]] for text, v in queries) / n_queries,
        "twin_share": sum(t is not None and t in gallery for t in twins) / max(n_videos, 1),
        "false_negative_share": sum(keys[tuple(meta[v]["caption_key"])] > 1 for _, v in queries) / n_queries,
        # a twin outside the gallery is usually in training: the hard negative this split should hold is learnt
        "twins_in_other_splits": sum(t is not None and t not in gallery for t in twins),
    }


def composition_gaps(val: dict[str, Any], test: dict[str, Any], tolerance: float = TOLERANCE) -> list[str]:
    """The :data:`SHARES` on which ``val`` and ``test`` differ by more than ``tolerance``, as ``name val vs test``."""
    return [
        f"{name} {val[name]:.2f} vs {test[name]:.2f}"
        for name in SHARES
        if abs(val[name] - test[name]) > tolerance + 1e-12
    ]


__all__ = ["SHARES", "TOLERANCE", "composition_gaps", "split_composition"]
