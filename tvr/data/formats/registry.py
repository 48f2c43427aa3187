"""Dataset-format registry: ``data.dataset`` → the :class:`~tvr.data.formats.base.DatasetFormat` that reads its files.

A format module registers itself with the :func:`register_dataset_format` class decorator::

    @register_dataset_format("msvd")
    class Msvd(DatasetFormat):
        def read(self, folder, cfg, split): ...

Formats are found without a hand-kept list, as heads are: the first lookup imports every module of the
``tvr.data.formats`` package (except ``base``, ``reading``, ``registry`` and ``_*`` modules, which hold no format).
An installed package contributes a format as an entry point of the ``tvr.datasets`` group (``name =
"package.module:FormatClass"``), found on the first lookup as the package's own modules are; code already running may
register one with :func:`register_dataset_format`; a format anywhere else is used by import path, ``data.dataset:
package.module:Class``, as a head is (the import runs the module's code, so a config may name one only when code is
trusted: ``tvr --trust-code``). ``data.dataset`` is checked against this registry when the run is resolved
(:func:`tvr.models.run_spec.resolve_run`), as ``head.name`` is against the heads'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from tvr.config import (
    REGISTERED_DATASETS,
    ConfigError,
    DataConfig,
    check_import_trusted,
    check_settings_declaration,
    import_named,
    typed_declared_settings,
)
from tvr.data.formats.base import DatasetFormat
from tvr.data.formats.reading import AnnotationError
from tvr.utils.plugins import Registry

F = TypeVar("F", bound=type[DatasetFormat])

PACKAGE = "tvr.data.formats"
#: the entry-point group through which an installed package contributes a dataset format
ENTRY_POINT_GROUP = "tvr.datasets"


def _named(name: str, cls: type[DatasetFormat]) -> None:
    declared = [c.Settings for c in _FORMATS.classes().values()]
    check_settings_declaration(cls.Settings, DataConfig, declared, "data", f"dataset format {name!r}")
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


def registered_dataset_formats() -> dict[str, type[DatasetFormat]]:
    """Every registered format class by name (this package's, entry points', and those registered so far, by name or
    by import path), without importing anything a config names."""
    return _FORMATS.classes()


def builtin_dataset_formats() -> list[str]:
    """Names of the formats that are modules of this package."""
    return sorted(name for name, cls in _FORMATS.classes().items() if cls.__module__.startswith(f"{PACKAGE}."))


def dataset_format_class(name: str) -> type[DatasetFormat] | None:
    """The format class ``data.dataset`` names: a registered name, or an import path ``package.module:Class`` (with
    trusted code; imported and registered under that path). None for an unknown name; ConfigError (UntrustedCodeError
    without trust) for an import path that does not give a format."""
    if isinstance(name, str) and ":" in name:
        check_import_trusted(name, "data.dataset", REGISTERED_DATASETS)  # each time: a file may not choose code
        if _FORMATS.get(name) is None:
            try:
                cls = _FORMATS.check(import_named(name, "data.dataset"), f"data.dataset = {name!r}")
            except TypeError as exc:
                raise ConfigError(str(exc)) from None
            _FORMATS.register(name)(cls)
    return _FORMATS.get(name)


def dataset_format(name: str) -> DatasetFormat:
    """The format ``data.dataset`` names (an AnnotationError listing the known ones otherwise)."""
    cls = dataset_format_class(name)
    if cls is None:
        raise AnnotationError(f"data.dataset must be one of {available_dataset_formats()}, got {name!r}")
    return cls()


def typed_data_config(data_cfg: DataConfig) -> DataConfig:
    """A copy of ``data_cfg`` whose format settings (``data.<key>``, declared by the formats' ``Settings``) are built
    into their dataclasses: the format's own and the built-in formats' (a resolved config has always carried
    ``train_split`` and ``generic_file``, so identities recorded from configs stay as they were), with their
    defaults, and any other a registered format declares that the config sets. ConfigError names the key no format
    declares, or the field that does not fit (``data.dataset`` must name a registered format)."""
    chosen = dataset_format_class(data_cfg.dataset)
    classes = registered_dataset_formats()
    builtin = [classes[name] for name in builtin_dataset_formats()]
    recorded = [cls.Settings for cls in (*builtin, chosen) if cls is not None and cls.Settings is not None]
    own = chosen.Settings if chosen is not None else None
    declared = [cls.Settings for cls in classes.values()]
    typed = typed_declared_settings(data_cfg, own, list(dict.fromkeys(recorded)), declared, "data")
    return dataclasses.replace(data_cfg, declared=typed)
