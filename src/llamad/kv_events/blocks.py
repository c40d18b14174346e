"""Block hashes over token ids: the chain a KV event names a prefix by.

A prompt's full blocks of ``block_size`` tokens are hashed in order, each
block's hash over its parent's hash, its extra keys and its own token ids::

    h(i) = blake2b-64(person=PERSON,
                      parent(i) || msgpack(extra(i)) if extra(i) || tokens(i) as u32 LE)

where ``parent(i)`` is ``h(i-1)`` as 8 bytes big-endian, or 8 bytes of 0xff
for the first block (no 63-bit hash has that top bit), and the result is
masked to 63 bits so every consumer (msgpack readers into a signed or an
unsigned 64-bit integer, in Go, Rust or Python) reads the same number. The
hash depends on nothing of the process or the host (never Python's
``hash()``), so every daemon and every client computes the same chain for
the same tokens. Only the first block has extra keys; msgpack delimits them,
and the tokens fill the rest. The token bytes are a row's own packing, so
cache-meta hashes a row without converting its tokens (a 2,048-token row is
128 blocks, well under a millisecond).

Tenants and builds never share a hash: the first block carries
:func:`root_extra_keys` of the row's 65-byte namespace header (the model's
fingerprint with the tenant's ``cache_salt`` already folded in, the quant
byte and the context hash with the libllama build folded in; see
``llamad.cache.key`` and ``llamad.model.identity``). A different salt or
build changes the first block's hash and so, through the chain, every hash
after it. The salt itself never travels: only the namespace digest does.

A trailing partial block is not hashed (vLLM only names full blocks either).
"""

from __future__ import annotations

import sys

# hashlib's blake2b is this very type (CPython never takes it from OpenSSL);
# importing hashlib would load OpenSSL's libcrypto, ~4 MB resident in every
# daemon process that imports this module and never hashes (SPEC P9).
from _blake2 import blake2b
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple, TypeAlias

import msgspec

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "HASH_MASK",
    "NAMESPACE_TAG",
    "NO_PARENT",
    "PERSON",
    "SALT_DOMAIN",
    "Block",
    "ExtraKeys",
    "block_hash",
    "chain",
    "chain_hashes",
    "root_extra_keys",
    "salted_header",
    "token_list",
]

DEFAULT_BLOCK_SIZE: Final = 16
"""vLLM's default block size too, so a router's block arithmetic needs no change."""

HASH_MASK: Final = (1 << 63) - 1
"""63 bits: the number is the same read as a signed or an unsigned 64-bit int."""

PERSON: Final = b"llamad-kvblk-v1"
"""blake2b's personalisation: a new chain definition gets a new one."""

NAMESPACE_TAG: Final = "llamad-ns"
"""The first element of the first block's extra keys."""

ExtraKeys: TypeAlias = tuple[Any, ...] | None

_encode = msgspec.msgpack.Encoder().encode


def token_list(tokens: Sequence[int] | bytes | bytearray | memoryview) -> list[int]:
    """Token ids as ints; packed input is read as u32 little-endian (a row's tokens)."""
    if isinstance(tokens, bytes | bytearray | memoryview):
        data = bytes(tokens)
        if len(data) % 4:
            raise ValueError(f"packed tokens are {len(data)} bytes, not a multiple of 4")
        packed = array("I")
        if packed.itemsize != 4:  # pragma: no cover - no such platform in CI
            raise ValueError("this platform has no 4-byte unsigned array type")
        packed.frombytes(data)
        if sys.byteorder != "little":  # pragma: no cover - little-endian hosts only
            packed.byteswap()
        return packed.tolist()
    return [int(t) for t in tokens]


SALT_DOMAIN: Final = b"llamad.cache_salt.v1\x00"
"""The domain of a tenant's salt fold: ``llamad.model.identity.SALT_DOMAIN``'s
value (a test holds the two together)."""


def salted_header(header: bytes, salt: bytes | str | None) -> bytes:
    """A model's 65-byte namespace header with a tenant's ``cache_salt`` folded in.

    What a router needs to hash a tenant's prompt: the daemon publishes each
    model's shared header (``WorkerStatus.namespace``), and a request's salt
    is folded in here exactly as the worker folds it
    (``llamad.model.identity.salted``: ``sha256(SALT_DOMAIN || fingerprint ||
    salt)`` replaces the 32-byte fingerprint). ``None`` is the shared namespace.
    """
    if salt is None:
        return bytes(header)
    raw = salt.encode() if isinstance(salt, str) else bytes(salt)
    if not raw:
        raise ValueError("a cache_salt is non-empty")
    if len(header) != 65:
        raise ValueError(f"a namespace header is 65 bytes, got {len(header)}")
    import hashlib  # noqa: PLC0415  (libcrypto only when a salt is folded: SPEC P9)

    fingerprint = hashlib.sha256(SALT_DOMAIN + header[:32] + raw).digest()
    return fingerprint + bytes(header[32:])


def root_extra_keys(namespace: bytes) -> tuple[str, str]:
    """The first block's extra keys: the namespace header, as hex."""
    if not isinstance(namespace, bytes | bytearray) or not namespace:
        raise ValueError("a namespace is non-empty bytes")
    return (NAMESPACE_TAG, bytes(namespace).hex())


NO_PARENT: Final = b"\xff" * 8
"""The first block's parent bytes (every real parent has its top bit clear)."""


def _pack(tokens: Sequence[int] | bytes | bytearray | memoryview) -> bytes:
    if isinstance(tokens, bytes | bytearray | memoryview):
        return bytes(tokens)
    packed = array("I", tokens)
    if sys.byteorder != "little":  # pragma: no cover - little-endian hosts only
        packed.byteswap()
    return packed.tobytes()


def block_hash(
    parent: int | None,
    tokens: Sequence[int] | bytes | bytearray | memoryview,
    extra: ExtraKeys = None,
) -> int:
    """The hash of one block under its parent's hash (``None`` for the first);
    ``tokens`` as ints or already packed as u32 little-endian."""
    h = blake2b(digest_size=8, person=PERSON)
    h.update(NO_PARENT if parent is None else parent.to_bytes(8, "big"))
    if extra is not None:
        h.update(_encode(list(extra)))
    h.update(_pack(tokens))
    return int.from_bytes(h.digest(), "big") & HASH_MASK


class Block(NamedTuple):
    """One full block of a chain, as a ``BlockStored`` names it.

    A named tuple rather than a frozen dataclass: a long row has thousands
    of blocks, and a tuple is built several times faster.
    """

    hash: int
    parent: int | None
    tokens: tuple[int, ...]
    extra: ExtraKeys


def _check_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


def iter_chain(
    namespace: bytes,
    tokens: Sequence[int] | bytes | bytearray | memoryview,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Iterator[Block]:
    """The full blocks of ``tokens`` under ``namespace``, first to last."""
    _check_size(block_size)
    ids = token_list(tokens)
    packed = memoryview(_pack(tokens))
    step = block_size * 4
    # One personalised state, copied per block: cheaper than a new one each time.
    base = blake2b(digest_size=8, person=PERSON)
    parent: int | None = None
    extra: ExtraKeys = root_extra_keys(namespace)
    for start in range(0, len(ids) - block_size + 1, block_size):
        h = base.copy()
        h.update(NO_PARENT if parent is None else parent.to_bytes(8, "big"))
        if extra is not None:
            h.update(_encode(list(extra)))
        h.update(packed[start * 4 : start * 4 + step])
        value = int.from_bytes(h.digest(), "big") & HASH_MASK
        yield Block(value, parent, tuple(ids[start : start + block_size]), extra)
        parent, extra = value, None


def chain(
    namespace: bytes,
    tokens: Sequence[int] | bytes | bytearray | memoryview,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[Block]:
    """Every full block of ``tokens`` under ``namespace``."""
    return list(iter_chain(namespace, tokens, block_size))


def chain_hashes(
    namespace: bytes,
    tokens: Sequence[int] | bytes | bytearray | memoryview,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[int]:
    """Just the hashes of :func:`chain`: what a router looks a prompt up by."""
    return [b.hash for b in iter_chain(namespace, tokens, block_size)]
