"""Crashes and restarts: the caller learns of a crash at once, and the same
client object works again afterwards with no action from the caller.

The daemon gives a model up after more than 3 worker restarts in 60 s
(``model_failed``), so this module kills its worker three times at most;
the async client's crash test lives in ``test_client_async.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from daemon_proc import DaemonProc
from llamad import AsyncClient, Client, Unavailable, WorkerCrashed
from served import Served, prompt_text

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[Client]:
    with Client(served.endpoint, timeout=120, connect_timeout=60) as c:
        yield c


def test_a_worker_killed_mid_stream_fails_it_within_a_second_then_serves_again(
    served: Served, client: Client
) -> None:
    stream = client.infer(served.model_id, prompt_text(500), max_tokens=400)
    next(stream)
    killed = time.monotonic()
    old = served.kill_worker()
    with pytest.raises(WorkerCrashed):
        for _ in stream:
            pass
    assert time.monotonic() - killed < 1.0
    assert isinstance(stream.error, WorkerCrashed)
    # The next request reaches the restarted worker: routed again, waiting for it.
    result = client.complete(served.model_id, prompt_text(501), max_tokens=2)
    assert result.stats.completion_tokens == 2
    assert served.worker_pid() not in (None, old)


def test_a_worker_killed_during_a_call_raises_worker_crashed(
    served: Served, client: Client
) -> None:
    client.complete(served.model_id, "warm up the connection", max_tokens=1)
    outcome: list[BaseException] = []

    def kill_soon() -> None:
        served.wait_until_busy()
        served.kill_worker()

    killer = threading.Thread(target=kill_soon)
    killer.start()
    try:
        client.complete(served.model_id, prompt_text(502), max_tokens=400)
    except WorkerCrashed as exc:
        outcome.append(exc)
    killer.join(60)
    assert len(outcome) == 1, "a generation cut by a crash must not be resent silently"
    assert client.tokenize(served.model_id, "back again") != []


def test_a_worker_that_died_while_idle_is_reached_again_transparently(
    served: Served, client: Client
) -> None:
    assert client.tokenize(served.model_id, "before") != []
    old = served.kill_worker()
    # Not back yet: the call routes again and waits for the restart.
    assert client.complete(served.model_id, "Hi", max_tokens=1).stats.completion_tokens == 1
    assert served.worker_pid() not in (None, old)


def test_the_same_clients_work_after_the_daemon_is_restarted(
    served: DaemonProc, client: Client
) -> None:
    prompt = prompt_text(505)
    before = client.complete(served.model_id, prompt, max_tokens=3, temperature=0.0)
    async_client = AsyncClient(served.endpoint, timeout=120, connect_timeout=60)
    try:
        asyncio.run(async_client.tokenize(served.model_id, "connected"))
        assert served.stop() == 0
        with (
            Client(served.endpoint, timeout=5, connect_timeout=0.5) as impatient,
            pytest.raises(Unavailable),
        ):
            impatient.complete(served.model_id, prompt, max_tokens=1)
        served.start()
        after = client.complete(served.model_id, prompt, max_tokens=3, temperature=0.0)
        assert after.reply == before.reply
        assert client.status().pid == served.pid
        assert asyncio.run(async_client.tokenize(served.model_id, "again")) != []
    finally:
        async_client.close()
