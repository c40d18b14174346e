"""The shared ``remote`` tier on a real Redis server (issue 20, item 1 and item 4's Redis parts).

Two real daemons (distinct instances, runtime and state directories; a
third for the end-to-end routing test) share
one real ``redis-server`` started by the fixture on a free loopback port,
with ``maxmemory`` and ``allkeys-lru`` as the docs tell operators. A
prompt is warmed on daemon A with ``prefill_only`` (its row holds exactly
the prompt), written behind to Redis, and must then be an exact hit on
daemon B, restored from Redis, with A's greedy reply. The faults: a
damaged row in Redis, a row Redis evicted, another tenant's identical
prompt, Redis SIGSTOPped, Redis SIGKILLed and started again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from daemon_proc import DaemonProc
from llamad import CacheHitKind, Client
from llamad.cache.remote import Manifest, row_name
from llamad.testing.launcher import WaitTimeout
from redis_server import RedisServer, redis_available
from served import EVENTUALLY, prompt_text, wait_until

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.model,
    pytest.mark.skipif(not redis_available(), reason="redis-server is not installed"),
]

GREEDY: dict[str, Any] = {"temperature": 0.0}
PREFIX = "llamad:kvc:v1"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        yield server.start()
    finally:
        server.close()


def _remote(url: str) -> str:
    # Bounds generous enough for a loaded 2-core machine (the defaults are
    # 50 ms and 1 s); a short backoff so a restarted Redis is used again soon.
    return f"""
[cache.remote]
url = "{url}"
min_tokens = 16
timeout_ms = 1000
fetch_timeout_ms = 5000
retry_min_ms = 100
retry_max_ms = 400
"""


@pytest.fixture(scope="module")
def daemons(redis_server: RedisServer) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    a = DaemonProc(extra=_remote(redis_server.url))
    b = DaemonProc(extra=_remote(redis_server.url))
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.fixture(scope="module")
def clients(daemons: tuple[DaemonProc, DaemonProc]) -> Iterator[tuple[Client, Client]]:
    a, b = daemons
    with (
        Client(a.endpoint, timeout=300, connect_timeout=30) as ca,
        Client(b.endpoint, timeout=300, connect_timeout=30) as cb,
    ):
        yield ca, cb


def _stored(server: RedisServer, key: bytes | None) -> bool:
    assert key is not None
    with server.client() as r:
        return bool(r.exists(row_name(PREFIX, key)))


def _warm(client: Client, server: RedisServer, prompt: str, **options: Any) -> bytes:
    """Prefill ``prompt`` on ``client``'s daemon; return its row's key once Redis holds it."""
    warmed = client.prefill_only("smol", prompt, **options)
    key = warmed.finish_key
    assert key is not None, "prefill_only saves the prompt"
    wait_until(lambda: _stored(server, key), "the row written behind to Redis", EVENTUALLY)
    return key


def _counter(client: Client, name: str) -> int:
    return client.counters().get(name, 0)


def test_a_prompt_prefilled_on_one_daemon_is_an_exact_hit_on_another_through_redis(
    redis_server: RedisServer,
    daemons: tuple[DaemonProc, DaemonProc],
    clients: tuple[Client, Client],
) -> None:
    ca, cb = clients
    b = daemons[1]
    prompt = prompt_text(2001)
    key = _warm(ca, redis_server, prompt)
    here = ca.complete("smol", prompt, max_tokens=8, **GREEDY)
    assert here.cache_delta.sources.remote == 0  # A's own tiers come first
    hits = _counter(cb, "remote_hits")
    there = cb.complete("smol", prompt, max_tokens=8, **GREEDY)
    assert there.cache_hit_kind is CacheHitKind.EXACT, there.cache_miss
    sources = there.cache_delta.sources
    assert sources.remote > 0 and sources.computed <= 1, sources
    assert sources.ram == sources.ram_file == sources.disk == sources.live == 0
    assert there.generated == here.generated
    assert there.reply == here.reply
    assert _counter(cb, "remote_hits") == hits + 1
    # The row was copied into one of B's local tiers.
    b.wait_saved(key)


def test_another_tenants_identical_prompt_is_cold_on_every_daemon(
    redis_server: RedisServer, clients: tuple[Client, Client]
) -> None:
    ca, cb = clients
    prompt = "Tenant ledger. " + prompt_text(2002)
    _warm(ca, redis_server, prompt, cache_salt="tenant-a")
    # Each daemon asks under namespaces nobody used yet (a cold request
    # saves its own row and shares it, so a namespace asked on A would be
    # found on B next, rightly).
    for client, salts in ((ca, (None, "tenant-c")), (cb, ("tenant-b", "tenant-d"))):
        for salt in salts:
            got = client.complete("smol", prompt, max_tokens=2, cache_salt=salt, **GREEDY)
            assert got.cache_hit_kind is CacheHitKind.COLD, (salt, got.cache_delta)
            assert got.cache_delta.sources.remote == 0
    # The owner of the salt finds it on the other daemon, through Redis.
    own = cb.complete("smol", prompt, max_tokens=2, cache_salt="tenant-a", **GREEDY)
    assert own.cache_hit_kind is CacheHitKind.EXACT
    assert own.cache_delta.sources.remote > 0


@pytest.fixture(scope="module")
def third(redis_server: RedisServer) -> Iterator[DaemonProc]:
    """Daemon C: a third instance on the same Redis, started only for the test that needs it."""
    c = DaemonProc(extra=_remote(redis_server.url))
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_three_daemons_route_a_follow_up_home_and_the_third_restores_through_redis(
    redis_server: RedisServer,
    daemons: tuple[DaemonProc, DaemonProc],
    third: DaemonProc,
    clients: tuple[Client, Client],
) -> None:
    """The several-daemons story end to end (issue 20, item 4): three daemons
    with distinct instances on one Redis, one client routing over all three.
    A prompt prefilled on A is announced by A's KV events; a routed follow-up
    that extends it goes to A; C, which never saw it, restores it exactly from
    Redis with A's reply; another tenant's identical prompt is cold on all three."""
    a, b = daemons
    ca, cb = clients
    prompt = "Three daemons. " + prompt_text(2004)
    follow_up = prompt + " Then the lamp went out over the garden."
    _warm(ca, redis_server, prompt)
    here = ca.complete("smol", prompt, max_tokens=8, **GREEDY)
    with Client(
        endpoints=[b.endpoint, third.endpoint, a.endpoint], timeout=300, connect_timeout=30
    ) as routed:
        affinity = routed.affinity
        assert affinity is not None
        tokens = routed.tokenize("smol", prompt)
        held = wait_until(
            lambda: (p := affinity.prefix("smol", tokens, None)).get(a.endpoint, 0) >= 2 and p,
            "A's row in the routing client's index",
            EVENTUALLY,
        )
        assert held.get(b.endpoint, 0) == held.get(third.endpoint, 0) == 0, held
        more = routed.infer("smol", follow_up, max_tokens=2, **GREEDY)
        reply = more.completion()
        assert more.endpoint == a.endpoint
        assert reply.cache_hit_kind is not CacheHitKind.COLD, reply.cache_delta
    with Client(third.endpoint, timeout=300, connect_timeout=30) as cc:
        there = cc.complete("smol", prompt, max_tokens=8, **GREEDY)
        assert there.cache_hit_kind is CacheHitKind.EXACT, there.cache_miss
        assert there.cache_delta.sources.remote > 0
        assert there.generated == here.generated
        # A tenant per daemon: a cold request shares its own row, so one
        # tenant asked on A would rightly be found on B next.
        for n, client in enumerate((ca, cb, cc)):
            salt = f"tenant-x{n}"
            got = client.complete("smol", prompt, max_tokens=2, cache_salt=salt, **GREEDY)
            assert got.cache_hit_kind is CacheHitKind.COLD, got.cache_delta
            assert got.cache_delta.sources.remote == 0


def test_a_damaged_remote_row_is_a_counted_miss_with_a_correct_reply(
    redis_server: RedisServer, clients: tuple[Client, Client]
) -> None:
    ca, cb = clients
    prompt = "Damaged ledger. " + prompt_text(2003)
    key = _warm(ca, redis_server, prompt)
    with redis_server.client() as r:
        raw = r.get(row_name(PREFIX, key))
        assert isinstance(raw, bytes)
        chunk = Manifest.decode(raw, key).chunk_names(PREFIX)[0]
        size = r.strlen(chunk)
        byte = r.getrange(chunk, size - 100, size - 100)
        r.setrange(chunk, size - 100, bytes([byte[0] ^ 0x40]))
    damaged = _counter(cb, "remote_damaged")
    got = cb.complete("smol", prompt, max_tokens=8, **GREEDY)
    # The whole prompt's row is refused; the cold save's shorter row (A's
    # prefill wrote it too) may serve the prefix.
    assert got.cache_hit_kind is not CacheHitKind.EXACT
    assert got.cache_delta.sources.computed > 1
    assert _counter(cb, "remote_damaged") == damaged + 1
    assert got.generated == ca.complete("smol", prompt, max_tokens=8, **GREEDY).generated
    # The damaged row is gone from Redis.
    wait_until(lambda: not _stored(redis_server, key), "the damaged row deleted", EVENTUALLY)


def test_a_row_redis_evicted_behind_our_back_is_a_counted_miss(
    redis_server: RedisServer, clients: tuple[Client, Client]
) -> None:
    ca, cb = clients
    prompt = "Evicted ledger. " + prompt_text(2004)
    key = _warm(ca, redis_server, prompt)
    with redis_server.client() as r:
        raw = r.get(row_name(PREFIX, key))
        assert isinstance(raw, bytes)
        r.delete(*Manifest.decode(raw, key).chunk_names(PREFIX))
    evicted = _counter(cb, "remote_evicted")
    got = cb.complete("smol", prompt, max_tokens=2, **GREEDY)
    assert got.cache_hit_kind is not CacheHitKind.EXACT
    assert got.cache_delta.sources.computed > 1
    assert _counter(cb, "remote_evicted") == evicted + 1


def test_a_stopped_redis_delays_no_request_and_fails_none(
    redis_server: RedisServer, clients: tuple[Client, Client]
) -> None:
    ca, cb = clients
    timeouts = _counter(cb, "remote_timeouts")
    redis_server.pause()
    try:
        # Served while Redis still answers nothing: each lookup gave up
        # within its bound (the request would hang here otherwise).
        got = cb.complete("smol", "Paused ledger. " + prompt_text(2005), max_tokens=2, **GREEDY)
        assert got.cache_hit_kind is CacheHitKind.COLD
        assert _counter(cb, "remote_timeouts") >= timeouts + 1
        # A save while it is stopped is kept locally.
        prompt = "Paused save. " + prompt_text(2006)
        warmed = ca.prefill_only("smol", prompt)
        assert warmed.finish_key is not None
        again = ca.complete("smol", prompt, max_tokens=2, **GREEDY)
        assert again.cache_hit_kind is CacheHitKind.EXACT
        assert again.cache_delta.sources.remote == 0
    finally:
        redis_server.resume()


def test_redis_killed_mid_save_loses_nothing_locally_and_the_daemons_share_again_after_a_restart(
    redis_server: RedisServer, clients: tuple[Client, Client]
) -> None:
    ca, cb = clients
    prompts = [f"Killed ledger {i}. " + prompt_text(2100 + i) for i in range(3)]
    errors: list[BaseException] = []

    def prefill_all() -> None:
        try:
            for p in prompts:
                ca.prefill_only("smol", p)
        except BaseException as exc:
            errors.append(exc)

    saving = threading.Thread(target=prefill_all)
    saving.start()
    redis_server.kill()
    saving.join(EVENTUALLY)
    assert not errors
    for p in prompts:
        got = ca.complete("smol", p, max_tokens=1, **GREEDY)
        assert got.cache_hit_kind is CacheHitKind.EXACT
    redis_server.start()
    # The daemon reconnects by itself (after its backoff): a row saved on A
    # reaches Redis again, and B restores it from there.
    attempt = iter(range(100))

    def shared() -> str | None:
        prompt = f"Restarted ledger {next(attempt)}. " + prompt_text(2200)
        key = ca.prefill_only("smol", prompt).finish_key
        try:
            wait_until(lambda: _stored(redis_server, key), "the row in Redis", 2.0)
        except WaitTimeout:
            return None
        return prompt

    prompt = wait_until(shared, "A sharing rows through the restarted Redis", EVENTUALLY, 0.2)
    there = cb.complete("smol", prompt, max_tokens=1, **GREEDY)
    assert there.cache_hit_kind is CacheHitKind.EXACT
    assert there.cache_delta.sources.remote > 0
    assert _counter(ca, "remote_reconnects") >= 1
