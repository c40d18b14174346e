"""KvIndex: several publishers' streams, longest prefix, gaps, restarts, silence."""

from __future__ import annotations

import pytest

from llamad.kv_events.blocks import chain_hashes
from llamad.kv_events.index import Applied, KvIndex, PrefixMatch
from llamad.kv_events.ledger import BlockLedger
from llamad.kv_events.wire import AllBlocksCleared, BlockRemoved, KVEvent, KVEventBatch

NS = bytes(65)
SHORT = list(range(32))
LONG = list(range(80))


def _batch(*events: KVEvent | None) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=[e for e in events if e is not None])


def test_longest_prefix_wins() -> None:
    a, b = BlockLedger(), BlockLedger()
    index = KvIndex()
    assert index.apply("A", 0, _batch(a.store(1, "ram", NS, SHORT)), now=0) == Applied("applied")
    assert index.apply("B", 0, _batch(b.store(1, "disk", NS, LONG)), now=0).outcome == "applied"
    hashes = chain_hashes(NS, LONG)
    assert index.matches(hashes) == {"A": 2, "B": 5}
    assert index.best(hashes) == PrefixMatch("B", 5)
    assert index.best(chain_hashes(NS, SHORT)) == PrefixMatch("A", 2)  # a tie: first heard
    assert index.best(chain_hashes(bytes([1]) + NS[1:], LONG)) is None
    assert index.best(hashes, ["A"]) == PrefixMatch("A", 2)


def test_a_removed_block_cuts_the_prefix_there() -> None:
    index = KvIndex()
    hashes = chain_hashes(NS, LONG)
    index.apply("A", 0, _batch(BlockLedger().store(1, "ram", NS, LONG)), now=0)
    index.apply("A", 1, _batch(BlockRemoved(block_hashes=[hashes[2]], medium="ram")), now=0)
    assert index.matches(hashes) == {"A": 2}


def test_a_block_stays_while_another_medium_holds_it() -> None:
    ledger = BlockLedger()
    index = KvIndex()
    hashes = chain_hashes(NS, SHORT)
    index.apply("A", 0, _batch(ledger.store(1, "ram", NS, SHORT)), now=0)
    index.apply("A", 1, _batch(ledger.store(1, "disk", NS, SHORT)), now=0)
    index.apply("A", 2, _batch(ledger.remove(1, "ram")), now=0)
    assert index.matches(hashes) == {"A": 2}
    index.apply("A", 3, _batch(ledger.remove(1, "disk")), now=0)
    assert index.matches(hashes) == {"A": 0}


def test_all_blocks_cleared() -> None:
    index = KvIndex()
    index.apply("A", 0, _batch(BlockLedger().store(1, "ram", NS, LONG)), now=0)
    index.apply("A", 1, _batch(AllBlocksCleared()), now=0)
    assert index.blocks("A") == 0


def test_a_gap_asks_for_replay_and_the_replay_fills_it() -> None:
    ledger = BlockLedger()
    index = KvIndex()
    b0 = _batch(ledger.store(1, "ram", NS, SHORT))
    b1 = _batch(ledger.store(2, "ram", NS, LONG))
    b2 = _batch(ledger.remove(1, "ram"))
    index.apply("A", 0, b0, now=0)
    # b1 was missed: b2 is not applied, replay from 1 is asked for.
    assert index.apply("A", 2, b2, now=0) == Applied("gap", replay_from=1)
    assert index.blocks("A") == 2
    assert index.apply("A", 0, b0, now=0).outcome == "duplicate"
    assert index.apply("A", 1, b1, now=0).outcome == "applied"
    assert index.apply("A", 2, b2, now=0).outcome == "applied"
    assert index.matches(chain_hashes(NS, LONG)) == {"A": 5}


def test_a_late_subscriber_asks_for_replay_from_zero() -> None:
    index = KvIndex()
    assert index.apply("A", 5, _batch(), now=0) == Applied("gap", replay_from=0)


def test_reset_takes_the_stream_from_where_it_is() -> None:
    # The replay buffer no longer reaches back: forget and go on.
    index = KvIndex()
    index.apply("A", 0, _batch(BlockLedger().store(1, "ram", NS, LONG)), now=0)
    index.reset("A")
    assert index.blocks("A") == 0
    assert index.apply("A", 90, _batch(), now=0).outcome == "applied"
    assert index.apply("A", 92, _batch(), now=0) == Applied("gap", replay_from=91)


def test_a_restarted_publisher_starts_over_at_zero() -> None:
    index = KvIndex()
    index.apply("A", 0, _batch(AllBlocksCleared()), now=0)
    index.apply("A", 1, _batch(BlockLedger().store(1, "ram", NS, LONG)), now=0)
    restarted = _batch(AllBlocksCleared(), BlockLedger().store(1, "ram", NS, SHORT))
    assert index.apply("A", 0, restarted, now=0).outcome == "applied"
    assert index.matches(chain_hashes(NS, LONG)) == {"A": 2}


def test_silent_and_gone_publishers_are_forgotten() -> None:
    index = KvIndex(silent_after=10.0)
    index.apply("A", 0, _batch(BlockLedger().store(1, "ram", NS, LONG)), now=0)
    index.apply("B", 0, _batch(BlockLedger().store(1, "ram", NS, LONG)), now=9)
    index.touch("A", now=8)
    assert index.expire(now=17) == []
    assert index.expire(now=18.5) == ["A"]
    assert index.endpoints == ["B"]
    index.forget("B")
    assert index.best(chain_hashes(NS, LONG)) is None
    assert KvIndex().expire(now=1e9) == []
    with pytest.raises(ValueError):
        KvIndex(silent_after=0)
