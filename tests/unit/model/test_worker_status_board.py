"""The status board: readers get the last whole snapshot without asking the worker (SPEC M10)."""

from __future__ import annotations

import os
import struct
import threading
import zlib
from pathlib import Path

import msgspec
import pytest

from llamad.model.results import WorkerPhase, WorkerStatus
from llamad.model.status_board import (
    SLOT_BYTES,
    StatusBoard,
    Throughput,
    WorkerSnapshot,
    read_status,
    status_path,
)

pytestmark = pytest.mark.timeout(60)


def snap(seq: int, *, model_id: str = "m", pending: int = 0) -> WorkerSnapshot:
    status = WorkerStatus(
        phase=WorkerPhase.PREFILLING if pending else WorkerPhase.IDLE,
        pending_len=pending,
        queue_depth=0,
        active_sequences=pending,
        free_sequences=4 - pending,
        sessions=0,
        kv_cells_used=0,
        ticks=seq,
    )
    return WorkerSnapshot(model_id=model_id, pid=1, instance="i", seq=seq, at=1.0, status=status)


def test_reader_gets_the_last_published_snapshot(tmp_path: Path) -> None:
    path = status_path(tmp_path, "model.m")
    board = StatusBoard(path)
    assert read_status(path) is None  # created, nothing published yet
    board.publish(snap(1))
    board.publish(snap(2, pending=3))
    got = read_status(path)
    assert got == snap(2, pending=3)
    board.close(remove=True)
    assert read_status(path) is None
    assert not path.exists()


def test_missing_board_reads_as_none(tmp_path: Path) -> None:
    assert read_status(tmp_path / "nobody.status") is None


def _write_raw(path: Path, seq: int, payload: bytes, crc: int | None = None) -> None:
    head = struct.pack("<QII", seq, len(payload), zlib.crc32(payload) if crc is None else crc)
    with open(path, "r+b") as f:
        f.write(head + payload)


def test_snapshot_being_written_is_never_read(tmp_path: Path) -> None:
    """An odd sequence number means the writer is mid-write: the reader retries
    and gives up with None rather than return what it saw."""
    path = tmp_path / "w.status"
    board = StatusBoard(path)
    board.publish(snap(1))
    payload = msgspec.msgpack.encode(snap(2))
    _write_raw(path, 3, payload)
    assert read_status(path) is None
    _write_raw(path, 4, payload)
    assert read_status(path) == snap(2)
    board.close()


def test_torn_payload_is_never_read(tmp_path: Path) -> None:
    """A payload whose checksum does not match (a write that landed half) is refused."""
    path = tmp_path / "t.status"
    board = StatusBoard(path)
    payload = msgspec.msgpack.encode(snap(7))
    _write_raw(path, 2, payload, crc=zlib.crc32(payload) ^ 1)
    assert read_status(path) is None
    board.close()


def test_concurrent_reads_see_only_whole_snapshots(tmp_path: Path) -> None:
    path = tmp_path / "c.status"
    board = StatusBoard(path)
    board.publish(snap(0))
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            # Sizes vary so a torn read would mix two lengths.
            board.publish(snap(i, model_id="x" * (i % 200 + 1)))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        seen = 0
        for _ in range(3000):
            got = read_status(path)
            if got is None:
                continue
            seen += 1
            assert got.model_id == "x" * (got.seq % 200 + 1) or got.seq == 0
    finally:
        stop.set()
        writer.join()
    assert seen > 0
    board.close()


def test_restarted_worker_replaces_the_board(tmp_path: Path) -> None:
    path = tmp_path / "r.status"
    old = StatusBoard(path)
    old.publish(snap(9, model_id="old"))
    new = StatusBoard(path)
    assert read_status(path) is None  # the new process has published nothing yet
    new.publish(snap(1, model_id="new"))
    old.publish(snap(10, model_id="old"))  # the dead one's file is no longer the board
    assert read_status(path) == snap(1, model_id="new")
    assert os.path.getsize(path) == SLOT_BYTES
    old.close()
    new.close()


def test_oversized_snapshot_is_refused(tmp_path: Path) -> None:
    board = StatusBoard(tmp_path / "o.status")
    with pytest.raises(ValueError):
        board.publish(snap(1, model_id="x" * SLOT_BYTES))
    board.close()


def test_throughput_of_one_tick_is_its_tokens_over_its_time() -> None:
    t = Throughput(window_s=5.0)
    t.add(100.0, generated=4, decoded=40)
    generated, decoded = t.rates(100.5)
    assert generated == pytest.approx(8.0)
    assert decoded == pytest.approx(80.0)


def test_throughput_forgets_ticks_older_than_the_window() -> None:
    t = Throughput(window_s=5.0)
    t.add(100.0, generated=10, decoded=10)
    t.add(104.0, generated=2, decoded=2)
    assert t.rates(106.0) == pytest.approx((1.0, 1.0))  # only the tick at 104 is left
    assert t.rates(110.0) == (0.0, 0.0)


def test_a_publish_makes_no_write_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop publishes once per decode step: through the board's mapping,
    not three ``pwrite`` calls; a reader's ``pread`` sees it all the same."""
    path = status_path(tmp_path, "model.m")
    board = StatusBoard(path)

    def refused(*args: object) -> int:
        raise AssertionError("publish called pwrite")

    monkeypatch.setattr(os, "pwrite", refused)
    board.publish(snap(1))
    board.publish(snap(2, pending=1))
    assert read_status(path) == snap(2, pending=1)
    board.close(remove=True)
