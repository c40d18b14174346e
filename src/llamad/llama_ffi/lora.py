"""LoRA adapters (SPEC L10).

An adapter is loaded for one model (:meth:`Model.load_adapter`), attached to
contexts at a scale (:meth:`Context.set_adapter`) and unloaded with
:meth:`LoraAdapter.unload`, which first detaches it from every live context.
Adapters lease the model, and attached contexts lease the adapter, so the
native free order is always context → adapter → model.

Each adapter records the sha256 of its file as it was loaded; the model layer
(:mod:`llamad.model.identity`) folds the digests and scales of a context's
active adapters into its cache namespace.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from llamad.llama_ffi.errors import AdapterError, ModelFileError
from llamad.llama_ffi.gguf_check import check_gguf
from llamad.llama_ffi.inputs import file_path
from llamad.llama_ffi.lifetime import NativeHandle
from llamad.llama_ffi.native import ffi, lib, read_metadata

if TYPE_CHECKING:
    from llamad.llama_ffi.model import Model

__all__ = ["LoraAdapter"]

log = structlog.get_logger("llamad.llama_ffi")


def _adapter_free(model_handle: NativeHandle, path: str) -> Callable[[Any], None]:
    def free(ptr: Any) -> None:
        lib.llama_adapter_lora_free(ptr)
        model_handle.release()
        log.info("adapter.freed", path=path)

    return free


# Keys llama.cpp reads with gguf_get_val_str / _f32, which abort on a value of
# another type; an adapter file must pass this check before llama.cpp sees it.
_ADAPTER_KEYS = {
    "general.type": int(lib.GGUF_TYPE_STRING),
    "general.architecture": int(lib.GGUF_TYPE_STRING),
    "adapter.type": int(lib.GGUF_TYPE_STRING),
    "adapter.lora.alpha": int(lib.GGUF_TYPE_FLOAT32),
}


def _file_sha256(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").digest()
    except OSError as exc:
        raise ModelFileError(
            f"cannot read {path}: {exc.strerror}", details={"path": str(path)}
        ) from None


def _check_adapter_header(path: Path) -> None:
    info = check_gguf(path, keys=_ADAPTER_KEYS)
    for key, want in _ADAPTER_KEYS.items():
        got = info.key_types[key]
        if got not in (-1, want):
            raise AdapterError(
                f"{path}: metadata {key} has GGUF type {got}, expected {want}",
                details={"path": str(path), "key": key},
            )


class LoraAdapter:
    """One LoRA adapter GGUF loaded for ``model``.

    ``sha256`` is the digest of the adapter file as it was loaded; the cache
    namespace of a context it is attached to folds it in (with its scale).
    """

    def __init__(self, model: Model, path: str | os.PathLike[str]) -> None:
        self.model = model
        self.path = file_path(path)
        _check_adapter_header(self.path)
        self.sha256 = _file_sha256(self.path)
        model_handle = model.native_handle
        model_ptr = model_handle.acquire()
        try:
            ptr = lib.llama_adapter_lora_init(model_ptr, os.fsencode(self.path))
            if ptr == ffi.NULL:
                raise AdapterError(
                    f"llama.cpp could not load {self.path} as a LoRA adapter for this model "
                    "(see llama.log events)",
                    details={"path": str(self.path)},
                )
        except BaseException:
            model_handle.release()
            raise
        self._handle = NativeHandle(ptr, _adapter_free(model_handle, str(self.path)), "adapter")
        self._finalizer = weakref.finalize(self, self._handle.close)
        log.info("adapter.loaded", path=str(self.path), sha256=self.sha256.hex())

    @property
    def native_handle(self) -> NativeHandle:
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle.closed

    @property
    def metadata(self) -> dict[str, str]:
        """The adapter's GGUF metadata key/values (scalars only)."""
        with self._handle.lease() as ptr:
            return read_metadata(
                ptr,
                lib.llama_adapter_meta_count,
                lib.llama_adapter_meta_key_by_index,
                lib.llama_adapter_meta_val_str_by_index,
            )

    def unload(self) -> None:
        """Detach from every context of the model and free the adapter (idempotent)."""
        for ctx in self.model._live_contexts():
            ctx.remove_adapter(self)
        self._finalizer()

    def __repr__(self) -> str:
        state = "unloaded" if self.closed else "loaded"
        return f"<LoraAdapter {self.path.name} {self.sha256.hex()[:12]} {state}>"
