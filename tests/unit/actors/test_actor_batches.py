"""Events folded into one message per client (``EVENTS``, issue 21 item 1).

An actor on a thread of the test process; its ``burst`` op emits, inside one
:meth:`Actor.batched` block, whatever its body lists on the streams the
``watch`` op holds open. A bare DEALER reads the frames as they come; the
client library reads the same through its streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from actor_thread import running
from llamad.actors import Actor, Client, OpKind, OpSpec, Registry, Request
from llamad.actors.connection import Connection, Slot
from llamad.actors.handles import StreamSender
from llamad.actors.monitor import ProcessRef
from llamad.actors.wire import MAX_BATCH_EVENTS, PROTOCOL_VERSION, Hello, Kind, encode_envelope
from llamad.errors import LlamadError
from llamad.testing import wait_until

pytestmark = pytest.mark.timeout(60)
ANY = msgspec.msgpack.Decoder()


class _Unencodable:
    """A body msgpack has no form for."""


class Batcher:
    """The actor's state: the streams ``watch`` opened, in order."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self.streams: list[StreamSender] = []
        actor.add_op(OpSpec("watch", OpKind.STREAM), self.watch)
        actor.add_op(OpSpec("burst", OpKind.CALL, body=Any), self.burst)

    def watch(self, req: Request[Any]) -> None:
        self.streams.append(req.stream())

    def burst(self, req: Request[Any]) -> int:
        with self.actor.batched():
            for index, action, payload in req.body:
                stream = self.streams[index]
                if action == "emit":
                    stream.emit(payload)
                elif action == "end":
                    stream.end(payload)
                elif action == "blob":
                    stream.emit(payload, (b"blob",))
                else:
                    stream.emit(_Unencodable())
        return len(req.body)


@pytest.fixture
def actor(tmp_path: Path) -> Iterator[tuple[Actor, Batcher]]:
    actor = Actor("batcher", registry=Registry(tmp_path / "reg"))
    state = Batcher(actor)
    with running(actor, lambda: None):
        yield actor, state


@pytest.fixture
def control(actor: tuple[Actor, Batcher]) -> Iterator[Client]:
    with Client(endpoint=actor[0].endpoint, timeout=20) as c:
        yield c


class Raw:
    """A bare DEALER that says in its HELLO whether it reads batches."""

    def __init__(self, endpoint: str, *, batches: bool) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 20_000)
        self.sock.connect(endpoint)
        me = ProcessRef.current()
        hello = Hello(me.pid, me.start_ticks, me.boot_id, me.pidns, "raw", batches=batches)
        self.sock.send(encode_envelope(Kind.HELLO, 1, "", hello))
        assert self.recv()[1] == Kind.REPLY

    def watch(self, cid: int) -> None:
        self.sock.send(encode_envelope(Kind.STREAM, cid, "watch", {}))

    def recv(self) -> list[Any]:
        header, *_ = self.sock.recv_multipart()
        return list(ANY.decode(header))

    def recv_all(self, n: int) -> list[tuple[int, int, Any, int]]:
        """The next ``n`` messages as (kind, cid, body, number of blobs)."""
        out = []
        for _ in range(n):
            header, *blobs = self.sock.recv_multipart()
            _, kind, cid, _, body = ANY.decode(header)
            out.append((kind, cid, body, len(blobs)))
        return out

    def nothing_more(self) -> bool:
        return not self.sock.poll(200)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def _raw(actor: tuple[Actor, Batcher], *, batches: bool, n: int) -> Raw:
    raw = Raw(actor[0].endpoint, batches=batches)
    for cid in range(2, 2 + n):
        raw.watch(cid)
    _wait_streams(actor[1], n)
    return raw


def _wait_streams(state: Batcher, n: int) -> None:
    wait_until(lambda: len(state.streams) >= n, f"{n} open streams", timeout=10)


def test_the_events_of_a_block_reach_a_client_that_reads_batches_as_one_message(
    actor: tuple[Actor, Batcher], control: Client
) -> None:
    raw = _raw(actor, batches=True, n=3)
    try:
        before = actor[0].stats.event_batches
        body = [[0, "emit", {"i": 0}], [1, "emit", {"i": 1}], [0, "emit", {"i": 2}]]
        control.call("burst", [*body, [2, "emit", {"i": 3}]])
        (message,) = raw.recv_all(1)
        assert message == (
            int(Kind.EVENTS),
            0,
            [[2, {"i": 0}], [3, {"i": 1}], [2, {"i": 2}], [4, {"i": 3}]],
            0,
        )
        assert raw.nothing_more()
        assert actor[0].stats.event_batches == before + 1
    finally:
        raw.close()


def test_a_client_that_did_not_ask_for_batches_gets_each_event_alone(
    actor: tuple[Actor, Batcher], control: Client
) -> None:
    raw = _raw(actor, batches=False, n=2)
    try:
        before = actor[0].stats.event_batches
        control.call("burst", [[0, "emit", "a"], [1, "emit", "b"], [0, "emit", "c"]])
        assert raw.recv_all(3) == [
            (int(Kind.EVENT), 2, "a", 0),
            (int(Kind.EVENT), 3, "b", 0),
            (int(Kind.EVENT), 2, "c", 0),
        ]
        assert raw.nothing_more()
        assert actor[0].stats.event_batches == before
    finally:
        raw.close()


def test_an_end_or_an_event_with_blobs_leaves_after_what_was_held_in_order(
    actor: tuple[Actor, Batcher], control: Client
) -> None:
    raw = _raw(actor, batches=True, n=2)
    try:
        control.call(
            "burst",
            [
                [0, "emit", "a"],
                [0, "emit", "b"],
                [1, "end", "done"],
                [0, "emit", "c"],
                [0, "blob", "d"],
                [0, "emit", "e"],
            ],
        )
        assert raw.recv_all(5) == [
            (int(Kind.EVENTS), 0, [[2, "a"], [2, "b"]], 0),
            (int(Kind.END), 3, "done", 0),
            (int(Kind.EVENT), 2, "c", 0),  # one held event goes as a plain EVENT
            (int(Kind.EVENT), 2, "d", 1),
            (int(Kind.EVENT), 2, "e", 0),
        ]
        assert raw.nothing_more()
    finally:
        raw.close()


def test_a_block_of_more_events_than_a_batch_holds_is_sent_in_several_in_order(
    actor: tuple[Actor, Batcher], control: Client
) -> None:
    raw = _raw(actor, batches=True, n=1)
    try:
        n = MAX_BATCH_EVENTS + 3
        control.call("burst", [[0, "emit", i] for i in range(n)])
        first, second = raw.recv_all(2)
        assert first[:2] == (int(Kind.EVENTS), 0)
        assert [body for _, body in first[2]] == list(range(MAX_BATCH_EVENTS))
        assert second[:2] == (int(Kind.EVENTS), 0)
        assert [body for _, body in second[2]] == list(range(MAX_BATCH_EVENTS, n))
        assert raw.nothing_more()
    finally:
        raw.close()


def test_the_client_library_hands_each_stream_its_own_events_from_a_batch(
    actor: tuple[Actor, Batcher], control: Client
) -> None:
    before = actor[0].stats.event_batches
    with Client(endpoint=actor[0].endpoint, timeout=20) as c:
        streams = [c.stream("watch") for _ in range(3)]
        _wait_streams(actor[1], 3)
        control.call(
            "burst",
            [
                [0, "emit", "a0"],
                [1, "emit", "b0"],
                [2, "emit", "c0"],
                [1, "emit", "b1"],
                [0, "emit", "a1"],
                [2, "end", "c-end"],
                [0, "emit", "a2"],
                [0, "end", "a-end"],
                [1, "end", "b-end"],
            ],
        )
        got = [[m.body for m in s] for s in streams]
        assert got == [["a0", "a1", "a2"], ["b0", "b1"], ["c0"]]
        assert [s.result for s in streams] == ["a-end", "b-end", "c-end"]
    assert actor[0].stats.event_batches > before


def test_an_unencodable_event_in_a_block_fails_its_stream_alone(
    actor: tuple[Actor, Batcher], control: Client
) -> None:
    with Client(endpoint=actor[0].endpoint, timeout=20) as c:
        good, bad = c.stream("watch"), c.stream("watch")
        _wait_streams(actor[1], 2)
        control.call(
            "burst", [[0, "emit", "x"], [1, "bad", None], [0, "emit", "y"], [0, "end", "z"]]
        )
        assert [m.body for m in good] == ["x", "y"]
        assert good.result == "z"
        with pytest.raises(LlamadError, match="could not be encoded"):
            list(bad)


def _body(raw: msgspec.Raw | None) -> Any:
    assert raw is not None
    return ANY.decode(raw)


def _connection() -> Connection:
    return Connection("ipc:///nonexistent/batch.sock", None, None, 1.0, 1.0, None, "test", None)


def test_a_batch_routes_to_open_streams_and_skips_unknown_and_ended_ones() -> None:
    conn = _connection()
    open_, ended = Slot(), Slot()
    ended.terminal = True
    conn._slots.update({5: open_, 6: ended})
    header = encode_envelope(Kind.EVENTS, 0, "", [[5, "a"], [9, "lost"], [6, "late"], [5, "b"]])
    conn._route(header)
    assert [(a.kind, _body(a.body)) for a in open_.arrivals] == [
        (int(Kind.EVENT), "a"),
        (int(Kind.EVENT), "b"),
    ]
    assert not ended.arrivals


@pytest.mark.parametrize("body", ["not a list", [[1]], [["five", "a"]], [[5, "a", "extra"]]])
def test_a_malformed_batch_is_dropped_without_touching_any_stream(body: Any) -> None:
    conn = _connection()
    slot = Slot()
    conn._slots[5] = slot
    conn._route(encode_envelope(Kind.EVENTS, 0, "", body))
    assert not slot.arrivals and not slot.terminal
    # The connection still routes what comes next.
    conn._route(encode_envelope(Kind.EVENT, 5, "", "next"))
    assert [_body(a.body) for a in slot.arrivals] == ["next"]


def test_the_handshake_says_the_client_library_reads_batches() -> None:
    hello = msgspec.msgpack.decode(_connection()._hello()[2])
    assert hello[0] == PROTOCOL_VERSION and hello[1] == int(Kind.HELLO)
    assert hello[4]["batches"] is True
    # A client from before batches existed sends no such field: it defaults off.
    old = {k: v for k, v in hello[4].items() if k != "batches"}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Hello).batches is False
