"""Frozen-backbone feature cache (``tvr features``).

Layout of a cache folder::

    manifest.json                     what was encoded (model, data settings, splits, shard lists, skipped videos)
    <split>/videos-00000.pt           {"ids": [...], "frames": [n, F, D], "mask": [n, F] (, "proxies": [n, M, D])}
    <split>/texts-00000.pt            {"texts": [...], "eot": [n, D], "words": [n, L, D], "word_mask": [n, L]}

Every shard is written atomically, so an interrupted run resumes by skipping the shards that exist. Training
on the cache trains only the temporal module and the head; augmentation is not possible (features are fixed).
This module holds the format and the reader; encoding a cache is a pipeline job (``tvr.pipeline.features``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tvr.config import Config
from tvr.utils.data_files import read_json
from tvr.utils.errors import UserError, reason
from tvr.utils.pickle_scan import PickleRefusedError
from tvr.utils.torch_files import TorchFileError, load_torch_file

MANIFEST = "manifest.json"


class FeatureCacheError(UserError, ValueError):
    """A feature cache folder is missing, damaged, or was made with other settings than the run asks for."""


CACHE_FORMAT = 1
#: the data settings that decide what a cache holds, with those the dataset formats declare (a resolved config's
#: ``data.train_split``, ``data.generic_file``, …); with the backbone's (:class:`FeatureIdentity`) its manifest
#: records them before the first shard is written, and ``tvr features`` resumes a cache only with the same values
#: (else shards of two models or two shardings mix)
FEATURE_DATA_SETTINGS = (
    "data.dataset",
    "data.annotations",
    "data.video_dir",
    "data.video_pattern",
    "data.allow_outside_video_dir",
    "data.val_fraction",
    "data.val_seed",
    "data.max_words",
    "data.max_frames",
    "data.frame_rate",
    "data.image_size",
    "data.sampling",
    "data.limit_train",
    "data.limit_eval",
)
#: the data settings a run on a cache must share with the cache (a cache made before one existed: its default)
MATCHED_DATA_SETTINGS = (
    "data.max_frames",
    "data.max_words",
    "data.sampling",
    "data.frame_rate",
    "data.image_size",
    "data.dataset",
)


@dataclass(frozen=True)
class FeatureIdentity:
    """What a backbone's frozen features are a function of, as its folder declares it (``tvr.models.backbones``;
    a run's is ``tvr.models.run_spec.resolve_run(cfg).features``): ``settings`` (dotted model settings → their
    values, as a config file writes them), ``seeded`` (the backbone is randomly initialised, so ``train.seed``
    decides its features too) and ``matched`` (the dotted settings a run on a cache must share with it, each with
    the value a cache made before the setting existed was made with)."""

    settings: dict[str, Any]
    seeded: bool
    matched: tuple[tuple[str, Any, Any], ...]


def cache_settings(cfg: Config, identity: FeatureIdentity, shard_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """What a cache built by ``cfg`` (whose backbone's features are a function of ``identity``) with this sharding
    and storage type holds, as plain values (JSON)."""
    from tvr.config import config_to_dict

    data = config_to_dict(cfg.data)
    settings: dict[str, Any] = {"shard_size": int(shard_size), "dtype": str(dtype).removeprefix("torch.")}
    settings.update(identity.settings)
    settings.update({name: data[name.split(".")[1]] for name in FEATURE_DATA_SETTINGS})
    settings.update({f"data.{key}": data[key] for key in cfg.data.declared})
    if identity.seeded:
        settings["train.seed"] = cfg.train.seed
    return settings


def check_cache_settings(cache_dir: str | Path, manifest: dict, wanted: dict[str, Any]) -> None:
    """Refuse to add to a cache that was started with other settings (:func:`cache_settings`)."""
    made = manifest.get("settings")
    if not isinstance(made, dict):
        raise FeatureCacheError(
            f"{Path(cache_dir) / MANIFEST} does not record the settings the cache was built with (an older tvr?), so "
            "shards of another model or sharding cannot be told apart: pass --overwrite to rebuild it, or use "
            "another --out"
        )
    differ = [f"{k}: {made.get(k)!r} in the cache, {v!r} now" for k, v in wanted.items() if made.get(k) != v]
    if differ:
        shown = "; ".join(differ[:6]) + (f"; … ({len(differ)} in all)" if len(differ) > 6 else "")
        raise FeatureCacheError(
            f"feature cache {cache_dir} was started with other settings ({shown}); resuming would mix them: use the "
            "same settings, pass --overwrite to rebuild it, or use another --out"
        )


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
    proxies: Tensor | None = None  # [N_v, M, D] (backbones with video proxies)


def _shards(paths: list[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        try:
            shard = load_torch_file(path, mmap=True)
        except PickleRefusedError as exc:
            raise FeatureCacheError(f"feature cache shard {exc}; delete it and rerun tvr features") from None
        except TorchFileError as exc:
            raise FeatureCacheError(
                f"feature cache shard {path} is unreadable ({exc.detail}); delete it and rerun tvr features"
            ) from exc
        yield shard


def read_manifest(cache_dir: str | Path) -> dict:
    path = Path(cache_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a tvr feature cache (run `tvr features --config ... --out {cache_dir}`)")
    try:
        manifest = read_json(path)
    except (ValueError, OSError) as exc:
        raise FeatureCacheError(
            f"{path}: damaged ({reason(exc)}); rebuild the cache (tvr features ... --overwrite)"
        ) from None
    if (
        not isinstance(manifest, dict)
        or not isinstance(manifest.get("splits"), dict)
        or not isinstance(manifest.get("config"), dict)
    ):
        raise FeatureCacheError(
            f"{path}: not a feature cache manifest (no splits / config); rebuild the cache "
            "(tvr features ... --overwrite)"
        )
    if manifest.get("format") != CACHE_FORMAT:
        raise FeatureCacheError(f"{path}: cache format {manifest.get('format')!r}, expected {CACHE_FORMAT}")
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
    no_videos = not any(len(p["ids"]) for p in video_parts)
    if no_videos or not any(len(p["texts"]) for p in text_parts):
        skipped = info.get("skipped") or []
        why = f" (all {len(skipped)} of its videos were unreadable when it was built)" if no_videos and skipped else ""
        raise FeatureCacheError(
            f"{cache_dir}: split {split!r} holds no {'video' if no_videos else 'caption'} features{why}; "
            "check the data (tvr check-data) and rebuild the cache"
        )
    # a shard whose videos were all unreadable holds no rows (and its placeholder shape need not match)
    filled = [p for p in video_parts if len(p["ids"])] or video_parts[:1]
    with_proxies = [p for p in filled if "proxies" in p]
    if with_proxies and len(with_proxies) != len(filled):
        raise FeatureCacheError(f"{cache_dir}: split {split!r} mixes shards with and without video proxies; rebuild it")
    return CachedSplit(
        video_ids=[i for part in video_parts for i in part["ids"]],
        frames=torch.cat([p["frames"] for p in filled]),
        frame_mask=torch.cat([p["mask"] for p in filled]),
        proxies=torch.cat([p["proxies"] for p in filled]) if with_proxies else None,
        texts=[t for part in text_parts for t in part["texts"]],
        eot=torch.cat([p["eot"] for p in text_parts]),
        words=torch.cat([p["words"] for p in text_parts]),
        word_mask=torch.cat([p["word_mask"] for p in text_parts]),
    )


def _recorded(made: dict, dotted: str, default: Any) -> Any:
    node: Any = made
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def check_cache_matches(cfg: Config, identity: FeatureIdentity, manifest: dict) -> None:
    """Refuse to train on a cache made with other frame/word settings or another backbone (the backbone names what
    of it must match: ``identity.matched``)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg.data)}
    data = [(name, getattr(cfg.data, name[5:]), defaults[name[5:]]) for name in MATCHED_DATA_SETTINGS]
    matched = [*identity.matched, *data]
    for name, wanted, default in matched:
        recorded = _recorded(manifest["config"], name, default)
        if recorded != wanted:
            raise FeatureCacheError(
                f"feature cache was made with {name}={recorded!r} but the run asks for {wanted!r}; rebuild the "
                "cache or change the config"
            )


class CachedPairDataset(torch.utils.data.Dataset):
    """Training pairs (caption k, its video) served from a feature cache.

    Captions whose video was skipped while caching (unreadable file) are left out and listed in ``skipped``.
    """

    def __init__(self, cached: CachedSplit, text_video_ids: list[str]) -> None:
        if len(text_video_ids) != len(cached.texts):
            raise FeatureCacheError(f"cache holds {len(cached.texts)} captions but the split has {len(text_video_ids)}")
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
            **({"video_proxies": c.proxies[v].float()} if c.proxies is not None else {}),
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
    for key in ("text_eot", "text_words", "text_word_mask", "frame_feats", "video_mask", "video_proxies"):
        if items and key in items[0]:
            out[key] = torch.stack([i[key] for i in items])
    return out
