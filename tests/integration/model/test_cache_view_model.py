"""A real KV state through ClientCacheView and back (SPEC M3, M5, C3, L7).

A sequence of a real context (the default model, ``kv_unified``, two
sequences) is packed into a pre-faulted buffer, saved through the view into a
real cache-meta's tiers, resolved, read (the ``ram`` row in place, a ``disk``
row through the view's reusable buffer) and restored into *another sequence
of another context*, which must then continue with exactly the greedy tokens
the original context produced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from cache_view_support import BufferState, Meta, settle_saves
from llamad.cache.client import CacheClient
from llamad.cache.kvc import SaveReason
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.llama_ffi import Context, Model, Sampler, SamplerParams, StateBuffer
from llamad.model import identity
from llamad.model.client_cache_view import ClientCacheView
from llamad.model.savepoints import SaveJob
from llamad.testing import discard_scratch, scratch_settings, wait_until

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

MakeCtx = Callable[..., Context]

TEXT = (
    "<|im_start|>system\nYou are a careful assistant who answers in short sentences.<|im_end|>\n"
    "<|im_start|>user\nName three rivers of Europe and one fact about each of them, "
    "then say which one is the longest and why people travel to see it.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def settings() -> Iterator[CacheSettings]:
    s = scratch_settings(prefix="lcvm", stats_flush_s=0.5)
    try:
        yield s
    finally:
        discard_scratch(s)


@pytest.fixture(scope="module")
def meta(settings: CacheSettings) -> Iterator[Meta]:
    m = Meta(settings)
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def admin(settings: CacheSettings, meta: Meta) -> Iterator[CacheClient]:
    with CacheClient.from_settings(settings, client_name="test-admin") as client:
        yield client


def worker_ctx(make_ctx: MakeCtx) -> Context:
    # The worker's layout: one KV pool shared by every sequence.
    return make_ctx(n_ctx=1024, n_seq_max=2, kv_unified=True)


def continue_greedy(model: Model, ctx: Context, last: int, seq: int, n: int = 24) -> list[int]:
    """Decode the held-back last prompt token alone, then ``n`` greedy tokens."""
    ctx.prefill([last], seq_id=seq)
    with Sampler(model, SamplerParams(greedy=True)) as s:
        return ctx.generate(s, n, seq_id=seq, stop_at_eog=False)


class Packed:
    """One sequence's state packed from a real context, and its cold continuation."""

    def __init__(self, model: Model, ctx: Context, tokens: Sequence[int]) -> None:
        self.head, self.last = list(tokens[:-1]), tokens[-1]
        ctx.prefill(self.head, seq_id=0)
        self.buffer = StateBuffer(ctx.seq_state_size(0))
        self.nbytes = ctx.pack_seq(0, self.buffer)
        self.expected = continue_greedy(model, ctx, self.last, 0)

    def state(self) -> BufferState:
        return BufferState(self.buffer, self.nbytes)


def restore_and_continue(
    model: Model, view: ClientCacheView, ctx: Context, packed: Packed
) -> tuple[list[int], bool]:
    ns = view.namespace(None)
    found = view.resolve(ns, [*packed.head, packed.last], parent_key=None, wait_s=0.0)
    assert found.row is not None and found.use_tokens == len(packed.head)
    try:
        with view.read(found.row) as got:
            assert got is not None and got.payload.nbytes == packed.nbytes
            payload = got.payload
            readonly = payload.readonly
            ctx.unpack_seq(1, payload)
    finally:
        view.checkin(found.row.pin)
    assert ctx.next_pos(1) == len(packed.head)
    return continue_greedy(model, ctx, packed.last, 1), readonly


def test_a_state_saved_to_ram_restores_in_place_into_another_context_identically(
    model: Model, make_ctx: MakeCtx, settings: CacheSettings, meta: Meta, admin: CacheClient
) -> None:
    source, target = worker_ctx(make_ctx), worker_ctx(make_ctx)
    packed = Packed(model, source, model.tokenize(TEXT, parse_special=True))
    view = ClientCacheView.from_settings(settings, source)
    try:
        ns = view.namespace(None)
        assert identity.namespace(target) == ns  # the same layout: rows are exchangeable
        job = SaveJob(SaveReason.FINISH, ns.key(packed.head), ns, tuple(packed.head), seq=0)
        state = packed.state()
        assert view.save(job, state)
        assert settle_saves(view) == [(job.key, True)]
        assert state.released == 1
        row = admin.lookup_exact(job.key, pin=False)
        assert row is not None and row.tier is TierKind.RAM

        tokens, readonly = restore_and_continue(model, view, target, packed)
        assert tokens == packed.expected
        # In place: the read-only shared mapping, never a copy into a buffer.
        assert readonly
        assert view.stats.reads_mapped == 1 and view.stats.reads_copied == 0
        wait_until(lambda: admin.status()["pins"] == 0, "the checkin", 10)
    finally:
        view.close()


def test_a_state_restored_from_disk_after_its_ram_copy_is_evicted_continues_identically(
    model: Model, make_ctx: MakeCtx, settings: CacheSettings, meta: Meta, admin: CacheClient
) -> None:
    # Saved with no tier named: it lands in ram, and cache-meta writes a disk
    # copy behind it. Waiting for that copy (polled through dump) is the one
    # wait here: it is the point of the test, and it is asynchronous.
    source, target = worker_ctx(make_ctx), worker_ctx(make_ctx)
    tokens = model.tokenize(TEXT + "The Danube", parse_special=True)
    packed = Packed(model, source, tokens)
    view = ClientCacheView.from_settings(settings, source)
    try:
        ns = view.namespace(None)
        job = SaveJob(SaveReason.FINISH, ns.key(packed.head), ns, tuple(packed.head), seq=0)
        assert view.save(job, packed.state())
        assert settle_saves(view) == [(job.key, True)]

        def copies() -> set[str]:
            found = [r for r in admin.dump() if r.get("key") == job.key.hex()]
            return {c["tier"] for c in found[0]["copies"]} if found else set()

        deadline = time.monotonic() + 30
        while copies() != {"ram", "disk"}:
            assert time.monotonic() < deadline, f"no disk copy written behind: {copies()}"
            time.sleep(0.02)
        rows, _ = admin.evict_bytes(1 << 40, tiers=[TierKind.RAM])
        assert rows >= 1
        row = admin.lookup_exact(job.key, pin=False)
        assert row is not None and row.tier is TierKind.DISK

        # The save told the view how large a row it will read: its buffer is
        # allocated off the loop, ahead of the read.
        assert view.read_buffer_ready(30)
        ahead = view.read_buffer()
        assert ahead.prepared == 1 and ahead.capacity >= packed.nbytes
        restored, readonly = restore_and_continue(model, view, target, packed)
        assert restored == packed.expected
        assert not readonly  # the view's own pre-faulted buffer, filled by plain reads
        assert view.stats.reads_copied == 1 and view.stats.reads_mapped == 0
        # The read found it large enough: nothing allocated on its path.
        after = view.read_buffer()
        assert after.grows_on_read == 0 and after.capacity == ahead.capacity
        wait_until(lambda: admin.status()["pins"] == 0, "the checkin", 10)
    finally:
        view.close()
