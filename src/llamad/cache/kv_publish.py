"""cache-meta's KV event publisher: every row copy as vLLM's block events (issue 20).

cache-meta sees every copy of every row come and go (a save published, a
move landed, a demotion finished, an eviction, a corrupt file forgotten, the
rebuild at start), so it owns the stream: :meth:`KvEventPublisher.copy_added`
and :meth:`KvEventPublisher.copy_dropped` are called from
:class:`~llamad.cache.meta.CacheMeta` at the two places a copy enters or
leaves the index. The row's namespace header (tenant salt and libllama build
folded in) and its token ids give the block chain
(:mod:`llamad.kv_events.blocks`); :class:`~llamad.kv_events.ledger.BlockLedger`
counts holders per ``(medium, block)``, so a block shared by several rows is
withdrawn only when the last of them leaves that tier.

Events gather while cache-meta handles a message and go out as one
``KVEventBatch`` per loop step (:meth:`KvEventPublisher.flush`): a PUB socket
sends ``[topic, seq, payload]``, and the last ``buffer_steps`` payloads stay
for the ROUTER replay socket, which answers a request for ``start_seq`` with
every buffered batch from there on and then ``END_SEQ`` (vLLM's protocol). The
first batch of every start (seq 0) is ``AllBlocksCleared``, then the rows the
rebuild found: a subscriber that sees seq 0 again knows the daemon (or its
cache-meta) restarted.

Both sockets are served in cache-meta's own loop (the replay socket is one
more reader of its poll): no thread, and PUB never blocks (a slow subscriber
loses messages at the high-water mark and asks for a replay).

``medium`` is the tier's name: ``ram``, ``ram_file``, ``disk``; and ``live``
for the idle entries a worker keeps resident, which each worker reports on its
cache connection whenever they change (:meth:`KvEventPublisher.live_set`, a
cast) and which go with the worker when it dies (cache-meta watches it).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec
import structlog
import zmq

from llamad.actors.sockets import restrict_ipc
from llamad.cache.errors import InvalidCacheValue
from llamad.kv_events.blocks import DEFAULT_BLOCK_SIZE
from llamad.kv_events.ledger import BlockLedger
from llamad.kv_events.wire import (
    END_SEQ,
    SEQ_BYTES,
    KVEvent,
    KVEventBatch,
    encode_batch,
    seq_bytes,
)

if TYPE_CHECKING:
    from llamad.cache.rows import Row
    from llamad.cache.tier_kind import TierKind

__all__ = ["KvEventPublisher", "KvEventsSettings"]

log = structlog.get_logger("llamad.cache.kv_events")

LIVE: Final = "live"
"""The medium of a worker's idle entries: KV kept resident, reused without a restore."""

#: Most events one batch carries (a rebuild of many rows goes out in several).
MAX_EVENTS_PER_BATCH: Final = 512
#: Replay requests served per wakeup, so a flood of them cannot stall lookups.
_REPLAYS_PER_WAKE: Final = 16


class KvEventsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where and how cache-meta publishes (``[kv_events]``, resolved)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    block_size: int = DEFAULT_BLOCK_SIZE
    buffer_steps: int = 10_000
    hwm: int = 100_000
    info_path: str | None = None
    """Where the endpoints are published for clients (``kv_events.json``)."""

    def __post_init__(self) -> None:
        for name in ("block_size", "buffer_steps", "hwm"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidCacheValue(f"kv_events.{name}", f"{n!r} is not a positive int")


class KvEventPublisher:
    """The ledger, the two sockets and the replay buffer."""

    def __init__(self, settings: KvEventsSettings, *, clock: Any = time.time) -> None:
        self.settings = settings
        self.ledger = BlockLedger(settings.block_size)
        self._clock = clock
        self._topic = settings.topic.encode()
        self._pending: list[KVEvent] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer_steps)
        self._seq = 0
        # owner pid -> its live entries as reported (the ledger's holders).
        self._live: dict[int, set[tuple[int, int, bytes, bytes]]] = {}
        self.batches = 0
        self.replays = 0
        # A context of its own: the actor's is made (and terminated) by the actor.
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        ctx = self._ctx
        self._pub: zmq.Socket[bytes] = ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.setsockopt(zmq.SNDHWM, settings.hwm)
            self._pub.bind(settings.endpoint)
            self.endpoint = _bound(self._pub, settings.endpoint)
            # The events carry every saved prompt's token ids: the socket
            # files are 0600 like every file of the runtime directory.
            restrict_ipc(self.endpoint)
            self.replay_endpoint: str | None = None
            if settings.replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(settings.replay_endpoint)
                self.replay_endpoint = _bound(self._replay, settings.replay_endpoint)
                restrict_ipc(self.replay_endpoint)
        except zmq.ZMQError:
            self.close()
            raise
        # Every start begins from nothing: a subscriber drops what it knew.
        self._pending.append(self.ledger.clear())

    # -- what cache-meta reports ------------------------------------------------

    def copy_added(self, row: Row, tier: TierKind) -> None:
        """A copy of ``row`` is now indexed in ``tier``."""
        event = self.ledger.store(row.key, str(tier), row.namespace, row.tokens)
        if event is not None:
            self._pending.append(event)

    def copy_dropped(self, row: Row, tier: TierKind) -> None:
        """``row``'s copy in ``tier`` left the index."""
        event = self.ledger.remove(row.key, str(tier))
        if event is not None:
            self._pending.append(event)

    def live_set(self, owner: int, entries: Sequence[tuple[int, bytes, bytes]]) -> None:
        """Process ``owner`` (a worker) keeps exactly ``entries`` live now:
        ``(seq, namespace header, tokens as u32 LE)``, medium ``live``."""
        new = {(owner, seq, bytes(ns), bytes(tokens)) for seq, ns, tokens in entries}
        old = self._live.get(owner, set())
        for holder in old - new:
            self._add(self.ledger.remove(("live", *holder), LIVE))
        for holder in new - old:
            _, _, ns, tokens = holder
            self._add(self.ledger.store(("live", *holder), LIVE, ns, tokens))
        if new:
            self._live[owner] = new
        else:
            self._live.pop(owner, None)

    def live_owners(self) -> set[int]:
        """The processes whose live entries are published (watched until they go)."""
        return set(self._live)

    def _add(self, event: KVEvent | None) -> None:
        if event is not None:
            self._pending.append(event)

    # -- the sockets ------------------------------------------------------------

    def replay_fd(self) -> int | None:
        """The replay socket's fd for cache-meta's poll (``None``: no replay socket)."""
        if self._replay is None:
            return None
        return int(self._replay.getsockopt(zmq.FD))

    def flush(self) -> int:
        """Send what gathered since the last flush; the number of batches sent."""
        sent = 0
        while self._pending:
            events = self._pending[:MAX_EVENTS_PER_BATCH]
            del self._pending[:MAX_EVENTS_PER_BATCH]
            payload = encode_batch(KVEventBatch(ts=self._clock(), events=events))
            seq = self._seq
            self._seq += 1
            with contextlib.suppress(zmq.Again):
                self._pub.send_multipart([self._topic, seq_bytes(seq), payload], zmq.NOBLOCK)
            self._buffer.append((seq, payload))
            sent += 1
        self.batches += sent
        return sent

    def serve_replay(self) -> None:
        """Answer the replay requests waiting (the reader of :meth:`replay_fd`)."""
        sock = self._replay
        if sock is None:
            return
        # The fd is edge-triggered: drain until the socket says nothing waits.
        for _ in range(_REPLAYS_PER_WAKE):
            if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._answer(sock, frames)

    def _answer(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
        # [identity, b"", start_seq]: what a DEALER or REQ sends.
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != SEQ_BYTES:
            log.warning("kv_events.bad_replay_request", frames=len(frames))
            return
        identity, start = frames[0], int.from_bytes(frames[2], "big", signed=True)
        self.replays += 1
        with contextlib.suppress(zmq.ZMQError):
            for seq, payload in self._buffer:
                if seq >= start:
                    sock.send_multipart([identity, b"", seq_bytes(seq), payload], zmq.NOBLOCK)
            sock.send_multipart([identity, b"", END_SEQ, b""], zmq.NOBLOCK)

    # -- discovery and status ------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """What a subscriber needs: endpoints, topic, block size, the stream's position."""
        return {
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": self.settings.topic,
            "block_size": self.settings.block_size,
            "next_seq": self._seq,
            "oldest_seq": self._buffer[0][0] if self._buffer else None,
            "blocks": len(self.ledger),
            "batches": self.batches,
            "replays": self.replays,
            "pid": os.getpid(),
        }

    def write_info(self) -> None:
        """Publish the endpoints in ``info_path`` (atomically: a reader never sees half)."""
        path = self.settings.info_path
        if path is None:
            return
        info = {k: v for k, v in self.info().items() if k in _DISCOVERY}
        tmp = Path(f"{path}.{os.getpid()}.tmp")
        try:
            # 0600 at creation, as every file of the runtime directory (security.md).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(info))
            tmp.replace(path)
        except OSError as exc:
            # The stream works without the file; status names it too.
            log.warning("kv_events.info_not_written", path=path, error=repr(exc))

    def stop(self) -> None:
        """A clean stop: tell subscribers this daemon holds nothing any more, then close.

        Rows on ``disk`` survive the stop, but nothing serves them until the
        next start (whose seq 0 announces them again): a router must not send
        requests here meanwhile.
        """
        self._pending.append(self.ledger.clear())
        self.flush()
        self.close(linger_s=0.2)

    def close(self, linger_s: float = 0.0) -> None:
        """Close both sockets and withdraw ``info_path`` (if it is still ours)."""
        path = self.settings.info_path
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                if json.loads(Path(path).read_text()).get("pid") == os.getpid():
                    Path(path).unlink()
        self._pub.close(linger=round(linger_s * 1000))
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()


_DISCOVERY: Final = ("endpoint", "replay_endpoint", "topic", "block_size", "pid")


def _bound(sock: zmq.Socket[bytes], asked: str) -> str:
    """The endpoint subscribers connect to (a tcp port 0 or ``*`` resolved)."""
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    text = last.decode() if isinstance(last, bytes) else str(last)
    return text or asked
