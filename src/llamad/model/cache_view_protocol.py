"""The narrow door from the worker core to the KV cache (``CacheView``).

The shell implements it over a :class:`llamad.cache.client.CacheClient` and
the writer pool; :class:`llamad.model.stub_cache.MemoryCache` implements it in
memory for tests. Calls happen between ticks on the loop thread.

The mapping onto the client is direct: :meth:`CacheView.resolve` is
``CacheClient.resolve`` (one round trip: parent key, in-flight wait, longest
prefix; the answered row is pinned), :meth:`CacheView.read` is
``load_mapped_row`` for the ``ram`` tier and ``load_row`` into a reusable
pre-faulted buffer otherwise (the payload, and the logits the row keeps),
:meth:`CacheView.checkin` returns the pin, and :meth:`CacheView.save` hands
a packed state to the writer pool (async) or writes it before returning
(evict, shutdown).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from llamad.cache.key import Namespace
from llamad.cache.kvc import KvcLogits
from llamad.cache.lookup import Lookup, RowRef
from llamad.cache.tiers import checked_whole
from llamad.model.backend import PackedState
from llamad.model.results import ReadBufferStats, TokenSources
from llamad.model.savepoints import SaveJob

__all__ = ["CacheView", "RowRead"]


@dataclass(frozen=True, slots=True)
class RowRead:
    """A row as :meth:`CacheView.read` hands it over, validated.

    ``payload``: the packed state, valid only inside the ``read`` block (a
    ``ram`` row's is the shared mapping itself). ``logits``: the logits the
    row keeps for one of its positions (a finish save keeps its prompt's
    last), or ``None``; immutable bytes, which may be kept past the block.
    ``check``: raises :class:`~llamad.cache.errors.KvcCorrupt` unless the
    payload's checksum matched. A ``ram`` row's checksum runs beside the
    block (the unpack copies the row while it runs), so the reader calls it
    once it has unpacked the payload and before anything reads those cells;
    for the others it is a no-op (checked before the block).
    """

    payload: memoryview
    logits: KvcLogits | None = None
    check: Callable[[], None] = checked_whole


class CacheView(Protocol):
    """What the core needs from the cache."""

    def namespace(self, salt: bytes | None) -> Namespace:
        """The namespace keys are made under now (model, context, adapters as
        attached at this moment), with ``salt`` folded in when given.

        Called once per request at submission: a request keeps the namespace it
        was admitted under even if an adapter's scale changes meanwhile.
        """
        ...

    def resolve(
        self,
        namespace: Namespace,
        tokens: Sequence[int],
        *,
        parent_key: bytes | None,
        wait_s: float,
    ) -> Lookup:
        """The best row to restore for ``tokens`` (pinned), and the nearest row
        for a miss explanation. ``wait_s`` > 0 lets the cache wait that long
        for ``parent_key``'s in-flight save; the core passes it only when no
        other sequence would be held up by the wait."""
        ...

    def read(self, row: RowRef) -> AbstractContextManager[RowRead | None]:
        """The row's validated payload and kept logits for the duration of the
        block, or ``None`` when the row turned out missing or corrupt, in any
        record, the logits' included (it is then never served again). A
        payload whose checksum fails in the block (:attr:`RowRead.check`)
        raises :class:`~llamad.cache.errors.KvcCorrupt` out of it, and is
        never served again either."""
        ...

    def read_buffer(self) -> ReadBufferStats | None:
        """The buffer rows read by copy go through, for the worker's status
        (``None``: there is none)."""
        ...

    def checkin(self, pin: int | None) -> None:
        """Release a pin :meth:`resolve` took (``None``: nothing was pinned)."""
        ...

    def save(self, job: SaveJob, state: PackedState) -> bool:
        """Write ``state`` as ``job``'s row; ``state`` is the callee's from now on.

        Synchronous reasons (``job.sync``) return once the row is published or
        failed, by ``job.deadline``, and answer whether it was published.
        Asynchronous ones return at once: ``False`` when the save was refused
        (writer pool saturated, already cached); otherwise the shell reports
        the outcome later through :meth:`llamad.model.core.WorkerCore.save_done`.
        """
        ...

    def account(self, sources: TokenSources) -> None:
        """Count where a resolved request's prompt tokens come from (the shared
        counters' ``prompt_tokens_*`` and ``hits_live``, SPEC C10, M18)."""
        ...

    def report_live(self, entries: Sequence[tuple[int, Namespace, Sequence[int]]]) -> None:
        """The idle entries this worker keeps live now, as ``(seq, namespace,
        tokens)``: all of them, replacing what was reported before. cache-meta
        publishes them as KV events (docs/internals/kv-events.md); a cache
        that is down misses them, and serving goes on."""
        ...

    def idle(self) -> None:
        """The worker has had nothing in flight for a moment (the shell's
        ``AHEAD_AFTER_IDLE_S``, once per idle spell): work the view keeps off
        the request path (preparing the read buffer for the largest row seen)
        may start. Cheap when there is nothing to do."""
        ...
