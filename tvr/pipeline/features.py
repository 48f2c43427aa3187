"""``tvr features``: encode every video and caption of some splits with the frozen backbone into a feature cache.

The cache format and its reader live in :mod:`tvr.data.feature_cache`; this job needs the model layer (backbone,
tokenizer), so it sits with the other pipeline jobs.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tvr.config import Config, config_to_dict
from tvr.data.annotations import known_splits, load_split
from tvr.data.datasets import VideoDataset, VideoResolver, collate_videos
from tvr.data.feature_cache import (
    CACHE_FORMAT,
    MANIFEST,
    FeatureCacheError,
    cache_settings,
    check_cache_settings,
    read_manifest,
)
from tvr.data.tokenizer import TOKENIZER_FOLDER, build_tokenizer
from tvr.models.build import build_backbone, check_data_fits_backbone, check_image_size
from tvr.models.run_spec import RunSpec, resolve_run
from tvr.pipeline.run_folder import StartUndo
from tvr.train.utils import seed_everything
from tvr.utils.device import resolve_device
from tvr.utils.errors import first_line
from tvr.utils.io import atomic_torch_save, atomic_write_json, remove_stale_temporaries
from tvr.utils.lock import folder_lock
from tvr.utils.parallel import loader_workers
from tvr.utils.progress import progress_bar
from tvr.utils.torch_files import load_torch_file

log = logging.getLogger(__name__)

#: the shard files of one split: ``<split>/videos-00000.pt``, ``<split>/texts-00000.pt``
_SHARD = re.compile(r"^(videos|texts)-\d{5}\.pt$")


def build_feature_cache(
    cfg: Config,
    out_dir: str | Path,
    splits: list[str],
    shard_size: int = 1024,
    dtype: torch.dtype = torch.float16,
    progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Encode every video and caption of ``splits`` with the frozen backbone of ``cfg`` and write shards (a
    two-tower backbone stores tower features: the bridge runs on them at training time).

    The manifest, holding every setting that decides what the cache holds (:func:`cache_settings`), is written
    before the first shard; rerunning resumes an interrupted cache only with the same settings. ``overwrite``
    removes an earlier cache's manifest and shards first. One job per cache folder (a lock)."""
    if shard_size < 1:
        raise FeatureCacheError(f"--shard-size {shard_size}: expected a positive number of items per shard")
    unknown = [s for s in splits if s not in known_splits()]
    if unknown or not splits:
        raise FeatureCacheError(f"--splits {','.join(splits)}: expected some of {', '.join(known_splits())}")
    run = resolve_run(cfg)
    check_image_size(run)
    check_data_fits_backbone(run)
    out_dir = Path(out_dir)
    # a start that fails before its first shard (a missing annotation folder, a backbone that does not build) leaves
    # the folder as it found it, so the corrected rerun is not refused as "started with other settings"
    undo = StartUndo(
        out_dir,
        created_folder=not out_dir.exists(),
        files=(MANIFEST,),
        folders=(TOKENIZER_FOLDER, *known_splits()),
        rewritten=(MANIFEST,),
        work="its first feature shard",
    )
    # entered before the lock, so it runs after the lock is released (and its file gone)
    with undo, folder_lock(out_dir, "feature cache"):
        return _build(run, out_dir, splits, shard_size, dtype, progress, overwrite, undo)


def _shard_files(out_dir: Path) -> list[Path]:
    folders = [out_dir / split for split in known_splits() if (out_dir / split).is_dir()]
    return [p for folder in folders for p in sorted(folder.iterdir()) if _SHARD.match(p.name)]


def _earlier_shard(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return load_torch_file(path, mmap=True)
    except Exception as exc:  # noqa: BLE001 - a damaged shard is encoded again
        why = getattr(exc, "detail", None) or getattr(exc, "reason", None) or first_line(exc)  # without the path
        log.warning("feature shard %s is unreadable (%s); encoding it again", path, why)
        return None


@torch.no_grad()
def _build(
    run: RunSpec,
    out_dir: Path,
    splits: list[str],
    shard_size: int,
    dtype: torch.dtype,
    progress: bool,
    overwrite: bool,
    undo: StartUndo,
) -> dict:
    manifest_path = out_dir / MANIFEST
    cfg = run.config
    settings = cache_settings(cfg, run.features, shard_size, dtype)
    manifest = _open_manifest(cfg, out_dir, splits, settings, overwrite, undo)
    encoder = _ShardEncoder.build(run, out_dir, dtype)
    manifest["embed_dim"] = encoder.backbone.embed_dim
    manifest["frame_dim"] = encoder.frame_dim
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
        for name, start in _shards(split, "videos", len(data.videos), shard_size, progress):
            path = out_dir / name
            shard = _earlier_shard(path)  # written by an earlier, interrupted run (same settings: checked above)
            if shard is None:
                end = start + shard_size
                shard = encoder.video_shard(data.videos[start:end], data.video_spans[start:end])
                undo.keep()  # features are being written: from here on a failure is resumed, not undone
                atomic_torch_save(shard, path)
            entry["video_shards"].append(name)
            entry["skipped"].extend(shard["skipped"])
            entry["num_videos"] += len(shard["ids"])
        for name, start in _shards(split, "texts", len(data.texts), shard_size, progress):
            path = out_dir / name
            if not path.is_file():
                shard = encoder.text_shard(data.texts[start : start + shard_size])
                undo.keep()
                atomic_torch_save(shard, path)
            entry["text_shards"].append(name)
        entry["complete"] = True
        atomic_write_json(manifest_path, manifest)
    atomic_write_json(manifest_path, manifest)
    return manifest


def _open_manifest(
    cfg: Config, out_dir: Path, splits: list[str], settings: dict, overwrite: bool, undo: StartUndo
) -> dict:
    """The cache's manifest, written back with ``splits`` marked incomplete: a new one, or the one an earlier run
    with the same ``settings`` left (``overwrite`` removes it and its shards first). ``undo`` records the folder
    as this start found it (after ``overwrite``), before anything of this start is written."""
    manifest_path = out_dir / MANIFEST
    if overwrite:
        for path in [manifest_path, *_shard_files(out_dir)]:
            path.unlink(missing_ok=True)
    for folder in [out_dir, *(out_dir / split for split in known_splits())]:
        remove_stale_temporaries(folder)  # writes of a killed run
    undo.record()
    if manifest_path.is_file():
        manifest = read_manifest(out_dir)
        check_cache_settings(out_dir, manifest, settings)
    elif _shard_files(out_dir):
        raise FeatureCacheError(
            f"{out_dir} holds feature shards but no {MANIFEST}, so what made them is unknown: pass --overwrite to "
            "rebuild the cache, or use another --out"
        )
    else:
        manifest = {"format": CACHE_FORMAT, "config": config_to_dict(cfg), "settings": settings, "splits": {}}
    for split in splits:  # a split being (re)built is incomplete until its last shard is written
        if split in manifest["splits"]:
            manifest["splits"][split]["complete"] = False
    atomic_write_json(manifest_path, manifest)  # first: every shard written from here on has its settings on record
    return manifest


def _shards(split: str, kind: str, count: int, shard_size: int, progress: bool) -> Iterator[tuple[str, int]]:
    """(file name, first item) of each shard of ``count`` items, under a progress bar."""
    starts = range(0, count, shard_size)
    for start in progress_bar(starts, f"{split}: {kind}", enabled=progress, total=len(starts)):
        yield f"{split}/{kind}-{start // shard_size:05d}.pt", start


@dataclasses.dataclass
class _ShardEncoder:
    """The frozen backbone of a cache and what its shards are stored in."""

    cfg: Config
    backbone: torch.nn.Module
    tokenizer: Callable[[list[str], int], tuple[torch.Tensor, torch.Tensor]]
    resolver: VideoResolver
    device: torch.device
    dtype: torch.dtype
    #: a two-tower backbone's frame features are image-tower features (their own width; the bridge maps them)
    frame_dim: int

    @classmethod
    def build(cls, run: RunSpec, out_dir: Path, dtype: torch.dtype) -> _ShardEncoder:
        cfg = run.config
        device = resolve_device(cfg.train.device)
        # seeded like training, so a randomly initialised ("tiny") backbone is the same one a run would build
        seed_everything(cfg.train.seed)
        backbone = build_backbone(run).to(device).eval()
        backbone.maybe_half(device)
        frame_dim = getattr(backbone, "image_width", backbone.embed_dim)
        tokenizer = build_tokenizer(run.tokenizer, out_dir)
        return cls(cfg, backbone, tokenizer, VideoResolver.from_config(cfg.data), device, dtype, frame_dim)

    def video_shard(self, ids: list[str], spans: list) -> dict:
        """Frame features (and proxies, where the backbone has them) of the readable videos of ``ids``; the
        unreadable ones are listed under ``skipped`` with their errors."""
        cfg, dtype = self.cfg, self.dtype
        loader = torch.utils.data.DataLoader(
            VideoDataset(ids, spans, self.resolver, cfg.data),
            batch_size=cfg.eval.batch_size,
            num_workers=loader_workers(cfg.data.num_workers),
            collate_fn=collate_videos,
        )
        kept, frames, masks, proxies, skipped = [], [], [], [], []
        for batch in loader:
            skipped.extend({"id": i, "error": e} for i, e in zip(batch["skipped"], batch["errors"], strict=True))
            if len(batch["video_ids"]) == 0:
                continue
            feats = self.backbone.encode_video(batch["video"].to(self.device), batch["video_mask"].to(self.device))
            frames.append(feats.frames.float().cpu().to(dtype))
            masks.append(feats.frame_mask.cpu())
            if feats.proxies is not None:
                proxies.append(feats.proxies.float().cpu().to(dtype))
            kept.extend(batch["video_ids"])
        shard = {
            "ids": kept,
            "frames": torch.cat(frames) if frames else torch.zeros(0, cfg.data.max_frames, self.frame_dim, dtype=dtype),
            "mask": torch.cat(masks) if masks else torch.zeros(0, cfg.data.max_frames, dtype=torch.long),
            "skipped": skipped,
        }
        if proxies:
            shard["proxies"] = torch.cat(proxies)
        return shard

    def text_shard(self, texts: list[str]) -> dict:
        """End-of-text and per-word features of ``texts`` (with the word mask)."""
        batch_size, dtype = self.cfg.eval.batch_size, self.dtype
        eots, words, word_masks = [], [], []
        for b in range(0, len(texts), batch_size):
            ids, mask = self.tokenizer(texts[b : b + batch_size], self.cfg.data.max_words)
            feats = self.backbone.encode_text(ids.to(self.device), mask.to(self.device))
            eots.append(feats.eot.float().cpu().to(dtype))
            words.append(feats.words.float().cpu().to(dtype))
            word_masks.append(mask.cpu())
        return {"texts": texts, "eot": torch.cat(eots), "words": torch.cat(words), "word_mask": torch.cat(word_masks)}
