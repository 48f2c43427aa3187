"""Dataset-format registry: ``data.dataset`` → the :class:`~tvr.data.formats.base.DatasetFormat` that reads its files.

A format module registers itself with the :func:`register_dataset_format` class decorator::

    @register_dataset_format("msvd")
    class Msvd(DatasetFormat):
        def read(self, folder, cfg, split): ...

Formats are found without a hand-kept list, as heads are: the first lookup imports every module of the
``tvr.data.formats`` package (except ``base``, ``reading``, ``registry`` and ``_*`` modules, which hold no format).
An installed package contributes a format as an entry point of the ``tvr.datasets`` group (``name =
"package.module:FormatClass"``), found on the first lookup as the package's own modules are; code already running may
register one with :func:`register_dataset_format`. ``data.dataset`` is checked against this registry when the run is
resolved (:func:`tvr.models.run_spec.resolve_run`), as ``head.name`` is against the heads'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tvr.data.formats.base import DatasetFormat
from tvr.data.formats.reading import AnnotationError
from tvr.utils.plugins import Registry

F = TypeVar("F", bound=type[DatasetFormat])

PACKAGE = "tvr.data.formats"
#: the entry-point group through which an installed package contributes a dataset format
ENTRY_POINT_GROUP = "tvr.datasets"


def _named(name: str, cls: type[DatasetFormat]) -> None:
    cls.name = name


#: modules of the package that hold no format: base, reading, registry
_FORMATS = Registry(
    "dataset", DatasetFormat, PACKAGE, frozenset({"base", "reading", "registry"}), ENTRY_POINT_GROUP, _named
)


def register_dataset_format(name: str, *, overwrite: bool = False) -> Callable[[F], F]:
    """Class decorator: make ``data.dataset == name`` read files with this format. Registering another class under a
    taken name is an error unless ``overwrite`` (re-importing the same module re-registers the same class silently)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_dataset_format: name must be an identifier, got {name!r}")
    return _FORMATS.register(name, overwrite=overwrite)


def available_dataset_formats() -> list[str]:
    """Names of every registered dataset format (this package's modules and the formats registered so far)."""
    return _FORMATS.names()


def builtin_dataset_formats() -> list[str]:
    """Names of the formats that are modules of this package."""
    return sorted(name for name, cls in _FORMATS.classes().items() if cls.__module__.startswith(f"{PACKAGE}."))


def dataset_format(name: str) -> DatasetFormat:
    """The format ``data.dataset`` names (an AnnotationError listing the known ones otherwise)."""
    cls = _FORMATS.get(name)
    if cls is None:
        raise AnnotationError(f"data.dataset must be one of {available_dataset_formats()}, got {name!r}")
    return cls()
