"""Head registry: a name (or an import path) → a head class and its options dataclass.

A head module registers itself with the :func:`register_head` class decorator::

    @register_head("gare")
    class GareHead(RetrievalHead):
        Options = GareOptions
        ...

Heads are found without a hand-kept list: the first lookup imports every method folder of the ``tvr.methods``
package, ``tvr/methods/<method>/``, whose ``__init__`` imports its head (``_*`` folders hold no head), and every entry
point of the ``tvr.heads`` group (how an installed package contributes heads). The methods sit above this layer (their
figures use analysis and evaluation), so they are found by name, as entry points are, never imported here by a
statement. A head that is neither can still be used
by its import path, ``head.name: my_pkg.heads:MyHead``; it needs no registration.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.metadata
import logging
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

from tvr.config import ConfigError, HeadConfig, build_section, import_named
from tvr.models.heads.base import RetrievalHead
from tvr.utils.plugins import qualified_name

log = logging.getLogger(__name__)

H = TypeVar("H", bound=type[RetrievalHead])

_HEADS: dict[str, type[RetrievalHead]] = {}
_DISCOVERED = False
#: the package whose folders are the built-in methods (imported by name on the first lookup)
METHODS_PACKAGE = "tvr.methods"
ENTRY_POINT_GROUP = "tvr.heads"


def _check_head_class(cls: Any, what: str) -> type[RetrievalHead]:
    if not (isinstance(cls, type) and issubclass(cls, RetrievalHead)):
        raise TypeError(f"{what}: expected a RetrievalHead subclass, got {cls!r}")
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        raise TypeError(f"{what}: {cls.__name__}.Options must be a dataclass (the head's options), got {options!r}")
    return cls


def register_head(name: str, *, overwrite: bool = False) -> Callable[[H], H]:
    """Class decorator: make ``head.name == name`` build this head. Registering another class under a taken name
    is an error unless ``overwrite`` (re-importing the same module re-registers the same class silently)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"register_head: name must be a non-empty string without ':', got {name!r}")

    def decorate(cls: H) -> H:
        _check_head_class(cls, f"register_head({name!r})")
        current = _HEADS.get(name)
        if current is not None and not overwrite and qualified_name(current) != qualified_name(cls):
            raise ValueError(f"head {name!r} is already registered by {qualified_name(current)}")
        cls.name = name
        _HEADS[name] = cls
        return cls

    return decorate


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    package = importlib.import_module(METHODS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"{package.__name__}.{info.name}")
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = _check_head_class(entry.load(), f"entry point {entry.name} = {entry.value}")
        except Exception as exc:  # one broken plug-in must not hide the others
            log.warning("head entry point %s (%s) could not be loaded: %s", entry.name, entry.value, exc)
            continue
        if entry.name not in _HEADS:
            cls.name = entry.name
            _HEADS[entry.name] = cls


def available_heads() -> list[str]:
    """Names of every registered head (built-in modules and entry points)."""
    _discover()
    return sorted(_HEADS)


def _import_path(spec: str) -> type[RetrievalHead]:
    try:
        return _check_head_class(import_named(spec, "head.name"), f"head.name = {spec!r}")
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def head_class(name: str) -> type[RetrievalHead]:
    """The head class for ``head.name``: a registered name or an import path ``package.module:Class``."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"head.name = {name!r}: expected a head name or 'package.module:ClassName'")
    if ":" in name:
        return _import_path(name)
    _discover()
    if name not in _HEADS:
        raise ConfigError(
            f"head.name = {name!r} is not a known head; valid names: {available_heads()} "
            "(or an import path 'package.module:ClassName')"
        )
    return _HEADS[name]


def head_options(name: str, values: Any = None) -> Any:
    """The head's options dataclass built from ``values`` (a mapping, an instance, or None for the defaults);
    unknown keys, wrong types, bad choices and out-of-range values raise a ConfigError naming the field."""
    cls = head_class(name)
    return build_section(cls.Options, values, "head.options")


def typed_head_config(head_cfg: HeadConfig) -> HeadConfig:
    """A copy of ``head_cfg`` whose ``options`` are the head's validated options dataclass (``head_cfg`` is not
    changed); ConfigError names ``head.name`` or the option that does not fit. Every job types its head once, when
    it resolves its config (:func:`tvr.models.run_spec.resolve_run`); from then on ``head.options`` is read by
    attribute, never as a mapping."""
    return dataclasses.replace(head_cfg, options=head_options(head_cfg.name, copy.deepcopy(head_cfg.options)))


def build_head(head_cfg: HeadConfig, dim: int, logit_scale_init: float) -> RetrievalHead:
    """Build the head named ``head_cfg.name`` for ``dim``-dimensional features from its options (a resolved run's
    ``head`` holds them typed; a mapping is checked and typed first, leaving ``head_cfg`` as it is).

    ``logit_scale_init`` is the backbone's value (ln 100 for pretrained CLIP); ``head_cfg.logit_scale_init``
    overrides it when set.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"build_head: dim must be a positive integer, got {dim!r}")
    cls = head_class(head_cfg.name)
    options = head_options(head_cfg.name, head_cfg.options)
    scale = float(head_cfg.logit_scale_init) if head_cfg.logit_scale_init is not None else float(logit_scale_init)
    return cls(dim, options, logit_scale_init=scale, logit_scale_max=head_cfg.logit_scale_max)
