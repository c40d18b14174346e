"""vLLM's event shapes on the wire: array-like, tagged, field order kept."""

from __future__ import annotations

import msgspec
import pytest

from llamad.kv_events.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireError,
    decode_batch,
    encode_batch,
    frame,
    parse_frame,
    parse_seq,
    seq_bytes,
)


def _stored() -> BlockStored:
    return BlockStored(
        block_hashes=[11, 12],
        parent_block_hash=None,
        token_ids=list(range(32)),
        block_size=16,
        lora_id=None,
        medium="ram",
        lora_name=None,
        extra_keys=[("llamad-ns", "00"), None],
    )


def test_batch_is_a_msgpack_array_with_tagged_event_arrays() -> None:
    batch = KVEventBatch(
        ts=1.5,
        events=[_stored(), BlockRemoved(block_hashes=[12], medium="ram"), AllBlocksCleared()],
    )
    raw = msgspec.msgpack.decode(encode_batch(batch))
    ts, events, *rest = raw
    assert ts == 1.5 and rest in ([], [None])
    stored, removed, cleared = events
    # The tag, then the fields in vLLM's order.
    assert stored[:8] == [
        "BlockStored",
        [11, 12],
        None,
        list(range(32)),
        16,
        None,
        "ram",
        None,
    ]
    assert stored[8] == [["llamad-ns", "00"], None]
    assert all(v is None for v in stored[9:])
    assert removed[:3] == ["BlockRemoved", [12], "ram"]
    assert cleared == ["AllBlocksCleared"]


def test_round_trip() -> None:
    batch = KVEventBatch(ts=2.0, events=[_stored(), AllBlocksCleared()])
    assert decode_batch(encode_batch(batch)) == batch


def test_medium_is_required_as_vllm_declares_it() -> None:
    # vLLM declares medium without a default: a removal without one is no event.
    old = msgspec.msgpack.encode([3.0, [["BlockRemoved", [5]]]])
    with pytest.raises(WireError):
        decode_batch(old)
    old = msgspec.msgpack.encode([3.0, [["BlockRemoved", [5], "GPU"]]])
    assert decode_batch(old).events == [BlockRemoved(block_hashes=[5], medium="GPU")]


def test_frames() -> None:
    parts = frame(b"kv", 7, encode_batch(KVEventBatch(ts=0.0, events=[])))
    assert parts[1] == (7).to_bytes(8, "big")
    topic, seq, batch = parse_frame(parts)
    assert (topic, seq, batch.events) == (b"kv", 7, [])
    assert parse_seq(END_SEQ) == -1 and seq_bytes(-1) == END_SEQ
    with pytest.raises(WireError):
        parse_frame(parts[:2])
    with pytest.raises(WireError):
        parse_seq(b"\x00" * 4)
    with pytest.raises(WireError):
        decode_batch(b"\xc1")
