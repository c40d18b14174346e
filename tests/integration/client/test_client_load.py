"""400 requests from 16 clients at once: nothing lost, nothing duplicated,
every stream ends with exactly one terminal event.

400 (25 per client, half of them streams) keeps every client's requests
interleaved with the others' for the whole run; it was 1,000, which took
77 s of the suite's 20-minute budget and exercised nothing more."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from llamad import Client, Completion, DoneEvent, TokenEvent
from served import Served

pytestmark = [pytest.mark.timeout(600), pytest.mark.model, pytest.mark.slow]

CLIENTS = 16
REQUESTS = 400


def test_four_hundred_requests_from_sixteen_clients_each_answered_once(served: Served) -> None:
    before = served.board()
    assert before is not None
    results: dict[str, Completion] = {}
    terminals: Counter[str] = Counter()
    failures: list[BaseException] = []
    lock = threading.Lock()

    def client_thread(k: int) -> None:
        try:
            with Client(served.endpoint, timeout=300, name=f"load-{k}") as client:
                for i in range(k, REQUESTS, CLIENTS):
                    rid = f"load-{i}"
                    prompt = f"Request number {i} of the load test says"
                    if i % 2:
                        result = client.complete(
                            served.model_id, prompt, request_id=rid, max_tokens=2
                        )
                        ends = 1
                    else:
                        events = list(
                            client.infer(served.model_id, prompt, request_id=rid, max_tokens=2)
                        )
                        dones = [e for e in events if isinstance(e, DoneEvent)]
                        ends = len(dones)
                        assert events[-1] is dones[-1]
                        assert all(isinstance(e, TokenEvent) for e in events[:-1])
                        result = dones[-1].result
                    with lock:
                        assert rid not in results, f"{rid} answered twice"
                        results[rid] = result
                        terminals[rid] += ends
        except BaseException as exc:
            with lock:
                failures.append(exc)

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(540)
    assert not failures, failures[:3]
    assert sorted(results) == sorted(f"load-{i}" for i in range(REQUESTS))
    assert set(terminals.values()) == {1}
    for result in results.values():
        assert 1 <= result.stats.completion_tokens <= 2
    after = served.wait_idle()
    if after.instance == before.instance:
        assert after.requests_total - before.requests_total >= REQUESTS
