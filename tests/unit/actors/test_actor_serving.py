"""Serving semantics with an actor on a thread of the test process (fast, no children)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from actor_thread import running
from llamad.actors import Actor, Client, Limits, OpKind, OpSpec, Registry, Request
from llamad.actors.errors import ActorConfigError, NameTaken
from llamad.actors.handles import Peer
from llamad.actors.monitor import ProcessRef
from llamad.actors.wire import PROTOCOL_VERSION, Hello, Kind, encode_envelope
from llamad.errors import (
    BadRequest,
    Cancelled,
    LlamadError,
    RequestTimeout,
    StickyBusy,
    TooLarge,
    UnknownOp,
)
from llamad.testing import wait_until
from llamad.testing.toy_actor import build_toy

pytestmark = pytest.mark.timeout(60)
ANY = msgspec.msgpack.Decoder()


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "reg")


@pytest.fixture
def toy(registry: Registry) -> Iterator[Actor]:
    actor = Actor("toy", registry=registry)
    state = build_toy(actor)
    with running(actor, state.tick):
        yield actor


@pytest.fixture
def client(toy: Actor, registry: Registry) -> Iterator[Client]:
    with Client(name="toy", registry=registry, timeout=20) as c:
        yield c


class Raw:
    """A bare DEALER speaking the wire format by hand, for malformed input."""

    def __init__(self, endpoint: str, max_frame: int = 1 << 30) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 20_000)
        self.sock.connect(endpoint)

    def hello(self, version: int = PROTOCOL_VERSION) -> list[Any]:
        me = ProcessRef.current()
        body = Hello(me.pid, me.start_ticks, me.boot_id, me.pidns, "raw")
        self.sock.send(msgspec.msgpack.encode([version, Kind.HELLO, 1, "", body]))
        return self.recv()

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self) -> list[Any]:
        header, *_ = self.sock.recv_multipart()
        return list(ANY.decode(header))

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def raw(toy: Actor) -> Iterator[Raw]:
    r = Raw(toy.endpoint)
    yield r
    r.close()


# -- immediate replies and errors ---------------------------------------------


def test_call_returns_the_handler_result(client: Client) -> None:
    assert client.call("echo", {"a": [1, 2]}) == {"a": [1, 2]}


def test_handshake_reports_the_actor_identity_and_ops(client: Client, toy: Actor) -> None:
    welcome = client.connect()
    assert welcome.pid == os.getpid()
    assert welcome.instance == toy.instance
    assert welcome.ops["count"] == "stream" and welcome.ops["echo"] == "call"


def test_handler_exception_becomes_an_error_reply_and_the_actor_keeps_serving(
    client: Client, toy: Actor
) -> None:
    with pytest.raises(LlamadError) as info:
        client.call("fail")
    assert info.value.code == "internal"
    assert "ValueError: boom" in info.value.message
    assert client.call("echo", 1) == 1
    assert toy.stats.handler_failures == 1


def test_typed_error_crosses_as_the_same_class(client: Client) -> None:
    with pytest.raises(StickyBusy) as info:
        client.call("refuse")
    assert info.value.details == {"session": "s1"}


def test_unknown_op_is_refused_with_unknown_op(client: Client) -> None:
    with pytest.raises(UnknownOp):
        client.call("no-such-op")


def test_invalid_body_is_refused_before_the_handler_runs(registry: Registry) -> None:
    calls: list[object] = []
    actor = Actor("strict", registry=registry)

    class Body(msgspec.Struct, forbid_unknown_fields=True):
        n: int

    actor.add_op(OpSpec("take", OpKind.CALL, body=Body), lambda req: calls.append(req.body))
    with running(actor), Client(name="strict", registry=registry, timeout=20) as c:
        for bad in ({"n": "1"}, {"m": 1}, {"n": 1, "extra": 2}, [1], None):
            with pytest.raises(BadRequest):
                c.call("take", bad)
        c.call("take", {"n": 5})
    assert calls == [Body(5)]


def test_calling_a_stream_op_as_a_call_is_bad_request(client: Client) -> None:
    with pytest.raises(BadRequest, match="stream op"):
        client.call("count", {"n": 1})


def test_unencodable_reply_becomes_an_internal_error(registry: Registry) -> None:
    actor = Actor("odd", registry=registry)
    actor.add_op(OpSpec("odd", OpKind.CALL), lambda req: object())
    # Text that is not Unicode cannot be encoded either (actors.wire refuses it).
    actor.add_op(OpSpec("surrogate", OpKind.CALL), lambda req: {"text": "caf\udce9"})
    with running(actor), Client(name="odd", registry=registry, timeout=20) as c:
        with pytest.raises(LlamadError, match="could not be encoded"):
            c.call("odd")
        with pytest.raises(LlamadError, match="could not be encoded"):
            c.call("surrogate")
        assert c.call("$ping")["name"] == "odd"


def test_reply_type_decodes_into_a_struct(client: Client) -> None:
    class Point(msgspec.Struct):
        x: int

    assert client.call("echo", {"x": 3}, reply_type=Point) == Point(3)


# -- blobs -------------------------------------------------------------------


def test_blobs_travel_as_separate_frames_and_come_back(client: Client) -> None:
    big = os.urandom(1 << 20)
    reply = client.request("echo", {"k": 1}, blobs=[big, memoryview(b"two")])
    assert reply.body == {"k": 1}
    assert [bytes(b) for b in reply.blobs] == [big, b"two"]


def test_blobs_on_an_op_that_takes_none_are_bad_request(client: Client) -> None:
    with pytest.raises(BadRequest, match="binary frames"):
        client.call("fail", blobs=[b"x"])


def test_client_refuses_a_blob_over_the_actor_frame_limit_before_sending(
    registry: Registry,
) -> None:
    actor = Actor("small", registry=registry, limits=Limits(max_frame_bytes=1000, max_blobs=4))
    build_toy(actor)
    with running(actor), Client(name="small", registry=registry, timeout=20) as c:
        with pytest.raises(TooLarge):
            c.call("echo", blobs=[b"x" * 1001])
        with pytest.raises(TooLarge):
            c.call("echo", blobs=[b"x"] * 5)
        with pytest.raises(TooLarge):
            c.call("echo", "x" * 2000)
        assert c.call("echo", 1) == 1


# -- deferred replies --------------------------------------------------------


def test_deferred_reply_is_answered_later_from_the_loop(client: Client, registry: Registry) -> None:
    with Client(name="toy", registry=registry) as publisher:
        timer = threading.Timer(0.2, publisher.cast, ("publish", {"key": "k", "value": 7}))
        timer.start()
        try:
            assert client.call("wait", {"key": "k", "timeout": 30}) == {"hit": True, "value": 7}
        finally:
            timer.join()


def test_deferred_timeout_answers_with_the_fallback_value(client: Client) -> None:
    assert client.call("wait", {"key": "never", "timeout": 0.05}) == {"hit": False}


def test_deferred_timeout_without_fallback_is_a_timeout_error(registry: Registry) -> None:
    actor = Actor("slow", registry=registry)
    actor.add_op(OpSpec("slow", OpKind.CALL), lambda req: req.defer(timeout=0.05))
    with (
        running(actor),
        Client(name="slow", registry=registry, timeout=20) as c,
        pytest.raises(RequestTimeout),
    ):
        c.call("slow")


def test_client_timeout_cancels_the_deferred_request_on_the_actor(client: Client) -> None:
    with pytest.raises(RequestTimeout):
        client.call("hang", timeout=0.1)
    wait_until(lambda: client.call("cancels") == ["cancelled"], "the cancel", 20)


def test_a_call_heard_within_may_wait_as_long_as_the_actor_runs(client: Client) -> None:
    # The actor holds the answer (a deferred wait) but its loop answers the
    # ping behind it: the call gets its whole timeout.
    got = client.call("wait", {"key": "late", "timeout": 1.0}, heard_within=0.2)
    assert got == {"hit": False}


def test_a_call_heard_within_fails_fast_when_the_actor_loop_is_stuck(client: Client) -> None:
    # "sleep" holds the actor's loop itself: not even the ping is answered.
    started = time.monotonic()
    with pytest.raises(RequestTimeout):
        client.call("sleep", {"s": 6.0}, timeout=30, heard_within=0.3)
    assert time.monotonic() - started < 5.0  # loose: 0.3 s against the 6 s sleep
    # The late answers to what was given up on are dropped; the client serves on.
    assert client.call("echo", [1], timeout=30) == [1]
    assert client.call("echo", [2], heard_within=0.5, timeout=30) == [2]


def test_defer_on_a_stream_op_is_a_handler_error(registry: Registry) -> None:
    actor = Actor("wrong", registry=registry)
    actor.add_op(OpSpec("s", OpKind.STREAM), lambda req: req.defer())
    with (
        running(actor),
        Client(name="wrong", registry=registry, timeout=20) as c,
        pytest.raises(LlamadError, match="defer"),
    ):
        list(c.stream("s"))


# -- streams -----------------------------------------------------------------


def test_stream_yields_events_then_ends_with_exactly_one_terminal(client: Client) -> None:
    s = client.stream("count", {"n": 5})
    assert [m.body for m in s] == [{"i": i} for i in range(5)]
    assert s.result == {"n": 5}
    assert list(s) == []  # nothing after the terminal


def test_stream_pushed_from_the_loop_across_polls(client: Client) -> None:
    s = client.stream("ticks", {"n": 4, "interval": 0.01})
    assert [m.body["i"] for m in s] == [0, 1, 2, 3]
    assert s.result == {"n": 4}


def test_stream_events_carry_blobs(client: Client) -> None:
    events = list(client.stream("count", {"n": 2, "size": 100}))
    assert [bytes(m.blobs[0]) for m in events] == [b"x" * 100] * 2


def test_handler_failure_mid_stream_is_a_terminal_error(registry: Registry) -> None:
    def broken(req: Request[Any]) -> Iterator[int]:
        yield 1
        raise StickyBusy("gone busy")

    actor = Actor("broken", registry=registry)
    actor.add_op(OpSpec("s", OpKind.STREAM), broken)
    with running(actor), Client(name="broken", registry=registry, timeout=20) as c:
        s = c.stream("s")
        assert next(s).body == 1
        with pytest.raises(StickyBusy):
            next(s)
        assert isinstance(s.error, StickyBusy)
        assert c.call("$ping")["name"] == "broken"


def test_returning_a_value_from_a_stream_handler_ends_the_stream(registry: Registry) -> None:
    actor = Actor("quick", registry=registry)
    actor.add_op(OpSpec("s", OpKind.STREAM), lambda req: {"done": True})
    with running(actor), Client(name="quick", registry=registry, timeout=20) as c:
        s = c.stream("s")
        assert list(s) == []
        assert s.result == {"done": True}


def test_cancelling_a_stream_runs_on_cancel_on_the_actor(client: Client) -> None:
    with client.stream("ticks", {"n": 100_000, "interval": 0.02}) as s:
        assert next(s).body["i"] == 0
    assert s.finished
    wait_until(lambda: client.call("cancels") == ["cancelled"], "the cancel", 20)


def test_a_slow_consumer_gets_every_event_of_a_long_stream_in_order(
    registry: Registry,
) -> None:
    actor = Actor("long", registry=registry, limits=Limits(sndhwm=100, rcvhwm=100))
    build_toy(actor)
    with running(actor), Client(name="long", registry=registry, timeout=60) as c:
        stream = c.stream("count", {"n": 20_000})
        first = next(stream)
        # Let the actor outrun us: its iterator must park, not drop or block.
        wait_until(lambda: c.call("$info")["stats"]["events"] >= 1000, "1000 events", 20)
        rest = [m.body["i"] for m in stream]
        assert [first.body["i"], *rest] == list(range(20_000))
        assert stream.result == {"n": 20_000}
        assert c.call("echo", "after") == "after"


def test_a_peer_that_stops_reading_is_dropped_as_stuck(registry: Registry) -> None:
    downs: list[str] = []
    limits = Limits(sndhwm=10, rcvhwm=10, max_backlog=50)
    actor = Actor("stuck", registry=registry, limits=limits)
    state = build_toy(actor)
    actor.on_peer_down(lambda peer, reason: downs.append(reason))
    with running(actor, state.tick):
        r = Raw(actor.endpoint)
        try:
            r.sock.setsockopt(zmq.RCVHWM, 10)
            r.hello()
            r.send(encode_envelope(Kind.STREAM, 2, "ticks", {"n": 1_000_000, "interval": 0}))
            wait_until(lambda: downs == ["backpressure"], "the peer down", 20)
        finally:
            r.close()
        with Client(name="stuck", registry=registry, timeout=20) as c:
            assert c.call("cancels") == ["backpressure"]


def test_breaking_out_of_a_stream_cancels_it_on_the_actor(client: Client) -> None:
    for event in client.stream("ticks", {"n": 100_000, "interval": 0.02}):
        assert event.body["i"] == 0
        break
    wait_until(lambda: client.call("cancels") == ["cancelled"], "the cancel", 20)


def test_a_client_dropped_as_stuck_reintroduces_itself_on_its_next_call(
    registry: Registry,
) -> None:
    actor = Actor("strict", registry=registry, limits=Limits(sndhwm=10, max_backlog=50))
    build_toy(actor)
    with (
        running(actor),
        Client(name="strict", registry=registry, timeout=20, limits=Limits(rcvhwm=10)) as c,
    ):
        stream = c.stream("count", {"n": 1_000_000})  # never read: the actor gives up on us
        with Client(name="strict", registry=registry, timeout=20) as probe:
            wait_until(lambda: probe.call("$info")["stats"]["peers_down"] == 1, "a peer down", 20)
        assert c.call("echo", "again") == "again"
        with pytest.raises(Cancelled):
            for _ in stream:
                pass


def test_calls_interleave_with_an_open_stream(client: Client) -> None:
    s = client.stream("ticks", {"n": 3, "interval": 0.01})
    first = next(s)
    assert client.call("echo", "between") == "between"
    assert [first.body["i"]] + [m.body["i"] for m in s] == [0, 1, 2]


# -- peers -------------------------------------------------------------------


def test_client_close_cancels_its_open_requests_and_reports_peer_down(
    registry: Registry,
) -> None:
    downs: list[tuple[str, str]] = []
    actor = Actor("watcher", registry=registry)
    state = build_toy(actor)
    actor.on_peer_down(lambda peer, reason: downs.append((peer.name, reason)))
    with running(actor, state.tick):
        leaving = Client(name="watcher", registry=registry, client_name="leaver")
        s = leaving.stream("ticks", {"n": 100_000, "interval": 0.02})
        next(s)
        leaving.close()
        with Client(name="watcher", registry=registry, timeout=20) as other:
            wait_until(lambda: other.call("cancels") == ["peer_closed"], "the cancel", 20)
            wait_until(lambda: ("leaver", "peer_closed") in downs, "the peer down", 20)
            assert len(actor.peers) == 1


def test_closed_client_refuses_to_send(client: Client) -> None:
    client.close()
    with pytest.raises(LlamadError, match="closed"):
        client.call("echo", 1)


def test_cast_runs_the_handler_and_a_failing_cast_is_only_logged(
    client: Client, toy: Actor
) -> None:
    client.cast("fail_cast")
    client.cast("publish", {"key": "none"})
    assert client.call("echo", "alive") == "alive"
    wait_until(lambda: toy.stats.handler_failures == 1, "the failure", 20)


# -- malformed input from a raw peer -----------------------------------------


def test_call_without_handshake_is_refused(raw: Raw) -> None:
    raw.send(encode_envelope(Kind.CALL, 5, "echo", 1))
    version, kind, cid, _, body = raw.recv()
    assert (version, kind, cid) == (PROTOCOL_VERSION, Kind.ERROR, 5)
    assert body["code"] == "bad_request" and "handshake" in body["message"]


def test_handshake_with_another_version_is_version_mismatch(raw: Raw) -> None:
    _, kind, cid, _, body = raw.hello(version=PROTOCOL_VERSION + 1)
    assert (kind, cid, body["code"]) == (Kind.ERROR, 1, "version_mismatch")


def test_handshake_naming_a_dead_process_is_refused(raw: Raw) -> None:
    me = ProcessRef.current()
    bogus = Hello(me.pid, me.start_ticks + 12345, me.boot_id, me.pidns)
    raw.send(msgspec.msgpack.encode([PROTOCOL_VERSION, Kind.HELLO, 3, "", bogus]))
    _, kind, _, _, body = raw.recv()
    assert (kind, body["code"]) == (Kind.ERROR, "bad_request")


def test_reused_correlation_id_is_bad_request(raw: Raw) -> None:
    assert raw.hello()[1] == Kind.REPLY
    raw.send(encode_envelope(Kind.CALL, 9, "hang", {}))
    raw.send(encode_envelope(Kind.CALL, 9, "hang", {}))
    _, kind, cid, _, body = raw.recv()
    assert (kind, cid, body["code"]) == (Kind.ERROR, 9, "bad_request")


def test_more_frames_than_the_limit_is_too_large(raw: Raw, toy: Actor) -> None:
    raw.hello()
    frames = [b"x"] * (toy.limits.max_blobs + 1)
    raw.send(encode_envelope(Kind.CALL, 4, "echo", 1), *frames)
    _, kind, cid, _, body = raw.recv()
    assert (kind, cid, body["code"]) == (Kind.ERROR, 4, "too_large")


def test_oversized_header_is_too_large(registry: Registry) -> None:
    actor = Actor("tiny", registry=registry, limits=Limits(max_header_bytes=256))
    build_toy(actor)
    with running(actor):
        r = Raw(actor.endpoint)
        try:
            r.hello()
            r.send(encode_envelope(Kind.CALL, 6, "echo", "x" * 1000))
            _, kind, cid, _, body = r.recv()
            assert (kind, cid, body["code"]) == (Kind.ERROR, 6, "too_large")
        finally:
            r.close()


def test_frame_over_maxmsgsize_drops_only_that_connection(registry: Registry) -> None:
    actor = Actor("capped", registry=registry, limits=Limits(max_frame_bytes=4096))
    build_toy(actor)
    with running(actor):
        r = Raw(actor.endpoint)
        try:
            r.hello()
            r.send(encode_envelope(Kind.CALL, 7, "echo", 1), b"x" * 10_000)
        finally:
            r.close()
        with Client(name="capped", registry=registry, timeout=20) as c:
            assert c.call("echo", "still here") == "still here"


# -- the loop step and lifecycle ---------------------------------------------


def test_poll_zero_returns_at_once_when_idle(registry: Registry) -> None:
    with Actor("idle", registry=registry) as actor:
        assert actor.poll(0) == 0


def test_wake_interrupts_a_blocking_poll(registry: Registry) -> None:
    with Actor("sleepy", registry=registry) as actor:
        timer = threading.Timer(0.05, actor.wake)
        timer.start()
        started = time.monotonic()
        actor.poll(60)
        timer.join()
        assert time.monotonic() - started < 30


def test_sigterm_wakes_a_blocking_poll_and_requests_stop(registry: Registry) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with Actor("sig", registry=registry) as actor:
        restore = actor.stop_on_signals()
        try:
            timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
            timer.start()
            deadline = time.monotonic() + 30
            while not actor.stop_requested and time.monotonic() < deadline:
                actor.poll(30)
            timer.join()
            assert actor.stop_requested
        finally:
            restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_reader_callback_runs_from_poll(registry: Registry) -> None:
    fired: list[bytes] = []
    r, w = os.pipe()
    try:
        with Actor("reader", registry=registry) as actor:
            actor.add_reader(r, lambda: fired.append(os.read(r, 10)))
            os.write(w, b"go")
            deadline = time.monotonic() + 20
            while not fired and time.monotonic() < deadline:
                actor.poll(1)
            assert fired == [b"go"]
    finally:
        os.close(r)
        os.close(w)


def test_a_second_live_actor_cannot_take_the_name(toy: Actor, registry: Registry) -> None:
    with pytest.raises(NameTaken):
        Actor("toy", registry=registry).start()


def test_closing_the_actor_fails_open_requests_with_unavailable(registry: Registry) -> None:
    actor = Actor("closing", registry=registry)
    build_toy(actor)
    outcome: list[BaseException] = []
    with running(actor):
        c = Client(name="closing", registry=registry, timeout=20)
        c.connect()

        def call() -> None:
            try:
                c.call("hang")
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        wait_until(lambda: sum(len(p.open) for p in actor.peers) == 1, "one open call", 20)
    caller.join(20)
    c.close()
    assert [e.code for e in outcome if isinstance(e, LlamadError)] == ["unavailable"]


def test_builtin_ping_and_info(client: Client, toy: Actor) -> None:
    assert client.call("$ping") == {"pid": os.getpid(), "instance": toy.instance, "name": "toy"}
    info = client.call("$info")
    assert info["peers"] == 1 and info["stats"]["received"] >= 2


def test_reserved_and_duplicate_op_names_are_refused(registry: Registry) -> None:
    actor = Actor("decl", registry=registry)
    with pytest.raises(ActorConfigError):
        actor.add_op(OpSpec("$mine", OpKind.CALL), lambda req: None)
    actor.add_op(OpSpec("x", OpKind.CALL), lambda req: None)
    with pytest.raises(ActorConfigError):
        actor.add_op(OpSpec("x", OpKind.CAST), lambda req: None)


def test_unregistered_actor_needs_an_endpoint() -> None:
    with pytest.raises(ActorConfigError) as info:
        Actor("anon", register=False)
    assert info.value.field == "endpoint"


def test_tcp_ephemeral_port_is_resolved_after_bind() -> None:
    actor = Actor("tcp", endpoint="tcp://127.0.0.1:0", register=False)
    build_toy(actor)
    with running(actor):
        assert not actor.endpoint.endswith(":0")
        with Client(actor.endpoint, timeout=20) as c:
            assert c.call("echo", "tcp") == "tcp"


def test_peer_object_describes_the_client(client: Client, toy: Actor) -> None:
    client.connect()
    [peer] = toy.peers
    assert isinstance(peer, Peer)
    assert peer.local and peer.process == ProcessRef.current()


def test_a_late_answer_to_a_timed_out_call_is_dropped_and_the_next_call_gets_its_own(
    client: Client,
) -> None:
    # The actor answers the sleep after the caller gave up on it: that answer
    # reaches the next call's wait first (well within one crash-check
    # interval) and must be dropped, not returned.
    with pytest.raises(RequestTimeout):
        client.call("sleep", {"s": 0.12}, timeout=0.05)
    assert client.call("echo", {"after": 1}) == {"after": 1}
    assert client.call("echo", {"after": 2}) == {"after": 2}


def test_a_call_while_a_stream_is_open_gets_its_own_answer(client: Client) -> None:
    # Events of the open stream arrive while the call waits: they are kept
    # for the stream, and the call returns its own reply.
    stream = client.stream("ticks", {"n": 5, "interval": 0.01})
    assert next(stream).body["i"] == 0
    assert client.call("echo", {"during": True}) == {"during": True}
    assert [m.body["i"] for m in stream] == [1, 2, 3, 4]
    assert stream.result == {"n": 5}


def test_a_cancel_of_a_call_answered_already_reaches_the_late_cancel_hook(
    registry: Registry,
) -> None:
    # The client gives up (its timeout sends a CANCEL) while the actor is
    # still inside the call; the actor answers, then reads the CANCEL with
    # nothing open for it: the hook hears of it, so an answer that handed
    # something out (cache-meta's pins) can take it back.
    actor = Actor("late", registry=registry)
    late: list[tuple[str, int]] = []
    answered: list[int] = []

    def slow(req: Request[Any]) -> int:
        time.sleep(0.4)
        answered.append(req.cid)
        return 7

    actor.add_op(OpSpec("slow", OpKind.CALL, body=Any), slow)
    actor.add_op(OpSpec("quick", OpKind.CALL, body=Any), lambda req: 1)
    actor.on_late_cancel(lambda peer, cid: late.append((peer.name, cid)))
    with running(actor), Client(name="late", registry=registry, timeout=20) as c:
        assert c.call("quick") == 1
        with pytest.raises(RequestTimeout):
            c.call("slow", timeout=0.1)
        wait_until(lambda: late, "the late cancel", 10)
        assert [cid for _, cid in late] == answered
        assert c.call("quick") == 1  # a call answered in time sends none
        time.sleep(0.1)
        assert len(late) == 1
