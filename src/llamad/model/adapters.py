"""LoRA adapters of a live worker: load, unload, rescale, list (SPEC M11, L10).

An :class:`AdapterSet` names the adapters attached to the worker's
generation context. The cache namespace is read from that context
(:func:`llamad.model.identity.namespace` folds the sha256 and scale of every
adapter attached with a non-zero scale), so loading, unloading or rescaling
an adapter changes the namespace of every key made afterwards, with nothing
else to keep in step; a request keeps the namespace it was submitted under
(the core snapshots it at submission).

An adapter change applies to the whole context at once. The worker must
therefore apply it only while no request is admitted or queued: a request
submitted under the old namespace that decoded under the new adapters would
save rows whose bytes its key does not describe. The embedding context
mirrors the generation context (:class:`llamad.model.embedder.Embedder`).
"""

from __future__ import annotations

import math
import os
from typing import Final

import structlog

from llamad.errors import BadRequest
from llamad.llama_ffi.context import Context
from llamad.llama_ffi.errors import AdapterError
from llamad.llama_ffi.lora import LoraAdapter
from llamad.model.wire import AdapterInfo

__all__ = ["MAX_ADAPTERS", "MAX_SCALE", "AdapterSet", "check_scale"]

log = structlog.get_logger("llamad.model")

MAX_ADAPTERS: Final = 16
"""Most adapters loaded at once on one worker."""
MAX_SCALE: Final = 100.0
"""Largest ``|scale|`` accepted; far past any useful strength."""
_MAX_NAME: Final = 128


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= _MAX_NAME or "\x00" in name:
        raise BadRequest(
            f"adapter name must be a non-empty string of at most {_MAX_NAME} characters",
            details={"field": "name"},
        )
    return name


def check_scale(scale: object) -> float:
    """``scale`` as a float, else ``bad_request`` naming ``scale``."""
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int | float)
        or not math.isfinite(scale)
        or abs(scale) > MAX_SCALE
    ):
        raise BadRequest(
            f"adapter scale must be a finite number in [-{MAX_SCALE}, {MAX_SCALE}], not {scale!r}",
            details={"field": "scale"},
        )
    return float(scale)


class AdapterSet:
    """The adapters attached to ``ctx``, by name."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._by_name: dict[str, LoraAdapter] = {}

    def _get(self, name: str) -> LoraAdapter:
        adapter = self._by_name.get(_check_name(name))
        if adapter is None:
            raise AdapterError(
                f"no adapter named {name!r} is loaded",
                details={"name": name, "loaded": sorted(self._by_name)},
            )
        return adapter

    def _info(self, name: str, adapter: LoraAdapter) -> AdapterInfo:
        scale = dict(self.ctx.adapters).get(adapter, 0.0)
        return AdapterInfo(name, str(adapter.path), adapter.sha256.hex(), scale)

    def load(self, name: str, path: str | os.PathLike[str], scale: float = 1.0) -> AdapterInfo:
        """Load the adapter GGUF at ``path`` and attach it at ``scale``."""
        name = _check_name(name)
        scale = check_scale(scale)
        if name in self._by_name:
            raise AdapterError(
                f"an adapter named {name!r} is already loaded", details={"name": name}
            )
        if len(self._by_name) >= MAX_ADAPTERS:
            raise AdapterError(
                f"{MAX_ADAPTERS} adapters are loaded already; unload one first",
                details={"limit": MAX_ADAPTERS},
            )
        adapter = self.ctx.model.load_adapter(path)
        try:
            self.ctx.set_adapter(adapter, scale)
        except BaseException:
            adapter.unload()
            raise
        self._by_name[name] = adapter
        log.info("model.adapter_loaded", name=name, sha256=adapter.sha256.hex(), scale=scale)
        return self._info(name, adapter)

    def set_scale(self, name: str, scale: float) -> AdapterInfo:
        """Rescale a loaded adapter (0 takes it out of the graph, keeps it loaded)."""
        adapter = self._get(name)
        scale = check_scale(scale)
        self.ctx.set_adapter(adapter, scale)
        log.info("model.adapter_scaled", name=name, scale=scale)
        return self._info(name, adapter)

    def unload(self, name: str) -> None:
        """Detach the adapter from every context of the model and free it."""
        adapter = self._get(name)
        del self._by_name[name]
        adapter.unload()
        log.info("model.adapter_unloaded", name=name)

    def list_adapters(self) -> list[AdapterInfo]:
        """Loaded adapters, in load order."""
        return [self._info(name, adapter) for name, adapter in self._by_name.items()]

    def close(self) -> None:
        """Unload every adapter."""
        for name in list(self._by_name):
            self.unload(name)
