"""What a worker process is built from, and the factories that build it.

:class:`WorkerParts` is the construction seam between the process shell and
the model: the backend (the core's door to llama.cpp), the cache view (its
door to the cache), the vocabulary and chat template (text ops), and the
optional extras (embeddings, adapters). The shell takes whatever
``WorkerSpec.parts`` names (``"module:function"`` taking the spec):

- :func:`llama_parts` (the default) loads the model and its one context and
  builds the real backend and cache view, its decodes governed by a
  :class:`~llamad.model.threads.ThreadGovernor` on the daemon's thread board
  (:func:`thread_board_path`);
- the tests' ``stub_worker_parts:stub_parts`` (``tests/support``) builds
  :class:`~llamad.model.stub.StubBackend` and
  :class:`~llamad.model.stub_cache.MemoryCache`: no model, for fast tests of
  the process itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import structlog

from llamad.actors import Registry
from llamad.cache.key import FingerprintMode, Namespace
from llamad.cache.lookup import Lookup, RowRef
from llamad.errors import ConfigError
from llamad.llama_ffi.errors import Closed
from llamad.model import identity
from llamad.model.backend import Backend, PackedState
from llamad.model.cache_view_protocol import CacheView, RowRead
from llamad.model.cpu_load import OthersGauge
from llamad.model.results import ReadBufferStats, TokenSources
from llamad.model.savepoints import SaveJob
from llamad.model.status_board import LoadProgressWriter, load_progress_path
from llamad.model.threads import ThreadGovernor
from llamad.model.worker_spec import WorkerSpec

__all__ = [
    "Adapters",
    "Completions",
    "Embeddings",
    "ModelText",
    "NoCache",
    "WorkerParts",
    "build_parts",
    "llama_parts",
    "run_closers",
    "thread_board_path",
]

log = structlog.get_logger("llamad.model")

THREAD_BOARD: Final = "threads.board"
"""The thread board's file name in the daemon's actor registry."""


def thread_board_path(registry_root: Path | str) -> Path:
    """The daemon-wide thread budget's file (SPEC M14): one per registry.

    Every worker of a daemon registers in the same registry (that is how it
    is found), so a file there is shared by all of them and by nothing of
    another daemon; the registry is in the runtime directory (tmpfs), beside
    the workers' status boards. The name cannot collide with an actor's
    files (``<name>.json``, ``.lock``, ``.sock``, ``.status``).
    """
    return Path(registry_root) / THREAD_BOARD


class ModelText(Protocol):
    """The vocabulary and chat template (SPEC M11). Called from the loop and
    from the worker's text thread (:mod:`llamad.model.text_jobs`): thread-safe.

    ``max_token_bytes``: the most bytes of text one token stands for, where
    every byte of a text lands in one token (``None``: no such bound), for
    :func:`~llamad.model.requests.refuse_unfittable`."""

    @property
    def max_token_bytes(self) -> int | None: ...

    def chat_prompt(self, messages: object, **options: Any) -> tuple[str, bool]: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def detokenize(
        self, tokens: Sequence[int], *, remove_special: bool, unparse_special: bool
    ) -> str: ...

    def apply_chat_template(self, messages: object, **options: Any) -> list[int]: ...

    def tool_grammar(self, tools: list[dict[str, Any]] | None, tool_choice: object) -> str | None:
        """The grammar that makes the model call a tool as ``tool_choice``
        asks, in its template's format (None: unconstrained)."""
        ...


class Embeddings(Protocol):
    def embed(
        self, inputs: Sequence[str | Sequence[int]], *, normalize: bool
    ) -> list[list[float]]: ...


class Adapters(Protocol):
    """LoRA adapters attached to the generation context (SPEC M11)."""

    def load(self, name: str, path: str, scale: float = 1.0) -> Any: ...

    def set_scale(self, name: str, scale: float) -> Any: ...

    def unload(self, name: str) -> None: ...

    def list_adapters(self) -> list[Any]: ...


class Completions(Protocol):
    """Finished asynchronous saves, for the loop: readable ``fileno()`` when
    some are waiting; ``drain()`` takes them as ``(key, published)``."""

    def fileno(self) -> int: ...

    def drain(self) -> list[tuple[bytes, bool]]: ...


@dataclass(eq=False)
class WorkerParts:
    """Everything the shell drives; :meth:`close` frees it (context, model, cache).

    ``threads``: the governor of the backend's decode threads, whose status
    the worker reports (``None``: the backend's threads are not governed).
    """

    backend: Backend
    cache: CacheView
    text: ModelText
    completions: Completions | None = None
    embeddings: Embeddings | None = None
    adapters: Adapters | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    threads: ThreadGovernor | None = None

    def close(self) -> None:
        """Run the closers in reverse order of construction (every one, even
        after a failure; the first failure is raised at the end)."""
        run_closers(self.closers)


def run_closers(closers: list[Callable[[], None]]) -> None:
    """Pop and run ``closers`` last first, every one even after a failure;
    the first failure is raised at the end."""
    first: BaseException | None = None
    while closers:
        try:
            closers.pop()()
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first


def build_parts(spec: WorkerSpec) -> WorkerParts:
    """The parts ``spec.parts`` names, built from ``spec``."""
    module_name, _, attr = spec.parts.partition(":")
    target: Any = importlib.import_module(module_name)
    for name in attr.split("."):
        target = getattr(target, name)
    parts = target(spec)
    if not isinstance(parts, WorkerParts):
        raise ConfigError(
            f"{spec.parts} returned {type(parts).__name__}, not WorkerParts",
            details={"field": "parts"},
        )
    return parts


def llama_parts(spec: WorkerSpec) -> WorkerParts:
    """The real model: one ``Model`` and its ``kv_unified`` context, the llama.cpp
    backend with its thread governor on the daemon's thread board, the cache
    view over cache-meta and the writer pool (or no cache), the tokenizer and
    chat template, a lazily made embedding context, adapters."""
    # Imported here: loading libllama is this factory's business, not the shell's.
    from llamad.llama_ffi import Model  # noqa: PLC0415
    from llamad.llama_ffi.spin import spin_setting  # noqa: PLC0415
    from llamad.llama_ffi.state import host_buffer_type  # noqa: PLC0415
    from llamad.llama_ffi.threadpool import worker_threadpool  # noqa: PLC0415
    from llamad.model.adapters import AdapterSet  # noqa: PLC0415
    from llamad.model.client_cache_view import ClientCacheView  # noqa: PLC0415
    from llamad.model.embedder import Embedder, EmbedderOptions  # noqa: PLC0415
    from llamad.model.llama_backend import LlamaBackend  # noqa: PLC0415
    from llamad.model.thread_board import ThreadBoard  # noqa: PLC0415
    from llamad.model.tokenizer import Tokenizer  # noqa: PLC0415

    closers: list[Callable[[], None]] = []
    parts: WorkerParts | None = None
    # The load reports its progress beside the worker's status board, for the
    # daemon's front to stream to load_model's caller; a complete load leaves
    # its last report (1.0, this pid) until the front's next load.
    progress = LoadProgressWriter(load_progress_path(Registry(spec.registry).root, spec.actor_name))
    try:
        try:
            model = Model(spec.model_path, spec.load_options(), progress=progress)
        except BaseException:
            progress.close()
            raise
        closers.append(model.close)
        ctx = model.context(spec.context)
        closers.append(ctx.close)
        policy = spec.thread_policy()
        # None under OpenMP (the pinned CPU build), where a pool measured no
        # effect; elsewhere a sleeping (poll 0) pool. The context leases it.
        pool = worker_threadpool(policy.max_threads)
        if pool is not None:
            closers.append(pool.close)
            ctx.attach_threadpool(pool)
        board = ThreadBoard(thread_board_path(Registry(spec.registry).root))
        closers.append(board.close)
        # The gauge lets a fallback end as soon as the other work has gone
        # (cpu_load), not only when its cool-down runs out. It averages over
        # an idle gap of up to 30 s (the governor reads it as the worker goes
        # idle while falling back): whether the other work went while the
        # worker waited for its next request.
        governor = ThreadGovernor(policy, board=board, gauge=OthersGauge(max_age_s=30.0))
        log.info(
            "model.threads",
            board=str(board.path),
            slot=board.slot,
            max_threads=policy.max_threads,
            cores=policy.cores,
            threadpool=pool is not None,
            spin=spin_setting().value,
        )
        backend = LlamaBackend(ctx, governor=governor)
        closers.append(backend.close)
        adapters = AdapterSet(ctx)
        closers.append(adapters.close)
        threads = spec.context.n_threads
        embedder = Embedder(model, EmbedderOptions(n_threads=threads), mirror=ctx)
        closers.append(embedder.close)
        cache: CacheView
        completions: Completions | None = None
        if spec.cache is not None:
            view = ClientCacheView.from_settings(
                spec.cache,
                ctx,
                config=spec.cache_view,
                align_tokens=spec.worker.policy.boundary_align_tokens,
                # Pinned memory on CUDA for rows read by copy; None (plain
                # memory, as before) on a CPU build or a model kept on the CPU.
                host_buffer=host_buffer_type(
                    offloaded=spec.model.n_gpu_layers != 0, main_gpu=spec.model.main_gpu
                ),
            )
            closers.append(_closer(view.close))
            cache, completions = view, view.completions
            # The pool's saves run beside the loop on the same cores: steps
            # they overlap are no sign of the machine's load (threads.py).
            governor.own_work = view.quiet_epoch
        else:
            cache = NoCache(ctx)
        parts = WorkerParts(
            backend=backend,
            cache=cache,
            text=Tokenizer(model),
            completions=completions,
            embeddings=embedder,
            adapters=adapters,
            closers=closers,
            threads=governor,
        )
        return parts
    finally:
        if parts is None:
            run_closers(closers)


def _closer(close: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        close()

    return run


class NoCache:
    """A worker without a cache: nothing is looked up or saved; only live KV
    (sessions, idle entries) is reused.

    With the live context, its namespace still follows the adapters attached
    and the salt (the model itself is named by a fixed digest: no row is ever
    written under it), so live KV computed under other adapters or for
    another tenant is never reused.
    """

    _NS: Final = Namespace(fingerprint=bytes(32), quant=0, ctx_hash=bytes(32))

    def __init__(self, ctx: identity.LiveContext | None = None) -> None:
        self._ctx = ctx
        self._shared: Namespace | None = None
        self._adapters: tuple[tuple[bytes, float], ...] = ()

    def namespace(self, salt: bytes | None) -> Namespace:
        """As ClientCacheView's: recomputed only when the adapters change (the
        status publish asks before every decode step)."""
        ctx = self._ctx
        if ctx is None:
            return identity.salted(self._NS, salt)
        if ctx.closed:
            raise Closed("context is closed")
        adapters = tuple((adapter.sha256, scale) for adapter, scale in ctx.adapters)
        if self._shared is None or adapters != self._adapters:
            self._shared = identity.namespace(ctx, FingerprintMode.FAST_UNSAFE, supplied=bytes(32))
            self._adapters = adapters
        return identity.salted(self._shared, salt)

    def resolve(
        self,
        namespace: Namespace,
        tokens: Sequence[int],
        *,
        parent_key: bytes | None,
        wait_s: float,
    ) -> Lookup:
        return Lookup(None, None, 0, 0, None, False)

    @contextmanager
    def read(self, row: RowRef) -> Iterator[RowRead | None]:
        yield None

    def checkin(self, pin: int | None) -> None:
        pass

    def read_buffer(self) -> ReadBufferStats | None:
        return None

    def save(self, job: SaveJob, state: PackedState) -> bool:
        state.release()
        return False

    def account(self, sources: TokenSources) -> None:
        pass

    def report_live(self, entries: Sequence[tuple[int, Namespace, Sequence[int]]]) -> None:
        pass

    def idle(self) -> None:
        pass
