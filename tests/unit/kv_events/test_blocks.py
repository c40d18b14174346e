"""The block hash chain: stable, prefix-shaped, and namespaced by salt and build."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys

import msgspec
import pytest

from llamad.kv_events.blocks import (
    DEFAULT_BLOCK_SIZE,
    HASH_MASK,
    NAMESPACE_TAG,
    PERSON,
    block_hash,
    chain,
    chain_hashes,
    root_extra_keys,
    token_list,
)

NS = bytes(range(65))
OTHER_NS = bytes([1]) + bytes(range(1, 65))


def test_hash_is_blake2b_of_the_documented_bytes_masked_to_63_bits() -> None:
    # The definition docs/internals/kv-events.md gives, computed by hand here so
    # a router in another language can follow the same steps.
    root = hashlib.blake2b(digest_size=8, person=PERSON)
    root.update(b"\xff" * 8)
    root.update(msgspec.msgpack.encode(["llamad-ns", "ab"]))
    root.update(struct.pack("<3I", 1, 2, 70000))
    first = int.from_bytes(root.digest(), "big") & HASH_MASK
    assert block_hash(None, [1, 2, 70000], ("llamad-ns", "ab")) == first
    child = hashlib.blake2b(digest_size=8, person=PERSON)
    child.update(first.to_bytes(8, "big"))
    child.update(struct.pack("<2I", 5, 6))
    assert block_hash(first, [5, 6]) == int.from_bytes(child.digest(), "big") & HASH_MASK
    assert block_hash(first, struct.pack("<2I", 5, 6)) == block_hash(first, [5, 6])


def test_the_same_in_another_process_with_another_hash_seed() -> None:
    # Never Python's hash(): a fresh interpreter with another PYTHONHASHSEED
    # (and another process) computes the same chain.
    tokens = list(range(100, 164))
    here = chain_hashes(NS, tokens)
    code = (
        "import sys; from llamad.kv_events.blocks import chain_hashes;"
        "print(chain_hashes(bytes(range(65)), list(range(100, 164))))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == here


def test_full_blocks_only_and_parent_chain() -> None:
    tokens = list(range(2 * DEFAULT_BLOCK_SIZE + 5))
    blocks = chain(NS, tokens)
    assert len(blocks) == 2
    assert blocks[0].parent is None and blocks[1].parent == blocks[0].hash
    assert blocks[0].tokens == tuple(range(16)) and blocks[1].tokens == tuple(range(16, 32))
    assert blocks[0].extra == (NAMESPACE_TAG, NS.hex()) == root_extra_keys(NS)
    assert blocks[1].extra is None
    assert blocks[1].hash == block_hash(blocks[0].hash, range(16, 32), None)
    assert chain(NS, tokens[:15]) == []
    assert all(0 <= b.hash <= HASH_MASK for b in blocks)


def test_a_prefix_has_the_prefix_of_the_chain() -> None:
    tokens = list(range(1000, 1100))
    assert chain_hashes(NS, tokens[:48]) == chain_hashes(NS, tokens)[:3]


def test_namespace_changes_every_block() -> None:
    # The namespace header carries the tenant's salt and the build: a second
    # tenant (or build) shares no block with the first, not even later ones.
    tokens = list(range(64))
    a, b = chain_hashes(NS, tokens), chain_hashes(OTHER_NS, tokens)
    assert not set(a) & set(b)


def test_one_token_changes_its_block_and_every_later_one() -> None:
    tokens = list(range(64))
    changed = [*tokens]
    changed[20] = 9999
    a, b = chain_hashes(NS, tokens), chain_hashes(NS, changed)
    assert a[0] == b[0]
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))


def test_block_size_is_configurable() -> None:
    tokens = list(range(64))
    assert len(chain(NS, tokens, 8)) == 8
    assert chain_hashes(NS, tokens, 8)[0] != chain_hashes(NS, tokens, 16)[0]
    with pytest.raises(ValueError, match="block_size"):
        chain(NS, tokens, 0)


def test_packed_row_tokens_read_as_u32_little_endian() -> None:
    tokens = [0, 1, 70000, 2**32 - 1] * 8
    packed = struct.pack(f"<{len(tokens)}I", *tokens)
    assert token_list(packed) == tokens
    assert chain_hashes(NS, packed) == chain_hashes(NS, tokens)
    with pytest.raises(ValueError, match="multiple of 4"):
        token_list(b"\x00" * 5)


def test_root_needs_a_namespace() -> None:
    with pytest.raises(ValueError, match="namespace"):
        root_extra_keys(b"")


def test_salted_header_folds_a_salt_exactly_as_the_worker_does() -> None:
    # A router hashes a tenant's prompt under the header the worker would use.
    from llamad.cache.key import Namespace  # noqa: PLC0415 - the daemon's side, for comparison
    from llamad.kv_events.blocks import SALT_DOMAIN, salted_header  # noqa: PLC0415
    from llamad.model.identity import SALT_DOMAIN as MODEL_SALT_DOMAIN  # noqa: PLC0415
    from llamad.model.identity import salted  # noqa: PLC0415

    assert SALT_DOMAIN == MODEL_SALT_DOMAIN
    ns = Namespace(fingerprint=bytes(range(32)), quant=15, ctx_hash=bytes(range(32, 64)))
    for salt in (b"acme", b"tenant-b", "t\u00e9nant".encode()):
        assert salted_header(ns.header(), salt) == salted(ns, salt).header()
    assert salted_header(ns.header(), "acme") == salted(ns, b"acme").header()
    assert salted_header(ns.header(), None) == ns.header()
    with pytest.raises(ValueError):
        salted_header(ns.header(), b"")
    with pytest.raises(ValueError):
        salted_header(b"short", b"x")
