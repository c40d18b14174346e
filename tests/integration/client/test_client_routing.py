"""A client of several real daemons (SPEC X3; ``docs/internals/client.md``, "Several daemons").

Two daemons (distinct runtime directories and cache instances), started once
for the module; each request of ``Client(endpoints=[a, b])`` goes to one of
them. Which one served a request is read from each daemon's worker status
board (``requests_total``), never from the client itself. Load is made with
a request under :data:`ENDLESS` from a client of that one daemon, cancelled
after. The test that SIGKILLs a daemon runs last and restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from daemon_proc import DaemonProc
from llamad import AsyncClient, Client, NoSession, WorkerCrashed
from served import ENDLESS, EVENTUALLY, MANY, prompt_text, wait_until

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[DaemonProc, DaemonProc]]:
    daemons = (DaemonProc(), DaemonProc())
    try:
        for d in daemons:  # both start at once: half the wait
            d.launcher.start()
        for d in daemons:
            d.launcher.wait_routed([d.model_id], timeout=EVENTUALLY)
        yield daemons
    finally:
        for d in daemons:
            d.close()


def _served(d: DaemonProc) -> int:
    """Requests the daemon's worker has admitted since it started."""
    snap = wait_until(d.board, "the worker's status board", EVENTUALLY)
    return snap.requests_total


def _counts(*daemons: DaemonProc) -> list[int]:
    return [_served(d) for d in daemons]


class _Busy:
    """An endless generation on ``daemon`` (from a client of it alone) until
    the block ends: the daemon has one request pending."""

    def __init__(self, daemon: DaemonProc) -> None:
        self.daemon = daemon
        self.client = Client(daemon.endpoint)

    def __enter__(self) -> _Busy:
        self.stream = self.client.infer(
            self.daemon.model_id, "Say la.", grammar=ENDLESS, max_tokens=MANY
        )
        next(self.stream)  # it runs: the daemon's status counts it
        wait_until(
            lambda: (b := self.daemon.board()) is not None and b.status.pending_len >= 1,
            "the busy request on the board",
            EVENTUALLY,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.close()
        self.client.close()
        self.daemon.wait_idle()


def test_a_request_goes_to_the_least_loaded_daemon(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    for busy, idle in ((a, b), (b, a)):
        with _Busy(busy):
            before = _counts(busy, idle)
            # A new client: its first request reads both daemons' status.
            with Client(endpoints=[a.endpoint, b.endpoint]) as c:
                c.complete("smol", prompt_text(1, 8), max_tokens=2)
            after = _counts(busy, idle)
        assert after[1] == before[1] + 1, f"the idle daemon served nothing: {before} -> {after}"
        assert after[0] == before[0], f"the busy daemon served it: {before} -> {after}"


def test_a_clients_own_running_stream_counts_as_load(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    with Client(endpoints=[a.endpoint, b.endpoint]) as c:
        streams = [c.infer("smol", "Say la.", grammar=ENDLESS, max_tokens=MANY)]
        try:
            next(streams[0])
            streams.append(c.infer("smol", "Say la.", grammar=ENDLESS, max_tokens=MANY))
            next(streams[1])
            assert {s.endpoint for s in streams} == {a.endpoint, b.endpoint}
            # cancel(request_id) goes to the daemon running it.
            for s in streams:
                assert c.cancel(s.request_id), s.endpoint
                assert s.completion().finish_reason == "cancelled"
        finally:
            for s in streams:
                s.close()
    a.wait_idle()
    b.wait_idle()


def test_a_model_change_goes_to_every_daemon(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    with Client(endpoints=[a.endpoint, b.endpoint]) as c:
        info = c.set_keep_alive("smol", 3600)
        assert info.keep_alive_s == 3600
        try:
            for d in pair:
                with Client(d.endpoint) as one:
                    assert one.model_info("smol").keep_alive_s == 3600, d.endpoint
        finally:
            c.set_keep_alive("smol", None)


def test_a_session_stays_on_its_daemon(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    by_endpoint = {a.endpoint: a, b.endpoint: b}
    with Client(endpoints=[a.endpoint, b.endpoint]) as c:
        stream = c.infer("smol", prompt_text(3, 8), session_id="route-s1", max_tokens=2)
        stream.completion()
        home = by_endpoint[stream.endpoint]
        away = b if home is a else a
        # The session's daemon is now the busier one: a request without a
        # session would go to the other, the session's next turn does not.
        with _Busy(home):
            before = _counts(home, away)
            c.router.expire()  # the next request reads the new load
            more = c.infer(
                "smol", " And then?", session_id="route-s1", continue_=True, max_tokens=2
            )
            more.completion()  # on the other daemon: no_session
            assert more.endpoint == home.endpoint
            assert _counts(home, away) == [before[0] + 1, before[1]]
        c.end_session("smol", "route-s1")
        # Ended: the daemon forgot it, and so did the router.
        assert c.router.session("route-s1") is None
        with pytest.raises(NoSession):
            c.end_session("smol", "route-s1")


def test_an_unreachable_daemon_is_skipped(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    dead = a.endpoint.replace("llamad.sock", "nobody.sock")
    with Client(endpoints=[dead, b.endpoint], connect_timeout=5.0) as c:
        before = _served(b)
        # As if it had answered its status just before it died, the less
        # loaded: the request itself finds it gone, and goes on to the next.
        c.router.loaded(dead, {})
        c.router.loaded(b.endpoint, {"smol": 1})
        reply = c.complete("smol", prompt_text(4, 8), max_tokens=2)
        assert reply.generated, reply
        assert _served(b) == before + 1
        assert c.router.failures(dead) >= 1
        assert c.status().pid == b.pid  # a read goes to the first that answers


def test_an_async_client_routes_and_skips_the_unreachable(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    dead = b.endpoint.replace("llamad.sock", "nobody.sock")

    async def main() -> tuple[str, str]:
        async with AsyncClient(endpoints=[dead, a.endpoint, b.endpoint]) as c:
            with _Busy(a):
                stream = await c.infer("smol", prompt_text(5, 8), max_tokens=2)
                await stream.completion()
            reply = await c.complete("smol", prompt_text(6, 8), max_tokens=2)
            assert reply.generated
            return stream.endpoint, dead

    served_at, _ = asyncio.run(main())
    assert served_at == b.endpoint, "the idle, reachable daemon"


def test_a_follow_up_goes_to_the_daemon_holding_its_prefix(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    by_endpoint = {a.endpoint: a, b.endpoint: b}
    first = prompt_text(8, 40)
    follow_up = first + " Then the river ran past the copper mirror."
    with Client(endpoints=[a.endpoint, b.endpoint]) as c:
        stream = c.infer("smol", first, max_tokens=2)
        stream.completion()
        home = by_endpoint[stream.endpoint]
        away = b if home is a else a
        affinity = c.affinity
        assert affinity is not None
        # The first prompt's row is saved, then published; the client's
        # event thread applies it.
        tokens = c.tokenize("smol", first)
        held = wait_until(
            lambda: (p := affinity.prefix("smol", tokens, None)).get(home.endpoint, 0) >= 2 and p,
            "the first prompt's blocks in the client's index",
            EVENTUALLY,
        )
        assert held.get(away.endpoint, 0) == 0, held
        # The home daemon is the busier one: by load alone the follow-up
        # would go to the other; its cached prefix brings it home.
        with _Busy(home):
            c.router.expire()
            more = c.infer("smol", follow_up, max_tokens=2)
            reply = more.completion()
            assert more.endpoint == home.endpoint
            assert reply.cache_hit_kind != "cold", reply
            # Another tenant's identical prompt hashes to other blocks: no
            # daemon holds them, so the load decides.
            c.router.expire()
            other = c.infer("smol", follow_up, max_tokens=2, cache_salt="tenant-2")
            other.completion()
            assert other.endpoint == away.endpoint


def test_a_chats_next_turn_goes_to_the_daemon_holding_its_first(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    by_endpoint = {a.endpoint: a, b.endpoint: b}
    chat = [
        {"role": "system", "content": prompt_text(11, 40)},
        {"role": "user", "content": "Name one thing in the story."},
    ]
    with Client(endpoints=[a.endpoint, b.endpoint]) as c:
        first = c.infer("smol", messages=chat, max_tokens=2)
        reply = first.completion()
        home = by_endpoint[first.endpoint]
        tokens = c.apply_chat_template("smol", chat)
        affinity = c.affinity
        assert affinity is not None
        wait_until(
            lambda: affinity.prefix("smol", tokens, None).get(home.endpoint, 0) >= 2 or None,
            "the first turn's blocks in the client's index",
            EVENTUALLY,
        )
        turn2 = [
            *chat,
            {"role": "assistant", "content": reply.reply},
            {"role": "user", "content": "And another?"},
        ]
        with _Busy(home):
            c.router.expire()
            second = c.infer("smol", messages=turn2, max_tokens=2)
            second.completion()
            # The chat went through apply_chat_template on a daemon, and its
            # blocks matched the first turn's: home, though busier.
            assert second.endpoint == home.endpoint


def test_requests_whose_daemon_dies_before_answering_are_sent_again_elsewhere(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    worker = a.worker_pid()
    assert worker is not None
    with Client(endpoints=[a.endpoint, b.endpoint]) as c:
        # b is said to be busy, so every request goes to a.
        c.router.loaded(a.endpoint, {})
        c.router.loaded(b.endpoint, {"smol": 5})
        c.tokenize("smol", "warm")  # connected to a's worker
        # a's worker takes the requests and never answers them.
        os.kill(worker, signal.SIGSTOP)

        def kill_a() -> None:
            try:
                wait_until(
                    lambda: c.router.running(a.endpoint) == 2 or None, "both sent to a", EVENTUALLY
                )
            finally:
                a.launcher.kill()  # its worker dies with it, stopped or not

        killer = threading.Thread(target=kill_a)
        try:
            stream = c.infer("smol", prompt_text(9, 8), max_tokens=2)
            assert stream.endpoint == a.endpoint
            killer.start()
            # Blocks until a dies; nothing of it reached the caller: b serves it.
            reply = c.complete("smol", prompt_text(10, 8), max_tokens=2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGCONT)
            killer.join()
        assert reply.generated
        # The stream had no event yet: it is opened again on b.
        assert stream.completion().generated
        assert stream.endpoint == b.endpoint
        assert c.router.failures(a.endpoint) >= 1
    a.start()  # for the next test


def test_a_daemon_killed_mid_stream_fails_it_and_the_next_request_goes_elsewhere(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    by_endpoint = {a.endpoint: a, b.endpoint: b}
    with Client(endpoints=[a.endpoint, b.endpoint]) as c:
        stream = c.infer("smol", "Say la.", grammar=ENDLESS, max_tokens=MANY)
        victim = by_endpoint[stream.endpoint]
        survivor = b if victim is a else a
        events = iter(stream)
        next(events)  # streaming: a token has arrived
        killer = threading.Thread(target=victim.launcher.kill)
        killer.start()
        with pytest.raises(WorkerCrashed):
            for _ in events:
                pass
        killer.join()
        # Not replayed elsewhere: the half-streamed request is the caller's.
        before = _served(survivor)
        reply = c.complete("smol", prompt_text(7, 8), max_tokens=2)
        assert reply.generated
        assert _served(survivor) == before + 1
        assert c.router.failures(victim.endpoint) >= 1
