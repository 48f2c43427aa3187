"""``tvr features``: the manifest is written first and holds every setting, so an interrupted cache resumes only
with the same settings (never mixing two shardings or two models) and ``--overwrite`` rebuilds it; a damaged
manifest, a bad ``--shard-size`` and a cache without features are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_end_to_end import make_msrvtt
from typer.testing import CliRunner

import tvr.pipeline.features as features_job
from tvr.cli import app
from tvr.config import config_from_dict
from tvr.data.annotations import load_split
from tvr.data.feature_cache import FeatureCacheError, load_cached_split, read_manifest
from tvr.pipeline import build_feature_cache


class KilledError(Exception):
    pass


@pytest.fixture
def values(tmp_path: Path) -> dict:
    return make_msrvtt(tmp_path / "data")


def _killed_after(monkeypatch, shards: int) -> None:
    """The job dies right after writing ``shards`` shard files, as a kill -9 would leave it."""
    save = features_job.atomic_torch_save
    written = []

    def save_then_die(obj, path):
        save(obj, path)
        written.append(path)
        if len(written) == shards:
            raise KilledError

    monkeypatch.setattr(features_job, "atomic_torch_save", save_then_die)


def test_manifest_is_written_before_the_first_shard(values, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    _killed_after(monkeypatch, 1)
    with pytest.raises(KilledError):
        build_feature_cache(config_from_dict(values), cache, ["train"], shard_size=2, progress=False)
    manifest = read_manifest(cache)
    assert manifest["settings"]["shard_size"] == 2 and manifest["settings"]["dtype"] == "float16"
    assert manifest["settings"]["model.clip"] == "tiny" and manifest["settings"]["data.max_frames"] == 4
    assert not manifest["splits"].get("train", {}).get("complete")


def test_resume_with_another_shard_size_or_backbone_is_refused(values, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    cfg = config_from_dict(values)
    _killed_after(monkeypatch, 2)
    with pytest.raises(KilledError):
        build_feature_cache(cfg, cache, ["train"], shard_size=2, progress=False)
    monkeypatch.undo()
    with pytest.raises(FeatureCacheError, match=r"shard_size: 2 in the cache, 3 now"):
        build_feature_cache(cfg, cache, ["train"], shard_size=3, progress=False)
    other = json.loads(json.dumps(values))
    other["model"]["tiny"]["embed_dim"] = 24
    with pytest.raises(FeatureCacheError, match=r"model\.tiny: .* in the cache"):
        build_feature_cache(config_from_dict(other), cache, ["train"], shard_size=2, progress=False)
    # the same settings resume; every training video is there
    manifest = build_feature_cache(cfg, cache, ["train"], shard_size=2, progress=False)
    videos = load_split(cfg.data, "train").videos
    assert manifest["splits"]["train"]["num_videos"] == len(videos) and not manifest["splits"]["train"]["skipped"]
    assert load_cached_split(cache, "train").video_ids == videos


def test_overwrite_rebuilds_with_the_new_settings(values, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cfg = config_from_dict(values)
    build_feature_cache(cfg, cache, ["train"], shard_size=2, progress=False)
    manifest = build_feature_cache(cfg, cache, ["train"], shard_size=3, progress=False, overwrite=True)
    assert manifest["settings"]["shard_size"] == 3
    shards = sorted(p.name for p in (cache / "train").iterdir())
    assert shards == sorted(
        Path(p).name for p in manifest["splits"]["train"]["video_shards"] + manifest["splits"]["train"]["text_shards"]
    )
    assert load_cached_split(cache, "train").video_ids == load_split(cfg.data, "train").videos


def test_bad_shard_size_damaged_manifest_and_empty_cache_are_one_line_errors(values, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(values))
    runner = CliRunner()
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(cache), "--shard-size", "0"])
    assert result.exit_code == 2 and "--shard-size 0: expected a positive number" in result.output
    assert "Traceback" not in result.output

    cache.mkdir(exist_ok=True)
    (cache / "manifest.json").write_text('{"format": 1, "splits": {"train"')  # torn
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(cache)])
    assert result.exit_code == 2 and "manifest.json: damaged" in result.output and "Traceback" not in result.output
    values["data"]["features_dir"] = str(cache)
    config.write_text(yaml.safe_dump(values))
    result = runner.invoke(app, ["train", "-c", str(config), "-o", str(tmp_path / "run")])
    assert result.exit_code == 2 and "manifest.json: damaged" in result.output

    # every training video unreadable: the cache has no training features
    values["data"]["features_dir"] = ""
    for video in load_split(config_from_dict(values).data, "train").videos:
        (Path(values["data"]["video_dir"]) / f"{video}.mp4").write_bytes(b"not a video")
    empty = tmp_path / "empty"
    build_feature_cache(config_from_dict(values), empty, ["train", "val"], progress=False)
    with pytest.raises(FeatureCacheError, match=r"split 'train' holds no video features \(all 5 of its videos"):
        load_cached_split(empty, "train")


def test_one_job_per_cache_and_a_killed_jobs_temporaries_go(values, tmp_path: Path) -> None:
    from tvr.utils.lock import FolderBusyError, folder_lock

    cache = tmp_path / "cache"
    cfg = config_from_dict(values)
    with folder_lock(cache), pytest.raises(FolderBusyError, match="feature cache .* is in use"):
        build_feature_cache(cfg, cache, ["train"], progress=False)
    (cache / "train").mkdir(parents=True)
    left = [cache / ".manifest.json.tvr-k1ll3d00.tmp", cache / "train" / ".videos-00000.pt.tvr-k1ll3d00.tmp"]
    for path in left:
        path.write_bytes(b"half")
    theirs = cache / "train" / ".notes.abcdefgh.tmp"
    theirs.write_text("not ours")
    build_feature_cache(cfg, cache, ["train"], progress=False)
    assert not any(path.exists() for path in left) and theirs.exists()


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_a_failed_start_leaves_the_cache_folder_as_it_found_it(values, tmp_path: Path, monkeypatch) -> None:
    """A start that fails before its first shard (here: the annotation folder is mistyped) writes nothing that
    stays: the corrected rerun starts without --overwrite. A start that fails after a shard keeps it to resume."""
    config = tmp_path / "tiny.yaml"
    annotations = values["data"]["annotations"]
    config.write_text(yaml.safe_dump({**values, "data": {**values["data"], "annotations": str(tmp_path / "typo")}}))
    runner = CliRunner()
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(cache)])
    assert result.exit_code == 2 and "annotation folder not found" in result.output
    assert not cache.exists()  # it did not exist before: no manifest, no tokenizer, no folder

    mine = tmp_path / "mine"  # a folder that exists, holding a file of the user's
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(mine)])
    assert result.exit_code == 2 and _tree(mine) == {"notes.txt": b"mine"}

    config.write_text(yaml.safe_dump(values))  # corrected: starts, no --overwrite needed
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(cache), "--splits", "train"])
    assert result.exit_code == 0, result.output
    assert read_manifest(cache)["settings"]["data.annotations"] == annotations

    # a cache that holds features: a failing rerun (the backbone does not build) leaves it byte for byte
    before = _tree(cache)

    def broken_backbone(*args, **kwargs):
        raise FileNotFoundError("model.clip: no such folder")

    monkeypatch.setattr(features_job, "build_backbone", broken_backbone)
    result = runner.invoke(app, ["features", "-c", str(config), "-o", str(cache), "--splits", "train,val"])
    assert result.exit_code == 2 and "model.clip: no such folder" in result.output
    assert _tree(cache) == before
    monkeypatch.undo()

    # once a shard is written the start has begun: a failure after it keeps the shard (and its manifest) to resume
    fresh = tmp_path / "fresh"
    _killed_after(monkeypatch, 1)
    with pytest.raises(KilledError):
        build_feature_cache(config_from_dict(values), fresh, ["train"], shard_size=2, progress=False)
    assert (fresh / "manifest.json").is_file() and (fresh / "train" / "videos-00000.pt").is_file()


def test_a_damaged_shard_is_encoded_again_with_one_warning_naming_it_once(values, tmp_path: Path, caplog) -> None:
    cache = tmp_path / "cache"
    cfg = config_from_dict(values)
    build_feature_cache(cfg, cache, ["train"], progress=False)
    shard = cache / "train" / "videos-00000.pt"
    shard.write_text("garbage")
    caplog.clear()
    build_feature_cache(cfg, cache, ["train"], progress=False)
    warned = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert warned == [f"feature shard {shard} is unreadable (a text file (starting b'garbage'); expected a torch.save "
                      "file); encoding it again"]  # fmt: skip
    assert shard.read_bytes()[:2] == b"PK"
