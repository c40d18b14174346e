"""The asyncio actor client against a real toy actor process (no model).

The toy (``llamad.testing.toy_actor``) serves calls, deferred replies and
pushed streams and records every cancellation it sees, so these tests check
what the actor observed, not only what the client returned.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.actors import Registry
from llamad.actors.aio_client import AsyncActorClient
from llamad.errors import RequestTimeout, StickyBusy, Unavailable, WorkerCrashed
from llamad.testing.toy_actor import ToyProcess, spawn_toy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "actors")


@pytest.fixture
def toy(registry: Registry) -> Iterator[ToyProcess]:
    with spawn_toy("--name", "toy", "--registry", str(registry.root)) as proc:
        yield proc


async def _cancels_seen(c: AsyncActorClient, n: int) -> list[str]:
    """The cancellations the toy recorded, once there are ``n`` (polled, with a deadline)."""
    deadline = time.monotonic() + 10
    while True:
        seen: list[str] = await c.call("cancels")
        if len(seen) >= n or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.01)


def test_calls_streams_and_typed_errors_round_trip(toy: ToyProcess, registry: Registry) -> None:
    async def main() -> None:
        c = AsyncActorClient(name="toy", registry=registry, timeout=10)
        try:
            assert await c.call("echo", {"x": [1, "two", b"3"]}) == {"x": [1, "two", b"3"]}
            assert await c.call("pid") == toy.pid
            with pytest.raises(StickyBusy) as info:
                await c.call("refuse")
            assert info.value.details == {"session": "s1"}
            stream = await c.stream("count", {"n": 500})
            assert [e["i"] async for e in stream] == list(range(500))
            assert stream.result is not None
        finally:
            c.close()

    asyncio.run(main())


def test_a_timed_out_call_is_cancelled_on_the_actor(toy: ToyProcess, registry: Registry) -> None:
    async def main() -> None:
        c = AsyncActorClient(name="toy", registry=registry, timeout=10)
        try:
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                await c.call("hang", timeout=0.2)
            assert 0.15 < time.monotonic() - started < 5
            assert await _cancels_seen(c, 1) == ["cancelled"]
        finally:
            c.close()

    asyncio.run(main())


def test_cancelling_the_task_cancels_the_call_on_the_actor(
    toy: ToyProcess, registry: Registry
) -> None:
    async def main() -> None:
        c = AsyncActorClient(name="toy", registry=registry, timeout=10)
        try:
            await c.connect()
            task = asyncio.ensure_future(c.call("hang"))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await _cancels_seen(c, 1) == ["cancelled"]
        finally:
            c.close()

    asyncio.run(main())


def test_a_stream_left_by_break_is_cancelled_on_the_actor(
    toy: ToyProcess, registry: Registry
) -> None:
    async def main() -> None:
        c = AsyncActorClient(name="toy", registry=registry, timeout=10)
        try:
            stream = await c.stream("ticks", {"n": 100_000, "interval": 0.001})
            async for _ in stream:
                break
            del stream
            gc.collect()
            assert await _cancels_seen(c, 1) == ["cancelled"]
        finally:
            c.close()

    asyncio.run(main())


def test_the_actor_dying_fails_a_waiting_call_within_a_second_and_a_restart_is_used(
    toy: ToyProcess, registry: Registry
) -> None:
    async def main() -> float:
        c = AsyncActorClient(name="toy", registry=registry, timeout=30, connect_timeout=5)
        try:
            await c.connect()
            task = asyncio.ensure_future(c.call("hang"))
            await asyncio.sleep(0.1)
            killed = time.monotonic()
            toy.kill()
            with pytest.raises(WorkerCrashed):
                await task
            noticed = time.monotonic() - killed
            with pytest.raises(Unavailable):
                await c.call("pid")
            with spawn_toy("--name", "toy", "--registry", str(registry.root)) as again:
                assert await c.call("pid") == again.pid
            return noticed
        finally:
            c.close()

    assert asyncio.run(main()) < 1.0


def test_sixteen_streams_share_one_loop_without_blocking_it(
    toy: ToyProcess, registry: Registry
) -> None:
    """16 concurrent streams of paced events; a ticker coroutine on the same
    loop is never held up for long (the client never blocks the loop)."""

    async def main() -> tuple[list[int], float]:
        c = AsyncActorClient(name="toy", registry=registry, timeout=30)
        worst = 0.0
        running = True

        async def ticker() -> None:
            nonlocal worst
            while running:
                before = time.monotonic()
                await asyncio.sleep(0.005)
                worst = max(worst, time.monotonic() - before - 0.005)

        async def one() -> int:
            stream = await c.stream("ticks", {"n": 200, "interval": 0.002})
            return len([e async for e in stream])

        try:
            tick = asyncio.ensure_future(ticker())
            counts = await asyncio.gather(*(one() for _ in range(16)))
            running = False
            await tick
            return list(counts), worst
        finally:
            c.close()

    counts, worst = asyncio.run(main())
    assert counts == [200] * 16
    # Generous for a loaded 2-core machine; a blocking recv would hold the
    # loop for the whole stream (seconds).
    assert worst < 0.25


def test_the_same_client_works_from_a_second_event_loop(
    toy: ToyProcess, registry: Registry
) -> None:
    c = AsyncActorClient(name="toy", registry=registry, timeout=10)
    try:
        assert asyncio.run(c.call("pid")) == toy.pid
        assert asyncio.run(c.call("echo", 7)) == 7
    finally:
        c.close()
