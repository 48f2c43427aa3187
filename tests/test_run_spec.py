"""``tvr.models.run_spec.resolve_run``: one function turns a loaded config into the run's resolved description
without changing the config it is given; the layers below take that description (what resolving each shipped preset
gives is pinned, from before resolution moved here, by tests/test_resolution_pin.py)."""

from __future__ import annotations

import dataclasses

import pytest

from tvr.config import ConfigError, available_presets, config_to_dict, load_config
from tvr.models.backbones.registry import backbone_spec
from tvr.models.heads.registry import head_class
from tvr.models.run_spec import RunSpec, resolve_run
from tvr.pipeline import resolve_config


@pytest.mark.parametrize("preset", available_presets())
def test_a_run_describes_its_own_config(preset: str) -> None:
    loaded = load_config(preset)
    run = resolve_run(loaded)
    cfg = resolve_config(loaded)  # the pipeline's entry point: the same resolved config, a new object
    assert config_to_dict(run.config) == config_to_dict(cfg) and cfg is not loaded and cfg is not run.config
    assert run.backbone is backbone_spec(cfg.model.backbone)
    assert run.head is head_class(cfg.head.name)
    assert (run.preprocess.image_size, run.preprocess.sampling) == (cfg.data.image_size, cfg.data.sampling)
    assert tuple(run.preprocess.norm.mean) == tuple(cfg.data.pixel_mean)
    assert tuple(run.preprocess.norm.std) == tuple(cfg.data.pixel_std)
    assert run.tokenizer == run.backbone.tokenizer(cfg.model)
    assert run.features == run.backbone.feature_identity(cfg)


def test_the_loaded_config_is_left_as_it_was() -> None:
    cfg = load_config("cpu/proxy")
    before = config_to_dict(cfg)
    assert cfg.data.image_size is None and isinstance(cfg.head.options, dict)  # left to the backbone and the head
    run = resolve_run(cfg)
    assert config_to_dict(cfg) == before
    assert cfg.data.image_size is None and isinstance(cfg.head.options, dict)
    assert run.config.data.image_size is not None and isinstance(run.config.head.options, run.head.Options)


def test_resolving_a_resolved_run_gives_it_again() -> None:
    run = resolve_run(load_config("clipvip/msrvtt"))
    again = resolve_run(run.config)
    assert again == run and again.config is not run.config


def test_a_run_description_cannot_be_reassigned() -> None:
    run = resolve_run(load_config("cpu/clip4clip"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.tokenizer = run.tokenizer  # type: ignore[misc]
    assert isinstance(run, RunSpec)


def test_the_models_layer_takes_the_resolved_run() -> None:
    from tvr.models.build import build_model

    with pytest.raises(TypeError, match=r"build_model takes a resolved run .*resolve_run\(cfg\).*got Config"):
        build_model(load_config("cpu/clip4clip"))
    model = build_model(resolve_run(load_config("cpu/clip4clip")))
    assert model.head.options == resolve_run(load_config("cpu/clip4clip")).config.head.options


def test_a_bad_head_option_is_named_before_the_backbone() -> None:
    cfg = load_config("cpu/gare", ["model.backbone=nosuch"])
    cfg.head.options = {"no_such_option": 1}
    with pytest.raises(ConfigError, match=r"head\.options"):
        resolve_run(cfg)
    with pytest.raises(ConfigError, match=r"model\.backbone"):
        resolve_run(load_config("cpu/gare", ["model.backbone=nosuch"]))
