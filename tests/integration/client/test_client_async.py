"""The asyncio client against a served model: concurrency, cancellation, the loop.

Each test runs its own ``asyncio.run`` with its own ``AsyncClient``: a plain
asyncio program, nothing else.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from llamad import (
    AsyncClient,
    CacheHitKind,
    Cancelled,
    DoneEvent,
    FinishReason,
    ModelNotFound,
    StickyBusy,
    TokenEvent,
    WorkerCrashed,
)
from served import Served, prompt_text

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]


class Ticker:
    """A coroutine that sleeps 5 ms at a time and records how late it woke:
    the longest time the event loop was held by something else."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.ticks = 0
        self._running = True

    async def run(self) -> None:
        while self._running:
            before = time.monotonic()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.monotonic() - before - 0.005)
            self.ticks += 1

    def stop(self) -> None:
        self._running = False


def test_sixteen_concurrent_streams_from_one_loop_never_block_it(served: Served) -> None:
    durations: list[float] = []

    async def main() -> tuple[list[list[object]], Ticker]:
        ticker = Ticker()
        async with AsyncClient(served.endpoint, timeout=240) as client:
            tick = asyncio.ensure_future(ticker.run())

            async def one(i: int) -> list[object]:
                started = time.monotonic()
                stream = await client.infer(served.model_id, prompt_text(400 + i), max_tokens=16)
                events = [event async for event in stream]
                durations.append(time.monotonic() - started)
                return events

            results = await asyncio.gather(*(one(i) for i in range(16)))
            ticker.stop()
            await tick
        return list(results), ticker

    results, ticker = asyncio.run(main())
    for events in results:
        assert sum(isinstance(e, DoneEvent) for e in events) == 1
        assert isinstance(events[-1], DoneEvent)
        done = events[-1].result
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert "".join(t.text for t in tokens) == done.reply
    assert ticker.ticks > 10
    # A blocking wait would hold the loop for a whole request. Measured
    # against the requests themselves, not a fixed bound: on a loaded machine
    # the process alone may wait a third of a second for a core.
    shortest = min(durations)
    assert ticker.worst < shortest / 2, (
        f"the event loop was held for {ticker.worst:.3f} s; the shortest request took "
        f"{shortest:.3f} s"
    )


def test_cancelling_the_consuming_task_cancels_the_request(served: Served) -> None:
    async def main() -> None:
        async with AsyncClient(served.endpoint, timeout=120) as client:
            first_event = asyncio.Event()

            async def consume() -> None:
                stream = await client.infer(served.model_id, prompt_text(420))  # unbounded
                async for _ in stream:
                    first_event.set()

            task = asyncio.ensure_future(consume())
            await asyncio.wait_for(first_event.wait(), 120)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # With the client still open (closing it would cancel everything).
            await asyncio.to_thread(served.wait_idle, timeout=5)

    asyncio.run(main())


def test_cancelling_a_task_awaiting_complete_cancels_the_request(served: Served) -> None:
    async def main() -> None:
        async with AsyncClient(served.endpoint, timeout=120) as client:
            task = asyncio.ensure_future(client.complete(served.model_id, prompt_text(421)))
            await asyncio.to_thread(served.wait_until_busy)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(served.wait_idle, timeout=5)

    asyncio.run(main())


def test_breaking_out_of_an_async_stream_cancels_it(served: Served) -> None:
    async def main() -> None:
        async with AsyncClient(served.endpoint, timeout=120) as client:
            stream = await client.infer(served.model_id, prompt_text(422))
            async for _ in stream:
                break
            # asyncio finalises the abandoned iterator on the loop.
            deadline = time.monotonic() + 10
            while not stream.finished and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert stream.finished
            await asyncio.to_thread(served.wait_idle, timeout=5)
            with pytest.raises(Cancelled) as exc:
                await stream.completion()
            assert exc.value.details["reason"] == "closed"

    asyncio.run(main())


def test_async_methods_mirror_the_blocking_client(served: Served) -> None:
    async def main() -> None:
        async with AsyncClient(served.endpoint, timeout=120) as client:
            model = served.model_id
            tokens = await client.tokenize(model, "Hello world", add_special=False)
            assert await client.detokenize(model, tokens) == "Hello world"
            first = await client.complete(model, prompt_text(430), max_tokens=3, temperature=0.0)
            served.wait_saved(first.finish_key)
            again = await client.complete(model, prompt_text(430), max_tokens=3, temperature=0.0)
            assert again.cache_hit_kind is CacheHitKind.EXACT
            assert again.reply == first.reply
            stream = await client.infer(model, prompt_text(431), max_tokens=300)
            await anext(stream)
            assert await stream.cancel() is True
            assert (await stream.completion()).finish_reason is FinishReason.CANCELLED
            await client.complete(model, prompt_text(432), session_id="as", max_tokens=1)
            async with await client.infer(
                model, "x", session_id="as", continue_=True, max_tokens=100
            ) as busy:
                await anext(busy)
                with pytest.raises(StickyBusy):
                    await client.complete(model, "y", session_id="as", continue_=True)
            served.wait_idle()
            await client.end_session(model, "as")
            vector = await client.embed(model, "The sea")
            assert len(vector) > 100
            with pytest.raises(ModelNotFound):
                await client.tokenize("no-such-model", "x")
            status = await client.status(model)
            assert status.info.model_id == model

    asyncio.run(main())


def test_the_async_client_sees_a_crash_within_a_second_and_then_serves_again(
    served: Served,
) -> None:
    async def main() -> float:
        async with AsyncClient(served.endpoint, timeout=120, connect_timeout=60) as client:
            stream = await client.infer(served.model_id, prompt_text(440), max_tokens=400)
            await anext(stream)
            killed = time.monotonic()
            served.kill_worker()
            with pytest.raises(WorkerCrashed):
                async for _ in stream:
                    pass
            noticed = time.monotonic() - killed
            again = await client.complete(served.model_id, prompt_text(441), max_tokens=2)
            assert again.stats.completion_tokens == 2
            return noticed

    assert asyncio.run(main()) < 1.0
