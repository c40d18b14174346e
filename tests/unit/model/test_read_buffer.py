"""ReadBuffer: the buffer for rows read by copy is sized ahead of the reads,
off the loop, from the rows seen, once the worker is idle (``prepare``); a
read only grows it for a row larger than any seen (issue 21, SPEC P1, P2)."""

from __future__ import annotations

import threading

import pytest

from llamad.llama_ffi.native import lib
from llamad.llama_ffi.state import PAGE_SIZE, HostBufferType, StateBuffer
from llamad.model.read_buffer import ReadBuffer
from llamad.model.state_pool import size_class

pytestmark = pytest.mark.timeout(30)

ROW = 3 * PAGE_SIZE + 17


def sized_for(capacity: int, row: int) -> bool:
    """The capacity a buffer prepared for ``row`` gets (its size class, in whole pages)."""
    return size_class(row) <= capacity < size_class(row) + PAGE_SIZE


def test_a_row_seen_gets_its_buffer_off_the_loop_and_its_read_does_not_grow_it() -> None:
    rb = ReadBuffer()
    try:
        assert rb.stats().capacity == 0  # nothing before a row is seen
        rb.note(ROW)
        assert rb.wait_ready(10)
        stats = rb.stats()
        assert sized_for(stats.capacity, ROW) and stats.prepared == 1
        buf = rb.take(ROW)
        assert buf.capacity >= ROW
        assert rb.take(ROW - 1) is buf  # reused
        assert rb.stats().grows_on_read == 0
        assert rb.stats().largest_seen == ROW and rb.stats().kind == "mmap"
    finally:
        rb.close()


def test_a_read_larger_than_any_row_seen_grows_on_its_path_and_is_counted() -> None:
    rb = ReadBuffer()
    try:
        buf = rb.take(ROW)  # never noted: the read allocates
        assert buf.capacity >= ROW
        assert rb.stats().grows_on_read == 1
        assert rb.take(ROW) is buf
        assert rb.stats().grows_on_read == 1
        # Seen already: no second allocation ahead for the same size.
        rb.note(ROW)
        assert rb.wait_ready(10) and rb.stats().prepared == 0
    finally:
        rb.close()


def test_a_larger_row_seen_replaces_the_buffer_and_smaller_ones_change_nothing() -> None:
    rb = ReadBuffer()
    try:
        rb.note(ROW)
        rb.note(4 * ROW)
        rb.note(2 * ROW)  # smaller than the largest seen: nothing asked
        assert rb.wait_ready(10)
        assert sized_for(rb.stats().capacity, 4 * ROW)
        assert rb.take(4 * ROW).capacity >= 4 * ROW
        assert rb.stats().grows_on_read == 0
    finally:
        rb.close()


def test_rows_past_the_bound_are_not_prepared_ahead() -> None:
    rb = ReadBuffer(max_ahead=2 * PAGE_SIZE)
    try:
        rb.note(ROW)
        assert rb.wait_ready(10) and rb.stats().capacity == 0 and rb.stats().prepared == 0
        rb.take(ROW)
        assert rb.stats().grows_on_read == 1
    finally:
        rb.close()


def test_notes_from_other_threads_are_taken_and_close_frees_everything() -> None:
    rb = ReadBuffer()
    threads = [threading.Thread(target=rb.note, args=(ROW * (i + 1),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rb.wait_ready(10)
    assert sized_for(rb.stats().capacity, 4 * ROW)
    buf = rb.take(4 * ROW)
    rb.close()
    assert buf.capacity == 0  # closed with the ReadBuffer
    rb.note(10 * ROW)  # after close: ignored
    assert rb.stats().capacity == 0


def test_a_host_buffer_type_gives_the_memory() -> None:
    rb = ReadBuffer(host=HostBufferType(lib.ggml_backend_cpu_buffer_type()))
    try:
        rb.note(ROW)
        assert rb.wait_ready(10)
        buf = rb.take(ROW)
        assert isinstance(buf, StateBuffer) and buf.kind == "CPU"
        assert rb.stats().kind == "CPU" and rb.stats().grows_on_read == 0
    finally:
        rb.close()


def test_a_row_seen_is_prepared_only_once_the_worker_is_idle() -> None:
    # A lookup notes the row the restore right after it reads: preparing
    # then ran the helper's page faults beside that restore (the first
    # repeat after a restart: ~25 ms against ~9; bench/restart_probe.py).
    rb = ReadBuffer()
    try:
        rb.note(ROW)
        assert rb._helper is None and rb.stats().capacity == 0  # nothing started
        assert rb.prepare() is True  # the shell's loop, idle
        assert rb.wait_ready(10)
        assert sized_for(rb.stats().capacity, ROW) and rb.stats().prepared == 1
        assert rb.prepare() is False  # nothing new asked for
        rb.note(ROW - 1)  # smaller than the largest seen
        assert rb.prepare() is False
        rb.note(4 * ROW)
        assert rb.prepare() is True and rb.wait_ready(10)
        assert sized_for(rb.stats().capacity, 4 * ROW) and rb.stats().prepared == 2
    finally:
        rb.close()


def test_a_read_before_the_idle_prepare_grows_once_and_the_prepare_then_does_nothing() -> None:
    rb = ReadBuffer()
    try:
        rb.note(ROW)
        buf = rb.take(ROW)  # the restore right after the lookup: nothing ready
        assert buf.capacity >= ROW and rb.stats().grows_on_read == 1
        assert rb.prepare() is False  # the read's buffer already holds the row
        assert rb.take(ROW) is buf
    finally:
        rb.close()
