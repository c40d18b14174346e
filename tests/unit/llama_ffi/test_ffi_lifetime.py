"""NativeHandle: a pointer is freed exactly once, after close and the last lease."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamad.llama_ffi.errors import Closed
from llamad.llama_ffi.lifetime import NativeHandle

pytestmark = pytest.mark.timeout(60)


def _handle() -> tuple[NativeHandle, list[object]]:
    freed: list[object] = []
    return NativeHandle("ptr", freed.append, "thing"), freed


def test_close_without_leases_frees_at_once() -> None:
    h, freed = _handle()
    assert h.close() is True
    assert freed == ["ptr"]
    assert h.freed


def test_close_with_lease_defers_free_to_last_release() -> None:
    h, freed = _handle()
    h.acquire()
    h.acquire()
    assert h.close() is False
    assert freed == []
    h.release()
    assert freed == []
    h.release()
    assert freed == ["ptr"]


def test_acquire_after_close_raises_closed() -> None:
    h, _ = _handle()
    h.acquire()
    h.close()
    with pytest.raises(Closed):
        h.acquire()


def test_close_is_idempotent() -> None:
    h, freed = _handle()
    h.close()
    assert h.close() is False
    assert freed == ["ptr"]


@given(st.lists(st.sampled_from(["acquire", "release", "close"]), max_size=40))
def test_free_happens_once_and_only_after_close_and_last_release(ops: list[str]) -> None:
    h, freed = _handle()
    held = 0
    closed = False
    for op in ops:
        if op == "acquire":
            if closed:
                with pytest.raises(Closed):
                    h.acquire()
            else:
                h.acquire()
                held += 1
        elif op == "release" and held:
            h.release()
            held -= 1
        elif op == "close":
            h.close()
            closed = True
        assert len(freed) == (1 if closed and held == 0 else 0)


def test_concurrent_leases_free_exactly_once() -> None:
    h, freed = _handle()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(2000):
            try:
                with h.lease():
                    pass
            except Closed:
                return

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    h.close()
    for t in threads:
        t.join(timeout=30)
    assert freed == ["ptr"]
