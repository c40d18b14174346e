"""vLLM's KV event messages, re-declared field for field (issue 20).

The shapes follow ``vllm/distributed/kv_events.py`` as llm-d and NVIDIA
Dynamo decode it: msgspec Structs encoded as msgpack *arrays* (``array_like``),
the events a tagged union whose tag is the class name, so a ``BlockStored``
travels as ``["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name]`` and a batch as ``[ts, [events...]]``.
Fields with defaults sit last and are left out when they hold the default
(``omit_defaults``), so a reader that knows only the older, shorter shapes
still reads ours; the field order is the wire and must never change.

A published message is three ZeroMQ frames: the topic, the sequence number as
8 bytes big-endian, and the msgpack batch. The replay socket (a ROUTER)
takes ``[b"", start_seq as 8 bytes big-endian]`` from a DEALER (or REQ) and
answers one ``[b"", seq, payload]`` per buffered batch at or after
``start_seq``, then ``[b"", END_SEQ, b""]``.

``medium`` names llamad's tier (``"ram"``, ``"ram_file"``, ``"disk"``, and
``"live"`` for prompt cells a worker keeps resident); vLLM says ``"GPU"`` and
``"CPU"``. The mapping is in ``docs/internals/kv-events.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

__all__ = [
    "END_SEQ",
    "SEQ_BYTES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVCacheEvent",
    "KVEvent",
    "KVEventBatch",
    "WireError",
    "decode_batch",
    "encode_batch",
    "frame",
    "parse_frame",
    "parse_seq",
    "seq_bytes",
]

SEQ_BYTES: Final = 8
END_SEQ: Final = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
"""The replay socket's last frame: seq -1, empty payload."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A timestamped batch of events (vLLM's base batch)."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """The tagged base of every KV cache event."""


class BlockStored(KVCacheEvent):
    """Blocks now held, first to last along one chain."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    # Later vLLM releases' fields, read so this module decodes their stream
    # too; llamad leaves them at their defaults (so they never travel).
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks no longer held in ``medium``."""

    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    """Every block this publisher announced is gone."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    """A batch whose events are decoded into the three event classes."""

    events: list[KVEvent]


class WireError(ValueError):
    """A frame or payload that is not a KV event message."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload of ``batch``."""
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch from its payload; :class:`WireError` when it is not one."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not a KV event batch: {exc}") from None


def seq_bytes(seq: int) -> bytes:
    """A sequence number as its 8-byte big-endian frame (signed: END_SEQ is -1)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def parse_seq(data: bytes) -> int:
    """The sequence number of an 8-byte frame."""
    if len(data) != SEQ_BYTES:
        raise WireError(f"a sequence frame is {SEQ_BYTES} bytes, got {len(data)}")
    return int.from_bytes(data, "big", signed=True)


def frame(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """The three frames one published batch travels as."""
    return [topic, seq_bytes(seq), payload]


def parse_frame(parts: Sequence[bytes]) -> tuple[bytes, int, KVEventBatch]:
    """Topic, sequence number and batch of one published message."""
    if len(parts) != 3:
        raise WireError(f"a published message is 3 frames, got {len(parts)}")
    topic, seq, payload = parts
    return bytes(topic), parse_seq(bytes(seq)), decode_batch(bytes(payload))
