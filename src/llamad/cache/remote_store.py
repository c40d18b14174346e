"""The ``remote`` tier's I/O: a Redis server several daemons share (issue 20, SPEC C12).

One :class:`RemoteStore` per model worker process (the process that owns KV
bytes, as for the writer pool). Its layout in Redis is :mod:`llamad.cache.remote`'s.

- **Lookups** (the worker's loop thread): one ``MGET`` of the candidate rows'
  manifests, bounded by ``timeout_ms``; for the longest found, one ``MGET``
  of its chunks, bounded by ``fetch_timeout_ms``. The bytes are checked
  like every tier's: the manifest's size and CRC32C, then the ``.kvc``
  checks (header, TLV and payload CRCs, the key recomputed from the TLV)
  and the namespace against the reader's. A manifest whose chunks Redis has
  evicted is a counted miss (``remote_evicted``); damaged bytes are a counted
  miss (``remote_damaged``), and the row is deleted there.
- **Writes** (write-behind): a published local row is offered to one thread
  of the store, which reads its file, checks it, and stores it in one
  ``MULTI`` (chunks, then the manifest with ``NX``), then adds it to the
  ledger (a Lua script that also evicts the least recently used rows while
  the ledger's total is over ``quota``). The queue is bounded (``queue``); a
  row offered to a full one is dropped and counted (``remote_saves_dropped``).
- **Failures**: a timeout, a refused connection or an error reply is
  counted (``remote_errors``, and ``remote_timeouts`` for timeouts), logged
  as ``cache.remote_failed`` with its ``op`` and ``kind``, and opens the
  breaker: every operation skips the tier at once (``remote_skipped``) for a
  backoff that doubles from ``retry_min_ms`` to ``retry_max_ms``; then one
  operation tries again, and its success closes it (``cache.remote_back``,
  ``remote_reconnects``). redis-py's own retries are off, so no call waits
  longer than its socket timeout, and no client storms a server that is back.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from llamad.cache.errors import KvcCorrupt
from llamad.cache.key import Namespace
from llamad.cache.kvc import KvcMeta, parse
from llamad.cache.remote import (
    WRITE_ID_LEN,
    Manifest,
    RemoteConfig,
    RemoteDamaged,
    assemble,
    row_name,
    split,
)

if TYPE_CHECKING:
    from llamad.cache.counters import CounterAdd

__all__ = ["RemoteRow", "RemoteStore"]

log = structlog.get_logger("llamad.cache.remote")

# The ledger (llamad's byte accounting of the tier). KEYS: the sorted set of
# rows by last use, the hash of each row's "size chunks write_id", the total.
# Rows of one prefix are named from the prefix (ARGV), which a single Redis
# server allows (not a cluster: there, every key a script touches must be
# in KEYS).
_ADD: Final = """
local added = redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
if added == 1 then
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
  redis.call('INCRBY', KEYS[3], ARGV[5])
end
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local quota = tonumber(ARGV[3])
local evicted = 0
while total > quota do
  local victim = redis.call('ZPOPMIN', KEYS[1])
  if #victim == 0 then
    redis.call('SET', KEYS[3], 0)
    break
  end
  local m = victim[1]
  local info = redis.call('HGET', KEYS[2], m)
  redis.call('HDEL', KEYS[2], m)
  redis.call('DEL', ARGV[6] .. ':row:' .. m)
  if info then
    local size, n, wid = string.match(info, '^(%d+) (%d+) (%x+)$')
    for i = 0, tonumber(n) - 1 do
      redis.call('DEL', ARGV[6] .. ':chunk:' .. m .. ':' .. wid .. ':' .. i)
    end
    total = redis.call('DECRBY', KEYS[3], size)
  end
  evicted = evicted + 1
end
return evicted
"""

# Drop one row: its manifest, its chunks and its ledger entry (damaged, or
# its chunks evicted by Redis behind the ledger's back).
_FORGET: Final = """
local m = ARGV[1]
local info = redis.call('HGET', KEYS[2], m)
redis.call('DEL', ARGV[2] .. ':row:' .. m)
if info then
  local size, n, wid = string.match(info, '^(%d+) (%d+) (%x+)$')
  for i = 0, tonumber(n) - 1 do
    redis.call('DEL', ARGV[2] .. ':chunk:' .. m .. ':' .. wid .. ':' .. i)
  end
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZREM', KEYS[1], m)
  redis.call('DECRBY', KEYS[3], size)
end
return info and 1 or 0
"""


@dataclass(frozen=True, slots=True)
class RemoteRow:
    """A row read back from the remote tier, every check passed."""

    key: bytes
    meta: KvcMeta
    payload: memoryview
    """A view into ``data``: what ``llama_state_seq_set_data`` takes."""
    data: bytes
    """The whole ``.kvc`` file's bytes."""


def _kind(exc: BaseException) -> str:
    if isinstance(exc, redis.TimeoutError):
        return "timeout"
    if isinstance(exc, redis.ConnectionError):
        return "connection"
    if isinstance(exc, redis.ResponseError):
        return "response"
    return type(exc).__name__


def _bytes(value: bytes | str) -> bytes:
    # The clients never decode responses: a str here would be a bug.
    if not isinstance(value, bytes):
        raise RemoteDamaged("type")
    return value


_STOP: Final = object()


class RemoteStore:
    """The remote tier for one process (see the module doc). Thread-safe as used:
    :meth:`fetch` from one thread (the worker's loop), :meth:`offer` from any."""

    def __init__(
        self,
        config: RemoteConfig,
        *,
        counters: CounterAdd | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._counters = counters
        self._clock = clock
        self._prefix = config.prefix
        self._ledger_keys = [
            f"{config.prefix}:ledger".encode(),
            f"{config.prefix}:sizes".encode(),
            f"{config.prefix}:bytes".encode(),
        ]
        fast = config.timeout_ms / 1000.0
        slow = config.fetch_timeout_ms / 1000.0
        # One client per use, each with its own bound: the manifest probe
        # (loop), the row read (loop) and the writes (the store's thread).
        self._probe = self._client(fast, fast)
        self._fetch = self._client(slow, fast)
        self._push = self._client(slow, slow)
        self._add = self._push.register_script(_ADD)
        self._forget = self._push.register_script(_FORGET)
        self._lock = threading.Lock()
        self._down_until = float("-inf")
        self._down_since: float | None = None
        self._backoff = config.retry_min_ms / 1000.0
        self._jobs: queue.Queue[object] = queue.Queue(maxsize=config.queue)
        self._thread = threading.Thread(target=self._run, name="kvc-remote", daemon=True)
        self._thread.start()

    def _client(self, timeout_s: float, connect_s: float) -> redis.Redis:
        return redis.Redis.from_url(
            self.config.url,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_s,
            # No retries inside redis-py: one try per operation, then the
            # breaker's backoff (its default would retry three times).
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
            max_connections=4,
        )

    # -- counters and the breaker ---------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        if self._counters is not None:
            self._counters.add(name, n)

    def available(self) -> bool:
        """Whether the next operation may try Redis (the breaker is closed, or its backoff over)."""
        with self._lock:
            return self._clock() >= self._down_until

    def _failed(self, op: str, exc: BaseException) -> None:
        kind = _kind(exc)
        self._count("remote_errors")
        if kind == "timeout":
            self._count("remote_timeouts")
        with self._lock:
            now = self._clock()
            backoff = self._backoff
            self._down_until = now + backoff
            self._backoff = min(backoff * 2, self.config.retry_max_ms / 1000.0)
            if self._down_since is None:
                self._down_since = now
        log.warning(
            "cache.remote_failed", op=op, kind=kind, error=repr(exc), retry_in_s=round(backoff, 3)
        )

    def _succeeded(self) -> None:
        with self._lock:
            since = self._down_since
            self._down_since = None
            self._backoff = self.config.retry_min_ms / 1000.0
        if since is not None:
            self._count("remote_reconnects")
            log.info("cache.remote_back", down_s=round(self._clock() - since, 3))

    # -- lookups ---------------------------------------------------------------------------

    def fetch(
        self, namespace: Namespace, candidates: Sequence[tuple[bytes, int]]
    ) -> RemoteRow | None:
        """The longest of ``candidates`` (``(key, n_tokens)``, longest first) the tier
        holds intact, or ``None``. Never raises for Redis's sake: every failure
        is a counted miss within the bounds."""
        if not candidates:
            return None
        if not self.available():
            self._count("remote_skipped")
            return None
        names = [row_name(self._prefix, key) for key, _ in candidates]
        try:
            manifests = self._probe.mget(names)
        except redis.RedisError as exc:
            self._failed("lookup", exc)
            return None
        self._succeeded()
        # Each lookup counts once: a hit, a row found unusable (evicted by
        # Redis, damaged: counted as such), or a miss (no row there at all).
        unusable = False
        for (key, n_tokens), raw in zip(candidates, manifests, strict=True):
            if raw is None:
                continue
            try:
                manifest = Manifest.decode(_bytes(raw), key)
                chunks = self._fetch.mget(manifest.chunk_names(self._prefix))
                data = assemble(manifest, [None if c is None else _bytes(c) for c in chunks])
                meta, payload = parse(data, expected_key=key)
                if meta.namespace != namespace or meta.n_tokens != n_tokens:
                    # The key recomputed from the TLV is the key asked for, so
                    # this cannot happen but by a hash collision: never restored.
                    raise RemoteDamaged("identity")
            except redis.RedisError as exc:
                self._failed("fetch", exc)
                return None
            except LookupError:
                # Redis's own LRU took a chunk behind the ledger's back.
                self._count("remote_evicted")
                log.info("cache.remote_evicted", key=key.hex())
                self._drop(key)
                unusable = True
                continue
            except (RemoteDamaged, KvcCorrupt) as exc:
                self._count("remote_damaged")
                log.warning("cache.remote_damaged", key=key.hex(), reason=exc.reason)
                self._drop(key)
                unusable = True
                continue
            self._count("remote_hits")
            self._touch(key)
            return RemoteRow(key, meta, payload, data)
        if not unusable:
            self._count("remote_misses")
        return None

    def _touch(self, key: bytes) -> None:
        self._submit(("touch", key))

    def _drop(self, key: bytes) -> None:
        self._submit(("forget", key))

    # -- writes ----------------------------------------------------------------------------

    def offer(self, key: bytes, location: str, n_tokens: int) -> bool:
        """Write the published row at ``location`` to the tier in the background
        (if it is long enough); ``False`` when it was not queued."""
        if n_tokens < self.config.min_tokens:
            return False
        if not self.available():
            self._count("remote_saves_dropped")
            return False
        if not self._submit(("save", key, location)):
            self._count("remote_saves_dropped")
            return False
        return True

    def _submit(self, job: tuple[Any, ...]) -> bool:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is _STOP:
                    return
                assert isinstance(job, tuple)
                self._do(job)
            finally:
                self._jobs.task_done()

    def _do(self, job: tuple[Any, ...]) -> None:
        op = job[0]
        try:
            if op == "save":
                self._save(job[1], job[2])
            elif op == "forget":
                self._forget(keys=self._ledger_keys, args=[job[1].hex(), self._prefix])
            elif op == "touch":
                self._push.zadd(self._ledger_keys[0], {job[1].hex(): time.time()}, xx=True)
        except redis.RedisError as exc:
            self._failed(op, exc)
            if op == "save":
                self._count("remote_saves_failed")
        except Exception as exc:
            log.warning("cache.remote_job_failed", op=op, error=repr(exc))
            if op == "save":
                self._count("remote_saves_failed")

    def _read_row(self, key: bytes, location: str) -> bytes | None:
        """The published file's bytes, checked; ``None`` if it is gone or (twice) damaged.

        cache-meta rewrites a header's hit count in place, so one torn read
        of the header is read again."""
        for _ in range(2):
            try:
                with open(location, "rb") as f:
                    data = f.read()
            except OSError:
                return None
            try:
                parse(data, expected_key=key)
            except KvcCorrupt:
                continue
            return data
        return None

    def _save(self, key: bytes, location: str) -> None:
        if not self.available():
            self._count("remote_saves_dropped")
            return
        data = self._read_row(key, location)
        if data is None:
            self._count("remote_saves_dropped")
            return
        name = row_name(self._prefix, key)
        if self._push.exists(name):
            self._count("remote_saves_duplicate")
            self._succeeded()
            return
        write_id = os.urandom(WRITE_ID_LEN)
        manifest, chunks = split(data, key, write_id, self.config.chunk_bytes)
        pipe = self._push.pipeline(transaction=True)
        for chunk_key, chunk in zip(manifest.chunk_names(self._prefix), chunks, strict=True):
            pipe.set(chunk_key, bytes(chunk))
        pipe.set(name, manifest.encode(), nx=True)
        replies = pipe.execute()
        if not replies[-1]:
            # Another daemon stored the row in between: ours are orphans.
            self._push.delete(*manifest.chunk_names(self._prefix))
            self._count("remote_saves_duplicate")
            self._succeeded()
            return
        info = f"{manifest.size} {manifest.n_chunks} {write_id.hex()}"
        evicted = int(
            self._add(
                keys=self._ledger_keys,
                args=[key.hex(), info, self.config.quota, time.time(), manifest.size, self._prefix],
            )
        )
        self._succeeded()
        self._count("remote_saves")
        self._count("remote_bytes_written", manifest.size)
        if evicted:
            self._count("remote_evictions", evicted)
        log.debug("cache.remote_saved", key=key.hex(), size=manifest.size, evicted=evicted)

    # -- lifetime --------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued job is done (tests, a clean stop); whether it was."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._jobs.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False

    def close(self, *, wait_s: float = 2.0) -> None:
        """Stop the write thread (after the queued jobs, at most ``wait_s``) and disconnect."""
        with contextlib.suppress(queue.Full):
            self._jobs.put(_STOP, timeout=wait_s)
        self._thread.join(wait_s)
        for client in (self._probe, self._fetch, self._push):
            client.close()
