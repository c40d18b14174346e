"""A real daemon's KV events, read the way llm-d or Dynamo would (issue 20).

One daemon for the module, kv_events on by default (ipc sockets in its
runtime directory). A plain ZeroMQ SUB socket reads the stream and a DEALER
asks the replay socket; the messages are decoded with classes declared HERE
from vLLM's published format (``vllm/distributed/kv_events.py``: array-like,
tagged msgspec Structs), not with llamad's own, and block hashes are
recomputed from the definition in docs/internals/kv-events.md. The salt test
then checks that a router can predict them with ``llamad.kv_events``
(``salted_header`` over the worker's published namespace, ``chain_hashes``).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import zmq

from daemon_proc import DaemonProc
from llamad import Client
from llamad.kv_events import chain_hashes, salted_header
from served import EVENTUALLY

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

GREEDY = {"temperature": 0.0, "max_tokens": 4}


# -- vLLM's messages, as its source declares them --------------------------------


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(KVEventBatch)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def chain_hash(parent: int | None, tokens: list[int], extra: list[Any] | None) -> int:
    """docs/internals/kv-events.md's definition, followed by hand."""
    h = hashlib.blake2b(digest_size=8, person=b"llamad-kvblk-v1")
    h.update(b"\xff" * 8 if parent is None else parent.to_bytes(8, "big"))
    if extra is not None:
        h.update(msgspec.msgpack.encode(extra))
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return int.from_bytes(h.digest(), "big") & ((1 << 63) - 1)


# -- the stream -------------------------------------------------------------------


class Stream:
    """Everything the SUB socket got, by sequence number."""

    def __init__(self, endpoint: str, topic: bytes = b"") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.raw: dict[int, bytes] = {}
        self.batches: dict[int, KVEventBatch] = {}

    def pump(self, timeout: float = 0.2) -> None:
        while self.sub.poll(round(timeout * 1000)):
            _topic, seq, payload = self.sub.recv_multipart()
            n = int.from_bytes(seq, "big")
            self.raw[n] = payload
            self.batches[n] = DECODE.decode(payload)
            timeout = 0

    def events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        return [e for n in sorted(self.batches) for e in self.batches[n].events]

    def wait_for(self, what: str, found: Callable[[], bool]) -> None:
        deadline = time.monotonic() + EVENTUALLY
        while not found():
            assert time.monotonic() < deadline, f"no {what} in the stream"
            self.pump()

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()


def replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        got: list[tuple[int, bytes]] = []
        while True:
            assert sock.poll(round(EVENTUALLY * 1000)), "the replay socket did not answer"
            empty, seq, payload = sock.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                assert payload == b""
                return got
            got.append((int.from_bytes(seq, "big"), payload))
    finally:
        sock.close(linger=0)
        ctx.term()


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProc]:
    daemon = DaemonProc()
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def info(served: DaemonProc) -> dict[str, Any]:
    path = served.launcher.runtime / "kv_events.json"
    deadline = time.monotonic() + EVENTUALLY
    while not path.exists():
        assert time.monotonic() < deadline, "kv_events.json was never published"
        time.sleep(0.05)
    found: dict[str, Any] = json.loads(path.read_text())
    return found


@pytest.fixture(scope="module")
def stream(info: dict[str, Any]) -> Iterator[Stream]:
    s = Stream(info["endpoint"], info["topic"].encode())
    # A SUB socket joins late by design (ZeroMQ's slow joiner): until the
    # subscription has reached the publisher, what it sends is not for us.
    time.sleep(0.3)
    yield s
    s.close()


def stored_chain(stream: Stream, tokens: list[int]) -> tuple[list[int], str]:
    """The stored blocks covering ``tokens`` (hashes, first to last) and the namespace."""
    by_hash = {
        h: (e, i)
        for e in stream.events()
        if isinstance(e, BlockStored)
        for i, h in enumerate(e.block_hashes)
    }
    roots = [
        e
        for e in stream.events()
        if isinstance(e, BlockStored)
        and e.parent_block_hash is None
        and e.token_ids[: e.block_size] == tokens[: e.block_size]
    ]
    assert roots, "no BlockStored starts with these tokens"
    assert roots[-1].extra_keys is not None
    root_extra = roots[-1].extra_keys[0]
    assert root_extra is not None and root_extra[0] == "llamad-ns"
    hashes: list[int] = []
    parent: int | None = None
    extra: list[Any] | None = list(root_extra)
    size = roots[-1].block_size
    for start in range(0, len(tokens) - size + 1, size):
        h = chain_hash(parent, tokens[start : start + size], extra)
        if h not in by_hash:
            break
        event, i = by_hash[h]
        # The event names this block's tokens at its place in its list.
        assert event.token_ids[i * size : (i + 1) * size] == tokens[start : start + size]
        hashes.append(h)
        parent, extra = h, None
    return hashes, root_extra[1]


def test_endpoints_are_discoverable(served: DaemonProc, info: dict[str, Any]) -> None:
    assert info["endpoint"].startswith("ipc://") and info["replay_endpoint"].startswith("ipc://")
    assert info["block_size"] == 16
    with Client(served.endpoint, timeout=120) as c:
        status = c.status()
    assert status.kv_events is not None
    assert status.kv_events.endpoint == info["endpoint"]
    assert status.kv_events.replay_endpoint == info["replay_endpoint"]


def test_a_saved_row_is_block_stored_with_its_tokens_and_chain(
    served: DaemonProc, stream: Stream
) -> None:
    prompt = "The lighthouse keeper counted " + " ".join(f"ship{i}" for i in range(30))
    with Client(served.endpoint, timeout=120) as c:
        done = c.complete(served.model_id, prompt, **GREEDY)
    served.wait_saved(done.finish_key)
    row = done.context_tokens[: done.committed_tokens]
    n_blocks = len(row) // 16
    assert n_blocks >= 3
    stream.wait_for(
        "BlockStored of the row", lambda: len(stored_chain_or_none(stream, row)) >= n_blocks
    )
    hashes, ns = stored_chain(stream, row)
    assert len(hashes) == n_blocks and len(ns) == 130  # the 65-byte namespace header, as hex
    stored = [e for e in stream.events() if isinstance(e, BlockStored)]
    assert all(
        e.block_size == 16 and e.medium in ("ram", "ram_file", "disk", "live") for e in stored
    )
    assert all(len(e.token_ids) == 16 * len(e.block_hashes) for e in stored)
    # Each list continues from its parent: a suffix names the block before it.
    for e in stored:
        if e.parent_block_hash is not None:
            assert any(e.parent_block_hash in s.block_hashes for s in stored)


def stored_chain_or_none(stream: Stream, tokens: list[int]) -> list[int]:
    try:
        return stored_chain(stream, tokens)[0]
    except AssertionError:
        return []


def test_replay_from_zero_returns_the_earlier_batches(stream: Stream, info: dict[str, Any]) -> None:
    stream.pump()
    got = replay(info["replay_endpoint"], 0)
    seqs = [n for n, _ in got]
    assert seqs == list(range(len(got))) and seqs[0] == 0
    first = DECODE.decode(got[0][1])
    assert isinstance(first.events[0], AllBlocksCleared)  # a start begins from nothing
    # What the late subscriber missed is there, and what it saw is the same bytes.
    for n, payload in got:
        if n in stream.raw:
            assert stream.raw[n] == payload
    assert max(stream.raw) <= seqs[-1]
    assert replay(info["replay_endpoint"], seqs[-1])[0][0] == seqs[-1]


def test_a_tenant_salt_changes_every_hash(served: DaemonProc, stream: Stream) -> None:
    prompt = "A salted tenant asks about " + " ".join(f"harbor{i}" for i in range(30))
    with Client(served.endpoint, timeout=120) as c:
        plain = c.complete(served.model_id, prompt, **GREEDY)
        salted = c.complete(served.model_id, prompt, cache_salt="tenant-b", **GREEDY)
    served.wait_saved(plain.finish_key)
    served.wait_saved(salted.finish_key)
    assert salted.context_tokens[:16] == plain.context_tokens[:16]
    stream.wait_for(
        "both rows' blocks",
        lambda: (
            stored_chain_or_none(stream, plain.context_tokens[: plain.committed_tokens]) != []
            and len(
                [
                    e
                    for e in stream.events()
                    if isinstance(e, BlockStored)
                    and e.parent_block_hash is None
                    and e.token_ids[:16] == plain.context_tokens[:16]
                ]
            )
            >= 2
        ),
    )
    roots = [
        e
        for e in stream.events()
        if isinstance(e, BlockStored)
        and e.parent_block_hash is None
        and e.token_ids[:16] == plain.context_tokens[:16]
    ]
    namespaces = {e.extra_keys[0][1] for e in roots if e.extra_keys and e.extra_keys[0]}
    firsts = {e.block_hashes[0] for e in roots}
    # Same first 16 tokens, two namespaces, two different first blocks.
    assert len(namespaces) == 2 and len(firsts) == 2
    # A router finds both from the worker's published header and the salt.
    with Client(served.endpoint, timeout=120) as c:
        worker = c.status(served.model_id).worker
    assert worker is not None and worker.status.namespace is not None
    header = worker.status.namespace
    assert namespaces == {header.hex(), salted_header(header, "tenant-b").hex()}
    salted_row = salted.context_tokens[: salted.committed_tokens]
    hashes, ns = stored_chain(stream, salted_row)
    assert ns == salted_header(header, "tenant-b").hex()
    assert hashes == chain_hashes(salted_header(header, "tenant-b"), salted_row)


def held(stream: Stream) -> set[tuple[str | None, int]]:
    """What the stream says the daemon holds now: (medium, block hash)."""
    out: set[tuple[str | None, int]] = set()
    for e in stream.events():
        if isinstance(e, AllBlocksCleared):
            out.clear()
        elif isinstance(e, BlockStored):
            out.update((e.medium, h) for h in e.block_hashes)
        else:
            out.difference_update((e.medium, h) for h in e.block_hashes)
    return out


def test_eviction_removes_every_stored_block(served: DaemonProc, stream: Stream) -> None:
    stream.pump()
    assert {m for m, _ in held(stream)} >= {"ram", "disk"}
    with Client(served.endpoint, timeout=120) as c:
        c.evict_bytes(sys.maxsize)

    def tiers_empty() -> bool:
        return not {(m, h) for m, h in held(stream) if m != "live"}

    stream.wait_for("BlockRemoved of every row's block", tiers_empty)


def test_idle_entries_are_live_until_their_worker_dies(served: DaemonProc, stream: Stream) -> None:
    prompt = "The night train to the coast stops at " + " ".join(f"town{i}" for i in range(30))
    with Client(served.endpoint, timeout=120) as c:
        done = c.complete(served.model_id, prompt, **GREEDY)
    first = done.context_tokens[:16]

    def live_roots() -> list[BlockStored]:
        return [
            e
            for e in stream.events()
            if isinstance(e, BlockStored)
            and e.medium == "live"
            and e.parent_block_hash is None
            and e.token_ids[:16] == first
        ]

    # The request's sequence stays as an idle entry: its KV is live.
    stream.wait_for("a live BlockStored of the prompt", lambda: bool(live_roots()))
    root = live_roots()[-1].block_hashes[0]
    assert ("live", root) in held(stream)
    served.wait_idle()
    served.kill_worker()
    # cache-meta watches the worker: its live blocks go with it.
    stream.wait_for(
        "BlockRemoved of the dead worker's live blocks", lambda: ("live", root) not in held(stream)
    )
    assert not {h for m, h in held(stream) if m == "live"}
