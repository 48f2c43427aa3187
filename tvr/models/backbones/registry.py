"""Backbone registry: ``model.backbone`` → the :class:`~tvr.models.backbones.base.Backbone` that declares everything
tvr needs of it.

A backbone is a folder, ``tvr/models/backbones/<name>/``, whose ``backbone.py`` registers a
:class:`~tvr.models.backbones.base.Backbone` subclass (``config.py`` holds its settings' dataclasses)::

    @register_backbone("clipvip")
    class ClipVip(Clip):
        sections = {"tiny": TinyClipConfig, "clipvip": ClipVipConfig}
        ...

The package's own folders are registered when this module is imported (so their settings sections load as their
dataclasses from the first config on); entry points of the ``tvr.backbones`` group (how an installed package
contributes a backbone: ``name = "package.module:BackboneClass"``) on the first lookup; code already running may
call :func:`register_backbone` itself. A backbone anywhere else is used by import path, ``model.backbone:
package.module:Class``, as a head is (the import runs the module's code, so a config, checkpoint or index may name
one only when code is trusted: ``tvr --trust-code``).

Resolving a run config (:func:`resolve_backbone_config`, part of every job's resolution) builds the backbone's
sections and writes its frame size, sampling and pixel normalisation into ``data.*`` where the config leaves them
unset. The rest of what the data pipeline needs of the backbone, its tokenizer and what decides its frozen features,
:func:`tvr.models.run_spec.resolve_run` answers once per job from the backbone's folder, and ``tvr.data`` is handed
those values. So ``tvr.data`` never reads ``cfg.model``, and no module outside a backbone's folder asks which
backbone it holds.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from tvr.config import (
    REGISTERED_BACKBONES,
    Config,
    ConfigError,
    ModelConfig,
    build_section,
    check_head_import,
    import_named,
    model_section_type,
)
from tvr.data.transforms import PixelNorm
from tvr.models.backbones.base import (
    _BACKBONES,
    FEATURES,
    Backbone,
    Preprocess,
    _add,
    _check_backbone_class,
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
    "register_backbone",
    "resolve_backbone_config",
    "resolve_backbone_sections",
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
        check_head_import(name, "model.backbone", REGISTERED_BACKBONES)  # each time: a file may not choose code
        if name not in _BACKBONES:
            return _import_path(name)
    if name not in _BACKBONES:
        _load_entry_points()
    if name not in _BACKBONES:
        raise ConfigError(f"model.backbone={name!r}: expected one of {available_backbones()}")
    return _BACKBONES[name]


# --------------------------------------------------------------------------------------------- resolution


def resolve_backbone_sections(model_cfg: ModelConfig) -> Backbone:
    """Check ``model.backbone`` and build every registered section of ``model_cfg`` (and ``model.options``, against
    the backbone's :attr:`~Backbone.Options`) into its dataclass, in place; returns the backbone. Idempotent."""
    backbone = backbone_spec(model_cfg.backbone)
    for f in dataclasses.fields(model_cfg):
        section = model_section_type(f.metadata.get("section", ""))
        if section is not None:
            setattr(model_cfg, f.name, build_section(section, getattr(model_cfg, f.name), f"model.{f.name}"))
    if backbone.Options is not None:
        model_cfg.options = build_section(backbone.Options, model_cfg.options, "model.options")
    elif model_cfg.options:
        raise ConfigError(f"model.options: backbone {backbone.name!r} takes no options, got {model_cfg.options!r}")
    return backbone


def resolve_backbone_config(cfg: Config) -> Preprocess:
    """Resolve everything the run config leaves to its backbone, in place (idempotent): its sections as their
    dataclasses, and ``data.image_size``, ``data.sampling``, ``data.pixel_mean`` / ``data.pixel_std`` where unset
    (values the config sets win). Returns the preprocessing the data pipeline will use."""
    backbone = resolve_backbone_sections(cfg.model)
    data = cfg.data
    if data.pixel_mean is None or data.pixel_std is None:
        norm = backbone.pixel_norm(cfg.model)
        data.pixel_mean = data.pixel_mean if data.pixel_mean is not None else tuple(norm.mean)
        data.pixel_std = data.pixel_std if data.pixel_std is not None else tuple(norm.std)
    if data.image_size is None:
        data.image_size = backbone.image_size(cfg.model)  # None still when it cannot tell without a download
    if data.sampling is None:
        data.sampling = backbone.sampling
    return Preprocess(data.image_size, data.sampling, PixelNorm(tuple(data.pixel_mean), tuple(data.pixel_std)))


def _register_builtin() -> None:
    """Import the package's backbone folders (each registers itself)."""
    package = importlib.import_module("tvr.models.backbones")
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}.backbone")


_register_builtin()
