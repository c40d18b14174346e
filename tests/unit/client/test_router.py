"""The choice of a daemon for a client of several (``llamad.client.router``,
``llamad.client.affinity``): pure, with the clock, the loads and the KV
index faked."""

from __future__ import annotations

import pytest

from llamad.client import asks
from llamad.client.affinity import TOKENS_KEPT, Affinity, as_seen_from
from llamad.client.base import combined
from llamad.client.router import Router, Spread, spread
from llamad.front.wire import (
    DaemonStatus,
    GcReport,
    KvEventsAddress,
    ModelInfo,
    ModelState,
    ModelStatus,
)
from llamad.kv_events import BlockStored, KVEventBatch, chain
from llamad.model.results import WorkerPhase, WorkerStatus
from llamad.model.wire import CancelReply, WorkerSnapshot

A, B, C = "ipc:///a.sock", "ipc:///b.sock", "ipc:///c.sock"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def router(*endpoints: str, clock: Clock | None = None) -> Router:
    return Router(endpoints or (A, B, C), clock=clock or Clock())


def test_the_configured_order_breaks_ties() -> None:
    assert router().order("m") == [A, B, C]


def test_a_prompts_spread_key_rotates_the_ties_and_nothing_else() -> None:
    r = router()
    assert r.order("m", spread_key=1) == [B, C, A]
    assert r.order("m", spread_key=5) == [C, A, B]
    assert r.order("m", spread_key=3) == [A, B, C]
    r.loaded(B, {"m": 1})
    assert r.order("m", spread_key=1) == [C, A, B]  # the load comes first
    assert r.order("m", prefix={B: 1}, spread_key=2) == [B, C, A]


def test_the_least_loaded_goes_first() -> None:
    r = router()
    r.loaded(A, {"m": 3})
    r.loaded(B, {"m": 1, "other": 9})
    r.loaded(C, {"m": 2})
    assert r.order("m") == [B, C, A]
    # Another model's load is its own.
    assert r.order("other") == [A, C, B]


def test_requests_this_client_started_count_until_the_next_read() -> None:
    r = router(A, B)
    r.loaded(A, {})
    r.loaded(B, {})
    r.started(A)
    assert r.order("m") == [B, A]
    r.started(B)
    r.started(B)
    assert r.order("m") == [A, B]
    r.ended(B)
    r.ended(B)
    assert r.order("m") == [B, A]
    # A read counts what runs (A's one request is in its 1): not twice.
    r.loaded(A, {"m": 1})
    r.loaded(B, {"m": 1})
    assert r.order("m") == [A, B]


def test_the_longest_cached_prefix_beats_the_load() -> None:
    r = router()
    r.loaded(A, {"m": 0})
    r.loaded(B, {"m": 5})
    r.loaded(C, {"m": 9})
    assert r.order("m", prefix={B: 3, C: 7}) == [C, B, A]
    # Equal prefixes: the load decides between them.
    assert r.order("m", prefix={B: 3, C: 3}) == [B, C, A]


def test_a_session_goes_only_to_its_daemon() -> None:
    r = router()
    r.bind("s", C)
    r.loaded(C, {"m": 50})
    assert r.order("m", session_id="s", prefix={A: 9}) == [C]
    assert r.session("s") == C
    r.unbind("s")
    assert r.session("s") is None
    assert r.order("m", session_id="s") == [A, B, C]


def test_a_failed_daemon_is_left_out_for_a_doubling_backoff() -> None:
    clock = Clock()
    r = Router([A, B], clock=clock, backoff_s=1.0, max_backoff_s=3.0)
    r.failed(A)
    assert r.order("m") == [B] and r.live() == [B] and r.is_down(A)
    clock.now += 1.01
    assert r.order("m") == [A, B]  # tried again
    r.failed(A)
    clock.now += 1.01
    assert r.order("m") == [B]  # 2 s this time
    clock.now += 1.0
    assert r.order("m") == [A, B]
    r.failed(A)
    r.failed(A)  # capped at 3 s
    clock.now += 3.01
    assert not r.is_down(A)
    assert r.failures(A) == 4
    r.reached(A)  # it answered: the backoff starts again from 1 s
    assert r.failures(A) == 0
    r.failed(A)
    clock.now += 1.01
    assert not r.is_down(A)


def test_when_everyone_is_down_all_are_tried_soonest_back_first() -> None:
    clock = Clock()
    r = Router([A, B], clock=clock)
    r.failed(B)
    clock.now += 0.1
    r.failed(A)
    assert r.order("m") == [B, A]
    assert r.live() == [B, A]


def test_stale_loads_are_read_again_and_a_down_daemon_is_not() -> None:
    clock = Clock()
    r = Router([A, B], clock=clock, load_ttl_s=0.5)
    assert r.stale() == [A, B]
    r.loaded(A, {})
    r.loaded(B, {})
    assert r.stale() == []
    clock.now += 0.6
    r.failed(B)
    assert r.stale() == [A]
    r.loaded(A, {})
    r.expire()
    assert r.stale() == [A]


def test_endpoints_must_be_distinct() -> None:
    with pytest.raises(ValueError, match="distinct"):
        Router([A, A])


def test_where_each_op_goes() -> None:
    assert spread("complete") is Spread.ANY
    assert spread("tokenize") is Spread.ANY
    assert spread("load_model") is Spread.ALL
    assert spread("load_adapter") is Spread.ALL
    assert spread("status") is Spread.FIRST
    assert spread("end_session") is Spread.SESSION
    assert spread("cancel") is Spread.REQUEST


def test_answers_from_every_daemon_are_combined() -> None:
    assert combined(asks.evict_bytes(10, None), [3, 4]) == 7
    reports = [GcReport(1, 10, 0, 2), GcReport(2, 5, 1, 0)]
    assert combined(asks.gc(), reports) == GcReport(3, 15, 1, 2)
    cancel = asks.cancel("m", "r-1")
    assert combined(cancel, [CancelReply(False), CancelReply(True)]).cancelled


# -- affinity: the prompt's blocks, the salt ---------------------------------------

HEADER = bytes(range(65))


def _status(model: str, namespace: bytes | None) -> DaemonStatus:
    info = ModelInfo(model_id=model, path="/m.gguf", state=ModelState.READY)
    status = WorkerStatus(
        phase=WorkerPhase.IDLE,
        pending_len=0,
        queue_depth=0,
        active_sequences=0,
        free_sequences=1,
        sessions=0,
        kv_cells_used=0,
        ticks=0,
        namespace=namespace,
    )
    worker = WorkerSnapshot(model_id=model, pid=1, instance="i", seq=1, at=0.0, status=status)
    # No kv_events address: the feed thread is not started.
    return DaemonStatus(pid=1, uptime_s=1.0, models=[ModelStatus(info=info, worker=worker)])


def _stored(affinity: Affinity, endpoint: str, header: bytes, tokens: list[int]) -> None:
    blocks = chain(header, tokens, 4)
    event = BlockStored(
        block_hashes=[b.hash for b in blocks],
        parent_block_hash=None,
        token_ids=tokens[: 4 * len(blocks)],
        block_size=4,
        lora_id=None,
        medium="ram",
        lora_name=None,
    )
    assert affinity.index.apply(endpoint, 0, KVEventBatch(ts=0.0, events=[event])).outcome == (
        "applied"
    )


def test_the_prefix_is_counted_in_blocks_under_the_models_namespace() -> None:
    affinity = Affinity()
    for endpoint in (A, B):
        # As learn() takes a status with a stream's address (block size 4),
        # without starting the feed thread.
        affinity._block_size[endpoint] = 4
        affinity.learn(endpoint, _status("m", HEADER))
    assert not affinity.worth_it("m")  # nothing announced yet
    prompt = list(range(1, 18))  # 4 full blocks and one token
    _stored(affinity, A, HEADER, prompt[:8])
    _stored(affinity, B, HEADER, prompt[:16])
    assert affinity.worth_it("m") and not affinity.worth_it("other")
    assert affinity.prefix("m", prompt, None) == {A: 2, B: 4}
    # A prompt that leaves the cached path after its first block.
    assert affinity.prefix("m", [1, 2, 3, 4, 9, 9, 9, 9], None) == {A: 1, B: 1}
    # Another tenant's prompt: the same tokens, no block in common.
    assert affinity.prefix("m", prompt, b"t2") == {A: 0, B: 0}
    # Another model (another namespace): nothing known.
    assert affinity.prefix("other", prompt, None) == {}


def test_token_ids_are_kept_per_text_least_recently_used_first() -> None:
    affinity = Affinity()
    for i in range(TOKENS_KEPT):
        affinity.keep(("m", i), [i])
    assert affinity.tokens(("m", 0)) == [0]  # used: kept
    affinity.keep(("m", "new"), [1])
    assert affinity.tokens(("m", 1)) is None  # the least recently used went
    assert affinity.tokens(("m", 0)) == [0]


def test_an_event_socket_bound_to_every_interface_is_reached_on_the_daemons_host() -> None:
    wild = KvEventsAddress("tcp://0.0.0.0:5557", "tcp://0.0.0.0:5558")
    seen = as_seen_from("tcp://gpu-3.lan:7420", wild)
    assert (seen.endpoint, seen.replay_endpoint) == ("tcp://gpu-3.lan:5557", "tcp://gpu-3.lan:5558")
    v6 = as_seen_from("tcp://[fd00::7]:7420", KvEventsAddress("tcp://[::]:5557"))
    assert v6.endpoint == "tcp://[fd00::7]:5557" and v6.replay_endpoint is None
    # A named host, or an ipc socket on the client's own machine, is kept.
    for kept in ("tcp://10.0.0.5:5557", "ipc:///run/llamad/kv-events.sock"):
        assert as_seen_from("tcp://gpu-3.lan:7420", KvEventsAddress(kept)).endpoint == kept
    assert as_seen_from("ipc:///run/a.sock", wild).endpoint == "tcp://0.0.0.0:5557"
