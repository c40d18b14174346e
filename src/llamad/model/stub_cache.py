"""An in-memory :class:`~llamad.model.cache_view_protocol.CacheView` for tests of the worker core.

:class:`MemoryCache` keeps rows in a dict and answers lookups with the
cache's own matching code (:class:`~llamad.cache.prefix.PrefixIndex` and
:func:`~llamad.cache.lookup.choose_restore`), so the core is tested against
the answers the real cache-meta gives (exact, prefix, a longer or diverging
row to truncate, the nearest row on a miss). It counts pins so a test can
check that every pin taken was returned, and it can hold asynchronous saves
back (``defer_async``) to play a writer that has not finished yet. With
``keep_logits=False`` it stores rows without the logits a save hands it, as
rows written before rows kept logits (version 1 files) are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgspec

from llamad.cache.key import Namespace, tokens_to_bytes
from llamad.cache.lookup import Lookup, LookupPolicy, RowRef, choose_restore
from llamad.cache.prefix import PrefixIndex
from llamad.cache.tier_kind import TierKind
from llamad.model.backend import PackedState
from llamad.model.cache_view_protocol import CacheView, RowRead
from llamad.model.results import ReadBufferStats, TokenSources
from llamad.model.savepoints import SaveJob

__all__ = ["MemoryCache", "StoredRow"]


@dataclass(eq=False)
class StoredRow:
    job: SaveJob
    payload: bytes
    hits: int = 0


@dataclass(eq=False)
class _Resolve:
    tokens: int
    parent_key: bytes | None
    wait_s: float
    answer: Lookup = field(repr=False)


class MemoryCache:
    """Rows in memory, matched like cache-meta matches them."""

    def __init__(
        self,
        *,
        fingerprint: bytes = b"\x11" * 32,
        quant: int = 2,
        ctx_hash: bytes = b"\x22" * 32,
        policy: LookupPolicy | None = None,
        defer_async: bool = False,
        keep_logits: bool = True,
    ) -> None:
        self._base = Namespace(fingerprint=fingerprint, quant=quant, ctx_hash=ctx_hash)
        self.policy = policy if policy is not None else LookupPolicy(common_min_tokens=1)
        self.defer_async = defer_async
        self.keep_logits = keep_logits
        self.refuse_async = False
        self.rows: dict[bytes, StoredRow] = {}
        self.pending: list[StoredRow] = []
        self.saves: list[SaveJob] = []
        self.resolves: list[_Resolve] = []
        self.corrupt: set[bytes] = set()
        self.reads = 0
        self.pins: dict[int, bytes] = {}
        self.accounted: list[TokenSources] = []
        self.live_reports: list[list[tuple[int, Namespace, list[int]]]] = []
        self._index = PrefixIndex()
        self._pending = PrefixIndex()
        self._pin_ids = itertools.count(1)

    # -- CacheView -----------------------------------------------------------------------

    def namespace(self, salt: bytes | None) -> Namespace:
        if salt is None:
            return self._base
        folded = hashlib.sha256(self._base.fingerprint + b"salt" + salt).digest()
        return Namespace(fingerprint=folded, quant=self._base.quant, ctx_hash=self._base.ctx_hash)

    def resolve(
        self,
        namespace: Namespace,
        tokens: Sequence[int],
        *,
        parent_key: bytes | None,
        wait_s: float,
    ) -> Lookup:
        match = self._index.match(namespace.header(), tokens_to_bytes(tokens))
        plan = choose_restore(match, len(tokens), self.policy)
        row = None if plan is None else self.rows.get(plan.key)
        if plan is None or row is None:
            answer = Lookup(None, None, 0, match.common_tokens, match.common_key, False)
        else:
            pin = next(self._pin_ids)
            self.pins[pin] = plan.key
            row.hits += 1
            ref = RowRef(
                key=plan.key,
                tier=TierKind.RAM,
                location=plan.key.hex(),
                file_size=len(row.payload),
                n_tokens=row.job.n_tokens,
                pin=pin,
            )
            answer = Lookup(
                plan.kind, ref, plan.use_tokens, match.common_tokens, match.common_key, False
            )
        answer = self._with_inflight(namespace, tokens, answer)
        self.resolves.append(_Resolve(len(tokens), parent_key, wait_s, answer))
        return answer

    def _with_inflight(self, namespace: Namespace, tokens: Sequence[int], answer: Lookup) -> Lookup:
        """``answer`` naming a held-back save that would serve ``tokens`` better,
        as cache-meta names a save in flight (it never waits for one here)."""
        if not len(self._pending):
            return answer
        match = self._pending.match(namespace.header(), tokens_to_bytes(tokens))
        plan = choose_restore(match, len(tokens), self.policy)
        if plan is None or plan.use_tokens <= answer.use_tokens:
            return answer
        return msgspec.structs.replace(
            answer, inflight_key=plan.key, inflight_tokens=plan.use_tokens
        )

    @contextmanager
    def read(self, row: RowRef) -> Iterator[RowRead | None]:
        stored = self.rows.get(row.key)
        if stored is None or row.key in self.corrupt:
            # As the real loader does: a damaged row is forgotten, never served.
            self.forget(row.key)
            yield None
            return
        self.reads += 1
        yield RowRead(memoryview(stored.payload), stored.job.logits)

    def checkin(self, pin: int | None) -> None:
        if pin is not None:
            del self.pins[pin]

    def read_buffer(self) -> ReadBufferStats | None:
        return None

    def save(self, job: SaveJob, state: PackedState) -> bool:
        try:
            payload = bytes(state.view())
        finally:
            state.release()
        self.saves.append(job)
        if job.key in self.rows:
            return True
        if not self.keep_logits:
            job = dataclasses.replace(job, logits=None)
        stored = StoredRow(job, payload)
        if not job.sync and self.refuse_async:
            return False
        if not job.sync and self.defer_async:
            self.pending.append(stored)
            self._pending.add(job.namespace.header(), tokens_to_bytes(job.tokens), job.key)
            return True
        self._publish(stored)
        return True

    def account(self, sources: TokenSources) -> None:
        self.accounted.append(sources)

    def report_live(self, entries: Sequence[tuple[int, Namespace, Sequence[int]]]) -> None:
        self.live_reports.append([(seq, ns, list(kv)) for seq, ns, kv in entries])

    def idle(self) -> None:
        pass

    # -- test controls ---------------------------------------------------------------------

    def _publish(self, stored: StoredRow) -> None:
        job = stored.job
        self.rows[job.key] = stored
        self._index.add(job.namespace.header(), tokens_to_bytes(job.tokens), job.key)

    def rebase(self, namespace: Namespace) -> None:
        """Answer ``namespace`` from now on, as a shell does after an adapter change."""
        self._base = namespace

    def publish_pending(self) -> list[bytes]:
        """Finish every held-back asynchronous save; returns their keys."""
        done, self.pending = self.pending, []
        for stored in done:
            job = stored.job
            self._pending.remove(job.namespace.header(), tokens_to_bytes(job.tokens))
            self._publish(stored)
        return [s.job.key for s in done]

    def forget(self, key: bytes) -> None:
        stored = self.rows.pop(key, None)
        if stored is not None:
            job = stored.job
            self._index.remove(job.namespace.header(), tokens_to_bytes(job.tokens))

    def row_tokens(self) -> dict[bytes, tuple[int, ...]]:
        return {k: r.job.tokens for k, r in self.rows.items()}


def _is_a_cache_view(cache: MemoryCache) -> CacheView:
    """Never called: mypy checks here that the fake implements the protocol."""
    return cache
