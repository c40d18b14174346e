"""Which publisher holds which blocks: the router's side of the stream.

:class:`KvIndex` applies the batches of several publishers (each named by its
endpoint) in sequence order and answers, for a prompt's block hashes, which
publisher holds the longest prefix of them. It is pure: the caller owns the
sockets and the clock, feeds each message in with :meth:`KvIndex.apply` and
acts on what comes back:

- ``"applied"``: the batch is in.
- ``"duplicate"``: a batch at or before one already applied (a replay's
  overlap); ignored.
- ``"gap"``: batches were missed; nothing was applied, and the caller asks the
  publisher's replay socket for everything from ``replay_from`` and applies
  what comes back. When the replay cannot reach back that far (its buffer is
  bounded), :meth:`KvIndex.reset` forgets what the publisher held and takes
  the stream from wherever it is.

A publisher that restarts starts again at sequence 0 with ``AllBlocksCleared``
(llamad's daemon does; so does a vLLM engine's first reset): that batch is
taken as a restart, not as a duplicate. A publisher that disconnects or goes
silent for longer than ``silent_after`` seconds is forgotten
(:meth:`KvIndex.forget`, :meth:`KvIndex.expire`): a router must not send
requests to a cache it can no longer see.

A block counts as held by a publisher while any medium holds it there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llamad.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

__all__ = ["Applied", "KvIndex", "PrefixMatch"]

Outcome = Literal["applied", "duplicate", "gap"]


@dataclass(frozen=True, slots=True)
class Applied:
    """What :meth:`KvIndex.apply` did with one batch."""

    outcome: Outcome
    replay_from: int | None = None
    """For a gap: the first sequence number to ask the replay socket for."""


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The publisher that holds the longest prefix, and how many blocks of it."""

    endpoint: str
    blocks: int


@dataclass(slots=True)
class _Publisher:
    # The next sequence number expected; None takes whatever comes next.
    expect: int | None = 0
    last_seen: float = 0.0
    # block hash -> the media holding it on this publisher.
    blocks: dict[int, set[str | None]] = field(default_factory=dict)


class KvIndex:
    """The blocks each publisher holds, kept from their event streams."""

    def __init__(self, silent_after: float | None = None) -> None:
        if silent_after is not None and silent_after <= 0:
            raise ValueError("silent_after must be positive (or None: never expire)")
        self.silent_after = silent_after
        self._pubs: dict[str, _Publisher] = {}

    # -- the stream ------------------------------------------------------

    def apply(
        self, endpoint: str, seq: int, batch: KVEventBatch, now: float | None = None
    ) -> Applied:
        """Apply one batch from ``endpoint``'s stream (see the module's doc)."""
        now = time.monotonic() if now is None else now
        pub = self._pubs.setdefault(endpoint, _Publisher())
        pub.last_seen = now
        restart = seq == 0 and bool(batch.events) and isinstance(batch.events[0], AllBlocksCleared)
        if pub.expect is not None and not restart:
            if seq < pub.expect:
                return Applied("duplicate")
            if seq > pub.expect:
                return Applied("gap", replay_from=pub.expect)
        for event in batch.events:
            if isinstance(event, BlockStored):
                for h in event.block_hashes:
                    pub.blocks.setdefault(h, set()).add(event.medium)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    media = pub.blocks.get(h)
                    if media is not None:
                        media.discard(event.medium)
                        if not media:
                            del pub.blocks[h]
            else:
                pub.blocks.clear()
        pub.expect = seq + 1
        return Applied("applied")

    def touch(self, endpoint: str, now: float | None = None) -> None:
        """``endpoint`` is alive though it sent nothing (a status answer, say)."""
        pub = self._pubs.get(endpoint)
        if pub is not None:
            pub.last_seen = time.monotonic() if now is None else now

    def reset(self, endpoint: str) -> None:
        """Forget what ``endpoint`` held and take its stream from the next batch on."""
        pub = self._pubs.setdefault(endpoint, _Publisher())
        pub.blocks.clear()
        pub.expect = None

    def forget(self, endpoint: str) -> None:
        """``endpoint`` is gone (disconnected, dead): it holds nothing any more."""
        self._pubs.pop(endpoint, None)

    def expire(self, now: float | None = None) -> list[str]:
        """Forget every publisher silent for longer than ``silent_after``; their endpoints."""
        if self.silent_after is None:
            return []
        now = time.monotonic() if now is None else now
        gone = [e for e, p in self._pubs.items() if now - p.last_seen > self.silent_after]
        for endpoint in gone:
            del self._pubs[endpoint]
        return gone

    # -- questions ---------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        """Publishers known, in the order first heard from."""
        return list(self._pubs)

    def blocks(self, endpoint: str) -> int:
        """How many distinct blocks ``endpoint`` holds."""
        pub = self._pubs.get(endpoint)
        return 0 if pub is None else len(pub.blocks)

    def holds(self, endpoint: str, block_hash: int) -> bool:
        """Whether ``endpoint`` holds ``block_hash`` in any medium."""
        pub = self._pubs.get(endpoint)
        return pub is not None and block_hash in pub.blocks

    def matches(
        self, hashes: Sequence[int], endpoints: Iterable[str] | None = None
    ) -> dict[str, int]:
        """For each publisher (or each of ``endpoints``), its matching prefix in blocks."""
        names = self._pubs if endpoints is None else endpoints
        out: dict[str, int] = {}
        for endpoint in names:
            pub = self._pubs.get(endpoint)
            n = 0
            if pub is not None:
                held = pub.blocks
                for h in hashes:
                    if h not in held:
                        break
                    n += 1
            out[endpoint] = n
        return out

    def best(
        self, hashes: Sequence[int], endpoints: Iterable[str] | None = None
    ) -> PrefixMatch | None:
        """The publisher with the longest matching prefix (first heard wins a tie).

        ``None`` when no publisher holds even the first block.
        """
        top: PrefixMatch | None = None
        for endpoint, n in self.matches(hashes, endpoints).items():
            if n and (top is None or n > top.blocks):
                top = PrefixMatch(endpoint, n)
        return top
