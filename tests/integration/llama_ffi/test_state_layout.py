"""llama_ffi.state_layout: a real sequence state walks as llama.cpp writes it.

A restore lets llama.cpp read a ``ram`` row before its checksum is known only
when :func:`plain_seq_state` passes it; these tests pin the layout it walks to
the pinned llama.cpp's own output (flash attention on and off, V rows plain
and transposed, one and two sequences in the context) and show that what the
reader would take as it comes (a cell's position, its sequence count) or a
header that does not add up is refused.
"""

from __future__ import annotations

import mmap
import random
import struct
from collections.abc import Callable, Iterator

import pytest

from llamad.llama_ffi import Context, FlashAttn
from llamad.llama_ffi.state_layout import plain_seq_state

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

N = 48
PREFIX = 8 + 4 + 4  # magic and seq id, the stream count, the cell count


def _tokens(n: int, start: int = 100) -> list[int]:
    return [(start + 7919 * i) % 20000 + 100 for i in range(n)]


@pytest.fixture(params=[FlashAttn.ON, FlashAttn.OFF], ids=["fa_on", "fa_off"])
def packed(request: pytest.FixtureRequest, make_ctx: Callable[..., Context]) -> Iterator[bytearray]:
    ctx = make_ctx(n_seq_max=2, kv_unified=True, flash_attn=request.param)
    ctx.prefill(_tokens(20, 7), seq_id=1)  # another sequence's cells interleave nothing
    ctx.prefill(_tokens(N), seq_id=0)
    buf = mmap.mmap(-1, ctx.seq_state_size(0))
    n = ctx.pack_seq(0, buf)
    yield bytearray(buf[:n])
    buf.close()


def _with(state: bytearray, offset: int, fmt: str, value: int) -> memoryview:
    damaged = bytearray(state)
    struct.pack_into(fmt, damaged, offset, value)
    return memoryview(damaged)


def test_a_real_sequence_state_is_plain(packed: bytearray) -> None:
    assert plain_seq_state(memoryview(packed), N)
    assert plain_seq_state(memoryview(packed), N + 100)  # positions inside the row's tokens


def test_a_row_of_fewer_tokens_than_cells_is_refused(packed: bytearray) -> None:
    assert not plain_seq_state(memoryview(packed), N - 1)


@pytest.mark.parametrize(
    ("what", "offset", "fmt", "value"),
    [
        ("a negative position", PREFIX + 12 * 5, "<i", -1),
        ("a position past the row", PREFIX + 12 * 5, "<i", N),
        ("a position held twice", PREFIX + 12 * 5, "<i", 4),
        ("a cell of two sequences", PREFIX + 12 * 5 + 4, "<I", 2),
        ("two streams", 8, "<I", 2),
        ("no stream", 8, "<I", 0),
        ("more cells", 12, "<I", N + 1),
        ("v_trans out of range", PREFIX + 12 * N, "<I", 2),
        ("another layer count", PREFIX + 12 * N + 4, "<I", 7),
        ("a K row size that overruns", PREFIX + 12 * N + 8 + 4, "<Q", 1 << 40),
    ],
)
def test_what_the_reader_takes_as_it_comes_or_does_not_add_up_is_refused(
    packed: bytearray, what: str, offset: int, fmt: str, value: int
) -> None:
    assert not plain_seq_state(_with(packed, offset, fmt, value), N), what


def test_a_truncated_or_longer_state_is_refused(packed: bytearray) -> None:
    assert not plain_seq_state(memoryview(packed)[:-1], N)
    assert not plain_seq_state(memoryview(bytes(packed) + b"\0"), N)
    assert not plain_seq_state(memoryview(b""), N)


def test_any_bytes_are_answered_without_raising(packed: bytearray) -> None:
    rng = random.Random(21)
    for _ in range(300):
        damaged = bytearray(packed)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(min(len(damaged), 4096))] = rng.randrange(256)
        plain_seq_state(memoryview(damaged), N)  # True or False, never an exception
        cut = rng.randrange(len(packed))
        assert not plain_seq_state(memoryview(packed)[:cut], N)
