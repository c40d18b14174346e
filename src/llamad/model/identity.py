"""The cache identity of a live model, context and adapter set (SPEC C1, L10).

A cache row may only ever be restored into a context that could have produced
it. :func:`namespace` is the one function that decides what that means: it
reads the *live* objects (the model as loaded, the context as llama.cpp
created it, the adapters attached right now) and builds the
:class:`~llamad.cache.key.Namespace` every key of that context is made under:

- ``fingerprint``: the model file's digest (:func:`base_fingerprint`, computed
  once per model and mode) folded with the sha256 and scale of every adapter
  with a non-zero scale (:func:`~llamad.cache.key.effective_fingerprint`);
- ``quant``: the model's ``llama_ftype`` as the cache's quant byte;
- ``ctx_hash``: :func:`~llamad.cache.key.ctx_params_hash` over every
  :class:`~llamad.llama_ffi.ContextOptions` field in
  :data:`HASHED_CONTEXT_FIELDS`, with the libllama build folded in
  (:func:`with_build`: the build's
  :class:`~llamad.llama_ffi.build_identity.BuildIdentity`, read once per
  process by :func:`~llamad.llama_ffi.build_info.build_identity`), so a row
  written by another llama.cpp, backend or numerics-relevant configuration is
  in another namespace (SPEC C12).

A request's ``cache_salt`` (SPEC M17) is folded into the fingerprint last
(:func:`salted`), so each tenant's rows live in a namespace of their own on
every tier; no salt is the model's shared namespace.

Every ``ContextOptions`` field is either hashed or listed in
:data:`EXCLUDED_CONTEXT_FIELDS` with the reason it cannot change the saved
bytes; a test fails when a field is added to the binding without deciding.
``docs/internals/model.md`` explains each choice.

The binding (:mod:`llamad.llama_ffi`) knows nothing of the cache, and the
cache knows nothing of llama.cpp (it hashes the numbers it is given): this
module is the one place that maps one onto the other.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from llamad.cache.errors import FingerprintMismatch, InvalidCacheValue
from llamad.cache.key import (
    FingerprintMode,
    Namespace,
    ctx_params_hash,
    effective_fingerprint,
    model_fingerprint,
    quant_byte,
)
from llamad.llama_ffi.errors import Closed

if TYPE_CHECKING:
    from llamad.llama_ffi.build_identity import BuildIdentity
    from llamad.llama_ffi.options import ContextOptions

__all__ = [
    "BUILD_DOMAIN",
    "EXCLUDED_CONTEXT_FIELDS",
    "EXCLUDED_MODEL_FIELDS",
    "HASHED_CONTEXT_FIELDS",
    "SALT_DOMAIN",
    "LiveAdapter",
    "LiveContext",
    "LiveModel",
    "base_fingerprint",
    "namespace",
    "salted",
    "with_build",
]

log = structlog.get_logger("llamad.model")

SALT_DOMAIN: Final = b"llamad.cache_salt.v1\x00"
"""Prefix of the salted fingerprint's preimage: no other digest llamad makes
(adapters, context parameters, keys) hashes the same bytes."""

BUILD_DOMAIN: Final = b"llamad.ctx_hash.build.v1\x00"
"""Prefix of the preimage that folds the build into ``ctx_hash`` (:func:`with_build`)."""

_ROPE = "K is stored already rotated, so another RoPE setting makes other K bytes"

HASHED_CONTEXT_FIELDS: Final[Mapping[str, str]] = {
    "n_ctx": "the KV cell count; read from the live context (llama.cpp pads the request)",
    "n_seq_max": "the number of sequences, and of KV streams without kv_unified; read live",
    "kv_unified": "one KV stream for all sequences or one each; a packed state records which",
    "type_k": "the element type of K cells",
    "type_v": "the element type of V cells",
    "flash_attn": "without flash attention V is stored transposed",
    "swa_full": "how many cells sliding-window layers keep",
    "rope_scaling_type": _ROPE,
    "rope_freq_base": _ROPE,
    "rope_freq_scale": _ROPE,
    "yarn_ext_factor": _ROPE,
    "yarn_attn_factor": _ROPE,
    "yarn_beta_fast": _ROPE,
    "yarn_beta_slow": _ROPE,
    "yarn_orig_ctx": _ROPE,
}
"""ContextOptions fields folded into ``ctx_hash``, each with why it changes the bytes.

The names are :func:`~llamad.cache.key.ctx_params_hash`'s parameters, one for one."""

EXCLUDED_CONTEXT_FIELDS: Final[Mapping[str, str]] = {
    "n_batch": "tokens per decode call; a state restores into a context of any batch size",
    "n_ubatch": "how a decode is split into compute passes, not what a cell holds",
    "n_threads": "CPU threads for generation; the same cells either way",
    "n_threads_batch": "CPU threads for prompt processing; the same cells either way",
    "embeddings": "whether pooled embeddings are read out; the KV cells are the same",
    "pooling": "how outputs are pooled into embeddings; the KV cells are the same",
    "offload_kqv": "where the KV cache lives; a packed state is the same bytes from GPU or host",
}
"""ContextOptions fields deliberately left out of ``ctx_hash``, each with the reason."""

EXCLUDED_MODEL_FIELDS: Final[Mapping[str, str]] = {
    "n_gpu_layers": "where the weights run; the fingerprint covers what they are",
    "load_mode": "how the file is mapped (mmap, mlock); the same weights",
    "vocab_only": "a vocab-only model cannot have a context, so has no namespace",
    "split_mode": "how the weights are spread over GPUs; the same weights",
    "main_gpu": "which GPU runs the model; the same weights",
    "tensor_split": "each GPU's share of the weights; the same weights",
    "check_tensors": "a validation pass at load; the same weights",
    "repack": (
        "interleaved weight layouts (other kernels, other bits): off only under the model "
        "option `deterministic`, whose runtime switches are in the build identity"
    ),
}
"""ModelOptions fields, none of which is part of a namespace: the model is
identified by its file (``fingerprint``, ``quant``), never by how it was loaded."""


class LiveModel(Protocol):
    """What :func:`namespace` reads from a loaded :class:`~llamad.llama_ffi.Model`."""

    @property
    def path(self) -> Path: ...
    @property
    def ftype(self) -> int: ...
    @property
    def file_identity(self) -> tuple[int, int, int, int]: ...


class LiveAdapter(Protocol):
    """What :func:`namespace` reads from a loaded :class:`~llamad.llama_ffi.LoraAdapter`."""

    @property
    def sha256(self) -> bytes: ...


class LiveContext(Protocol):
    """What :func:`namespace` reads from a :class:`~llamad.llama_ffi.Context`."""

    @property
    def model(self) -> LiveModel: ...
    @property
    def options(self) -> ContextOptions: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_seq_max(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def adapters(self) -> Sequence[tuple[LiveAdapter, float]]: ...


_FingerprintKey = tuple[FingerprintMode, bytes | None]

_lock = threading.Lock()
# Weak: a fingerprint lives exactly as long as the model object it describes.
_fingerprints: weakref.WeakKeyDictionary[LiveModel, dict[_FingerprintKey, bytes]]
_fingerprints = weakref.WeakKeyDictionary()


def _file_identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _check_unchanged(model: LiveModel) -> None:
    if _file_identity(model.path) != model.file_identity:
        raise FingerprintMismatch(
            f"{model.path} changed on disk since the model was loaded; its digest would not "
            "describe the weights in memory",
            details={"path": str(model.path), "reason": "file_changed"},
        )


def base_fingerprint(
    model: LiveModel,
    mode: FingerprintMode | str = FingerprintMode.GGUF_CHUNKED,
    *,
    supplied: bytes | None = None,
) -> bytes:
    """The fingerprint of ``model``'s file under ``mode``, without adapters.

    Computed once per model, mode and supplied digest (a whole-file sha256 of a
    large model takes seconds; the worker calls this right after loading).
    The file must still be the one that was loaded (same device, inode, size
    and modification time, before and after hashing), else
    :class:`~llamad.cache.errors.FingerprintMismatch`: a digest of a replaced
    file would name weights that are not in memory.
    """
    try:
        mode = FingerprintMode(mode)
    except ValueError:
        raise InvalidCacheValue("fingerprint_mode", f"unknown mode {mode!r}") from None
    key = (mode, supplied)
    with _lock:
        cached = _fingerprints.get(model, {}).get(key)
    if cached is not None:
        return cached
    started = time.monotonic()
    if mode is FingerprintMode.FAST_UNSAFE:
        # Trusting the caller is the point of this mode: nothing is read.
        digest = model_fingerprint(model.path, mode, supplied=supplied)
    else:
        _check_unchanged(model)
        digest = model_fingerprint(model.path, mode, supplied=supplied)
        _check_unchanged(model)
    with _lock:
        _fingerprints.setdefault(model, {})[key] = digest
    log.info(
        "model.fingerprinted",
        path=str(model.path),
        mode=mode.value,
        fingerprint=digest.hex(),
        seconds=round(time.monotonic() - started, 3),
    )
    return digest


def _context_params(ctx: LiveContext) -> dict[str, object]:
    opts = ctx.options
    params: dict[str, object] = {name: getattr(opts, name) for name in HASHED_CONTEXT_FIELDS}
    # The sizes llama.cpp runs with, not the ones asked for: it pads n_ctx to a
    # multiple of 256 (per sequence without kv_unified), so two requests that
    # give the same context share rows and no request is hashed as a size the
    # context does not have.
    params["n_ctx"] = ctx.n_ctx
    params["n_seq_max"] = ctx.n_seq_max
    return params


def salted(ns: Namespace, salt: bytes | None) -> Namespace:
    """``ns`` with a tenant's ``cache_salt`` folded into its fingerprint (SPEC M17).

    ``sha256(SALT_DOMAIN || fingerprint || salt)``: the fingerprint and the
    domain have fixed lengths, so distinct salts are distinct preimages, and
    nothing depends on the process (the same salt names the same rows after a
    restart, on every tier). ``None`` is the model's shared namespace; an
    empty salt is refused rather than quietly treated as either.
    """
    if salt is None:
        return ns
    if not isinstance(salt, bytes) or not salt:
        raise InvalidCacheValue("cache_salt", "expected non-empty bytes")
    fingerprint = hashlib.sha256(SALT_DOMAIN + ns.fingerprint + salt).digest()
    return Namespace(fingerprint=fingerprint, quant=ns.quant, ctx_hash=ns.ctx_hash)


def with_build(ctx_hash: bytes, build: BuildIdentity) -> bytes:
    """``ctx_hash`` with the libllama ``build`` folded in (SPEC C12).

    ``sha256(BUILD_DOMAIN || ctx_hash || build.digest)``: both have fixed
    lengths, so distinct builds are distinct preimages, and nothing depends on
    the process (the same build names the same rows after a restart, in
    another worker, on another host).
    """
    return hashlib.sha256(BUILD_DOMAIN + ctx_hash + build.digest).digest()


def _loaded_build() -> BuildIdentity:
    # Imported here, not at the top: the client imports this package (for its
    # result types) and must not load libllama by doing so.
    from llamad.llama_ffi.build_info import build_identity  # noqa: PLC0415

    return build_identity()


def namespace(
    ctx: LiveContext,
    mode: FingerprintMode | str = FingerprintMode.GGUF_CHUNKED,
    *,
    supplied: bytes | None = None,
    salt: bytes | None = None,
    build: BuildIdentity | None = None,
) -> Namespace:
    """The cache namespace of ``ctx`` as it runs now: its model (fingerprinted
    under ``mode``, see :func:`base_fingerprint`), the adapters attached at this
    moment with a non-zero scale, its live context parameters and the libllama
    build (``build``, by default the one loaded in this process, see
    :func:`with_build`); with ``salt``, folded by :func:`salted`.

    Call it when a key is made (lookup, save), from the thread that drives the
    context: attaching or rescaling an adapter changes the namespace.
    """
    if ctx.closed:
        raise Closed("context is closed")
    model = ctx.model
    base = base_fingerprint(model, mode, supplied=supplied)
    # A zero scale keeps an adapter listed but out of the graph (the outputs
    # are the base model's), so it must not split the cache.
    active = tuple((adapter.sha256, scale) for adapter, scale in ctx.adapters if scale != 0.0)
    params = _context_params(ctx)
    built = build if build is not None else _loaded_build()
    # Every input, as plain values: the four sha256s below are what a call
    # costs, and the worker asks on every status publish (once per decode step).
    memo = (base, active, tuple(params.items()), model.ftype, built.digest, salt)
    known = _NAMESPACES.get(memo)
    if known is not None:
        return known
    layout = ctx_params_hash(**params)  # type: ignore[arg-type]
    shared = Namespace(
        fingerprint=effective_fingerprint(base, active),
        quant=quant_byte(model.ftype),
        ctx_hash=with_build(layout, built),
    )
    result = salted(shared, salt)
    if len(_NAMESPACES) >= _NAMESPACES_KEPT:
        _NAMESPACES.clear()  # tenants' salts come and go: never grow without bound
    _NAMESPACES[memo] = result
    return result


_NAMESPACES_KEPT: Final = 256
_NAMESPACES: dict[tuple[object, ...], Namespace] = {}
"""namespace()'s answers by their inputs (a Namespace is immutable)."""
