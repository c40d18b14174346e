"""The memoised primer in the worker process (SPEC M3, P1): a real supervisor
starts cache-meta and the worker (real model, real cache), driven through
WorkerClient.

A cold request's finish row keeps the logits of its prompt's last position;
an exact repeat restores the row and samples its first token from them: its
stats show the restore and no prompt token decoded, the worker's status
counts it, and the reply (tokens and logprobs) is the cold one.

These tests are about the row, so the worker keeps no idle entries
(``live_reuse=False``): with them, the repeat would reuse the live KV and its
logits instead (tests/integration/model/test_worker_proc_live.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llamad.cache.kvc import parse_meta
from llamad.cache.tier_kind import TierKind
from llamad.model.results import CacheHitKind, ReadBufferStats
from llamad.model.worker_client import WorkerClient
from llamad.testing.launcher import wait_until
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(n_ctx=1024, n_batch=64, n_seq_max=2, prefix="lwsl", live_reuse=False)


@pytest.mark.parametrize(
    ("i", "params"),
    [(71, {"temperature": 0.0}), (72, {"temperature": 0.8, "top_k": 40, "seed": 99})],
    ids=["greedy", "seeded"],
)
def test_an_exact_hit_samples_its_first_token_from_the_rows_logits_and_replies_as_cold(
    tree: WorkerTree, worker: WorkerClient, i: int, params: dict[str, Any]
) -> None:
    prompt = prompt_text(i, words=30)
    cold = worker.complete(prompt, max_tokens=8, logprobs=2, **params)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert cold.stats.prefill_tokens == cold.stats.prompt_tokens
    tree.wait_saved(cold.finish_key)
    assert cold.finish_key is not None
    with tree.cache() as cache:
        row = cache.lookup_exact(cold.finish_key, pin=False)
        assert row is not None
        kept = parse_meta(Path(row.location)).logits
    assert kept is not None and kept.position == cold.stats.prompt_tokens - 1
    hits = worker.status_from_loop().status.stored_logits_hits

    warm = worker.complete(prompt, max_tokens=8, logprobs=2, **params)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.cache_delta.read == warm.stats.prompt_tokens
    # Restored, then no prompt token decoded: the first token came from the
    # row's logits, and the worker counted it.
    assert warm.stats.restore_ms > 0
    assert warm.stats.prefill_tokens == 0
    assert worker.status_from_loop().status.stored_logits_hits == hits + 1
    assert warm.generated == cold.generated
    assert warm.reply == cold.reply
    assert warm.logprobs == cold.logprobs


def _only_on_disk(tree: WorkerTree, key: bytes | None) -> None:
    """Wait until every row (the prompt's and the finish's) has its disk copy,
    written behind its ram one, then evict every ram and ram_file copy: the
    next restore is read by copy, through the read buffer."""
    assert key is not None
    tree.wait_saved(key)
    tree.wait_idle()
    with tree.cache() as cache:

        def all_on_disk() -> bool:
            # No save still reserved (a reservation has no copies yet), and
            # every row written behind to disk.
            rows = cache.dump()
            return any(r.get("key") == key.hex() for r in rows) and all(
                "disk" in {c["tier"] for c in r.get("copies", ())} for r in rows
            )

        wait_until(all_on_disk, "every row's disk copy")
        cache.evict_bytes(1 << 40, tiers=[TierKind.RAM, TierKind.RAM_FILE])
        assert all({c["tier"] for c in r["copies"]} == {"disk"} for r in cache.dump())


def test_a_restore_from_disk_finds_its_read_buffer_sized_ahead_and_replies_as_cold(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    # Issue 21: the buffer a copied row is read into is allocated ahead, off
    # the loop, from the rows the worker saw (its own finish save here); the
    # restore then allocates nothing on its path.
    prompt = prompt_text(73, words=30)
    cold = worker.complete(prompt, max_tokens=4, temperature=0.0)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    _only_on_disk(tree, cold.finish_key)
    with tree.cache() as cache:
        largest = max(int(r["size"]) for r in cache.dump())

    def sized() -> ReadBufferStats | None:
        rb = worker.status_from_loop().status.read_buffer
        return rb if rb is not None and rb.capacity >= largest else None

    ahead = wait_until(sized, "the read buffer sized ahead")
    assert ahead.prepared >= 1 and ahead.kind == "mmap"  # plain memory on a CPU build
    warm = worker.complete(prompt, max_tokens=4, temperature=0.0)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.cache_delta.sources.disk == warm.stats.prompt_tokens  # read by copy
    assert warm.stats.prefill_tokens == 0  # the row's logits, restored from disk
    # The restore's parts: the lookup, and the row's validated read and unpack.
    s = warm.stats
    assert s.lookup_ms > 0 and s.load_ms > 0
    assert s.lookup_ms + s.load_ms <= s.restore_ms + 0.002
    assert warm.generated == cold.generated and warm.reply == cold.reply
    after = worker.status_from_loop().status.read_buffer
    assert after is not None
    assert after.grows_on_read == ahead.grows_on_read and after.capacity == ahead.capacity


def test_a_damaged_row_read_by_copy_is_a_counted_miss_and_the_request_runs_cold(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    prompt = prompt_text(74, words=30)
    cold = worker.complete(prompt, max_tokens=4, temperature=0.0)
    _only_on_disk(tree, cold.finish_key)
    assert cold.finish_key is not None
    with tree.cache() as cache:
        # The row the repeat restores (its finish row), found without a
        # lookup: a hit would have cache-meta promote it back into ram.
        (row,) = [r for r in cache.dump() if r.get("key") == cold.finish_key.hex()]
        assert row["tier"] == "disk"
        location = row["location"]
        meta = parse_meta(Path(location))
        corrupt = cache.counters()["corrupt_files"]
        # One payload byte flipped: only the payload's checksum can find it,
        # once the bytes are in the read buffer.
        at = meta.payload_offset + meta.payload_len // 2
        with open(location, "r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x01]))
        damaged = worker.complete(prompt, max_tokens=4, temperature=0.0)
        assert damaged.cache_hit_kind is CacheHitKind.COLD
        assert damaged.stats.prefill_tokens == damaged.stats.prompt_tokens
        assert damaged.generated == cold.generated and damaged.reply == cold.reply
        assert cache.counters()["corrupt_files"] == corrupt + 1
