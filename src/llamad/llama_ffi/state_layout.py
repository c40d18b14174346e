"""What llama.cpp's reader of a sequence's state could be misled by, checked first.

A restore can hand a row's bytes to ``llama_state_seq_set_data`` while the
row's checksum still runs beside it (``RowRead.check``, issue 21): the copy
into the KV and the CRC then take one's time, not both. Damage that the CRC
finds afterwards must then have done nothing but write wrong values into
that sequence's own cells, which the restore drops before anything reads
them. The pinned llama.cpp's reader checks most of what could do worse: the
stream count, each cell count against the cache, ``n_seq_id``, every layer's
type and row size, and every read against the buffer's end. What it takes
as it comes is each cell's position, and a cell at position -1 (or at one
its sequence holds twice) leaves the cache's books inconsistent after the
cells are dropped.

:func:`plain_seq_state` walks the layout the way llama.cpp writes it for one
sequence of a plain attention KV cache (``llama_context::state_seq_get_data``
and ``llama_kv_cache::state_write``):

- ``u32 magic`` and ``i32 seq_id`` (the reader checks the magic itself and
  ignores the id on the host path this project uses);
- ``u32 n_stream``, then per stream ``u32 cell_count`` and, unless it is 0:
- per cell ``i32 pos``, ``u32 n_seq_id`` (1 for one sequence), ``i32 seq_id``;
- ``u32 v_trans``, ``u32 n_layer``; per layer ``i32 type``, ``u64 row`` and
  ``cell_count`` K rows; then per layer the V rows the same way, or, with
  ``v_trans``, ``i32 type``, ``u32 el``, ``u32 n_embd`` and ``n_embd *
  cell_count`` elements.

A row passes when the walk ends exactly at the payload's end, every cell
has one sequence and the cells' positions are distinct and inside the row's
own tokens. Anything else (a model whose cells carry an extension, M-RoPE;
an iSWA model's two caches; a layer without V; damage in these fields) is
answered False, and the caller waits for the checksum before llama.cpp
reads a byte: never worse than checking first.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["plain_seq_state"]

_PREFIX: Final = struct.Struct("<Ii")  # magic, seq_id
_U32: Final = struct.Struct("<I")
_DATA_HEAD: Final = struct.Struct("<II")  # v_trans, n_layer
_ROWS_HEAD: Final = struct.Struct("<iQ")  # type, row size
_VT_HEAD: Final = struct.Struct("<iII")  # type, element size, n_embd_v_gqa
_CELL_WORDS: Final = 3  # pos, n_seq_id, seq_id
_MAX_STREAMS: Final = 256
_MAX_LAYERS: Final = 4096


def plain_seq_state(payload: memoryview, n_tokens: int) -> bool:
    """Whether ``payload`` walks as one sequence's state of a plain KV cache
    with at most ``n_tokens`` cells at distinct positions in
    ``[0, n_tokens)`` (see the module doc). Reads headers only (~0.1 ms at
    2,048 cells); never raises on any bytes."""
    try:
        with payload.cast("B") as data:
            return _walk(data, n_tokens)
    except (struct.error, ValueError, TypeError):
        return False


def _walk(data: memoryview, n_tokens: int) -> bool:
    size = len(data)
    (n_stream,) = _U32.unpack_from(data, _PREFIX.size)
    if not 0 < n_stream <= _MAX_STREAMS:
        return False
    off = _PREFIX.size + _U32.size
    for _ in range(n_stream):
        (cells,) = _U32.unpack_from(data, off)
        off += _U32.size
        if cells == 0:
            continue
        end = off + cells * _CELL_WORDS * 4
        if cells > n_tokens or end > size or not _cells_sane(data[off:end], n_tokens):
            return False
        off = _data_end(data, end, cells)
        if off < 0:
            return False
    return off == size


def _cells_sane(meta: memoryview, n_tokens: int) -> bool:
    with meta.cast("i") as words:
        positions = words[0::_CELL_WORDS].tolist()
        seq_counts = words[1::_CELL_WORDS].tolist()
    if seq_counts.count(1) != len(seq_counts):
        return False
    if positions == list(range(len(positions))):
        return True  # a row saved whole, cell after cell: the usual case, checked at once
    return (
        min(positions) >= 0 and max(positions) < n_tokens and len(set(positions)) == len(positions)
    )


def _data_end(data: memoryview, off: int, cells: int) -> int:
    """Where a stream's K and V rows end, or -1 when they do not fit."""
    size = len(data)
    v_trans, n_layer = _DATA_HEAD.unpack_from(data, off)
    off += _DATA_HEAD.size
    if v_trans > 1 or not 0 < n_layer <= _MAX_LAYERS:
        return -1
    for _ in range(n_layer):  # K
        _, row = _ROWS_HEAD.unpack_from(data, off)
        off += _ROWS_HEAD.size + row * cells
        if row == 0 or off > size:
            return -1
    for _ in range(n_layer):  # V
        if v_trans:
            _, el, n_embd = _VT_HEAD.unpack_from(data, off)
            off += _VT_HEAD.size + el * n_embd * cells
            if el == 0 or n_embd == 0:
                return -1
        else:
            _, row = _ROWS_HEAD.unpack_from(data, off)
            off += _ROWS_HEAD.size + row * cells
            if row == 0:
                return -1
        if off > size:
            return -1
    return off
