"""Helpers for the ClientCacheView tests: a real cache-meta process, a stand-in
live context, a packed state over a real StateBuffer, and a loop that drives a
WorkerCore the way the worker's shell does (step, then hand finished saves to
``save_done`` when the completions fd is readable)."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from llamad.cache.lookup import LookupPolicy
from llamad.cache.policy import CachePolicy
from llamad.cache.settings import CacheSettings
from llamad.llama_ffi import Context, Model
from llamad.llama_ffi.options import ContextOptions
from llamad.llama_ffi.state import StateBuffer
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.client_cache_view import ClientCacheView
from llamad.model.config import WorkerConfig
from llamad.model.core import WorkerCore
from llamad.model.llama_backend import LlamaBackend
from llamad.model.requests import RequestParams
from llamad.model.results import Completion, DoneEvent, ErrorEvent, Event
from llamad.model.stub import StubBackend
from llamad.testing import MetaProcess, discard_scratch, scratch_settings

DIGEST = b"\x5a" * 32

# Small numbers so a test's prompts cross every save boundary in a few ticks.
SMALL_POLICY = CachePolicy(
    min_tokens=8,
    cold_min_tokens=8,
    cold_max_tokens=10_000,
    continued_interval=16,
    boundary_trim_tokens=2,
    boundary_align_tokens=8,
    session_resume_wait_ms=500,
    evict_save_timeout_ms=2_000,
)


class FakeModel:
    """What identity.namespace reads of a model; ``fast_unsafe`` never opens the path."""

    def __init__(self, ftype: int = 3) -> None:
        self.path = "/nonexistent/stub-model.gguf"
        self.ftype = ftype
        self.file_identity = (0, 0, 0, 0)


class FakeAdapter:
    def __init__(self, digest: bytes) -> None:
        self.sha256 = digest


class FakeContext:
    """A LiveContext for the stub backend: real ContextOptions, no llama.cpp context."""

    def __init__(self, n_ctx: int = 1024, n_seq_max: int = 2) -> None:
        self.model = FakeModel()
        self.options = ContextOptions(n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=1)
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.adapters: tuple[tuple[FakeAdapter, float], ...] = ()
        self.closed = False


def stub_config(**overrides: Any) -> CacheViewConfig:
    fields: dict[str, Any] = {
        "fingerprint_mode": "fast_unsafe",
        "supplied_fingerprint": DIGEST,
        **overrides,
    }
    return CacheViewConfig(**fields)


class Meta:
    """One cache-meta process for a test module; can be killed and started again."""

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        self.proc = MetaProcess(settings).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.proc is not None and self.proc.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        assert self.proc.proc is not None
        self.proc.proc.wait(30)
        self.proc.stop()

    def restart(self) -> None:
        self.proc.stop()  # also reaps a killed one and removes its settings file
        self.proc = MetaProcess(self.settings).start()

    def ensure(self) -> None:
        if not self.alive():
            self.restart()

    def stop(self) -> None:
        self.proc.stop()


class BufferState:
    """A PackedState over a real pre-faulted StateBuffer (what the backend's lease is)."""

    def __init__(self, buffer: StateBuffer, nbytes: int) -> None:
        self.buffer = buffer
        self._nbytes = nbytes
        self.released = 0
        self.views: list[memoryview] = []

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def view(self) -> memoryview:
        v = self.buffer.view(self._nbytes)
        self.views.append(v)
        return v

    def release(self) -> None:
        self.released += 1


def settle_saves(view: ClientCacheView, timeout: float = 30.0) -> list[tuple[bytes, bool]]:
    """Wait (on the completions fd) until every accepted save finished; drained pairs."""
    out: list[tuple[bytes, bool]] = []
    deadline = time.monotonic() + timeout
    while view.in_flight() or view.completions.pending():
        left = deadline - time.monotonic()
        assert left > 0, "saves did not finish"
        select.select([view.completions.fileno()], [], [], min(left, 0.5))
        out += view.completions.drain()
    out += view.completions.drain()
    return out


@dataclass
class Driver:
    """A WorkerCore over a backend and a ClientCacheView, driven like the shell."""

    core: WorkerCore
    backend: Any
    view: ClientCacheView
    events: dict[str, list[Event]] = field(default_factory=dict)
    saved: list[tuple[bytes, bool]] = field(default_factory=list)

    def submit(self, rid: str, tokens: Sequence[int], **params: Any) -> None:
        self.core.submit(rid, tokens, RequestParams(**{"temperature": 0.0, **params}))

    def _feed_saves(self) -> None:
        for key, published in self.view.completions.drain():
            self.saved.append((key, published))
            self.core.save_done(key, published)

    def run(self, max_ticks: int = 10_000, *, settle: bool = True) -> None:
        """Step until no request is left (and, with ``settle``, every save reported back)."""
        for _ in range(max_ticks):
            if not self.core.requests:
                break
            report = self.core.step()
            for rid, ev in report.events:
                self.events.setdefault(rid, []).append(ev)
            self._feed_saves()
        else:
            raise AssertionError("requests still running")
        if not settle:
            return
        for key, published in settle_saves(self.view):
            self.saved.append((key, published))
            self.core.save_done(key, published)

    def result(self, rid: str) -> Completion:
        last = self.events[rid][-1]
        assert isinstance(last, DoneEvent), last
        return last.result

    def complete(self, rid: str, tokens: Sequence[int], **params: Any) -> Completion:
        self.submit(rid, tokens, **params)
        self.run()
        return self.result(rid)

    def error(self, rid: str) -> ErrorEvent:
        last = self.events[rid][-1]
        assert isinstance(last, ErrorEvent), last
        return last


def make_driver(
    view: ClientCacheView,
    *,
    n_ctx: int = 1024,
    n_batch: int = 64,
    n_seq_max: int = 2,
    live_reuse: bool = False,
) -> Driver:
    """A core over the stub backend and ``view``. These tests are about the
    cache, so by default a finished request leaves no idle entry
    (``live_reuse``): a repeat then goes through the view."""
    backend = StubBackend(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max)
    cfg = WorkerConfig(
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_seq_max=n_seq_max,
        prefill_chunk_size=16,
        policy=SMALL_POLICY,
        live_reuse=live_reuse,
    )
    return Driver(WorkerCore(cfg, backend, view), backend, view)


def prompt(n: int, start: int = 1) -> list[int]:
    """``n`` tokens inside the stub's 256-token vocabulary."""
    return [(start + 7 * i) % 250 + 1 for i in range(n)]


@contextmanager
def scratch_cache(prefix: str) -> Iterator[tuple[CacheSettings, Meta]]:
    """A scratch cache and its running cache-meta for a module of real-model tests.

    One copy per row (no write-behind to disk): these modules damage the
    files of rows they saved, and a mover copying the row (or finding the
    damage first) would race what they check. test_cache_view_model.py
    covers a real model's rows written behind to disk.
    """
    settings = scratch_settings(
        prefix=prefix,
        stats_flush_s=0.5,
        lookup=LookupPolicy(common_min_tokens=8),
        write_behind=False,
    )
    try:
        meta = Meta(settings)
        try:
            yield settings, meta
        finally:
            meta.stop()
    finally:
        discard_scratch(settings)


def real_context(model: Model) -> Context:
    """The real model's context for WorkerCore tests: 2 unified sequences, 1 thread."""
    return model.context(
        ContextOptions(
            n_ctx=1024,
            n_batch=256,
            n_ubatch=256,
            n_seq_max=2,
            kv_unified=True,
            n_threads=1,
            n_threads_batch=1,
        )
    )


@contextmanager
def real_driver(
    ctx: Context,
    settings: CacheSettings,
    backend: LlamaBackend,
    *,
    chunk: int,
    live_reuse: bool = False,
) -> Iterator[Driver]:
    """WorkerCore over ``backend`` and a ClientCacheView of ``settings``' cache,
    on a cleared ``ctx``; on exit every packed state must have come back. As
    in :func:`make_driver`, no idle entries unless ``live_reuse``."""
    ctx.clear()
    view = ClientCacheView.from_settings(settings, ctx, config=CacheViewConfig())
    cfg = WorkerConfig(
        n_ctx=ctx.n_ctx,
        n_batch=ctx.n_batch,
        n_seq_max=ctx.n_seq_max,
        prefill_chunk_size=chunk,
        policy=SMALL_POLICY,
        live_reuse=live_reuse,
    )
    drv = Driver(WorkerCore(cfg, backend, view), backend, view)
    try:
        yield drv
    finally:
        drv.core.shutdown()
        view.close()
        assert backend.pool.leased == 0  # every packed state came back
        backend.close()
