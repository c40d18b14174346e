"""ggml threadpools and how many threads a decode runs on (SPEC M14).

A :class:`Threadpool` owns one ``ggml_threadpool``; :meth:`Context.attach_threadpool
<llamad.llama_ffi.context.Context.attach_threadpool>` makes a context compute on
it and :meth:`Context.set_threads <llamad.llama_ffi.context.Context.set_threads>`
changes the thread count between decodes (``llama_set_n_threads`` only stores
two integers; the next decode uses them).

What a pool does depends on how ggml was built (``docs/internals/threads.md``
has the measurements):

* **OpenMP builds** (the pinned CPU build: :func:`openmp_build`): ggml runs
  each graph in an ``omp parallel`` region and its barriers are libgomp's. A
  pool then only carries the threads' priority and CPU mask; ``poll`` is never
  read. How long a thread spins at a barrier before it sleeps is libgomp's
  ``GOMP_SPINCOUNT``, read once when libgomp loads (see :mod:`llamad.llama_ffi.spin`).
* **Builds without OpenMP**: the pool's threads persist between decodes and
  ``poll`` (0-100) says how long they spin waiting for the next graph.

Two hazards are checked here instead of left to ggml:

* a context asked to compute on more threads than its attached pool has
  indexes past the pool's per-thread array (measured: a segfault), so
  :class:`~llamad.llama_ffi.errors.ThreadsExceedPool` is raised first;
* a priority above ``NORMAL`` switches every computing thread to
  ``SCHED_FIFO``, *including the thread that called decode*, which keeps it
  afterwards (measured on the pinned build). It needs ``CAP_SYS_NICE`` and
  starves every other process on those cores while a decode runs, so it is
  only ever an operator's explicit choice.
"""

from __future__ import annotations

import enum
import functools
import weakref
from dataclasses import dataclass
from typing import Any

from llamad.errors import ConfigError
from llamad.llama_ffi.errors import ThreadpoolError
from llamad.llama_ffi.lifetime import NativeHandle
from llamad.llama_ffi.native import ffi, lib, system_info

__all__ = [
    "MAX_THREADS",
    "ThreadPriority",
    "Threadpool",
    "ThreadpoolOptions",
    "openmp_build",
    "worker_threadpool",
]

MAX_THREADS: int = int(lib.GGML_MAX_N_THREADS)
"""ggml's hard limit on threads per pool (and on CPU ids in a mask)."""


class ThreadPriority(enum.IntEnum):
    """Scheduling priority of a pool's threads (``ggml_sched_priority``).

    On Linux ``LOW`` is ``SCHED_BATCH``, ``NORMAL`` keeps the inherited policy,
    ``MEDIUM``/``HIGH``/``REALTIME`` are ``SCHED_FIFO`` 40/80/90.
    """

    LOW = int(lib.GGML_SCHED_PRIO_LOW)
    NORMAL = int(lib.GGML_SCHED_PRIO_NORMAL)
    MEDIUM = int(lib.GGML_SCHED_PRIO_MEDIUM)
    HIGH = int(lib.GGML_SCHED_PRIO_HIGH)
    REALTIME = int(lib.GGML_SCHED_PRIO_REALTIME)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(name: str, message: str) -> ConfigError:
    return ConfigError(f"{name}: {message}", details={"field": name})


@dataclass(frozen=True)
class ThreadpoolOptions:
    """How a :class:`Threadpool` is built; validated at construction.

    ``n_threads`` is the most threads any context on the pool may use.
    ``poll`` (0-100) only matters without OpenMP: 0 lets idle threads sleep
    between decodes instead of spinning. ``cpus`` restricts the threads to
    those CPU ids (empty: inherit the process's affinity); ``strict_cpu``
    pins one thread per listed CPU instead of letting all share the set.
    """

    n_threads: int
    priority: ThreadPriority = ThreadPriority.NORMAL
    poll: int = 0
    cpus: tuple[int, ...] = ()
    strict_cpu: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.n_threads) or not 1 <= self.n_threads <= MAX_THREADS:
            raise _bad(
                "n_threads", f"must be an integer in [1, {MAX_THREADS}], not {self.n_threads!r}"
            )
        try:
            prio = (
                ThreadPriority[self.priority.upper()]
                if isinstance(self.priority, str)
                else ThreadPriority(self.priority)
            )
        except (KeyError, ValueError):
            names = ", ".join(p.name.lower() for p in ThreadPriority)
            raise _bad("priority", f"{self.priority!r} is not one of {names}") from None
        object.__setattr__(self, "priority", prio)
        if not _is_int(self.poll) or not 0 <= self.poll <= 100:
            raise _bad("poll", f"must be an integer in [0, 100], not {self.poll!r}")
        cpus = tuple(self.cpus)
        if any(not _is_int(c) or not 0 <= c < MAX_THREADS for c in cpus):
            raise _bad("cpus", f"CPU ids must be integers in [0, {MAX_THREADS}), not {cpus!r}")
        if len(set(cpus)) != len(cpus):
            raise _bad("cpus", f"CPU ids must be distinct, not {cpus!r}")
        object.__setattr__(self, "cpus", cpus)
        if not isinstance(self.strict_cpu, bool):
            raise _bad("strict_cpu", f"must be a bool, not {self.strict_cpu!r}")
        if self.strict_cpu and not cpus:
            raise _bad("strict_cpu", "needs the CPUs to pin to (cpus)")


def _pool_free(ptr: Any) -> None:
    lib.ggml_threadpool_free(ptr)


class Threadpool:
    """One ``ggml_threadpool``; freed on :meth:`close` once no context uses it.

    Contexts that attach the pool lease it, so closing a pool that is still
    attached defers the free to the last detach (or the context's close).
    """

    def __init__(self, options: ThreadpoolOptions | int) -> None:
        opts = options if isinstance(options, ThreadpoolOptions) else ThreadpoolOptions(options)
        self.options = opts
        params = ffi.new("struct ggml_threadpool_params *")
        params[0] = lib.ggml_threadpool_params_default(opts.n_threads)
        params.prio = int(opts.priority)
        params.poll = opts.poll
        params.strict_cpu = opts.strict_cpu
        for cpu in opts.cpus:
            params.cpumask[cpu] = True
        ptr = lib.ggml_threadpool_new(params)
        if ptr == ffi.NULL:  # pragma: no cover - only on allocation failure
            raise ThreadpoolError(f"ggml could not create a threadpool with {opts}")
        self._handle = NativeHandle(ptr, _pool_free, "threadpool")
        self._finalizer = weakref.finalize(self, self._handle.close)

    @property
    def n_threads(self) -> int:
        return self.options.n_threads

    @property
    def native_handle(self) -> NativeHandle:
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def close(self) -> None:
        """Drop the owner's reference (the pool is freed when no context holds it)."""
        self._finalizer()

    def __enter__(self) -> Threadpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        prio = self.options.priority.name
        return f"Threadpool(n_threads={self.n_threads}, priority={prio}, {state})"


@functools.cache
def openmp_build() -> bool:
    """True when the loaded ggml CPU backend runs its threads under OpenMP."""
    return "OPENMP = 1" in system_info()


def worker_threadpool(n_threads: int) -> Threadpool | None:
    """The pool a model worker should attach for up to ``n_threads``, or None.

    Under OpenMP (the pinned CPU build) a pool brings nothing measurable (poll
    0, a lower priority or pinned threads left the collapse as it was;
    ``docs/internals/threads.md``) and only caps :meth:`Context.set_threads
    <llamad.llama_ffi.context.Context.set_threads>`, so there is none. Without
    OpenMP ggml's threads persist in the pool across decodes, and ``poll=0``
    lets them sleep between decodes instead of spinning on cores another
    worker could use.
    """
    if openmp_build():
        return None
    return Threadpool(ThreadpoolOptions(n_threads=n_threads, poll=0))
