"""Frozen-backbone feature cache (``tvr features``).

Layout of a cache folder::

    manifest.json                     what was encoded (model, data settings, splits, shard lists, skipped videos)
    <split>/videos-00000.pt           {"ids": [...], "frames": [n, F, D], "mask": [n, F]}
    <split>/texts-00000.pt            {"texts": [...], "eot": [n, D], "words": [n, L, D], "word_mask": [n, L]}

Every shard is written atomically, so an interrupted run resumes by skipping the shards that exist. Training
on the cache trains only the temporal module and the head; augmentation is not possible (features are fixed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tvr.config import Config, config_to_dict
from tvr.utils.io import atomic_torch_save, atomic_write_json

MANIFEST = "manifest.json"
CACHE_FORMAT = 1


@dataclass
class CachedSplit:
    """All cached features of one split, loaded memory-mapped."""

    video_ids: list[str]
    frames: Tensor  # [N_v, F, D]
    frame_mask: Tensor  # [N_v, F]
    texts: list[str]
    eot: Tensor  # [N_t, D]
    words: Tensor  # [N_t, L, D]
    word_mask: Tensor  # [N_t, L]


def _shards(paths: list[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        try:
            yield torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - re-raised with the file named
            raise RuntimeError(
                f"feature cache shard {path} is unreadable ({exc}); delete it and rerun tvr features"
            ) from exc


def read_manifest(cache_dir: str | Path) -> dict:
    path = Path(cache_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a tvr feature cache (run `tvr features --config ... --out {cache_dir}`)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != CACHE_FORMAT:
        raise ValueError(f"{path}: cache format {manifest.get('format')!r}, expected {CACHE_FORMAT}")
    return manifest


def load_cached_split(cache_dir: str | Path, split: str) -> CachedSplit:
    cache_dir = Path(cache_dir)
    manifest = read_manifest(cache_dir)
    info = manifest["splits"].get(split)
    if info is None or not info.get("complete"):
        raise FileNotFoundError(
            f"{cache_dir}: split {split!r} is not (completely) cached; cached: "
            f"{[k for k, v in manifest['splits'].items() if v.get('complete')]}"
        )
    video_parts = list(_shards([cache_dir / p for p in info["video_shards"]]))
    text_parts = list(_shards([cache_dir / p for p in info["text_shards"]]))
    return CachedSplit(
        video_ids=[i for part in video_parts for i in part["ids"]],
        frames=torch.cat([p["frames"] for p in video_parts]),
        frame_mask=torch.cat([p["mask"] for p in video_parts]),
        texts=[t for part in text_parts for t in part["texts"]],
        eot=torch.cat([p["eot"] for p in text_parts]),
        words=torch.cat([p["words"] for p in text_parts]),
        word_mask=torch.cat([p["word_mask"] for p in text_parts]),
    )


def check_cache_matches(cfg: Config, manifest: dict) -> None:
    """Refuse to train on a cache made with other frame/word settings or another backbone."""
    made = manifest["config"]
    for section, key in (
        ("model", "clip"),
        ("data", "max_frames"),
        ("data", "max_words"),
        ("data", "sampling"),
        ("data", "frame_rate"),
        ("data", "image_size"),
        ("data", "dataset"),
    ):
        if made[section][key] != getattr(getattr(cfg, section), key):
            raise ValueError(
                f"feature cache was made with {section}.{key}={made[section][key]!r} but the run asks for "
                f"{getattr(getattr(cfg, section), key)!r}; rebuild the cache or change the config"
            )


@torch.no_grad()
def build_feature_cache(
    cfg: Config,
    out_dir: str | Path,
    splits: list[str],
    shard_size: int = 1024,
    dtype: torch.dtype = torch.float16,
    progress: bool = True,
) -> dict:
    """Encode every video and caption of ``splits`` with the frozen CLIP of ``cfg`` and write shards."""
    from tvr.data.annotations import load_split
    from tvr.data.datasets import VideoDataset, VideoResolver, collate_videos
    from tvr.models.build import build_tokenizer
    from tvr.models.clip_backbone import ClipBackbone
    from tvr.train.utils import seed_everything
    from tvr.utils.progress import progress_bar

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / MANIFEST
    if manifest_path.is_file():
        manifest = read_manifest(out_dir)
        check_cache_matches(cfg, manifest)
    else:
        manifest = {"format": CACHE_FORMAT, "config": config_to_dict(cfg), "splits": {}}
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.device in ("auto", "cuda") else "cpu")
    # seeded like training, so a randomly initialised ("tiny") backbone is the same one a run would build
    seed_everything(cfg.train.seed)
    backbone = ClipBackbone.from_config(cfg.model).to(device).eval()
    backbone.maybe_half(device)
    manifest["embed_dim"] = backbone.embed_dim
    tokenizer = build_tokenizer(cfg, out_dir)
    resolver = VideoResolver.from_config(cfg.data)

    for split in splits:
        data = load_split(cfg.data, split)
        (out_dir / split).mkdir(exist_ok=True)
        entry = {
            "video_shards": [],
            "text_shards": [],
            "skipped": [],
            "complete": False,
            "num_videos": 0,
            "num_texts": len(data.texts),
        }
        manifest["splits"][split] = entry
        # videos
        for start in progress_bar(
            range(0, len(data.videos), shard_size),
            f"{split}: videos",
            enabled=progress,
            total=-(-len(data.videos) // shard_size),
        ):
            name = f"{split}/videos-{start // shard_size:05d}.pt"
            path = out_dir / name
            if path.is_file():  # written by an earlier, interrupted run
                shard = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            else:
                ids = data.videos[start : start + shard_size]
                spans = data.video_spans[start : start + shard_size]
                dataset = VideoDataset(ids, spans, resolver, cfg.data)
                loader = torch.utils.data.DataLoader(
                    dataset, batch_size=cfg.eval.batch_size, num_workers=cfg.data.num_workers, collate_fn=collate_videos
                )
                kept, frames, masks, skipped = [], [], [], []
                for batch in loader:
                    skipped.extend(
                        {"id": i, "error": e} for i, e in zip(batch["skipped"], batch["errors"], strict=True)
                    )
                    if len(batch["video_ids"]) == 0:
                        continue
                    feats = backbone.encode_frames(batch["video"].to(device))
                    frames.append(feats.float().cpu().to(dtype))
                    masks.append(batch["video_mask"].cpu())
                    kept.extend(batch["video_ids"])
                shard = {
                    "ids": kept,
                    "frames": torch.cat(frames)
                    if frames
                    else torch.zeros(0, cfg.data.max_frames, backbone.embed_dim, dtype=dtype),
                    "mask": torch.cat(masks) if masks else torch.zeros(0, cfg.data.max_frames, dtype=torch.long),
                    "skipped": skipped,
                }
                atomic_torch_save(shard, path)
            entry["video_shards"].append(name)
            entry["skipped"].extend(shard["skipped"])
            entry["num_videos"] += len(shard["ids"])
        # texts
        for start in progress_bar(
            range(0, len(data.texts), shard_size),
            f"{split}: texts",
            enabled=progress,
            total=-(-len(data.texts) // shard_size),
        ):
            name = f"{split}/texts-{start // shard_size:05d}.pt"
            path = out_dir / name
            if not path.is_file():
                chunk = data.texts[start : start + shard_size]
                eots, words, word_masks = [], [], []
                for b in range(0, len(chunk), cfg.eval.batch_size):
                    ids, mask = tokenizer(chunk[b : b + cfg.eval.batch_size], cfg.data.max_words)
                    feats = backbone.encode_text(ids.to(device), mask.to(device))
                    eots.append(feats.eot.float().cpu().to(dtype))
                    words.append(feats.words.float().cpu().to(dtype))
                    word_masks.append(mask.cpu())
                atomic_torch_save(
                    {
                        "texts": chunk,
                        "eot": torch.cat(eots),
                        "words": torch.cat(words),
                        "word_mask": torch.cat(word_masks),
                    },
                    path,
                )
            entry["text_shards"].append(name)
        entry["complete"] = True
        atomic_write_json(manifest_path, manifest)
    atomic_write_json(manifest_path, manifest)
    return manifest


class CachedPairDataset(torch.utils.data.Dataset):
    """Training pairs (caption k, its video) served from a feature cache.

    Captions whose video was skipped while caching (unreadable file) are left out and listed in ``skipped``.
    """

    def __init__(self, cached: CachedSplit, text_video_ids: list[str]) -> None:
        if len(text_video_ids) != len(cached.texts):
            raise ValueError(f"cache holds {len(cached.texts)} captions but the split has {len(text_video_ids)}")
        index = {vid: k for k, vid in enumerate(cached.video_ids)}
        self.cached = cached
        self.pairs = [(t, index[v]) for t, v in enumerate(text_video_ids) if v in index]
        self.skipped = sorted({v for v in text_video_ids if v not in index})

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, k: int) -> dict[str, Any]:
        t, v = self.pairs[k]
        c = self.cached
        return {
            "text_eot": c.eot[t].float(),
            "text_words": c.words[t].float(),
            "text_word_mask": c.word_mask[t],
            "frame_feats": c.frames[v].float(),
            "video_mask": c.frame_mask[v],
            "video_id": c.video_ids[v],
            "caption": c.texts[t],
        }


def collate_cached(items: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "video_ids": [i["video_id"] for i in items],
        "captions": [i["caption"] for i in items],
        "skipped": [],
        "errors": [],
    }
    for key in ("text_eot", "text_words", "text_word_mask", "frame_feats", "video_mask"):
        out[key] = torch.stack([i[key] for i in items])
    return out
