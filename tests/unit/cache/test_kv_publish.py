"""cache-meta's publisher on real ZeroMQ sockets: batches, the replay buffer, discovery."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from llamad.cache.kv_publish import KvEventPublisher, KvEventsSettings
from llamad.cache.kvc import SaveReason
from llamad.cache.rows import Row
from llamad.kv_events.blocks import chain_hashes
from llamad.kv_events.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    parse_frame,
)
from llamad.tiers import TierKind

pytestmark = pytest.mark.timeout(60)

NS = bytes(range(65))


def _row(key: bytes, tokens: list[int]) -> Row:
    packed = struct.pack(f"<{len(tokens)}I", *tokens)
    return Row(key, NS, len(tokens), SaveReason.COLD, 0, 0, tokens=packed)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # ipc paths must fit in 107 bytes: a short directory of our own.
    path = Path(tempfile.mkdtemp(prefix="lkv-", dir="/tmp"))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _publisher(run_dir: Path, buffer_steps: int = 100) -> KvEventPublisher:
    return KvEventPublisher(
        KvEventsSettings(
            endpoint=f"ipc://{run_dir}/pub.sock",
            replay_endpoint=f"ipc://{run_dir}/replay.sock",
            topic="kv",
            buffer_steps=buffer_steps,
            info_path=str(run_dir / "kv_events.json"),
        )
    )


def _replay(pub: KvEventPublisher, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            # The publisher serves replays from its owner's loop: step it here.
            for _ in range(500):
                pub.serve_replay()
                if sock.poll(10):
                    break
            else:
                raise AssertionError("no replay answer")
            _, seq, payload = sock.recv_multipart()
            if seq == END_SEQ:
                return got
            got.append((int.from_bytes(seq, "big"), payload))
    finally:
        sock.close(linger=0)
        ctx.term()


def test_start_clears_then_rows_go_out_one_batch_per_flush(run_dir: Path) -> None:
    pub = _publisher(run_dir)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(pub.endpoint)
        tokens = list(range(40))
        pub.copy_added(_row(b"a", tokens), TierKind.RAM)
        pub.copy_added(_row(b"a", tokens), TierKind.DISK)
        assert pub.flush() == 1
        assert pub.flush() == 0  # nothing new, no empty batch
        pub.copy_dropped(_row(b"a", tokens), TierKind.RAM)
        assert pub.flush() == 1
        got = _replay(pub, pub.replay_endpoint or "", 0)
        assert [n for n, _ in got] == [0, 1]
        first = decode_batch(got[0][1]).events
        assert isinstance(first[0], AllBlocksCleared)
        stored = first[1:]
        assert [type(e) for e in stored] == [BlockStored, BlockStored]
        assert all(isinstance(e, BlockStored) for e in stored)
        assert [e.medium for e in stored if isinstance(e, BlockStored)] == ["ram", "disk"]
        hashes = chain_hashes(NS, tokens)
        assert decode_batch(got[1][1]).events == [BlockRemoved(block_hashes=hashes, medium="ram")]
        # A subscriber that connected in time got the same batches over PUB.
        if sub.poll(2000):
            topic, seq, batch = parse_frame(sub.recv_multipart())
            assert topic == b"kv" and batch == decode_batch(dict(got)[seq])
    finally:
        sub.close(linger=0)
        ctx.term()
        pub.close()


def test_the_replay_buffer_is_bounded_and_starts_where_asked(run_dir: Path) -> None:
    pub = _publisher(run_dir, buffer_steps=3)
    try:
        for i in range(5):
            pub.copy_added(_row(bytes([i]), [i] * 16), TierKind.RAM)
            pub.flush()
        # Five batches (the start's clear goes with the first row); the last three stay.
        assert [n for n, _ in _replay(pub, pub.replay_endpoint or "", 0)] == [2, 3, 4]
        assert [n for n, _ in _replay(pub, pub.replay_endpoint or "", 4)] == [4]
        assert _replay(pub, pub.replay_endpoint or "", 9) == []
        assert pub.info()["oldest_seq"] == 2 and pub.info()["next_seq"] == 5
    finally:
        pub.close()


def test_a_malformed_replay_request_is_ignored_and_the_socket_still_serves(
    run_dir: Path,
) -> None:
    pub = _publisher(run_dir)
    pub.flush()
    ctx = zmq.Context()
    bad = ctx.socket(zmq.DEALER)
    try:
        bad.connect(pub.replay_endpoint or "")
        bad.send_multipart([b"", b"\x01\x02"])
        bad.send_multipart([b"nonsense"])
        for _ in range(20):
            pub.serve_replay()
        assert not bad.poll(100)
        assert [n for n, _ in _replay(pub, pub.replay_endpoint or "", 0)] == [0]
    finally:
        bad.close(linger=0)
        ctx.term()
        pub.close()


def test_discovery_file_is_written_and_withdrawn(run_dir: Path) -> None:
    pub = _publisher(run_dir)
    pub.write_info()
    info = json.loads((run_dir / "kv_events.json").read_text())
    assert info == {
        "endpoint": f"ipc://{run_dir}/pub.sock",
        "replay_endpoint": f"ipc://{run_dir}/replay.sock",
        "topic": "kv",
        "block_size": 16,
        "pid": os.getpid(),
    }
    pub.stop()
    assert not (run_dir / "kv_events.json").exists()


def test_stop_says_all_blocks_cleared(run_dir: Path) -> None:
    pub = _publisher(run_dir)
    pub.copy_added(_row(b"a", list(range(16))), TierKind.DISK)
    pub.flush()
    seen: list[object] = []
    original = pub.close

    def close(linger_s: float = 0.0) -> None:
        seen.extend(decode_batch(p).events for _, p in pub._buffer)
        original(linger_s)

    pub.close = close  # type: ignore[method-assign]
    pub.stop()
    assert seen[-1] == [AllBlocksCleared()]


def test_live_entries_are_replaced_per_worker_and_go_with_it(run_dir: Path) -> None:
    pub = _publisher(run_dir)
    try:
        tokens = list(range(32))
        packed = struct.pack("<32I", *tokens)
        hashes = chain_hashes(NS, tokens)
        pub.live_set(101, [(0, NS, packed)])
        pub.live_set(202, [(3, NS, packed)])  # another worker, the same prompt
        pub.live_set(101, [(0, NS, packed)])  # a repeat changes nothing
        pub.flush()
        pub.live_set(101, [])
        pub.flush()
        assert pub.ledger.held("live", hashes[0]) == 1  # worker 202 still holds it
        assert pub.live_owners() == {202}
        pub.live_set(202, [])
        pub.flush()
        got = [decode_batch(p).events for _, p in _replay(pub, pub.replay_endpoint or "", 0)]
        stored = [e for e in got[0] if isinstance(e, BlockStored)]
        assert [(e.medium, e.block_hashes) for e in stored] == [("live", hashes)]
        # Worker 101 leaving sent nothing (202 still held every block); 202
        # leaving removed them all.
        assert got[1:] == [[BlockRemoved(block_hashes=hashes, medium="live")]]
    finally:
        pub.close()
