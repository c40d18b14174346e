"""The client's KV event thread (``llamad.client.affinity.EventFeed``) against
a stand-in publisher on real ZeroMQ sockets: a PUB for the stream and a
ROUTER answering replay requests as cache-meta does
(``docs/internals/kv-events.md``). What it must do: take what was published
before it subscribed from the replay socket, and fill a gap in the stream
from it too."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from llamad.client.affinity import EventFeed
from llamad.front.wire import KvEventsAddress
from llamad.kv_events import BlockStored, KVEventBatch, KvIndex, encode_batch, frame
from llamad.kv_events.wire import END_SEQ, seq_bytes
from llamad.testing import wait_until

pytestmark = pytest.mark.timeout(60)

TOPIC = b"kv"


def _batch(h: int) -> bytes:
    event = BlockStored(
        block_hashes=[h],
        parent_block_hash=None,
        token_ids=[1, 2, 3, 4],
        block_size=4,
        lora_id=None,
        medium="ram",
        lora_name=None,
    )
    return encode_batch(KVEventBatch(ts=0.0, events=[event]))


class Publisher:
    """A PUB socket and a replay ROUTER over a buffer of every batch published."""

    def __init__(self, base: Path) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"ipc://{base}/pub.sock")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(f"ipc://{base}/replay.sock")
        self.address = KvEventsAddress(
            endpoint=f"ipc://{base}/pub.sock",
            replay_endpoint=f"ipc://{base}/replay.sock",
            topic=TOPIC.decode(),
            block_size=4,
        )
        self.buffer: list[tuple[int, bytes]] = []
        self.replays = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def publish(self, seq: int, *, send: bool = True) -> None:
        """Batch ``seq`` (its one block's hash is ``1000 + seq``), into the
        buffer, and on the stream unless ``send`` is false (a lost message)."""
        payload = _batch(1000 + seq)
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart(frame(TOPIC, seq, payload))

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            identity, _, start = self.router.recv_multipart()
            self.replays += 1
            first = int.from_bytes(start, "big", signed=True)
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self.router.send_multipart([identity, b"", seq_bytes(seq), payload])
            self.router.send_multipart([identity, b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[Publisher]:
    p = Publisher(tmp_path)
    yield p
    p.close()


def test_the_feed_replays_what_came_before_it_and_fills_gaps(publisher: Publisher) -> None:
    index, lock = KvIndex(), threading.Lock()
    feed = EventFeed(index, lock)
    try:
        for seq in range(3):  # before anyone subscribed
            publisher.publish(seq)
        feed.follow("daemon-a", publisher.address)

        def held(*hashes: int) -> bool | None:
            with lock:
                return all(index.holds("daemon-a", h) for h in hashes) or None

        wait_until(lambda: held(1000, 1001, 1002), "the replay of seq 0..2", 30)
        # The stream goes on; 3 and 4 are lost on the way (a slow joiner, a
        # full queue): the gap at 5 asks the replay socket for them.
        replays = publisher.replays
        publisher.publish(3, send=False)
        publisher.publish(4, send=False)

        def sent_5() -> bool | None:
            # A PUB drops what it sends before the SUB's subscription has
            # arrived: send until the feed has it.
            if held(1005):
                return True
            publisher.pub.send_multipart(frame(TOPIC, 5, publisher.buffer[-1][1]))
            return None

        publisher.publish(5, send=False)
        wait_until(sent_5, "seq 5 through the stream", 30)
        assert held(1003, 1004, 1005)
        assert publisher.replays > replays
    finally:
        feed.close()
