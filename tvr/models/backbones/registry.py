"""Backbone registry: ``model.backbone`` → the :class:`~tvr.models.backbones.base.Backbone` that declares everything
tvr needs of it.

A backbone is a folder, ``tvr/models/backbones/<name>/``, whose ``backbone.py`` registers a
:class:`~tvr.models.backbones.base.Backbone` subclass (``config.py`` holds its settings' dataclasses)::

    @register_backbone("clipvip")
    class ClipVip(Clip):
        Settings = ClipVipSettings  # model.clip, model.tiny, model.clipvip
        ...

The package's own folders are registered when this module is imported; entry points of the ``tvr.backbones`` group
(how an installed package contributes a backbone: ``name = "package.module:BackboneClass"``) on the first lookup;
code already running may call :func:`register_backbone` itself. A backbone anywhere else is used by import path,
``model.backbone: package.module:Class``, as a head is (the import runs the module's code, so a config, checkpoint
or index may name one only when code is trusted: ``tvr --trust-code``).

A job resolves its config once (:func:`tvr.models.run_spec.resolve_run`): the backbone's settings typed
(:func:`typed_model_config`), its frame size, sampling and pixel normalisation written into ``data.*`` where the
config leaves them unset (:func:`with_backbone_pixels`), and what the data pipeline needs of the backbone, its
tokenizer and what decides its frozen features, answered from the backbone's folder; ``tvr.data`` is handed those
values. So ``tvr.data`` never reads ``cfg.model``, and no module outside a backbone's folder asks which
backbone it holds.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from tvr.config import (
    REGISTERED_BACKBONES,
    ConfigError,
    DataConfig,
    ModelConfig,
    check_import_trusted,
    import_named,
    typed_declared_settings,
)
from tvr.data.transforms import PixelNorm
from tvr.models.backbones.base import (
    _BACKBONES,
    FEATURES,
    Backbone,
    Preprocess,
    _add,
    _check_backbone_class,
    _declared_settings,
    recorded_settings,
    register_backbone,
)
from tvr.utils.plugins import load_entry_points

__all__ = [
    "ENTRY_POINT_GROUP",
    "FEATURES",
    "Backbone",
    "Preprocess",
    "available_backbones",
    "backbone_spec",
    "data_preprocess",
    "register_backbone",
    "typed_model_config",
    "with_backbone_pixels",
]

ENTRY_POINT_GROUP = "tvr.backbones"
_ENTRY_POINTS_LOADED = False


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for name, cls in load_entry_points(ENTRY_POINT_GROUP, _check_backbone_class, "backbone"):
        if name not in _BACKBONES:
            _add(name, cls)


def available_backbones() -> list[str]:
    """Names of every registered backbone (the package's folders, entry points, and registered classes)."""
    _load_entry_points()
    return sorted(_BACKBONES)


def _import_path(spec: str) -> Backbone:
    """The backbone class ``package.module:Class`` names, registered under that path (code must be trusted: the
    import runs the module)."""
    try:
        _add(spec, _check_backbone_class(import_named(spec, "model.backbone"), f"model.backbone = {spec!r}"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return _BACKBONES[spec]


def backbone_spec(name: str) -> Backbone:
    """The :class:`Backbone` of ``model.backbone``: a registered name, or an import path ``package.module:Class``
    (with trusted code, as a head's); ConfigError naming the known ones."""
    if isinstance(name, str) and ":" in name:
        check_import_trusted(name, "model.backbone", REGISTERED_BACKBONES)  # each time: a file may not choose code
        if name not in _BACKBONES:
            return _import_path(name)
    if name not in _BACKBONES:
        _load_entry_points()
    if name not in _BACKBONES:
        raise ConfigError(f"model.backbone={name!r}: expected one of {available_backbones()}")
    return _BACKBONES[name]


# --------------------------------------------------------------------------------------------- typed settings


def typed_model_config(model_cfg: ModelConfig) -> ModelConfig:
    """A copy of ``model_cfg`` whose backbone settings (``model.<key>``, declared by the backbones' ``Settings``)
    are built into their dataclasses: the backbone's own and the built-in backbones' (:func:`recorded_settings`,
    with their defaults), and any other a registered backbone declares that the config sets. ``model_cfg`` is not
    changed. ConfigError names the key that no backbone declares, or the field that does not fit. Typing a typed
    config gives an equal one."""
    backbone = backbone_spec(model_cfg.backbone)
    _load_entry_points()  # an installed package's backbone may declare a key the config sets
    declared = _declared_settings()
    typed = typed_declared_settings(model_cfg, backbone.Settings, recorded_settings(backbone), declared, "model")
    return dataclasses.replace(model_cfg, declared=typed)


def with_backbone_pixels(data_cfg: DataConfig, backbone: Backbone, model_cfg: ModelConfig) -> DataConfig:
    """A copy of ``data_cfg`` whose ``image_size``, ``sampling``, ``pixel_mean`` and ``pixel_std`` left unset are
    the backbone's (values the config sets win; ``model_cfg`` typed). ``image_size`` stays None when the backbone
    cannot tell it without a download."""
    filled = {}
    if data_cfg.pixel_mean is None or data_cfg.pixel_std is None:
        norm = backbone.pixel_norm(model_cfg)
        filled["pixel_mean"] = data_cfg.pixel_mean if data_cfg.pixel_mean is not None else tuple(norm.mean)
        filled["pixel_std"] = data_cfg.pixel_std if data_cfg.pixel_std is not None else tuple(norm.std)
    if data_cfg.image_size is None:
        filled["image_size"] = backbone.image_size(model_cfg)
    if data_cfg.sampling is None:
        filled["sampling"] = backbone.sampling
    return dataclasses.replace(data_cfg, **filled)


def data_preprocess(data_cfg: DataConfig) -> Preprocess:
    """The preprocessing a resolved ``data`` section makes (frame size, sampling, pixel normalisation)."""
    return Preprocess(
        data_cfg.image_size, data_cfg.sampling, PixelNorm(tuple(data_cfg.pixel_mean), tuple(data_cfg.pixel_std))
    )


def _register_builtin() -> None:
    """Import the package's backbone folders (each registers itself)."""
    package = importlib.import_module("tvr.models.backbones")
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}.backbone")


_register_builtin()
