"""Fuzz: 10,000 random or malformed messages at an actor in a child process.

The actor must stay alive, answer a valid call afterwards, refuse the junk
with the stable codes, and not grow its RSS by more than 20 MB.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
import zmq

from llamad.actors import Client
from llamad.actors.monitor import ProcessRef
from llamad.actors.wire import PROTOCOL_VERSION, Hello, Kind, encode_envelope
from llamad.testing.toy_actor import spawn_toy

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

MESSAGES = 10_000
MAX_FRAME = 64 * 1024  # the toy's MAXMSGSIZE, so over-limit frames stay cheap to send
RSS_BUDGET = 20 * 1024 * 1024
PACE = 250  # messages between pings: bounds the actor's queue (see ping_and_wait)
pack = msgspec.msgpack.encode


def junk_value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.randint(-(2**63), 2**64 - 1)
    if choice == 3:
        return rng.random() * 1e300
    if choice == 4:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(20)))
    if choice == 5:
        return rng.randbytes(rng.randrange(20))
    if choice == 6:
        return [junk_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    if choice == 7:
        size = rng.randrange(5)
        return {str(junk_value(rng, 3)): junk_value(rng, depth + 1) for _ in range(size)}
    return {"n": junk_value(rng, depth + 1), "s": junk_value(rng, depth + 1)}


def huge_length_header(rng: random.Random) -> bytes:
    # A msgpack container or string claiming ~4 G elements/bytes, then little data.
    tag = rng.choice([0xDD, 0xDF, 0xDB, 0xC6, 0xC7])
    claim = struct.pack(">I", rng.randrange(2**31, 2**32))
    prefix = rng.choice([b"", b"\x95\x01\x01\x07", b"\x95\x01\x01\x07\xa4echo"])
    return prefix + bytes([tag]) + claim + rng.randbytes(rng.randrange(10))


def build_cases(hello: bytes) -> list[Callable[[random.Random], list[bytes]]]:
    def random_bytes(rng: random.Random) -> list[bytes]:
        return [rng.randbytes(rng.randrange(0, 200))]

    def wrong_types(rng: random.Random) -> list[bytes]:
        return [pack(junk_value(rng))]

    def wrong_envelope_fields(rng: random.Random) -> list[bytes]:
        env = [PROTOCOL_VERSION, Kind.CALL, rng.randrange(1, 1000), "echo", {}]
        env[rng.randrange(5)] = junk_value(rng)
        return [pack(env)]

    def huge_lengths(rng: random.Random) -> list[bytes]:
        return [huge_length_header(rng)]

    def unknown_op(rng: random.Random) -> list[bytes]:
        op = rng.choice(["nope", "ECHO", "$secret", "count2", "x" * rng.randrange(1, 70)])
        return [encode_envelope(Kind.CALL, rng.randrange(1, 2**40), op, junk_value(rng))]

    def bad_body(rng: random.Random) -> list[bytes]:
        op, kind = rng.choice([("sleep", Kind.CALL), ("count", Kind.STREAM), ("wait", Kind.CALL)])
        return [encode_envelope(kind, rng.randrange(1, 2**40), op, junk_value(rng))]

    def wrong_frame_count(rng: random.Random) -> list[bytes]:
        op = rng.choice(["echo", "fail", "pid"])
        extra = [rng.randbytes(rng.randrange(50)) for _ in range(rng.randrange(1, 25))]
        return [encode_envelope(Kind.CALL, rng.randrange(1, 2**40), op, {}), *extra]

    def wrong_kind_or_version(rng: random.Random) -> list[bytes]:
        version = rng.choice([PROTOCOL_VERSION, PROTOCOL_VERSION + 1, 0, 255, -1])
        kind = rng.choice([0, 2, 3, 6, 7, 11, 255])
        return [pack([version, kind, rng.randrange(1, 100), "echo", {}])]

    def oversized_header(rng: random.Random) -> list[bytes]:
        pad = "x" * rng.randrange(MAX_FRAME - 200, MAX_FRAME - 50)
        return [encode_envelope(Kind.CALL, rng.randrange(1, 100), "echo", pad)]

    def control_junk(rng: random.Random) -> list[bytes]:
        kind = rng.choice([Kind.CANCEL, Kind.BYE, Kind.CAST, Kind.HELLO])
        body = junk_value(rng) if kind != Kind.CAST else {"key": junk_value(rng)}
        op = "publish" if kind == Kind.CAST else ""
        return [encode_envelope(kind, rng.randrange(0, 2**40), op, body)]

    def handshake_again(rng: random.Random) -> list[bytes]:
        return [hello]

    def empty_frames(rng: random.Random) -> list[bytes]:
        return [b""] * rng.randrange(1, 4)

    return [
        random_bytes,
        wrong_types,
        wrong_envelope_fields,
        huge_lengths,
        unknown_op,
        bad_body,
        wrong_frame_count,
        wrong_kind_or_version,
        oversized_header,
        control_junk,
        handshake_again,
        empty_frames,
    ]


def ping_and_wait(sock: zmq.Socket[bytes], hello: bytes, cid: int) -> int:
    """Ping and read until the pong; return how many other replies came first.

    The connection is FIFO: once the ping is answered, every message sent
    before it has been handled. The loop pings every ``PACE`` messages so that
    the actor's queue never holds more than that: a backlog of thousands of
    frames (its RCVHWM is 10,000) raises the heap's high-water mark under CPU
    contention, and glibc keeps that memory, which is not a leak. A leak grows
    with the messages handled, paced or not.
    """
    # The fuzz may have sent a bad handshake that closed this peer: greet again.
    sock.send(hello)
    sock.send(encode_envelope(Kind.CALL, cid, "$ping", None))
    others = 0
    while True:
        assert sock.poll(60_000), "the actor stopped answering"
        _, kind, got, _, _ = msgspec.msgpack.decode(sock.recv_multipart()[0])
        if (kind, got) == (Kind.REPLY, cid):
            return others
        others += 1


def test_fuzzed_actor_stays_alive_answers_and_does_not_leak(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/fuzz.sock"
    args = ("--endpoint", endpoint, "--no-register", "--max-frame-bytes", str(MAX_FRAME))
    with spawn_toy(*args) as toy:
        actor_proc = psutil.Process(toy.pid)
        with Client(endpoint, timeout=60) as c:
            assert c.call("echo", "warm") == "warm"
            received_before = c.call("$info")["stats"]["received"]
        rss_before = actor_proc.memory_info().rss

        me = ProcessRef.current()
        hello = encode_envelope(
            Kind.HELLO, 1, "", Hello(me.pid, me.start_ticks, me.boot_id, me.pidns, "fuzz")
        )
        cases = build_cases(hello)
        rng = random.Random(20261125)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(endpoint)
        replies = 0
        try:
            sock.send(hello)
            for n in range(MESSAGES):
                if n % PACE == PACE - 1:
                    replies += ping_and_wait(sock, hello, 2**50 + n)
                if n % 1000 == 999:
                    # Over MAXMSGSIZE, on a connection of its own: ZeroMQ drops
                    # that connection and the actor never sees the frame.
                    oversize = ctx.socket(zmq.DEALER)
                    oversize.setsockopt(zmq.LINGER, 0)
                    oversize.connect(endpoint)
                    oversize.send(rng.randbytes(MAX_FRAME + 1))
                    oversize.close(0)
                    continue
                sock.send_multipart(rng.choice(cases)(rng))
                while sock.poll(0):
                    sock.recv_multipart()
                    replies += 1
            replies += ping_and_wait(sock, hello, 2**50 + MESSAGES)
            assert toy.proc.poll() is None, "the actor died"
        finally:
            sock.close(0)
            ctx.term()

        with Client(endpoint, timeout=60) as c:
            assert c.call("echo", {"after": "fuzz"}) == {"after": "fuzz"}
            info = c.call("$info")
        rss_after = actor_proc.memory_info().rss

    assert replies > 0
    rejected = info["stats"]["rejected"]
    assert {"bad_request", "unknown_op", "too_large", "version_mismatch"} <= set(rejected)
    handled = info["stats"]["received"] - received_before
    assert handled >= MESSAGES - MESSAGES // 1000
    assert rss_after - rss_before <= RSS_BUDGET, (rss_before, rss_after)
