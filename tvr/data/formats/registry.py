"""Dataset-format registry: ``data.dataset`` → the :class:`~tvr.data.formats.base.DatasetFormat` that reads its files.

A format module registers itself with the :func:`register_dataset_format` class decorator::

    @register_dataset_format("msvd")
    class Msvd(DatasetFormat):
        def read(self, folder, cfg, split): ...

Formats are found without a hand-kept list, as heads are: the first lookup imports every module of the
``tvr.data.formats`` package (except ``base``, ``reading``, ``registry`` and ``_*`` modules, which hold no format) and
every entry point of the ``tvr.datasets`` group (how an installed package contributes one). Registering also lets
``data.dataset`` name the format (:func:`tvr.config.register_dataset_name`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

from tvr.config import register_dataset_name
from tvr.data.formats.base import DatasetFormat
from tvr.data.formats.reading import AnnotationError

log = logging.getLogger(__name__)

F = TypeVar("F", bound=type[DatasetFormat])

_FORMATS: dict[str, type[DatasetFormat]] = {}
_DISCOVERED = False
#: modules of this package that hold no format
_NOT_FORMATS = frozenset({"base", "reading", "registry"})
ENTRY_POINT_GROUP = "tvr.datasets"
PACKAGE = "tvr.data.formats"


def _check_format_class(cls: Any, what: str) -> type[DatasetFormat]:
    if not (isinstance(cls, type) and issubclass(cls, DatasetFormat)):
        raise TypeError(f"{what}: expected a DatasetFormat subclass, got {cls!r}")
    return cls


def _add(name: str, cls: type[DatasetFormat]) -> None:
    cls.name = name
    _FORMATS[name] = cls
    register_dataset_name(name)


def register_dataset_format(name: str, *, overwrite: bool = False) -> Callable[[F], F]:
    """Class decorator: make ``data.dataset == name`` read files with this format. Registering another class under a
    taken name is an error unless ``overwrite`` (re-importing the same module re-registers the same class silently)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_dataset_format: name must be an identifier, got {name!r}")

    def decorate(cls: F) -> F:
        _check_format_class(cls, f"register_dataset_format({name!r})")
        current = _FORMATS.get(name)
        same = current is not None and (current.__module__, current.__qualname__) == (cls.__module__, cls.__qualname__)
        if current is not None and not overwrite and not same:
            raise ValueError(f"dataset {name!r} is already registered by {current.__module__}.{current.__qualname__}")
        _add(name, cls)
        return cls

    return decorate


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    package = importlib.import_module(PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _NOT_FORMATS and not info.name.startswith("_"):
            importlib.import_module(f"{PACKAGE}.{info.name}")
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = _check_format_class(entry.load(), f"entry point {entry.name} = {entry.value}")
        except Exception as exc:  # one broken plug-in must not hide the others
            log.warning("dataset entry point %s (%s) could not be loaded: %s", entry.name, entry.value, exc)
            continue
        if entry.name not in _FORMATS:
            _add(entry.name, cls)


def available_dataset_formats() -> list[str]:
    """Names of every registered dataset format (this package's modules, entry points, formats registered so far)."""
    _discover()
    return sorted(_FORMATS)


def builtin_dataset_formats() -> list[str]:
    """Names of the formats that are modules of this package."""
    _discover()
    return sorted(name for name, cls in _FORMATS.items() if cls.__module__.startswith(f"{PACKAGE}."))


def dataset_format(name: str) -> DatasetFormat:
    """The format ``data.dataset`` names (an AnnotationError listing the known ones otherwise)."""
    _discover()
    cls = _FORMATS.get(name)
    if cls is None:
        raise AnnotationError(f"data.dataset must be one of {available_dataset_formats()}, got {name!r}")
    return cls()
