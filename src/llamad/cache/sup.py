"""cache_sup: the cache's place in the supervision tree.

``cache_sup`` is a ``rest_for_one`` supervisor whose first child is
cache-meta (:func:`llamad.cache.meta_proc.run_meta`); anything started after
it (a writer pool process, say) depends on it and restarts with it, while a
crash of a later child leaves cache-meta alone.

What runs where, and why (ARCHITECTURE asks for the choice to be written
down):

- **cache-meta** is its own OS process: it owns the index and every pin and
  reservation, and must survive any model worker's crash.
- **Tiers** are not processes. A tier is a directory (or a shared-memory
  namespace) plus stateless file operations any process may perform; the
  sole-writer rule is kept because only cache-meta decides what is indexed,
  evicted or adopted. A loader reads a pinned row's file directly.
- **The pressure scheduler** is a part of cache-meta's loop: its only action
  is an eviction, which must go through the sole writer anyway, and a
  cache-meta crash loses nothing of it (its state is a few numbers).
  Slow sources sample on a thread so the loop never waits on them.
- **Writers** run wherever the KV bytes are (the model worker) and talk to
  cache-meta through :class:`llamad.cache.client.CacheClient`; cache-meta
  watches their pids, so a dead writer's reservation is reaped at once. Their
  daemon-wide cap is the permits file (:class:`llamad.cache.writer.PermitSet`)
  that cache-meta creates when it starts, beside the counters file; a writer
  pool attaches to it (:meth:`llamad.cache.writer.WriterPool.from_settings`).
- **The mover** (demotions, promotions, write-behind copies to ``disk``) is
  two threads in cache-meta's process (:mod:`llamad.cache.mover`): cache-meta
  decides each move on its loop and alone changes the index; the threads do
  the file work off that loop (a link, or a tmp file written, fdatasync'ed
  and linked) and report back through an eventfd it polls. Not the writer
  pool: the cache must move rows with no model loaded, and a move's bytes
  are already in a file. A mover dies with cache-meta; the next scan deletes
  a move's ``*.tmp`` and adopts a linked destination as a copy.

The settings themselves are :class:`llamad.cache.settings.CacheSettings`; the
``ram`` tier's life across daemon runs is :mod:`llamad.cache.ram_purge`.
"""

from __future__ import annotations

from collections.abc import Sequence

from llamad.cache.settings import CacheSettings
from llamad.supervisor.spec import ChildSpec, Start, Strategy, SupervisorSpec, SupFlags

__all__ = ["cache_sup_spec", "meta_child_spec"]


def meta_child_spec(settings: CacheSettings, *, child_id: str = "cache-meta") -> ChildSpec:
    """The child spec that runs cache-meta under a supervisor."""
    return ChildSpec(
        id=child_id,
        start=Start("llamad.cache.meta_proc:run_meta", (), {"settings": settings.to_wire()}),
        # A clean stop demotes ram rows and finishes moves for up to
        # stop_moves_s, then flushes hit counts.
        shutdown=settings.stop_moves_s + 5.0,
        liveness_timeout=settings.liveness_timeout,
        start_timeout=120.0,
    )


def cache_sup_spec(
    settings: CacheSettings,
    *,
    extra_children: Sequence[ChildSpec] = (),
    intensity: int = 5,
    period: float = 30.0,
) -> SupervisorSpec:
    """``cache_sup``: cache-meta first, then anything that depends on it (rest_for_one)."""
    return SupervisorSpec(
        "cache_sup",
        SupFlags(strategy=Strategy.REST_FOR_ONE, intensity=intensity, period=period),
        (meta_child_spec(settings), *extra_children),
    )
