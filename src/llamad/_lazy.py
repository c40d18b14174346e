"""Lazy package faces: a name a package exports is imported on first use.

Each package's ``__init__`` names what it exports and where each name lives;
this module builds the module-level ``__getattr__`` and ``__dir__`` (PEP 562)
that import the home module when the name is first read. Importing a package
therefore costs only its ``__init__``: a client that needs
``llamad.model.results`` never loads the worker, and ``import llamad`` loads
neither ZeroMQ nor libllama. Type checkers read the names from the
``TYPE_CHECKING`` imports and the literal ``__all__`` beside each call.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["defer_module", "exports", "lazy_face"]

_FACES: dict[str, Mapping[str, str]] = {}


def lazy_face(
    package: str, homes: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose exports are
    ``homes``: a home module's full name to the names it defines."""
    where: dict[str, str] = {}
    for module, names in homes.items():
        for name in names:
            if name in where:
                raise ValueError(f"{package}: {name!r} exported from two modules")
            where[name] = module
    _FACES[package] = where

    def __getattr__(name: str) -> Any:  # noqa: N807  (PEP 562's name)
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        # Later reads find the value in the package's globals and skip this.
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__


def exports(package: str) -> Mapping[str, str]:
    """What ``package``'s face exports: each name's home module (the package
    must have been imported)."""
    return dict(_FACES[package])


class _Deferred(types.ModuleType):
    """Stands in ``sys.modules`` for a module until something reads from it.

    ``import name`` then binds this stand-in and costs nothing; the first
    attribute read imports the real module, which takes the stand-in's place
    in ``sys.modules`` and lends it its namespace.
    """

    def __getattr__(self, attr: str) -> Any:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def defer_module(name: str) -> None:
    """Let ``import name`` succeed without importing ``name`` until one of its
    attributes is read (no-op when it is already imported).

    For a process that imports a library which imports ``name`` only for
    code paths the process never takes: structlog imports asyncio (and with
    it ssl, ~8 MB resident) for its async logging methods, which no daemon
    process calls (SPEC P9). Only a process's entry point calls this, before
    its first import of such a library.
    """
    if name not in sys.modules:
        sys.modules[name] = _Deferred(name)
