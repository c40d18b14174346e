"""The remote tier's pure parts: names, manifest, chunks, damage, candidate lengths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.key import Namespace, ctx_params_hash
from llamad.cache.pressure import PressureConfig
from llamad.cache.remote import (
    Manifest,
    RemoteConfig,
    RemoteDamaged,
    assemble,
    candidate_lengths,
    chunk_name,
    row_name,
    split,
)
from llamad.cache.settings import CacheSettings
from llamad.cache.tiers import TierConfig
from llamad.errors import ConfigError
from llamad.model.identity import salted
from llamad.tiers import TierKind

KEY = bytes(range(32))
WID = b"\xab" * 16


def test_names_carry_the_prefix_and_the_full_key() -> None:
    assert row_name("llamad:kvc:v1", KEY) == b"llamad:kvc:v1:row:" + KEY.hex().encode()
    assert chunk_name("p", KEY, WID, 3) == f"p:chunk:{KEY.hex()}:{WID.hex()}:3".encode()


def test_the_key_of_a_salted_namespace_differs_so_its_redis_name_does() -> None:
    ns = Namespace(fingerprint=b"\x11" * 32, quant=3, ctx_hash=ctx_params_hash(n_ctx=4096))
    tokens = list(range(40))
    names = {row_name("p", n.key(tokens)) for n in (ns, salted(ns, b"a"), salted(ns, b"b"))}
    assert len(names) == 3


def test_another_build_or_context_names_another_redis_key() -> None:
    tokens = list(range(40))
    names = {
        row_name("p", Namespace(b"\x11" * 32, 3, ctx_params_hash(n_ctx=n)).key(tokens))
        for n in (4096, 8192)
    }
    assert len(names) == 2


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * 4096, 3 * 4096 + 7])
def test_split_and_assemble_round_trip_at_every_chunk_boundary(size: int) -> None:
    data = os.urandom(size)
    manifest, chunks = split(data, KEY, WID, 4096)
    assert manifest.n_chunks == len(chunks) == -(-size // 4096)
    assert all(len(c) <= 4096 for c in chunks)
    back = Manifest.decode(manifest.encode(), KEY)
    assert back == manifest
    assert assemble(back, [bytes(c) for c in chunks]) == data
    assert len(back.chunk_names("p")) == manifest.n_chunks


def test_every_bit_flip_in_a_chunk_is_damage() -> None:
    data = os.urandom(300)
    manifest, _ = split(data, KEY, WID, 128)
    for i in range(len(data) * 8):
        bad = bytearray(data)
        bad[i // 8] ^= 1 << (i % 8)
        parts = [bytes(bad[j : j + 128]) for j in range(0, len(bad), 128)]
        with pytest.raises(RemoteDamaged):
            assemble(manifest, parts)  # type: ignore[arg-type]


def test_a_truncated_or_missing_chunk_is_refused() -> None:
    data = os.urandom(300)
    manifest, chunks = split(data, KEY, WID, 128)
    parts: list[bytes | None] = [bytes(c) for c in chunks]
    with pytest.raises(RemoteDamaged):
        assemble(manifest, [*parts[:-1], parts[-1][:-1]])  # type: ignore[index]
    with pytest.raises(LookupError):
        assemble(manifest, [parts[0], None, parts[2]])
    with pytest.raises(RemoteDamaged):
        assemble(manifest, parts[:2])


def test_a_manifest_is_refused_under_another_key_or_damaged() -> None:
    manifest, _ = split(b"x" * 10, KEY, WID, 4096)
    raw = manifest.encode()
    with pytest.raises(RemoteDamaged, match="manifest_key"):
        Manifest.decode(raw, b"\x00" * 32)
    with pytest.raises(RemoteDamaged):
        Manifest.decode(raw[:-1], KEY)
    with pytest.raises(RemoteDamaged):
        Manifest.decode(b"X" + raw[1:], KEY)


def test_candidate_lengths_are_the_prompt_and_the_aligned_boundaries_above_what_is_covered() -> (
    None
):
    assert candidate_lengths(100, 0, 16, at_least=16) == [100, 96, 80, 64, 48]
    assert candidate_lengths(96, 0, 16, at_least=16) == [96, 80, 64, 48, 32]
    assert candidate_lengths(100, 64, 16, at_least=16) == [100, 96, 80]
    assert candidate_lengths(100, 100, 16, at_least=16) == []
    assert candidate_lengths(40, 0, 16, at_least=48) == []
    assert candidate_lengths(5000, 0, 2048, at_least=1024) == [5000, 4096, 2048]


def test_config_refuses_bad_values_naming_the_field() -> None:
    RemoteConfig(url="redis://127.0.0.1:6379/0")
    for field, value in (
        ("url", "http://x"),
        ("prefix", "has space"),
        ("chunk_bytes", 512 * 2**20),
        ("timeout_ms", 0),
        ("min_tokens", 0),
    ):
        kwargs = {"url": "redis://h:1/0", field: value}
        with pytest.raises(InvalidCacheValue) as err:
            RemoteConfig(**kwargs)  # type: ignore[arg-type]
        assert err.value.field == f"remote.{field}"
    with pytest.raises(InvalidCacheValue):
        RemoteConfig(url="redis://h:1/0", retry_min_ms=10, retry_max_ms=5)


def test_cache_meta_never_owns_or_evicts_the_remote_tier(tmp_path: Path) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        CacheSettings(
            tiers=(TierConfig(TierKind.REMOTE, tmp_path, 1),), counters_path=tmp_path / "c"
        )
    assert err.value.field == "tiers"
    with pytest.raises(ConfigError):
        PressureConfig(evict_tiers=(TierKind.RAM, TierKind.REMOTE))
