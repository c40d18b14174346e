"""RemoteStore against a real ``redis-server`` (no daemon): chunked rows, the
ledger's quota, identity and damage checks, and the breaker's bounds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache.counters import DictCounters
from llamad.cache.key import FingerprintMode, Namespace, ctx_params_hash, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason, encode_kvc
from llamad.cache.remote import RemoteConfig, row_name
from llamad.cache.remote_store import RemoteStore
from llamad.model.identity import salted
from redis_server import RedisServer, redis_available
from served import wait_until

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not redis_available(), reason="redis-server is not installed"),
]

NS = Namespace(fingerprint=b"\x22" * 32, quant=3, ctx_hash=ctx_params_hash(n_ctx=4096))
PAYLOAD = 20_000  # five 4 KiB chunks with the header


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = RedisServer()
    try:
        yield s.start()
    finally:
        s.close()


def _store(server: RedisServer, prefix: str, **config: int) -> tuple[RemoteStore, DictCounters]:
    counters = DictCounters()
    values = {
        "chunk_bytes": 4096,
        "min_tokens": 1,
        "timeout_ms": 300,
        "fetch_timeout_ms": 2000,
        "retry_min_ms": 200,
        "retry_max_ms": 400,
        **config,
    }
    cfg = RemoteConfig(url=server.url, prefix=prefix, **values)
    return RemoteStore(cfg, counters=counters), counters


def _row(tmp: Path, ns: Namespace, tokens: list[int]) -> tuple[bytes, Path, bytes]:
    spec = KvcSpec(ns, tokens_to_bytes(tokens), FingerprintMode.SAFE, SaveReason.COLD)
    data = encode_kvc(spec, os.urandom(PAYLOAD))
    path = tmp / f"{spec.key.hex()}.kvc"
    path.write_bytes(data)
    return spec.key, path, data


def _put(store: RemoteStore, key: bytes, path: Path, n: int) -> None:
    assert store.offer(key, str(path), n)
    assert store.drain(30)


def test_a_row_larger_than_a_chunk_round_trips_intact(server: RedisServer, tmp_path: Path) -> None:
    store, counters = _store(server, "t1")
    try:
        tokens = list(range(64))
        key, path, data = _row(tmp_path, NS, tokens)
        _put(store, key, path, len(tokens))
        assert counters.get("remote_saves") == 1
        with server.client() as r:
            assert len(r.keys(b"t1:chunk:*")) == -(-len(data) // 4096) > 1
        got = store.fetch(NS, [(key, len(tokens))])
        assert got is not None and got.data == data
        assert got.meta.namespace == NS and got.meta.n_tokens == 64
        # Another tenant's key for the same tokens is not there.
        other = salted(NS, b"tenant")
        assert store.fetch(other, [(other.key(tokens), 64)]) is None
        assert counters.get("remote_hits") == 1 and counters.get("remote_misses") == 1
        # Written once: a second offer is a duplicate.
        _put(store, key, path, len(tokens))
        assert counters.get("remote_saves_duplicate") == 1
    finally:
        store.close()


def test_a_row_stored_under_another_key_is_damage_and_deleted(
    server: RedisServer, tmp_path: Path
) -> None:
    store, counters = _store(server, "t2")
    try:
        key, path, _ = _row(tmp_path, NS, list(range(10)))
        _put(store, key, path, 10)
        forged = NS.key(list(range(11)))
        with server.client() as r:
            r.set(row_name("t2", forged), r.get(row_name("t2", key)))
            assert store.fetch(NS, [(forged, 11)]) is None
            assert counters.get("remote_damaged") == 1
            assert store.drain(10)
            assert not r.exists(row_name("t2", forged))
    finally:
        store.close()


def test_the_ledger_keeps_the_quota_deleting_the_least_recently_used(
    server: RedisServer, tmp_path: Path
) -> None:
    size = len(_row(tmp_path, NS, [0])[2])
    store, counters = _store(server, "t3", quota=int(2.5 * size))
    try:
        keys = []
        for i in range(4):
            key, path, _ = _row(tmp_path, NS, [100 + i, 1, 2])
            _put(store, key, path, 3)
            keys.append(key)
        with server.client() as r:
            assert int(r.get(b"t3:bytes") or 0) <= 2.5 * size
            kept = [bool(r.exists(row_name("t3", k))) for k in keys]
            assert kept == [False, False, True, True]
            assert not r.keys(b"t3:chunk:" + keys[0].hex().encode() + b"*")
        assert counters.get("remote_evictions") == 2
    finally:
        store.close()


def test_a_stopped_server_costs_one_bound_then_is_skipped_and_used_again_once_back(
    server: RedisServer, tmp_path: Path
) -> None:
    store, counters = _store(server, "t4")
    key, path, _ = _row(tmp_path, NS, list(range(20)))
    try:
        _put(store, key, path, 20)
        server.pause()
        try:
            assert store.fetch(NS, [(key, 20)]) is None
            assert counters.get("remote_timeouts") == 1
            # The breaker is open: the next lookup does not try.
            assert store.fetch(NS, [(key, 20)]) is None
            assert counters.get("remote_skipped") == 1
        finally:
            server.resume()
        got = wait_until(lambda: store.fetch(NS, [(key, 20)]), "the store back", 30, 0.05)
        assert got.key == key
        assert counters.get("remote_reconnects") == 1
    finally:
        store.close()


def test_rows_redis_evicts_under_maxmemory_are_counted_misses_never_errors(
    tmp_path: Path,
) -> None:
    small = RedisServer(maxmemory="4mb").start()
    store, counters = _store(small, "t5")
    try:
        rows = [_row(tmp_path, NS, [500 + i, 7]) for i in range(120)]  # ~2.9 MB of rows
        for key, path, _ in rows:
            _put(store, key, path, 2)
        with small.client() as r:
            assert int(r.info("stats")["evicted_keys"]) > 0, "Redis evicted nothing"
        found = [store.fetch(NS, [(key, 2)]) for key, _, _ in rows]
        hits = sum(f is not None for f in found)
        assert all(
            f.data == data for f, (_, _, data) in zip(found, rows, strict=True) if f is not None
        )
        assert 0 < hits < len(rows)
        lost = counters.get("remote_misses") + counters.get("remote_evicted")
        assert hits + lost == len(rows)
        assert counters.get("remote_errors") == 0
        assert counters.get("remote_damaged") == 0
    finally:
        store.close()
        small.close()
