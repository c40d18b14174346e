"""cache-meta's copy-activity board (llamad.cache.activity): what the model
workers' thread governors read of the mover's copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamad.cache.activity import LEASE_S, CopyActivity

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_a_copy_reads_as_running_from_begin_to_end_and_moves_the_epoch(tmp_path: Path) -> None:
    clock = Clock()
    writer = CopyActivity.create(tmp_path / "copies", clock=clock)
    reader = CopyActivity.attach(tmp_path / "copies", clock=clock)
    assert reader is not None
    try:
        before = reader.quiet_epoch()
        assert before is not None and reader.quiet_epoch() == before
        writer.begin()
        assert reader.quiet_epoch() is None
        clock.now += LEASE_S / 2
        writer.touch()
        clock.now += LEASE_S * 0.9  # alive: touched less than a lease ago
        assert reader.quiet_epoch() is None
        writer.end()
        after = reader.quiet_epoch()
        assert after is not None and after != before
    finally:
        reader.close()
        writer.close()


def test_a_copy_whose_writer_died_lapses_after_its_lease(tmp_path: Path) -> None:
    clock = Clock()
    writer = CopyActivity.create(tmp_path / "copies", clock=clock)
    reader = CopyActivity.attach(tmp_path / "copies", clock=clock)
    assert reader is not None
    writer.begin()
    writer.close()  # cache-meta killed mid-copy: nobody ends it
    assert reader.quiet_epoch() is None
    clock.now += LEASE_S + 0.01
    assert reader.quiet_epoch() is not None
    reader.close()


def test_a_restarted_writer_carries_the_epoch_on_and_clears_a_left_mark(tmp_path: Path) -> None:
    clock = Clock()
    first = CopyActivity.create(tmp_path / "copies", clock=clock)
    reader = CopyActivity.attach(tmp_path / "copies", clock=clock)
    assert reader is not None
    first.begin()
    first.close()
    second = CopyActivity.create(tmp_path / "copies", clock=clock)
    epoch = reader.quiet_epoch()  # the same file: a reader attached before sees it
    assert epoch == 1
    second.begin()
    second.end()
    assert reader.quiet_epoch() == 3
    second.close()
    reader.close()


def test_no_board_or_a_file_that_is_not_one_reads_as_none_and_is_rewritten(
    tmp_path: Path,
) -> None:
    path = tmp_path / "copies"
    assert CopyActivity.attach(path) is None
    path.write_bytes(b"not a board at all, just some bytes")
    assert CopyActivity.attach(path) is None
    writer = CopyActivity.create(path)
    reader = CopyActivity.attach(path)
    assert reader is not None and reader.quiet_epoch() == 0
    reader.close()
    writer.close()


def test_writes_after_close_are_ignored(tmp_path: Path) -> None:
    # The mover's stop may give up on a copy thread that ends its copy later.
    writer = CopyActivity.create(tmp_path / "copies")
    writer.begin()
    writer.close()
    writer.touch()
    writer.end()
