"""The stored responses: bounded by count and bytes, oldest out first, kept across restarts."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from llamad.gateway.response_store import ResponseStore, StoredResponse, new_response_id


def _record(text: str = "hello", response_id: str | None = None) -> StoredResponse:
    return StoredResponse(
        id=response_id or new_response_id(),
        model="smol",
        messages=[{"role": "user", "content": text}, {"role": "assistant", "content": "hi"}],
        finish_key="ab" * 32,
        response={"object": "response"},
    )


def test_a_record_round_trips_and_survives_a_restart(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    record = _record()
    assert store.put(record)
    assert store.get(record.id) == record
    again = ResponseStore(tmp_path)  # another gateway process, later
    assert again.get(record.id) == record
    assert len(again) == 1 and again.bytes == store.bytes
    assert again.delete(record.id)
    assert again.get(record.id) is None
    assert ResponseStore(tmp_path).get(record.id) is None
    assert not again.delete(record.id)


def test_the_count_bound_drops_the_oldest_first(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, max_count=3)
    records = [_record(str(i)) for i in range(5)]
    for r in records:
        store.put(r)
    assert [store.get(r.id) is not None for r in records] == [False, False, True, True, True]
    assert len(list(tmp_path.iterdir())) == 3
    # The order holds across a restart: the next put drops the oldest kept one.
    again = ResponseStore(tmp_path, max_count=3)
    again.put(_record("5"))
    assert again.get(records[2].id) is None and again.get(records[3].id) is not None


def test_the_byte_bound_drops_the_oldest_first(tmp_path: Path) -> None:
    size = len(msgspec.json.encode(_record("x" * 100)))
    store = ResponseStore(tmp_path, max_bytes=size * 2 + size // 2)
    records = [_record("x" * 100) for _ in range(4)]
    for r in records:
        store.put(r)
    assert [r.id in store for r in records] == [False, False, True, True]
    assert store.bytes <= store.max_bytes
    # A smaller bound at restart applies at once.
    assert len(ResponseStore(tmp_path, max_bytes=size)) == 1


def test_a_record_larger_than_the_bound_is_not_stored(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, max_bytes=400)
    kept = _record("a")
    assert store.put(kept)
    assert not store.put(_record("x" * 1000))
    assert kept.id in store and len(store) == 1


def test_leftovers_and_damaged_records_are_dropped(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    record = _record()
    store.put(record)
    (tmp_path / "0000000000000009-resp_abc.tmp").write_bytes(b"half")
    (tmp_path / "junk.json").write_bytes(b"{}")
    again = ResponseStore(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if p.name.endswith(f"{record.id}.json")
    )
    next(tmp_path.glob("*.json")).write_bytes(b"not json")
    assert again.get(record.id) is None
    assert record.id not in again and not list(tmp_path.iterdir())


def test_bounds_must_leave_room() -> None:
    with pytest.raises(ValueError):
        ResponseStore("/tmp/unused", max_count=0)
