"""CRC32C for ``.kvc`` rows: the ``crc32c`` package's C function, without its package face.

``import crc32c`` runs the package's ``__init__``, which reads its own
version through ``importlib.metadata``: that drags in ``email``, ``zipfile``,
``csv`` and ~50 more modules, 3.5 MB of RSS in every process that checks a
row (the root, the front, cache-meta, each worker; SPEC P9), for a string
nobody reads. This module loads the package's compiled ``_crc32c`` extension
by itself, under its own name, so a later ``import crc32c`` reuses it. If
the package's layout ever differs from what this expects, it falls back to
the plain import: slower to load, never wrong.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Final, Protocol, cast

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["HARDWARE_BASED", "crc32c"]

_EXTENSION: Final = "crc32c._crc32c"


def _extension() -> ModuleType:
    loaded = sys.modules.get(_EXTENSION)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("crc32c")  # finds it, runs nothing
    roots = package.submodule_search_locations if package is not None else None
    for root in roots or ():
        finder = importlib.machinery.FileFinder(
            root,
            (
                importlib.machinery.ExtensionFileLoader,
                importlib.machinery.EXTENSION_SUFFIXES,
            ),
        )
        spec = finder.find_spec(_EXTENSION)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[_EXTENSION] = module
        spec.loader.exec_module(module)
        return module
    import crc32c as whole  # noqa: PLC0415  (the layout changed: the plain way)

    return whole


class _Crc32c(Protocol):
    def __call__(self, data: Buffer, value: int = 0, /) -> int: ...


_crc = _extension()

crc32c = cast("_Crc32c", _crc.crc32c)
"""``crc32c(data, value=0)``: the CRC32C of ``data``, continuing from ``value``."""

HARDWARE_BASED: Final[bool] = bool(_crc.hardware_based)
"""Whether the C code uses the CPU's CRC instructions (SSE4.2 or ARMv8)."""
