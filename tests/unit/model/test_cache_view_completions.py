"""SaveCompletions: writer threads post, the loop's fd wakes, drain releases and reports."""

from __future__ import annotations

import select
import threading

import pytest

from llamad.model.save_completions import Completed, SaveCompletions

pytestmark = pytest.mark.timeout(30)


def readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


class Releases:
    def __init__(self) -> None:
        self.order: list[bytes] = []
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def of(self, key: bytes) -> Completed:
        def release() -> None:
            with self.lock:
                self.order.append(key)
                self.threads.add(threading.get_ident())

        return Completed(key, key[0] % 2 == 0, release)


def test_a_post_from_a_writer_thread_wakes_the_fd_until_drained() -> None:
    done = SaveCompletions()
    releases = Releases()
    try:
        assert not readable(done.fileno())
        t = threading.Thread(target=done.post, args=(releases.of(b"\x02" * 32),))
        t.start()
        t.join()
        assert readable(done.fileno(), 5.0)
        assert releases.order == []  # nothing is released off the loop thread
        assert done.drain() == [(b"\x02" * 32, True)]
        assert releases.threads == {threading.get_ident()}
        assert not readable(done.fileno())
        assert done.drain() == []
    finally:
        done.close()


def test_drain_answers_every_completion_once_in_the_order_posted() -> None:
    done = SaveCompletions()
    releases = Releases()
    keys = [bytes([i]) * 32 for i in range(40)]
    gate = threading.Lock()
    posted: list[bytes] = []

    def writer(chunk: list[bytes]) -> None:
        for key in chunk:
            with gate:  # the order of posting is the order the saves finished
                posted.append(key)
                done.post(releases.of(key))

    try:
        threads = [threading.Thread(target=writer, args=(keys[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        drained: list[tuple[bytes, bool]] = []
        while any(t.is_alive() for t in threads) or done.pending():
            if readable(done.fileno(), 0.05):
                drained += done.drain()
        for t in threads:
            t.join()
        drained += done.drain()
        assert [k for k, _ in drained] == posted
        assert sorted(posted) == keys
        assert [p for _, p in drained] == [k[0] % 2 == 0 for k in posted]
        assert releases.order == posted
    finally:
        done.close()


def test_a_release_only_entry_releases_without_reporting() -> None:
    done = SaveCompletions()
    releases = Releases()
    late = releases.of(b"\x01" * 32)
    try:
        done.post(Completed(late.key, False, late.release, report=False))
        done.post(releases.of(b"\x04" * 32))
        assert done.drain() == [(b"\x04" * 32, True)]
        assert releases.order == [b"\x01" * 32, b"\x04" * 32]
    finally:
        done.close()


def test_a_failing_release_does_not_hide_the_others() -> None:
    done = SaveCompletions()
    releases = Releases()

    def broken() -> None:
        raise RuntimeError("pool gone")

    try:
        done.post(Completed(b"\x06" * 32, True, broken))
        done.post(releases.of(b"\x08" * 32))
        assert done.drain() == [(b"\x06" * 32, True), (b"\x08" * 32, True)]
        assert releases.order == [b"\x08" * 32]
    finally:
        done.close()


def test_close_releases_what_is_left_and_later_posts_still_release_on_drain() -> None:
    done = SaveCompletions()
    releases = Releases()
    done.post(releases.of(b"\x02" * 32))
    assert done.close() == [(b"\x02" * 32, True)]
    done.post(releases.of(b"\x03" * 32))  # a writer finishing after close: no fd write
    assert done.drain() == [(b"\x03" * 32, False)]
    assert releases.order == [b"\x02" * 32, b"\x03" * 32]
    assert done.close() == []
