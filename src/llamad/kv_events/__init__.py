"""KV events in the wire format llm-d and NVIDIA Dynamo read (issue 20).

vLLM publishes what its KV cache holds as msgpack ``EventBatch`` messages of
``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared`` over a ZeroMQ PUB
socket, with a ROUTER socket that replays buffered batches; routers that
understand that stream send each request where its prefix is already cached.
llamad speaks the same stream for its saved rows and live entries.

This package is pure and sits on the floor just above the ground
(``tests/unit/test_layers.py``): a client imports it to hash a prompt into
blocks (:mod:`.blocks`), decode the stream (:mod:`.wire`) and keep the index
of which daemon holds what (:mod:`.index`) without loading the cache, the
model worker or libllama. The daemon's side (the reference counts that decide
when a block is really gone) is :mod:`.ledger`; the sockets are cache-meta's.
"""

from __future__ import annotations

from llamad.kv_events.blocks import (
    DEFAULT_BLOCK_SIZE,
    Block,
    block_hash,
    chain,
    chain_hashes,
    root_extra_keys,
    salted_header,
)
from llamad.kv_events.index import Applied, KvIndex, PrefixMatch
from llamad.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    frame,
    parse_frame,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "AllBlocksCleared",
    "Applied",
    "Block",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "KvIndex",
    "PrefixMatch",
    "block_hash",
    "chain",
    "chain_hashes",
    "decode_batch",
    "encode_batch",
    "frame",
    "parse_frame",
    "root_extra_keys",
    "salted_header",
]
