"""The publisher's reference counts: a block goes only when nothing holds it."""

from __future__ import annotations

from llamad.kv_events.blocks import chain_hashes
from llamad.kv_events.ledger import BlockLedger
from llamad.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored

NS = bytes(65)
BASE = list(range(48))  # three blocks
LONGER = [*BASE, *range(500, 532)]  # the same three, then two more


def test_store_announces_the_chain_with_tokens_and_extra_keys() -> None:
    ledger = BlockLedger(16)
    event = ledger.store(b"a", "ram", NS, BASE)
    assert isinstance(event, BlockStored)
    assert event.block_hashes == chain_hashes(NS, BASE)
    assert event.parent_block_hash is None
    assert event.token_ids == BASE and event.block_size == 16 and event.medium == "ram"
    assert event.extra_keys == [("llamad-ns", NS.hex()), None, None]
    assert ledger.store(b"a", "ram", NS, BASE) is None  # a repeat says nothing


def test_a_shared_prefix_is_announced_once_and_the_suffix_names_its_parent() -> None:
    ledger = BlockLedger(16)
    ledger.store(b"a", "ram", NS, BASE)
    event = ledger.store(b"b", "ram", NS, LONGER)
    assert isinstance(event, BlockStored)
    hashes = chain_hashes(NS, LONGER)
    assert event.block_hashes == hashes[3:]
    assert event.parent_block_hash == hashes[2]
    assert event.token_ids == LONGER[48:80]
    assert event.extra_keys == [None, None]


def test_removed_only_when_no_holder_is_left() -> None:
    ledger = BlockLedger(16)
    ledger.store(b"a", "ram", NS, BASE)
    ledger.store(b"b", "ram", NS, LONGER)
    hashes = chain_hashes(NS, LONGER)
    # b goes: only its own two blocks go; a still holds the first three.
    assert ledger.remove(b"b", "ram") == BlockRemoved(block_hashes=hashes[3:], medium="ram")
    assert ledger.held("ram", hashes[0]) == 1
    assert ledger.remove(b"a", "ram") == BlockRemoved(block_hashes=hashes[:3], medium="ram")
    assert len(ledger) == 0 and ledger.holders() == 0
    assert ledger.remove(b"a", "ram") is None


def test_media_are_counted_apart() -> None:
    ledger = BlockLedger(16)
    ledger.store(b"a", "ram", NS, BASE)
    stored = ledger.store(b"a", "disk", NS, BASE)
    assert isinstance(stored, BlockStored) and stored.medium == "disk"
    removed = ledger.remove(b"a", "ram")
    assert isinstance(removed, BlockRemoved) and removed.medium == "ram"
    assert ledger.held("disk", chain_hashes(NS, BASE)[0]) == 1


def test_a_cleared_medium_and_a_cleared_ledger() -> None:
    ledger = BlockLedger(16)
    ledger.store(b"a", "ram", NS, BASE)
    ledger.store(b"b", "ram", NS, LONGER)
    ledger.store(b"a", "disk", NS, BASE)
    event = ledger.remove_medium("ram")
    assert isinstance(event, BlockRemoved)
    assert sorted(event.block_hashes) == sorted(chain_hashes(NS, LONGER))
    assert ledger.remove_medium("ram") is None
    assert len(ledger) == 3
    assert ledger.clear() == AllBlocksCleared() and len(ledger) == 0


def test_fewer_tokens_than_a_block_hold_nothing() -> None:
    ledger = BlockLedger(16)
    assert ledger.store(b"a", "ram", NS, BASE[:10]) is None
    assert ledger.remove(b"a", "ram") is None
