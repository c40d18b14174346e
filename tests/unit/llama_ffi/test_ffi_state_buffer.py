"""StateBuffer: page-rounded, pre-faulted, growable; prefault keeps contents."""

from __future__ import annotations

import pytest

from llamad.errors import BadRequest
from llamad.llama_ffi import PAGE_SIZE, Closed, StateBuffer, prefault

pytestmark = pytest.mark.timeout(30)


def test_capacity_rounds_up_to_whole_pages() -> None:
    with StateBuffer(PAGE_SIZE + 1) as buf:
        assert buf.capacity == 2 * PAGE_SIZE
        assert len(buf.memory) == buf.capacity


def test_memory_is_writable_and_view_is_a_prefix() -> None:
    with StateBuffer(100) as buf:
        buf.memory[:5] = b"hello"
        view = buf.view(5)
        assert bytes(view) == b"hello"
        view.release()


def test_ensure_grows_only_when_needed() -> None:
    with StateBuffer(PAGE_SIZE) as buf:
        buf.ensure(10)
        assert buf.capacity == PAGE_SIZE
        buf.ensure(3 * PAGE_SIZE)
        assert buf.capacity >= 3 * PAGE_SIZE


def test_view_past_capacity_is_rejected() -> None:
    with StateBuffer(PAGE_SIZE) as buf, pytest.raises(BadRequest):
        buf.view(buf.capacity + 1)


def test_closing_with_a_live_view_is_refused() -> None:
    buf = StateBuffer(PAGE_SIZE)
    view = buf.view(10)
    with pytest.raises(BadRequest):
        buf.close()
    view.release()
    buf.close()
    with pytest.raises(Closed):
        _ = buf.memory


def test_prefault_preserves_contents() -> None:
    data = bytearray(range(256)) * (3 * PAGE_SIZE // 256 + 1)
    before = bytes(data)
    prefault(data)
    assert bytes(data) == before


def test_prefault_needs_writable_memory() -> None:
    with pytest.raises(BadRequest):
        prefault(b"read only")
