"""Which daemon holds a prompt's longest cached prefix, from their KV events.

A client of several daemons (:mod:`llamad.client.router`) subscribes to each
daemon's KV event stream (vLLM's format, :mod:`llamad.kv_events`; the address
comes with the daemon's status, ``DaemonStatus.kv_events``) and keeps a
:class:`~llamad.kv_events.KvIndex` of the blocks each one holds. To route a
request it hashes the prompt's token ids into the same block chain the
daemons publish: the chain is keyed by the model's namespace header (each
worker publishes it in its status, ``WorkerStatus.namespace``) with the
request's ``cache_salt`` folded in exactly as the worker folds it
(:func:`llamad.kv_events.salted_header`), so another tenant's blocks never
match.

:class:`EventFeed` is the one thread that reads the streams (a SUB socket per
daemon, and the replay socket on a gap or a late start); :class:`Affinity`
is what the clients ask, under a lock. Token ids a text prompt or a chat
renders to come from a daemon (``tokenize``, ``apply_chat_template``) and
are kept per text (:class:`Affinity` holds a bounded LRU).
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Final

import msgspec
import structlog
import zmq

from llamad.front.wire import DaemonStatus, KvEventsAddress
from llamad.kv_events import KvIndex, chain_hashes, parse_frame, salted_header
from llamad.kv_events.wire import END_SEQ, WireError, decode_batch, parse_seq, seq_bytes

__all__ = ["TOKENS_KEPT", "Affinity", "EventFeed"]

log = structlog.get_logger("llamad.client.affinity")

_HEADER: Final = 65
"""A namespace header's bytes (``llamad.cache.key.Namespace.header``)."""
TOKENS_KEPT: Final = 256
"""Texts whose token ids an :class:`Affinity` keeps (least recently used go)."""
_REPLAY_WAIT_MS: Final = 1000
_POLL_MS: Final = 100


class EventFeed:
    """The thread that keeps ``index`` from the daemons' event streams."""

    def __init__(self, index: KvIndex, lock: threading.Lock) -> None:
        self._index = index
        self._lock = lock
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._new: queue.SimpleQueue[tuple[str, KvEventsAddress]] = queue.SimpleQueue()
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, endpoint: str, address: KvEventsAddress) -> None:
        """Subscribe to ``endpoint``'s stream at ``address`` (once)."""
        if endpoint in self._known or self._stop.is_set():
            return
        address = as_seen_from(endpoint, address)
        self._known.add(endpoint)
        self._new.put((endpoint, address))
        if self._thread is None:
            self._ctx = zmq.Context()
            self._thread = threading.Thread(target=self._run, name="llamad-kv-events", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _run(self) -> None:
        assert self._ctx is not None
        poller = zmq.Poller()
        subs: dict[zmq.Socket[bytes], tuple[str, KvEventsAddress]] = {}
        try:
            while not self._stop.is_set():
                while not self._new.empty():
                    endpoint, address = self._new.get()
                    sock = self._ctx.socket(zmq.SUB)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.setsockopt(zmq.SUBSCRIBE, address.topic.encode())
                    sock.connect(address.endpoint)
                    poller.register(sock, zmq.POLLIN)
                    subs[sock] = (endpoint, address)
                    # What it published before we joined (the ZeroMQ slow
                    # joiner loses a few more): the gap rule asks again.
                    self._replay(endpoint, address, 0)
                for sock, _ in poller.poll(_POLL_MS):
                    endpoint, address = subs[sock]
                    self._take(endpoint, address, sock.recv_multipart())
        finally:
            for sock in subs:
                sock.close(0)

    def _take(self, endpoint: str, address: KvEventsAddress, parts: list[bytes]) -> None:
        try:
            _, seq, batch = parse_frame(parts)
        except WireError:
            log.warning("client.kv_events.bad_message", endpoint=endpoint)
            return
        with self._lock:
            applied = self._index.apply(endpoint, seq, batch)
        if applied.outcome == "gap" and applied.replay_from is not None:
            self._replay(endpoint, address, applied.replay_from)
            with self._lock:
                again = self._index.apply(endpoint, seq, batch)
                if again.outcome == "gap":  # the replay could not fill it
                    self._index.reset(endpoint)
                    self._index.apply(endpoint, seq, batch)

    def _replay(self, endpoint: str, address: KvEventsAddress, start: int) -> None:
        """Apply what ``address``'s replay socket still holds from ``start`` on;
        what it no longer holds is forgotten (:meth:`KvIndex.reset`)."""
        assert self._ctx is not None
        if address.replay_endpoint is None:
            with self._lock:
                self._index.reset(endpoint)
            return
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(address.replay_endpoint)
            sock.send_multipart([b"", seq_bytes(start)])
            first = True
            while sock.poll(_REPLAY_WAIT_MS):
                frames = sock.recv_multipart()
                if len(frames) != 3 or frames[1] == END_SEQ:
                    break
                seq, batch = parse_seq(frames[1]), decode_batch(frames[2])
                with self._lock:
                    if first and seq > start:
                        self._index.reset(endpoint)  # it no longer reaches back
                    self._index.apply(endpoint, seq, batch)
                first = False
        except (WireError, zmq.ZMQError) as exc:
            log.warning("client.kv_events.replay_failed", endpoint=endpoint, error=str(exc))
        finally:
            sock.close(0)


_WILDCARDS: Final = ("tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:")


def _seen_from(daemon: str, published: str) -> str:
    for wildcard in _WILDCARDS:
        if published.startswith(wildcard) and daemon.startswith("tcp://"):
            host = daemon[len("tcp://") :].rpartition(":")[0]
            return f"tcp://{host}:{published[len(wildcard) :]}"
    return published


def as_seen_from(daemon: str, address: KvEventsAddress) -> KvEventsAddress:
    """``address`` as a client that reaches the daemon at ``daemon`` connects
    to it: a socket bound to every interface (``tcp://0.0.0.0:5557``) is
    published as bound, and is reached on the daemon's own host."""
    return msgspec.structs.replace(
        address,
        endpoint=_seen_from(daemon, address.endpoint),
        replay_endpoint=None
        if address.replay_endpoint is None
        else _seen_from(daemon, address.replay_endpoint),
    )


class Affinity:
    """What a client of several daemons knows of their caches (module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.index = KvIndex()
        self.feed = EventFeed(self.index, self._lock)
        self._namespaces: dict[tuple[str, str], bytes] = {}  # (endpoint, model) -> header
        self._block_size: dict[str, int] = {}
        self._tokens: OrderedDict[Hashable, list[int]] = OrderedDict()

    def close(self) -> None:
        self.feed.close()

    def learn(self, endpoint: str, status: DaemonStatus) -> None:
        """What ``endpoint``'s status says: its models' namespaces, its stream."""
        with self._lock:
            for model in status.models:
                ns = model.worker.status.namespace if model.worker is not None else None
                if ns is not None and len(ns) == _HEADER:
                    self._namespaces[(endpoint, model.info.model_id)] = ns
            if status.kv_events is not None:
                self._block_size[endpoint] = status.kv_events.block_size
        if status.kv_events is not None:
            self.feed.follow(endpoint, status.kv_events)

    def worth_it(self, model_id: str) -> bool:
        """Whether a prompt's tokens are worth getting: some daemon announced
        blocks, and the model's namespace is known."""
        with self._lock:
            return any(self.index.blocks(e) for e in self.index.endpoints) and any(
                m == model_id for _, m in self._namespaces
            )

    def prefix(self, model_id: str, tokens: Sequence[int], salt: bytes | None) -> dict[str, int]:
        """Per daemon, how many of the prompt's leading blocks it holds."""
        with self._lock:
            wanted = {
                e: salted_header(h, salt) for (e, m), h in self._namespaces.items() if m == model_id
            }
            sizes = dict(self._block_size)
        out: dict[str, int] = {}
        chains: dict[tuple[bytes, int], list[int]] = {}
        for endpoint, header in wanted.items():
            size = sizes.get(endpoint)
            if size is None:
                continue
            hashes = chains.get((header, size))
            if hashes is None:
                hashes = chains[(header, size)] = chain_hashes(header, tokens, size)
            with self._lock:
                out[endpoint] = self.index.matches(hashes, [endpoint])[endpoint]
        return out

    def tokens(self, key: Hashable) -> list[int] | None:
        """The token ids kept for ``key`` (a text or a chat, with its options)."""
        with self._lock:
            found = self._tokens.get(key)
            if found is not None:
                self._tokens.move_to_end(key)
            return found

    def keep(self, key: Hashable, tokens: list[int]) -> None:
        with self._lock:
            self._tokens[key] = tokens
            self._tokens.move_to_end(key)
            while len(self._tokens) > TOKENS_KEPT:
                self._tokens.popitem(last=False)
