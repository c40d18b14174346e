"""Block hashes over token ids: the chain a KV event names a prefix by.

A prompt's full blocks of ``block_size`` tokens are hashed in order, each
block's hash over its parent's hash, its own token ids and its extra keys::

    h(i) = blake2b-64(person=PERSON, msgpack([h(i-1) or None, tokens(i), extra(i)]))

masked to 63 bits so every consumer (msgpack readers into a signed or an
unsigned 64-bit integer, in Go, Rust or Python) reads the same number. The
hash depends on nothing of the process or the host (never Python's
``hash()``), so every daemon and every client computes the same chain for
the same tokens.

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

import hashlib
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgspec

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "HASH_MASK",
    "NAMESPACE_TAG",
    "PERSON",
    "Block",
    "ExtraKeys",
    "block_hash",
    "chain",
    "chain_hashes",
    "root_extra_keys",
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


def root_extra_keys(namespace: bytes) -> tuple[str, str]:
    """The first block's extra keys: the namespace header, as hex."""
    if not isinstance(namespace, bytes | bytearray) or not namespace:
        raise ValueError("a namespace is non-empty bytes")
    return (NAMESPACE_TAG, bytes(namespace).hex())


def block_hash(parent: int | None, tokens: Sequence[int], extra: ExtraKeys = None) -> int:
    """The hash of one block under its parent's hash (``None`` for the first)."""
    payload = _encode([parent, list(tokens), None if extra is None else list(extra)])
    digest = hashlib.blake2b(payload, digest_size=8, person=PERSON).digest()
    return int.from_bytes(digest, "big") & HASH_MASK


@dataclass(frozen=True, slots=True)
class Block:
    """One full block of a chain, as a ``BlockStored`` names it."""

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
    parent: int | None = None
    extra: ExtraKeys = root_extra_keys(namespace)
    for start in range(0, len(ids) - block_size + 1, block_size):
        block = tuple(ids[start : start + block_size])
        h = block_hash(parent, block, extra)
        yield Block(h, parent, block, extra)
        parent, extra = h, None


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
