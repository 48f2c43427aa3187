"""Plug-ins: the objects an entry-point group of installed packages names, each loaded and checked on its own, so
one broken plug-in is reported and does not hide the others; and a registry of named classes that finds a package's
own modules and those entry points on its first lookup."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)


def load_entry_points(group: str, check: Callable[[Any, str], Any], kind: str) -> Iterator[tuple[str, Any]]:
    """(name, checked object) for every entry point of ``group`` that loads and passes ``check(obj, what)``; one
    that does not is logged as a warning naming the ``kind`` of plug-in, and skipped."""
    for entry in importlib.metadata.entry_points(group=group):
        try:
            yield entry.name, check(entry.load(), f"entry point {entry.name} = {entry.value}")
        except Exception as exc:  # one broken plug-in must not hide the others
            log.warning("%s entry point %s (%s) could not be loaded: %s", kind, entry.name, entry.value, exc)


class Registry:
    """Named classes of one kind (subclasses of ``base``), found without a hand-kept list: the first lookup imports
    every module and sub-package of ``package`` (except those in ``skip`` and ``_*`` ones, which hold none; each
    registers its classes with :meth:`register`) and, where ``group`` is given, every entry point of that group (how
    an installed package contributes one). ``on_add(name, cls)`` runs for each class before it is added (to name
    it, or to refuse it)."""

    def __init__(
        self,
        kind: str,
        base: type,
        package: str,
        skip: frozenset[str],
        group: str | None,
        on_add: Callable[[str, type], None] | None = None,
    ) -> None:
        self.kind, self.base, self.package, self.skip, self.group = kind, base, package, skip, group
        self._on_add = on_add
        self._classes: dict[str, type] = {}
        self._discovered = False

    def check(self, cls: Any, what: str) -> type:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{what}: expected a {self.base.__name__} subclass, got {cls!r}")
        return cls

    def _add(self, name: str, cls: type) -> None:
        if self._on_add is not None:  # first: it may refuse the class
            self._on_add(name, cls)
        self._classes[name] = cls

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[Any], Any]:
        """Class decorator: register the class as ``name``. Another class under a taken name is an error unless
        ``overwrite`` (re-importing the same module registers the same class again, silently)."""

        def decorate(cls: Any) -> Any:
            self.discover()  # the package's own classes first, so that a taken name is known
            self.check(cls, f"register {self.kind} {name!r}")
            current = self._classes.get(name)
            if current is not None and not overwrite and qualified_name(current) != qualified_name(cls):
                raise ValueError(f"{self.kind} {name!r} is already registered by {qualified_name(current)}")
            self._add(name, cls)
            return cls

        return decorate

    def discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(package.__path__):
            if info.name not in self.skip and not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")
        for name, cls in load_entry_points(self.group, self.check, self.kind) if self.group else ():
            if name not in self._classes:
                self._add(name, cls)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self.discover()
        return sorted(self._classes)

    def get(self, name: str) -> type | None:
        self.discover()
        return self._classes.get(name)

    def classes(self) -> dict[str, type]:
        self.discover()
        return dict(self._classes)


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class: how registries tell the same class registered again (a module imported
    twice) from another class under a taken name."""
    return f"{cls.__module__}.{cls.__qualname__}"
