"""Token-exact cache keys (SPEC C1).

A key is ``sha256(fingerprint[32] || quant_byte || ctx_params_hash[32] || tokens)``
with the tokens as unsigned 32-bit little-endian integers. Everything except the
tokens is the :class:`Namespace`: two rows can only ever be confused if they were
produced by the same model bytes, quantisation and KV layout *and* the exact
same token ids.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final, TypeAlias

from llamad.cache.errors import FingerprintMismatch, InvalidCacheValue
from llamad.cache.fingerprint import file_sha256, gguf_chunked_sha256

if TYPE_CHECKING:
    from hashlib import _Hash

KEY_LEN: Final = 32
FINGERPRINT_LEN: Final = 32
CTX_HASH_LEN: Final = 32
HEADER_LEN: Final = FINGERPRINT_LEN + 1 + CTX_HASH_LEN
TOKEN_BYTES: Final = 4

TokenSeq: TypeAlias = Sequence[int] | bytes | bytearray | memoryview
"""Token ids as Python ints, or already packed as u32 little-endian bytes."""


class FingerprintMode(StrEnum):
    """How the model fingerprint is established when a model loads."""

    SAFE = "safe"
    """sha256 of the whole GGUF file."""
    GGUF_CHUNKED = "gguf_chunked"
    """sha256 of the GGUF header, metadata, tensor table and first tensor."""
    FAST_UNSAFE = "fast_unsafe"
    """The caller supplies the digest and it is trusted as is."""


# The cache-internal quant byte is llama.cpp's ``llama_ftype`` value, which is
# stable (removed types keep their number, commented out) and fits in a byte.
# ``guessed`` (1024 upstream) maps to 255 so it still fits.
QUANT_BYTES: Final[Mapping[str, int]] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q2_k": 10,
    "q3_k_s": 11,
    "q3_k_m": 12,
    "q3_k_l": 13,
    "q4_k_s": 14,
    "q4_k_m": 15,
    "q5_k_s": 16,
    "q5_k_m": 17,
    "q6_k": 18,
    "iq2_xxs": 19,
    "iq2_xs": 20,
    "q2_k_s": 21,
    "iq3_xs": 22,
    "iq3_xxs": 23,
    "iq1_s": 24,
    "iq4_nl": 25,
    "iq3_s": 26,
    "iq3_m": 27,
    "iq2_s": 28,
    "iq2_m": 29,
    "iq4_xs": 30,
    "iq1_m": 31,
    "bf16": 32,
    "tq1_0": 36,
    "tq2_0": 37,
    "mxfp4_moe": 38,
    "nvfp4": 39,
    "q1_0": 40,
    "q2_0": 41,
    "guessed": 255,
}
_QUANT_NAMES: Final[Mapping[int, str]] = {v: k for k, v in QUANT_BYTES.items()}
_LLAMA_FTYPE_GUESSED: Final = 1024


def quant_byte(quant: str | int) -> int:
    """The quant byte for a quant name (``"q4_k_m"``) or a ``llama_ftype`` value.

    Unknown names raise; unknown ftype numbers below 255 are accepted as is so a
    newer llama.cpp type still gets a distinct byte.
    """
    if isinstance(quant, str):
        try:
            return QUANT_BYTES[quant.strip().lower()]
        except KeyError:
            raise InvalidCacheValue("quant", f"unknown quant type {quant!r}") from None
    if isinstance(quant, bool) or not isinstance(quant, int):
        raise InvalidCacheValue("quant", f"expected a name or an int, got {type(quant).__name__}")
    if quant == _LLAMA_FTYPE_GUESSED:
        return QUANT_BYTES["guessed"]
    if not 0 <= quant <= 255:
        raise InvalidCacheValue("quant", f"ftype {quant} does not fit the quant byte")
    return quant


def quant_name(byte: int) -> str:
    """The name for a quant byte (``"ftype_<n>"`` for a byte not in the table)."""
    return _QUANT_NAMES.get(byte, f"ftype_{byte}")


def tokens_to_bytes(tokens: TokenSeq) -> bytes:
    """Token ids as u32 little-endian bytes; packed input is checked and passed through."""
    if isinstance(tokens, bytes | bytearray | memoryview):
        data = bytes(tokens)
        if len(data) % TOKEN_BYTES:
            raise InvalidCacheValue(
                "tokens", f"packed tokens are {len(data)} bytes, not a multiple of 4"
            )
        return data
    try:
        packed = array("I", tokens)
    except (OverflowError, TypeError) as exc:
        raise InvalidCacheValue("tokens", f"token ids must be ints in [0, 2**32): {exc}") from None
    if packed.itemsize != TOKEN_BYTES:  # pragma: no cover - no such platform in CI
        packed = array("L", packed)
    if sys.byteorder != "little":  # pragma: no cover - little-endian hosts only in CI
        packed.byteswap()
    return packed.tobytes()


def bytes_to_tokens(data: bytes | bytearray | memoryview) -> list[int]:
    """Inverse of :func:`tokens_to_bytes`."""
    if len(data) % TOKEN_BYTES:
        raise InvalidCacheValue("tokens", "packed tokens are not a multiple of 4 bytes")
    return list(struct.unpack(f"<{len(data) // TOKEN_BYTES}I", data))


def _check_digest(field: str, value: object, length: int) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise InvalidCacheValue(field, f"expected {length} bytes, got {type(value).__name__}")
    if len(value) != length:
        raise InvalidCacheValue(field, f"expected {length} bytes, got {len(value)}")
    return bytes(value)


def sha256(data: bytes = b"") -> _Hash:
    """``hashlib.sha256(data)``, with :mod:`hashlib` imported on the first key.

    ``hashlib`` loads OpenSSL's libcrypto (~4 MB resident); the root and the
    front import this module for its constants and types only and never hash
    (SPEC P9). OpenSSL's sha256 stays: on a long prompt it is ~7x CPython's own.
    """
    import hashlib  # noqa: PLC0415  (deferred: see above)

    return hashlib.sha256(data)


def row_key(header: bytes, tokens: bytes | memoryview) -> bytes:
    """The key of ``tokens`` (u32 LE bytes) under a 65-byte :meth:`Namespace.header`."""
    # Hash in two steps: concatenating would copy a whole prompt first.
    h = sha256(header)
    h.update(tokens)
    return h.digest()


@dataclass(frozen=True, slots=True)
class Namespace:
    """Everything in a key except the tokens: one model, quantisation and KV layout."""

    fingerprint: bytes
    quant: int
    ctx_hash: bytes

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "fingerprint", _check_digest("fingerprint", self.fingerprint, FINGERPRINT_LEN)
        )
        object.__setattr__(self, "ctx_hash", _check_digest("ctx_hash", self.ctx_hash, CTX_HASH_LEN))
        if isinstance(self.quant, bool) or not isinstance(self.quant, int):
            raise InvalidCacheValue("quant", "expected an int quant byte")
        if not 0 <= self.quant <= 255:
            raise InvalidCacheValue("quant", f"{self.quant} is not a byte")

    def header(self) -> bytes:
        """The 65 bytes hashed before the tokens."""
        return self.fingerprint + bytes((self.quant,)) + self.ctx_hash

    def key(self, tokens: TokenSeq) -> bytes:
        """The 32-byte key of exactly these tokens."""
        return row_key(self.header(), tokens_to_bytes(tokens))

    def keys_at(self, tokens: TokenSeq, lengths: Iterable[int]) -> list[bytes]:
        """Keys of several prefixes of ``tokens`` in one pass over the bytes.

        Results follow the order of ``lengths``; each length must lie in
        ``[0, len(tokens)]``. The hash state is extended incrementally, so the
        cost is one sha256 over the longest prefix plus a state copy per length.
        """
        data = tokens_to_bytes(tokens)
        n_tokens = len(data) // TOKEN_BYTES
        wanted = list(lengths)
        for n in wanted:
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= n_tokens:
                raise InvalidCacheValue("lengths", f"{n!r} is not in [0, {n_tokens}]")
        view = memoryview(data)
        state = sha256(self.header())
        done = 0
        by_length: dict[int, bytes] = {}
        for n in sorted(set(wanted)):
            state.update(view[done * TOKEN_BYTES : n * TOKEN_BYTES])
            done = n
            by_length[n] = state.copy().digest()
        return [by_length[n] for n in wanted]


_CTX_HASH_DOMAIN: Final = b"llamad.ctx_params.v1\x00"


# The cache knows no names for KV types, flash-attention modes or RoPE
# scaling types: it hashes the numbers llama.cpp itself uses (``ggml_type``,
# ``llama_flash_attn_type``, ``llama_rope_scaling_type``). The one vocabulary
# that names them is the binding's (``llamad.llama_ffi.KVType``, ``FlashAttn``,
# ``RopeScaling``, IntEnums whose values are those numbers), and the model
# layer (``llamad.model.identity``) is the one caller that maps a live context
# onto these arguments. The cache never imports the binding (SPEC C11).
def _int_in(field: str, value: int, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < hi:
        raise InvalidCacheValue(field, f"{value!r} is not an integer in [{lo}, {hi})")
    return int(value)


def _f32_bits(field: str, value: float) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidCacheValue(field, f"{value!r} is not a finite number")
    # llama.cpp stores these as float32: two Python floats that round to the
    # same float32 configure the same context, so they must hash the same.
    try:
        bits = struct.pack("<f", float(value))
    except OverflowError:
        raise InvalidCacheValue(field, f"{value!r} does not fit a float32") from None
    return b"\x00\x00\x00\x00" if bits == b"\x00\x00\x00\x80" else bits


def ctx_params_hash(
    *,
    n_ctx: int,
    type_k: int = 1,
    type_v: int = 1,
    flash_attn: int = -1,
    n_seq_max: int = 1,
    kv_unified: bool = False,
    swa_full: bool = True,
    rope_scaling_type: int = -1,
    rope_freq_base: float = 0.0,
    rope_freq_scale: float = 0.0,
    yarn_ext_factor: float = -1.0,
    yarn_attn_factor: float = -1.0,
    yarn_beta_fast: float = -1.0,
    yarn_beta_slow: float = -1.0,
    yarn_orig_ctx: int = 0,
) -> bytes:
    """A 32-byte digest of every context parameter that changes the saved KV bytes.

    The KV element types (``type_k``/``type_v``: ``ggml_type`` numbers), the V
    layout (``flash_attn``: ``llama_flash_attn_type``, -1 auto, 0 off, 1 on),
    the cell count and how sequences share it (``n_ctx``, ``n_seq_max``,
    ``kv_unified``, ``swa_full``), and the RoPE/YaRN settings (K is stored
    already rotated). Thread counts, batch sizes and sampling do not change the
    bytes and are deliberately not parameters.

    The defaults are llama.cpp's own, for tools and tests; the model worker
    passes every argument from the live context through
    :func:`llamad.model.identity.namespace` (a test holds it to that).
    """
    for name, flag in (("kv_unified", kv_unified), ("swa_full", swa_full)):
        if not isinstance(flag, bool):
            raise InvalidCacheValue(name, "expected a bool")
    fields: list[tuple[str, bytes]] = [
        ("flash_attn", struct.pack("<b", _int_in("flash_attn", flash_attn, -128, 128))),
        ("kv_unified", struct.pack("<B", kv_unified)),
        ("n_ctx", struct.pack("<I", _int_in("n_ctx", n_ctx, 1, 2**32))),
        ("n_seq_max", struct.pack("<I", _int_in("n_seq_max", n_seq_max, 1, 2**32))),
        ("rope_freq_base", _f32_bits("rope_freq_base", rope_freq_base)),
        ("rope_freq_scale", _f32_bits("rope_freq_scale", rope_freq_scale)),
        (
            "rope_scaling_type",
            struct.pack("<i", _int_in("rope_scaling_type", rope_scaling_type, -(2**31), 2**31)),
        ),
        ("swa_full", struct.pack("<B", swa_full)),
        ("type_k", struct.pack("<B", _int_in("type_k", type_k, 0, 256))),
        ("type_v", struct.pack("<B", _int_in("type_v", type_v, 0, 256))),
        ("yarn_attn_factor", _f32_bits("yarn_attn_factor", yarn_attn_factor)),
        ("yarn_beta_fast", _f32_bits("yarn_beta_fast", yarn_beta_fast)),
        ("yarn_beta_slow", _f32_bits("yarn_beta_slow", yarn_beta_slow)),
        ("yarn_ext_factor", _f32_bits("yarn_ext_factor", yarn_ext_factor)),
        ("yarn_orig_ctx", struct.pack("<I", _int_in("yarn_orig_ctx", yarn_orig_ctx, 0, 2**32))),
    ]
    h = sha256(_CTX_HASH_DOMAIN)
    for name, value in fields:
        h.update(name.encode() + b"=" + value + b"\x00")
    return h.digest()


# Scales are folded as signed micro-units: two scales that differ below 1e-6
# give the same adapter mix in practice and must not split the cache.
SCALE_UNITS: Final = 1_000_000
_ADAPTER_DOMAIN: Final = b"llamad.adapters.v1\x00"


def scale_fixed_point(scale: float) -> int:
    """An adapter scale as the signed 64-bit fixed-point value folded into keys."""
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise InvalidCacheValue("scale", f"{scale!r} is not a finite number")
    units = round(scale * SCALE_UNITS)
    if not -(2**63) <= units < 2**63:
        raise InvalidCacheValue("scale", f"{scale!r} is out of range")
    return units


def effective_fingerprint(base: bytes, adapters: Iterable[tuple[bytes, float]]) -> bytes:
    """The fingerprint of a model with LoRA adapters attached.

    ``adapters`` holds ``(sha256 of the adapter file, scale)`` pairs; order does
    not matter (they are sorted) and no adapters gives ``base`` unchanged, so a
    plain model keeps its rows when adapter support is merely enabled.
    """
    base = _check_digest("fingerprint", base, FINGERPRINT_LEN)
    folded = sorted(
        (_check_digest("adapter", digest, FINGERPRINT_LEN), scale_fixed_point(scale))
        for digest, scale in adapters
    )
    if not folded:
        return base
    h = sha256(_ADAPTER_DOMAIN + base)
    for digest, units in folded:
        h.update(digest + struct.pack("<q", units))
    return h.digest()


def model_fingerprint(
    path: str | os.PathLike[str],
    mode: FingerprintMode | str,
    *,
    supplied: bytes | None = None,
) -> bytes:
    """The 32-byte fingerprint of a GGUF model file under ``mode``.

    ``safe`` hashes the whole file, ``gguf_chunked`` its header, metadata,
    tensor table and first tensor (catches the wrong file or a damaged one, not
    tampering); both check ``supplied`` when it is given and raise
    :class:`FingerprintMismatch` on a difference. ``fast_unsafe`` reads nothing
    and returns ``supplied``, which is then required.
    """
    try:
        mode = FingerprintMode(mode)
    except ValueError:
        raise InvalidCacheValue("fingerprint_mode", f"unknown mode {mode!r}") from None
    if supplied is not None:
        supplied = _check_digest("fingerprint", supplied, FINGERPRINT_LEN)
    if mode is FingerprintMode.FAST_UNSAFE:
        if supplied is None:
            raise InvalidCacheValue("fingerprint", "fast_unsafe needs a supplied fingerprint")
        return supplied
    computed = file_sha256(path) if mode is FingerprintMode.SAFE else gguf_chunked_sha256(path)
    if supplied is not None and supplied != computed:
        raise FingerprintMismatch(
            f"{os.fspath(path)} does not match the supplied {mode.value} fingerprint",
            details={"mode": mode.value, "computed": computed.hex(), "supplied": supplied.hex()},
        )
    return computed
