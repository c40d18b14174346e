"""ClientCacheView: the worker core's door to the real cache (SPEC M3, M5, M17, C4-C8).

Implements :class:`~llamad.model.cache_view_protocol.CacheView` over a
:class:`~llamad.cache.client.CacheClient` (lookups, pins, forgets: the loop
thread's one connection to cache-meta) and a
:class:`~llamad.cache.writer.WriterPool` (saves). Everything here runs on the
worker's loop thread except the writes, which run on the pool's threads and
come back through :class:`~llamad.model.save_completions.SaveCompletions`.

- **namespace**: :func:`llamad.model.identity.namespace` of the live context,
  recomputed only when the attached adapter set changes, with the request's
  ``cache_salt`` folded in by :func:`llamad.model.identity.salted`.
- **resolve**: one ``resolve`` round trip (the answered row pinned), bounded
  by ``wait_s + lookup_timeout_s``; cache-meta must answer it, or a ``$ping``
  that follows it, within ``lookup_timeout_s`` whatever the wait (a stopped
  cache-meta costs the loop that, not the wait). A cache that is down,
  restarting or hung raises a :class:`~llamad.errors.LlamadError`
  (``worker_crashed``, ``unavailable``, ``timeout``), which the core turns
  into a cold start. **Cache down**: after a timeout the view takes the
  cache for down: every lookup is skipped (cold at once, no round trip) and
  no sync save is tried, for at least ``cooldown_s`` and until cache-meta
  answers a probe (a thread of the view pinging it on its own connection, which
  follows a restarted cache-meta). So a wedged cache-meta costs one
  ``lookup_timeout_s`` per episode, never one per request. The loop's client
  reconnects by itself once cache-meta is back (it follows the registry
  name). The lookup names the tiers this model restores from, and
  cache-meta answers the fastest copy among them (a row with none there is
  a miss).
- **read**: a ``ram`` row's payload in place (the shared-memory mapping,
  validated, no copy); any other tier's through plain reads into one reusable
  pre-faulted buffer (:class:`~llamad.model.read_buffer.ReadBuffer`: sized
  ahead of the reads, off the loop, from the largest row the view has seen in
  a lookup or a save, in the device's host memory where it has one); with
  either, the logits the row keeps (validated with its TLV). A missing or
  damaged row is ``None`` (deleted and counted once by the loader, forgotten
  by cache-meta).
- **save**: to the configured tier, or with ``auto`` to the one cache-meta
  picks among the restore tiers (the fastest with room). Asynchronous
  reasons go to the writer pool and return at once
  (``False`` when the pool refuses: no permit, closed); synchronous ones
  (evict, shutdown) are written by a dedicated thread while the loop waits,
  at most until ``job.deadline``. A packed state is released exactly once,
  on the loop thread, when its write is over or refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec
import structlog

from llamad.actors.client import HANDSHAKE_TIMEOUT
from llamad.cache.activity import CopyActivity
from llamad.cache.client import CacheClient
from llamad.cache.counters import Counters, CountersUnavailable
from llamad.cache.errors import KvcCorrupt
from llamad.cache.key import Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcLogits, KvcSpec
from llamad.cache.lookup import HitKind, Lookup, RowRef
from llamad.cache.meta_wire import LiveEntry
from llamad.cache.populate import prepare_populate
from llamad.cache.publish import PublishOutcome, PublishResult
from llamad.cache.remote import candidate_lengths
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import load_mapped_row, load_row
from llamad.cache.writer import WriterPool
from llamad.errors import LlamadError, RequestTimeout, Unavailable
from llamad.llama_ffi.errors import Closed
from llamad.llama_ffi.state import HostBufferType
from llamad.model import identity
from llamad.model.backend import PackedState
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.cache_view_protocol import CacheView, RowRead
from llamad.model.read_buffer import ReadBuffer, ReadBufferStats
from llamad.model.results import TokenSource, TokenSources
from llamad.model.save_completions import Completed, SaveCompletions
from llamad.model.savepoints import SaveJob

if TYPE_CHECKING:
    from llamad.cache.counters import CounterAdd
    from llamad.cache.remote_store import RemoteRow, RemoteStore
    from llamad.cache.settings import CacheSettings

__all__ = ["PROBE_TIMEOUT_S", "ClientCacheView", "ViewStats"]

log = structlog.get_logger("llamad.model")

PROBE_TIMEOUT_S: Final = 1.0
"""How long one probe of a cache taken for down waits for cache-meta's answer
(then it asks again); also its connect bound. Off the loop: only how soon a
cache that is back is used again depends on it."""
_PROBE_RETRY_S: Final = 0.1
"""Between probes that failed at once (cache-meta dead, not back yet)."""
CONNECT_AHEAD_S: Final = 1.0
"""The most a starting worker waits for cache-meta's first answer (its
handshake, paid at start rather than in the first lookup)."""


@dataclass(slots=True)
class ViewStats:
    """What the view did, for status and tests (loop thread only)."""

    lookups: int = 0
    lookup_failures: int = 0
    lookups_skipped: int = 0
    reads_mapped: int = 0
    reads_copied: int = 0
    reads_with_logits: int = 0
    """Rows read (mapped or copied) that keep logits."""
    read_misses: int = 0
    saves_async: int = 0
    saves_refused: int = 0
    saves_sync: int = 0
    sync_timeouts: int = 0
    saves_skipped: int = 0
    """Sync saves not tried because the cache was down (:attr:`ClientCacheView.cache_down`)."""
    cache_downs: int = 0
    """Times a lookup timeout made the view take the cache for down."""
    remote_lookups: int = 0
    """Lookups that asked the remote tier (the local tiers covered less than it might)."""
    remote_hits: int = 0
    remote_copies: int = 0
    """Rows found on the remote tier handed to the writer pool for a local copy."""


_ROW_SLACK: Final = 64 << 10
"""More than a row's header, namespace and alignment padding take."""


def _releaser(state: PackedState, payload: memoryview | None) -> Callable[[], None]:
    def release() -> None:
        if payload is not None:
            try:
                payload.release()
            except BufferError:
                # Something still exports it; the state's own release decides.
                log.warning("model.state_view_kept", nbytes=state.nbytes)
        state.release()

    return release


def _stored(result: PublishResult) -> bool:
    # A duplicate is a row that exists (or another writer's save of the same
    # bytes in flight): for the core, as good as written.
    return result.stored or result.outcome is PublishOutcome.DUPLICATE


def _published(future: Future[PublishResult], key: bytes) -> bool:
    if future.cancelled():
        return False
    exc = future.exception()
    if exc is not None:
        log.warning("model.save_failed_in_writer", key=key.hex(), error=repr(exc))
        return False
    return _stored(future.result())


class ClientCacheView:
    """The real :class:`~llamad.model.cache_view_protocol.CacheView` (see the module doc).

    ``ctx``: the live context (:class:`llamad.model.identity.LiveContext`),
    read for the namespace and the context size written into each row.
    ``client`` and ``writer`` become the view's: :meth:`close` closes them.
    ``client`` is used from the loop thread only; ``clock`` must be the
    core's (``SaveJob.deadline`` is a time on it). ``probe`` makes the
    connection a thread of the view pings a cache taken for down on
    (without one, lookups are tried again once ``cooldown_s`` has passed). The shell registers
    ``completions.fileno()`` in its poll and feeds ``completions.drain()`` to
    ``WorkerCore.save_done``.
    """

    def __init__(
        self,
        ctx: identity.LiveContext,
        client: CacheClient,
        writer: WriterPool,
        *,
        config: CacheViewConfig | None = None,
        counters: CounterAdd | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[], CacheClient] | None = None,
        remote: RemoteStore | None = None,
        align_tokens: int = 2048,
        host_buffer: HostBufferType | None = None,
    ) -> None:
        self.config = config if config is not None else CacheViewConfig()
        # The shared remote tier (issue 20): asked after the local tiers, in
        # the same resolution, when this model restores from it.
        self._remote = remote if TierKind.REMOTE in self.config.restore_tiers else None
        self._align = align_tokens
        self._fetched: RemoteRow | None = None
        quotas = {k: t.quota for k, t in client.tiers.items() if k in writer.tiers}
        self.restore_tiers = self.config.check_against(quotas)
        # What the lookups send: nothing when this model reads every tier the
        # cache has (the common case, and the cheapest message).
        self._lookup_tiers = (
            None if self.restore_tiers >= client.tiers.keys() else self.restore_tiers
        )
        # An auto save may land in any tier this model restores from that holds bytes.
        self._save_tiers = (
            None
            if self.config.save_tier is not None
            else frozenset(t for t in self.restore_tiers if quotas.get(t, 0) > 0)
        )
        self._ctx = ctx
        self._shared: Namespace | None = None
        self._adapters: tuple[tuple[bytes, float], ...] | None = None
        # Fingerprint the model before anything is opened: a whole-file digest
        # takes seconds, which the first request must not pay, and a file
        # changed since it was loaded is a refusal to start, not a failed request.
        self.namespace(None)
        self._client = client
        self._writer = writer
        # cache-meta's copy-activity board, attached by from_settings.
        self._copies: CopyActivity | None = None
        self._counters = counters
        self._clock = clock
        self.stats = ViewStats()
        self._skip_until = float("-inf")
        # The cache-down state (loop thread) and its probe: the thread sets
        # _answered once cache-meta answers, and clears _probing under the
        # lock as it ends, so the loop never waits on a thread that is done.
        self._down_since: float | None = None
        self._probe_client = probe
        self._answered = threading.Event()
        self._probing = False
        self._probe_lock = threading.Lock()
        self._probe_stop = threading.Event()
        self._probe_thread: threading.Thread | None = None
        # Rows read by copy land here; sized ahead from the rows seen.
        self._buffer = ReadBuffer(host=host_buffer)
        if TierKind.RAM in self.restore_tiers:
            # A ram row is mapped at its first load; what the mapping calls
            # (populate.py) is loaded here, not on that restore's path. When
            # it was cffi's ABI mode, building it was ~11 ms of the first
            # restore after a start (SPEC P2); it is well under 1 ms now.
            prepare_populate()
        self._owned: list[Callable[[], None]] = []
        self._closed = False
        self.completions = SaveCompletions()
        # Saves whose completion is not posted yet. The writer pool's own count
        # drops when its thread finishes writing, before the done callback
        # posts: "nothing in flight, nothing pending" must mean every
        # completion is already in the queue.
        self._unposted = 0
        self._unposted_lock = threading.Lock()
        self._sync = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvc-sync-save")

    @classmethod
    def from_settings(
        cls,
        settings: CacheSettings,
        ctx: identity.LiveContext,
        *,
        config: CacheViewConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        client_name: str = "model-worker",
        align_tokens: int = 2048,
        host_buffer: HostBufferType | None = None,
    ) -> ClientCacheView:
        """A view over the cache ``settings`` describe: a client bounded by the
        config's lookup timeout, this process's counters row, and a writer pool."""
        config = config if config is not None else CacheViewConfig()
        try:
            counters: Counters | None = Counters.attach(settings.counters_path)
        except CountersUnavailable as exc:
            # Counting is not worth refusing to serve over; cache-meta creates
            # the file, and a worker started before it just counts nothing.
            log.warning("model.counters_unavailable", error=repr(exc))
            counters = None
        bound = config.lookup_timeout_s
        client = CacheClient.from_settings(
            settings, timeout=bound, connect_timeout=bound, client_name=client_name
        )

        def probe() -> CacheClient:
            return CacheClient.from_settings(
                settings,
                timeout=PROBE_TIMEOUT_S,
                connect_timeout=PROBE_TIMEOUT_S,
                client_name=f"{client_name}-probe",
            )

        writer: WriterPool | None = None
        remote: RemoteStore | None = None
        try:
            if settings.remote is not None and TierKind.REMOTE in config.restore_tiers:
                # Imported only where a remote tier is configured: the redis
                # package is the optional extra ``remote``.
                from llamad.cache.remote_store import RemoteStore  # noqa: PLC0415

                remote = RemoteStore(settings.remote, counters=counters)
            writer = WriterPool.from_settings(
                settings,
                client_name=f"{client_name}-writer",
                counters=counters,
                threads=config.writer_threads,
            )
            client.load_counters = counters
            view = cls(
                ctx,
                client,
                writer,
                config=config,
                counters=counters,
                clock=clock,
                probe=probe,
                remote=remote,
                align_tokens=align_tokens,
                host_buffer=host_buffer,
            )
        except BaseException:
            client.close()
            if remote is not None:
                remote.close()
            if writer is not None:
                writer.close()
            if counters is not None:
                counters.close()
            raise
        if remote is not None:
            view._owned.append(remote.close)
        if counters is not None:
            view._owned.append(counters.close)
        # cache-meta created it before it served (None: an older file, or none).
        view._copies = CopyActivity.attach(settings.copies_file())
        # The handshake with cache-meta now, not in the first request's lookup
        # (~1.5 ms of the first repeat after a start, SPEC P2). A cache-meta not
        # up yet costs at most this wait; the first lookup then connects, or
        # the view serves cold until cache-meta answers.
        try:
            client.ping(timeout=min(bound, CONNECT_AHEAD_S))
        except (LlamadError, OSError) as exc:
            log.info("model.cache_not_reached_at_start", error=repr(exc))
        if view._copies is not None:
            view._owned.append(view._copies.close)
        return view

    def idle(self) -> None:
        """Prepare the read buffer the rows seen since asked for (see
        :class:`~llamad.model.read_buffer.ReadBuffer`): now, with nothing to
        restore beside it."""
        if not self._closed:
            self._buffer.prepare()

    # -- accounting --------------------------------------------------------------------

    def report_live(self, entries: Sequence[tuple[int, Namespace, Sequence[int]]]) -> None:
        if self._closed:
            return
        live = [LiveEntry(seq, ns.header(), tokens_to_bytes(kv)) for seq, ns, kv in entries]
        try:
            self._client.report_live(live)
        except Exception as exc:
            # A cast never waits for cache-meta; a link that is closed or
            # down loses this report, and the next change sends the whole set.
            log.debug("model.live_report_lost", error=repr(exc))

    def account(self, sources: TokenSources) -> None:
        """Add a resolved request's prompt tokens, by source, to this process's
        counters row (SPEC C10); a live reuse also counts ``hits_live``."""
        counters = self._counters
        if counters is None:
            return
        for source in TokenSource:
            n = sources.of(source)
            if n:
                counters.add(f"prompt_tokens_{source.value}", n)
        if sources.live:
            counters.add("hits_live")

    # -- namespace ---------------------------------------------------------------------

    def namespace(self, salt: bytes | None) -> Namespace:
        """The live context's namespace (recomputed only when its adapters
        change), with ``salt`` folded in when given."""
        ctx = self._ctx
        if ctx.closed:
            raise Closed("context is closed")
        adapters = tuple((adapter.sha256, scale) for adapter, scale in ctx.adapters)
        if self._shared is None or adapters != self._adapters:
            self._shared = identity.namespace(
                ctx, self.config.fingerprint_mode, supplied=self.config.supplied_fingerprint
            )
            self._adapters = adapters
        return identity.salted(self._shared, salt)

    # -- lookups and pins ----------------------------------------------------------------

    def resolve(
        self,
        namespace: Namespace,
        tokens: Sequence[int],
        *,
        parent_key: bytes | None,
        wait_s: float,
    ) -> Lookup:
        """cache-meta's resolve (pinned row); a failing cache raises a typed error."""
        if self.cache_down:
            self.stats.lookups_skipped += 1
            raise Unavailable(
                "the cache is taken for down after a lookup timed out",
                details={"down_s": round(self._clock() - (self._down_since or 0.0), 3)},
            )
        self.stats.lookups += 1
        bound = self.config.lookup_timeout_s
        try:
            found = self._client.resolve(
                namespace,
                tokens,
                parent_key=parent_key,
                wait_s=wait_s,
                timeout=wait_s + bound,
                tiers=self._lookup_tiers,
                heard_within=bound,
            )
        except RequestTimeout:
            self.stats.lookup_failures += 1
            self._went_down()
            raise
        except LlamadError as exc:
            self.stats.lookup_failures += 1
            if isinstance(exc, Unavailable) and exc.details.get("reason") == HANDSHAKE_TIMEOUT:
                # Reconnecting to a cache-meta that does not run: hung as well.
                self._went_down()
            raise
        except Exception as exc:
            # Whatever the transport raised, the request must still run (cold).
            self.stats.lookup_failures += 1
            raise Unavailable(f"cache lookup failed: {exc!r}") from exc
        row = found.row
        if row is not None:
            # Any tier: a ram row read in place now may be demoted and read
            # by copy later; its buffer is then ready.
            self._buffer.note(row.file_size)
        if row is not None and row.tier not in self.restore_tiers:
            # cache-meta answers only the tiers asked for; this guards a
            # cache-meta that would not (it is never trusted with a restore).
            self.checkin(row.pin)
            found = msgspec.structs.replace(found, kind=None, row=None, use_tokens=0)
        if self._remote is not None:
            return self._remote_lookup(namespace, tokens, found)
        return found

    def _remote_lookup(self, namespace: Namespace, tokens: Sequence[int], found: Lookup) -> Lookup:
        """``found`` (the local answer), or a longer row the remote tier holds.

        The remote tier is keyed by exact prefixes (:func:`candidate_lengths`):
        the whole prompt and the cold-save boundaries below it longer than what
        the local tiers cover. A row found is checked (:class:`RemoteStore`),
        handed to the writer pool for a copy in the fastest local tier with
        room, and restored from the bytes read (:meth:`read`)."""
        assert self._remote is not None
        self._fetched = None
        n = len(tokens)
        covered = found.use_tokens if found.row is not None else 0
        if found.inflight_key is not None and found.inflight_tokens > covered:
            return found  # a save in flight here serves it: no need to ask
        lengths = candidate_lengths(
            n, covered, self._align, at_least=self._remote.config.min_tokens
        )
        if not lengths:
            return found
        self.stats.remote_lookups += 1
        keys = namespace.keys_at(tokens, lengths)
        got = self._remote.fetch(namespace, list(zip(keys, lengths, strict=True)))
        if got is None:
            return found
        self.stats.remote_hits += 1
        if found.row is not None:
            self.checkin(found.row.pin)
        self._fetched = got
        self._copy_local(got)
        use = got.meta.n_tokens
        row = RowRef(got.key, TierKind.REMOTE, "", got.meta.file_size, use, None)
        return Lookup(
            kind=HitKind.EXACT if use == n else HitKind.PREFIX,
            row=row,
            use_tokens=use,
            common_tokens=max(use, found.common_tokens),
            common_key=got.key if use >= found.common_tokens else found.common_key,
            probes=found.probes,
        )

    def _copy_local(self, got: RemoteRow) -> None:
        """Save the row read from the remote tier into a local tier (never shared back)."""
        meta = got.meta
        try:
            spec = KvcSpec(
                namespace=meta.namespace,
                tokens=meta.tokens,
                mode=meta.mode,
                reason=meta.reason,
                reason_detail=meta.reason_detail,
                context_size=meta.context_size,
                logits=meta.logits,
            )
            # The future keeps `got` (and so the payload's bytes) alive until written.
            future = self._writer.save_async(
                spec, self.config.save_tier, got.payload, tiers=self._save_tiers
            )
        except Exception as exc:
            log.warning("model.remote_copy_failed", key=got.key.hex(), error=repr(exc))
            return
        if future is not None:
            self.stats.remote_copies += 1

    # -- the cache-down state -------------------------------------------------------------

    @property
    def cache_down(self) -> bool:
        """Whether the cache is taken for down (loop thread): since a lookup
        timed out, for at least ``cooldown_s`` and until cache-meta answered
        the probe. Reading it ends the state once both hold."""
        if self._down_since is None:
            return False
        if self._clock() < self._skip_until:
            return True
        if self._probe_client is not None and not self._answered.is_set():
            return True
        log.info("model.cache_back", down_s=round(self._clock() - self._down_since, 3))
        self._down_since = None
        return False

    def _went_down(self) -> None:
        now = self._clock()
        self._skip_until = now + self.config.cooldown_s
        if self._down_since is None:
            self._down_since = now
            self.stats.cache_downs += 1
            log.warning(
                "model.cache_down",
                lookup_timeout_s=self.config.lookup_timeout_s,
                cooldown_s=self.config.cooldown_s,
            )
        self._answered.clear()
        with self._probe_lock:
            if self._probing or self._probe_client is None or self._closed:
                return
            self._probing = True
        self._probe_thread = threading.Thread(target=self._probe, name="kvc-probe", daemon=True)
        self._probe_thread.start()

    def _probe(self) -> None:
        """Ping cache-meta on a connection of its own until it answers (probe thread)."""
        assert self._probe_client is not None
        client: CacheClient | None = None
        try:
            while not self._probe_stop.is_set():
                try:
                    if client is None:
                        client = self._probe_client()
                    client.ping(PROBE_TIMEOUT_S)
                except RequestTimeout:
                    continue  # stopped or stuck: ask again
                except Exception:
                    # Dead and not back yet, or not registered again yet.
                    self._probe_stop.wait(_PROBE_RETRY_S)
                    continue
                self._answered.set()
                return
        finally:
            with self._probe_lock:
                self._probing = False
            if client is not None:
                client.close()

    def checkin(self, pin: int | None) -> None:
        """Release a pin, without waiting for cache-meta: a cast, so a warm
        request does not pay a round trip between its restore and its first
        token (0.1-0.25 ms of P1's restore, measured). Never raises: a
        release queued while cache-meta is stopped is read once it runs
        again, and one lost to a dead cache-meta died with it (pins are
        released with their owner)."""
        if pin is None:
            return
        try:
            self._client.release(pin)
        except Exception as exc:
            log.info("model.checkin_failed", pin=pin, error=repr(exc))

    # -- reading a row -------------------------------------------------------------------

    @contextmanager
    def read(self, row: RowRef) -> Iterator[RowRead | None]:
        """The row's validated payload for the block (in place for ``ram``, else
        in the reusable buffer) and the logits it keeps; ``None`` when missing
        or damaged."""
        if row.tier is TierKind.REMOTE:
            fetched, self._fetched = self._fetched, None
            if fetched is None or fetched.key != row.key:
                self.stats.read_misses += 1
                yield None
                return
            self.stats.reads_copied += 1
            self._count_logits(fetched.meta.logits)
            yield RowRead(fetched.payload, fetched.meta.logits)
            return
        tier = self._client.tiers.get(row.tier)
        if tier is None or row.tier not in self.restore_tiers:
            self.stats.read_misses += 1
            yield None
            return
        if row.tier is TierKind.RAM:
            try:
                # The checksum runs beside the restore's unpack, which checks
                # it before anything reads the cells (RowRead.check): the two
                # take about as long, and they no longer add up.
                with load_mapped_row(
                    tier, row.location, self._counters, check_beside=True
                ) as mapped:
                    if mapped is None:
                        self._missed(row)
                        yield None
                        return
                    yield RowRead(mapped.payload, mapped.meta.logits, mapped.check)
            except KvcCorrupt:
                self._missed(row)
                raise
            # Counted once its checksum passed (a damaged one is a miss).
            self.stats.reads_mapped += 1
            self._count_logits(mapped.meta.logits)
            return
        buffer = self._buffer.take(row.file_size)
        meta = load_row(tier, row.location, buffer.memory, self._counters)
        if meta is None:
            self._missed(row)
            yield None
            return
        self.stats.reads_copied += 1
        self._count_logits(meta.logits)
        payload = buffer.memory[: meta.payload_len]
        try:
            yield RowRead(payload, meta.logits)
        finally:
            payload.release()

    def _count_logits(self, logits: KvcLogits | None) -> None:
        if logits is not None:
            self.stats.reads_with_logits += 1

    def read_buffer(self) -> ReadBufferStats:
        """The buffer rows read by copy go through (see :class:`ReadBuffer`)."""
        return self._buffer.stats()

    def read_buffer_ready(self, timeout: float | None = None) -> bool:
        """Whether the buffer asked for ahead is in place within ``timeout``
        (loop thread; tests and benches)."""
        return self._buffer.wait_ready(timeout)

    def _missed(self, row: RowRef) -> None:
        self.stats.read_misses += 1
        if self.cache_down:
            return  # the loader deleted the file; cache-meta notices it later
        try:
            # Only the copy this read found missing or damaged: the row's
            # copies in other tiers stay served.
            self._client.forget(row.key, tier=row.tier)
        except Exception as exc:
            # The loader deleted the file; cache-meta drops the row when it
            # next finds the file gone.
            log.info("model.forget_failed", key=row.key.hex(), error=repr(exc))

    # -- saves -------------------------------------------------------------------------

    def save(self, job: SaveJob, state: PackedState) -> bool:
        """Write ``state`` as ``job``'s row (see the module doc); owns ``state``."""
        payload: memoryview | None = None
        try:
            if self._closed:
                raise Unavailable("the cache view is closed")
            spec = KvcSpec(
                namespace=job.namespace,
                tokens=tokens_to_bytes(job.tokens),
                mode=self.config.fingerprint_mode,
                reason=job.reason,
                reason_detail=f"seq={job.seq}",
                context_size=self._ctx.n_ctx,
                logits=job.logits,
            )
            payload = state.view()
            # The row's file will be about this large (payload, the tokens
            # and logits it keeps, a header rounded up): its read buffer is
            # made ready ahead of the turn that restores it.
            logits_bytes = 0 if job.logits is None else 4 * job.logits.count
            self._buffer.note(payload.nbytes + logits_bytes + 4 * len(job.tokens) + _ROW_SLACK)
        except Exception as exc:
            _releaser(state, payload)()
            log.warning("model.save_not_started", key=job.key.hex(), error=repr(exc))
            return False
        release = _releaser(state, payload)
        if job.sync:
            if self.cache_down:
                # Its reservation would hold the loop for its whole deadline.
                # (An async save is still tried: a writer thread waits, not
                # the loop, and the pool's permits bound how many.)
                self.stats.saves_skipped += 1
                release()
                return False
            return self._save_sync(job, spec, payload, release)
        return self._save_async(job, spec, payload, release)

    def _save_async(
        self, job: SaveJob, spec: KvcSpec, payload: memoryview, release: Callable[[], None]
    ) -> bool:
        key, post = job.key, self._post_counted

        share, n_tokens = self._share, spec.n_tokens

        def done(future: Future[PublishResult]) -> None:
            stored = _published(future, key)
            if stored:
                share(future.result(), n_tokens)
            post(Completed(key, stored, release))

        self._count_unposted(+1)
        try:
            future = self._writer.save_async(
                spec, self.config.save_tier, payload, on_done=done, tiers=self._save_tiers
            )
        except Exception as exc:
            log.warning("model.save_refused", key=key.hex(), error=repr(exc))
            future = None
        if future is None:
            self._count_unposted(-1)
            self.stats.saves_refused += 1
            release()
            return False
        self.stats.saves_async += 1
        return True

    def _save_sync(
        self, job: SaveJob, spec: KvcSpec, payload: memoryview, release: Callable[[], None]
    ) -> bool:
        if job.deadline is None:
            budget = self.config.sync_save_timeout_s
        else:
            budget = job.deadline - self._clock()
        self.stats.saves_sync += 1
        if budget <= 0:
            self.stats.sync_timeouts += 1
            release()
            return False
        future = self._sync.submit(
            self._writer.save_sync,
            spec,
            self.config.save_tier,
            payload,
            timeout_s=budget,
            tiers=self._save_tiers,
        )
        try:
            result = future.result(timeout=budget)
        except FutureTimeout:
            self.stats.sync_timeouts += 1
            log.warning("model.sync_save_timed_out", key=job.key.hex(), budget_s=round(budget, 3))
            if future.cancel():
                release()
            else:
                # Still writing: its buffer comes back when it is done.
                key, post = job.key, self._post_counted
                self._count_unposted(+1)
                future.add_done_callback(
                    lambda f: post(Completed(key, _published(f, key), release, report=False))
                )
            return False
        except Exception as exc:
            log.warning("model.sync_save_failed", key=job.key.hex(), error=repr(exc))
            release()
            return False
        release()
        self._share(result, spec.n_tokens)
        return _stored(result)

    def _share(self, result: PublishResult, n_tokens: int) -> None:
        """Offer a row this worker saved to the remote tier (write-behind).

        Every published row at least ``[cache.remote] min_tokens`` long is
        worth sharing: it was worth saving here, and the threshold keeps
        the rows a prefill beats off the network. A duplicate (the row was
        already saved) is not offered again."""
        remote = self._remote
        if remote is None or not result.stored or result.location is None:
            return
        try:
            remote.offer(result.key, result.location, n_tokens)
        except Exception as exc:
            log.warning("model.remote_offer_failed", key=result.key.hex(), error=repr(exc))

    # -- lifetime ----------------------------------------------------------------------

    def in_flight(self) -> int:
        """Saves handed to writer threads whose completion is not posted yet:
        once this is 0, every finished save is in :attr:`completions`."""
        with self._unposted_lock:
            return self._unposted

    def quiet_epoch(self) -> int | None:
        """The daemon's own background work, for the thread governor's
        ``own_work``: None while this process's writer pool saves
        (:meth:`~llamad.cache.writer.WriterPool.quiet_epoch`) or cache-meta
        copies a row (:class:`~llamad.cache.activity.CopyActivity`); otherwise
        the sum of both epochs, which moves whenever either does."""
        own = self._writer.quiet_epoch()
        copies = self._copies
        if own is None or copies is None:
            return own
        theirs = copies.quiet_epoch()
        return None if theirs is None else own + theirs

    def _count_unposted(self, delta: int) -> None:
        with self._unposted_lock:
            self._unposted += delta

    def _post_counted(self, done: Completed) -> None:
        """Post a counted save's completion, then stop counting it (any thread)."""
        try:
            self.completions.post(done)
        finally:
            self._count_unposted(-1)

    def close(self, *, wait: bool = True) -> list[tuple[bytes, bool]]:
        """Refuse new saves, let accepted ones finish (``wait``), release every
        state, close the connections; answers the completions not drained yet."""
        self._closed = True
        self._probe_stop.set()
        if self._probe_thread is not None:
            self._probe_thread.join(PROBE_TIMEOUT_S + 1.0)
        # The save thread first: it writes through a connection the pool
        # closes once its own threads are done.
        self._sync.shutdown(wait=wait, cancel_futures=not wait)
        self._writer.close(wait=wait)
        left = self.completions.close()
        self._client.close()
        self._buffer.close()
        for close in self._owned:
            close()
        self._owned = []
        return left


def _is_a_cache_view(view: ClientCacheView) -> CacheView:
    """Never called: mypy checks here that the view implements the protocol."""
    return view
