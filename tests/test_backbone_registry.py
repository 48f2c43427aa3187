"""Backbones as registered folders (tvr/models/backbones/<name>/): the package's own are found without a list, one
defined outside the package (tests/toy_backbones.py, with its own preset tests/toy_backbone.yaml) trains, evaluates,
indexes and searches through the CLI with no edit in tvr/, and nothing outside a backbone's folder asks which
backbone it holds (tvr/data never reads the model config)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import json
from pathlib import Path

import pytest
import toy_backbones
import yaml
from typer.testing import CliRunner

from tvr.config import ConfigError, config_from_dict, load_config
from tvr.data.feature_cache import cache_settings
from tvr.models.backbones import registry
from tvr.models.backbones.base import setting_owner
from tvr.models.backbones.clip.config import ClipSettings, TinyClipConfig
from tvr.models.backbones.clipvip.config import ClipVipSettings
from tvr.models.backbones.two_tower.config import TwoTowerConfig
from tvr.models.run_spec import resolve_run
from tvr.pipeline import resolve_config

PACKAGE = Path(__file__).resolve().parents[1] / "tvr"
PRESET = Path(__file__).resolve().parent / "toy_backbone.yaml"


@dataclasses.dataclass
class OtherTiny:
    width: int = 8


@dataclasses.dataclass
class OtherSettings:
    """Declares ``model.tiny`` otherwise than the CLIP backbones do."""

    tiny: OtherTiny = dataclasses.field(default_factory=OtherTiny)


@dataclasses.dataclass
class BagSettings:
    """A backbone from elsewhere naming its own key, ``model.bag``."""

    #: the bag's sizes
    bag: toy_backbones.ToyBagOptions = dataclasses.field(default_factory=toy_backbones.ToyBagOptions)


def test_the_packages_backbones_are_registered_with_their_sections() -> None:
    assert {"clip", "clipvip", "two_tower", toy_backbones.NAME} <= set(registry.available_backbones())
    loaded = config_from_dict({"model": {"tiny": {"embed_dim": 16}, "two_tower": {"bridge": "projection"}}})
    # the config layer holds a backbone's settings as it read them; resolving builds them into its folder's
    # dataclasses, with the defaults of those the config leaves out
    assert loaded.model.tiny == {"embed_dim": 16} and "clipvip" not in loaded.model.declared
    with pytest.raises(AttributeError, match="resolve_run"):
        _ = loaded.model.clipvip
    cfg = resolve_config(loaded)
    assert isinstance(cfg.model.tiny, TinyClipConfig) and cfg.model.tiny.embed_dim == 16
    assert isinstance(cfg.model.two_tower, TwoTowerConfig) and cfg.model.two_tower.bridge == "projection"
    assert loaded.model.tiny == {"embed_dim": 16}  # resolving left the loaded config as it was
    wires = config_from_dict({"model": {"two_tower": {"bridge": "wires"}}})
    with pytest.raises(ConfigError, match=r"model\.two_tower\.bridge = 'wires': expected one of"):
        resolve_config(wires)
    with pytest.raises(ConfigError, match=r"model\.tiny: expected a mapping, got 5"):
        resolve_config(config_from_dict({"model": {"tiny": 5}}))
    with pytest.raises(ConfigError, match=r"model: unknown key\(s\) \['tinny'\]; valid keys: \[.*'tiny'"):
        resolve_config(config_from_dict({"model": {"tinny": {}}}))


def test_an_unknown_backbone_names_the_registered_ones() -> None:
    cfg = config_from_dict({"model": {"backbone": "vip"}})
    with pytest.raises(ConfigError, match=r"model\.backbone='vip': expected one of \[.*'clip', 'clipvip'"):
        resolve_config(cfg)


def test_register_backbone_refuses_a_taken_name_and_a_non_backbone() -> None:
    with pytest.raises(ValueError, match="already registered"):

        @registry.register_backbone("clip")
        class Other(toy_backbones.ToyBag):
            pass

    with pytest.raises(TypeError, match="Backbone subclass"):
        registry.register_backbone("bad")(object)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=r"model\.tiny is already declared otherwise by .*clip\.config\.ClipSettings"):

        @registry.register_backbone("other_tiny")
        class OtherSections(toy_backbones.ToyBag):
            Settings = OtherSettings

    assert "other_tiny" not in registry.available_backbones()
    assert setting_owner("tiny") is ClipSettings  # what the built-in clip and clipvip declare
    assert [f.name for f in dataclasses.fields(ClipVipSettings)] == ["clip", "tiny", "clipvip"]


def test_a_backbone_from_elsewhere_declares_its_settings_as_the_built_in_ones_do() -> None:
    """A backbone outside the package names its own ``model.<key>`` settings with a ``Settings`` dataclass, as clip
    (``model.clip``, ``model.tiny``) and two_tower (``model.two_tower``) do: typed, checked, recorded and part of its
    feature identity; a run on another backbone does not record them."""

    @registry.register_backbone("named_bag")
    class NamedBag(toy_backbones.ToyBag):
        Settings = BagSettings

        def image_size(self, model_cfg):  # type: ignore[no-untyped-def]
            return model_cfg.bag.image_size

    try:
        cfg = resolve_config(load_config(PRESET, ["model.backbone=named_bag", "model.bag.image_size=8"]))
        assert isinstance(cfg.model.bag, toy_backbones.ToyBagOptions) and cfg.model.bag.image_size == 8
        assert cfg.data.image_size == 8
        recorded = yaml.safe_load(yaml.safe_dump(config_from_dict({"model": {"bag": {"embed_dim": 4}}}).model.declared))
        assert recorded == {"bag": {"embed_dim": 4}}
        written = resolve_config(config_from_dict({"model": {"backbone": "named_bag"}}))
        assert {"clip", "tiny", "clipvip", "two_tower", "bag"} <= set(written.model.declared)
        features = resolve_run(cfg).features
        assert features.settings["model.bag"] == {"embed_dim": 16, "vocab_size": 1024, "image_size": 8}
        assert [name for name, *_ in features.matched] == ["model.backbone", "model.bag"]
        with pytest.raises(ConfigError, match=r"model\.bag\.image_size = 0: expected a number >= 4"):
            resolve_config(load_config(PRESET, ["model.backbone=named_bag", "model.bag.image_size=0"]))
        clip_run = resolve_config(config_from_dict({}))
        assert "bag" not in clip_run.model.declared and {"clip", "tiny", "clipvip", "two_tower"} <= set(
            clip_run.model.declared
        )
    finally:
        registry._BACKBONES.pop("named_bag", None)


def test_backbones_of_installed_packages_join_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    good = importlib.metadata.EntryPoint("plugged_bag", "toy_backbones:ToyBag", registry.ENTRY_POINT_GROUP)
    broken = importlib.metadata.EntryPoint("broken", "no_such_module_xyz:Backbone", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [good, broken])
    try:
        names = registry.available_backbones()
        assert "plugged_bag" in names and "broken" not in names
        assert registry.backbone_spec("plugged_bag").name == "plugged_bag"
        assert registry.backbone_spec(toy_backbones.NAME).name == toy_backbones.NAME  # the same class, its own name
    finally:
        registry._BACKBONES.pop("plugged_bag", None)


def test_resolution_gives_data_what_it_needs_of_the_backbone() -> None:
    """The toy backbone's options are its dataclass, its frame size lands in data.*, data learns its tokenizer, and
    its feature cache identity names its options and the seed (it is randomly initialised)."""
    cfg = resolve_config(load_config(PRESET))
    assert isinstance(cfg.model.options, toy_backbones.ToyBagOptions)
    assert (cfg.data.image_size, cfg.data.sampling) == (16, "clip4clip")
    run = resolve_run(cfg)
    assert run.tokenizer.kind == "tiny_clip_bpe"
    settings = cache_settings(cfg, run.features, 64, __import__("torch").float16)
    assert settings["model.options"] == {"embed_dim": 16, "vocab_size": 1024, "image_size": 16}
    assert settings["model.backbone"] == toy_backbones.NAME and settings["train.seed"] == 0
    with pytest.raises(ConfigError, match=r"model\.options\.embed_dim = 0"):
        resolve_config(load_config(PRESET, ["model.options.embed_dim=0"]))


def test_a_backbone_outside_the_package_trains_evaluates_indexes_and_searches(tmp_path: Path) -> None:
    from search_fixtures import index_args, write_caption_set, write_videos

    from tvr.cli import app

    videos = write_videos(tmp_path / "videos")
    clips = write_caption_set(tmp_path / "work", videos)
    runner = CliRunner()
    run = tmp_path / "run"
    data = ["--set", f"data.annotations={tmp_path / 'work'}", "--set", f"data.video_dir={clips}"]
    result = runner.invoke(app, ["train", "--config", str(PRESET), "--out", str(run), *data])
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["backbone"] == toy_backbones.NAME and saved["model"]["options"]["embed_dim"] == 16
    tested = json.loads((run / "test_last" / "metrics.json").read_text())

    # the checkpoint describes itself: evaluating it needs no config
    result = runner.invoke(app, ["eval", "--checkpoint", str(run / "last.pt"), "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["t2v"] == tested["t2v"]
    # the table's title is on stdout right above it (`tvr eval ... > metrics.txt` keeps them together)
    printed = result.stdout.splitlines()
    assert printed[printed.index("test split") + 1].startswith("| | R@1 | R@5 | R@10 | MdR | MnR |")
    assert tested["t2v"]["R1"] == 100.0  # five colours, one caption each: the toy tells them apart

    index = tmp_path / "index"
    result = runner.invoke(app, index_args(videos, index, run / "last.pt"))
    assert result.exit_code == 0, result.output
    for colour in ("red", "green", "blue"):
        result = runner.invoke(app, ["search", str(index), f"a {colour} screen", "--json", "-k", "5"])
        assert result.exit_code == 0, result.output
        hits = json.loads(result.output)
        assert Path(hits[0]["video"]).name == f"{colour}.mp4", hits


def test_a_backbone_named_by_import_path_trains_from_the_shell_with_trusted_code(tmp_path: Path) -> None:
    """``tvr --trust-code train --set model.backbone=pkg.module:Class`` in a fresh process (nothing imported the
    module before): the backbone is imported by its path, as a head is; without ``--trust-code`` it is refused (exit
    2, one line naming the field), and the checkpoint it writes records the path."""
    import os
    import subprocess
    import sys

    from search_fixtures import write_caption_set, write_videos

    clips = write_caption_set(tmp_path / "work", write_videos(tmp_path / "videos"))
    path = "toy_backbones:ToyBag"
    args = ["train", "--config", str(PRESET), "--set", f"model.backbone={path}", "--set", "train.max_steps=2"]
    args += ["--set", f"data.annotations={tmp_path / 'work'}", "--set", f"data.video_dir={clips}"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent), "TVR_TRUST_CODE": ""}

    def tvr(*extra: str, out: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "tvr", *extra, *args, "--out", str(tmp_path / out)]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    refused = tvr(out="refused")
    assert refused.returncode == 2, refused.stderr
    assert f"model.backbone = '{path}' is an import path" in refused.stderr
    assert not (tmp_path / "refused" / "last.pt").exists()
    trusted = tvr("--trust-code", out="run")
    assert trusted.returncode == 0, trusted.stderr
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["backbone"] == path and saved["model"]["options"]["embed_dim"] == 16
    assert (tmp_path / "run" / "last.pt").is_file()


def test_a_backbone_import_path_must_name_a_backbone_class() -> None:
    from tvr.config import trusting_code

    try:
        with trusting_code():
            with pytest.raises(ConfigError, match="expected a Backbone subclass"):
                registry.backbone_spec("toy_backbones:ToyBagModule")
            with pytest.raises(ConfigError, match="has no attribute 'Nothing'"):
                registry.backbone_spec("toy_backbones:Nothing")
            assert registry.backbone_spec("toy_backbones:ToyBag").name == "toy_backbones:ToyBag"
        with pytest.raises(ConfigError, match="is an import path"):  # once imported, still only with trust
            registry.backbone_spec("toy_backbones:ToyBag")
    finally:
        registry._BACKBONES.pop("toy_backbones:ToyBag", None)


# --------------------------------------------------------------------------------------------- the seam holds


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py"))


def test_tvr_data_never_reads_the_model_config() -> None:
    reads = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in _modules(PACKAGE / "data")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "model" and isinstance(node.value, ast.Name)
    ]
    assert not reads, f"tvr/data reads the model config (resolve what it needs into data.*): {reads}"


def test_no_module_outside_a_backbones_folder_compares_backbone_names() -> None:
    names = set(registry.available_backbones())
    found = []
    for path in _modules(PACKAGE):
        if (PACKAGE / "models" / "backbones") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare) or "backbone" not in ast.unparse(node):
                continue
            constants = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if constants & names:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, f"backbone names compared outside tvr/models/backbones/: {found}"
