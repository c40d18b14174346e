"""The blocking public client: ``from llamad import Client`` (SPEC D3).

A :class:`Client` talks to the daemon's front (the configured endpoint) for
the control plane, and straight to each model's worker actor for requests:
``route`` once per model (cached), then every ``complete``, ``infer``,
``tokenize``... goes to the worker, so token events take one hop.

**Errors.** Every error code raises its own class (``from llamad import
StickyBusy, ContextOverflow, WorkerCrashed, ...``). A bad parameter is
refused before anything is sent, with the class and field the worker would
have answered.

**Reconnect.** When a worker is gone before a request is sent (unloaded by
``keep_alive``, restarting, the daemon restarted) the client asks the front
to route again (the front reloads an expired model) and retries once. A
worker that dies *during* a request fails it with ``WorkerCrashed``: a
generation is never silently sent twice. When the daemon itself is down, a
call waits up to ``connect_timeout`` for it to come back.

**Threads.** A client may be shared by threads: each thread gets its own
sockets on first use. A stream is consumed on the thread that opened it;
:meth:`Client.cancel` works from any thread. :meth:`Client.close` closes
every thread's sockets: call it once the other threads are done with it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar, cast, overload

from llamad.actors.client import StreamCall
from llamad.actors.curve import CurveClient
from llamad.actors.errors import ClientClosed
from llamad.actors.sockets import FORKS
from llamad.client import asks
from llamad.client.asks import Ask
from llamad.client.base import (
    DEFAULT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    STATUS_TIMEOUT,
    ClientBase,
    combined,
)
from llamad.client.bodies import AdapterInfo, Prompt
from llamad.client.router import Spread, spread
from llamad.client.routes import Links
from llamad.client.stream import Stream
from llamad.errors import LlamadError, Unavailable
from llamad.front.wire import (
    DaemonStatus,
    GcReport,
    LoadProgress,
    MetricsSnapshot,
    ModelInfo,
    ModelStatus,
    NoArgs,
)
from llamad.model.results import Completion, Event
from llamad.model.wire import ChatOptions

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_IDLE_TIMEOUT", "DEFAULT_TIMEOUT", "Client"]

R = TypeVar("R")
T = TypeVar("T")

NO_ARGS: Final = NoArgs()

_DEFAULT: Final[Any] = DEFAULT


class Client(ClientBase):
    """A connection to the llamad daemon (see the module doc).

    ``endpoint``: the daemon's client endpoint; ``None`` reads it from the
    configuration (``config``, else ``$LLAMAD_CONFIG``, with the ``LLAMAD_*``
    environment overrides; by default ``ipc://<runtime_dir>/llamad.sock``).
    ``timeout`` bounds each call, and a stream's wait for its first event
    (``None``: no bound); ``idle_timeout`` bounds a stream's wait for each
    later event; every method takes ``timeout=`` to override it once.
    ``curve``: the keys for a ``tcp://`` daemon that serves CURVE (``None``:
    ``[client]`` of the configuration, if it names any); a daemon that
    refuses them raises :class:`~llamad.errors.PermissionDenied` at once.
    ``endpoints``: several daemons (instead of ``endpoint``); each request
    goes to one of them (:mod:`llamad.client.router`: the longest cached
    prefix, else the least loaded; failover; sessions stay put).
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        name: str = "",
        curve: CurveClient | None = None,
        endpoints: Sequence[str] | None = None,
    ) -> None:
        self._local = threading.local()
        self._all_links: weakref.WeakSet[Links] = weakref.WeakSet()
        super().__init__(
            endpoint, config, timeout, connect_timeout, idle_timeout, name, curve, endpoints
        )

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every thread's sockets. Idempotent; the client is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._affinity is not None:
            self._affinity.close()
        with self._lock:
            every = list(self._all_links)
        for links in every:
            if links.forks == FORKS[0]:
                links.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- models (the front) --------------------------------------------------

    def load_model(
        self,
        model_id: str,
        path: str | os.PathLike[str] | None = None,
        *,
        progress: Callable[[float], None] | None = None,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> ModelInfo:
        """Load ``model_id`` from ``path`` (``None``: its configured path) with
        ``options`` (the keys of a ``[models.<id>]`` config table); returns
        once it serves. ``progress`` is called with the fraction loaded."""
        ask = asks.load_model(model_id, path, options)

        def load_at(endpoint: str) -> Any:
            call = self._links(endpoint).front.stream(
                ask.op, ask.body, timeout=self._t(timeout), event_type=LoadProgress
            )
            for message in call:
                if progress is not None:
                    progress(message.body.fraction)
            return call.result

        if self._router is None:
            return self._answered(ask, load_at(self.endpoint))
        return self._answered(ask, self._spread(ask, load_at))

    def unload(self, model_id: str, *, timeout: float | None = _DEFAULT) -> None:
        """Stop ``model_id``'s worker (its shutdown saves run; its cache rows stay)."""
        return self._run(asks.unload(model_id), timeout)

    def list_models(self, *, timeout: float | None = _DEFAULT) -> list[ModelInfo]:
        return self._run(asks.list_models(), timeout)

    def model_info(self, model_id: str, *, timeout: float | None = _DEFAULT) -> ModelInfo:
        return self._run(asks.model_info(model_id), timeout)

    def set_keep_alive(
        self, model_id: str, seconds: float | None, *, timeout: float | None = _DEFAULT
    ) -> ModelInfo:
        """Unload ``model_id`` once idle ``seconds`` from now on (``None``: never;
        0: at the front's next check once nothing runs on it)."""
        return self._run(asks.set_keep_alive(model_id, seconds), timeout)

    @overload
    def status(self, model_id: None = None, *, timeout: float | None = ...) -> DaemonStatus: ...
    @overload
    def status(self, model_id: str, *, timeout: float | None = ...) -> ModelStatus: ...
    def status(
        self, model_id: str | None = None, *, timeout: float | None = _DEFAULT
    ) -> DaemonStatus | ModelStatus:
        """The daemon's status, or one model's (its info and its worker's
        published snapshot: read without waiting on a busy worker)."""
        return self._run(asks.status(model_id), timeout)

    def counters(self, *, timeout: float | None = _DEFAULT) -> dict[str, int]:
        """The cache's counters (SPEC C10)."""
        return self._run(asks.counters(), timeout)

    def metrics(self, *, timeout: float | None = _DEFAULT) -> MetricsSnapshot:
        """Every model's request counts and latency histograms (from its
        worker's status board), the cache's counters and tiers: one read,
        never waiting on a busy worker. :func:`llamad.client.prometheus.exposition`
        renders it as Prometheus text."""
        return self._run(asks.metrics(), timeout)

    def evict_bytes(
        self, n: int, tiers: Iterable[str] | None = None, *, timeout: float | None = _DEFAULT
    ) -> int:
        """Evict at least ``n`` bytes of cache rows (LRU, unpinned) from ``tiers``
        (default all); the bytes freed. Any int ``n >= 0``: past everything
        (``sys.maxsize``) it is clamped, and evicts all that can go."""
        return self._run(asks.evict_bytes(n, tiers), timeout)

    def gc(self, *, timeout: float | None = _DEFAULT) -> GcReport:
        """Run the cache's garbage collection now."""
        return self._run(asks.gc(), timeout)

    # -- requests (the worker) -----------------------------------------------

    def complete(
        self,
        model_id: str,
        prompt: Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        chat: ChatOptions | Mapping[str, Any] | None = None,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> Completion:
        """Generate from ``prompt`` (text or token ids) or ``messages`` (a chat,
        rendered by the model's template); the whole :class:`Completion`.

        ``options``: sampling and output (``temperature``, ``max_tokens``,
        ``stop``, ``grammar``, ``json_schema``, ``seed``, ``logprobs``...),
        cache and sessions (``parent_key``, ``session_id``, ``continue_``,
        ``expect_committed``, ``cache_salt``) and chat template switches
        (``add_generation_prompt``, ``enable_thinking``, ``tools``...).
        """
        return self._run(
            asks.generation(
                "complete", model_id, prompt, messages, request_id, add_special, chat, options
            ),
            timeout,
        )

    def prefill_only(
        self,
        model_id: str,
        prompt: Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        chat: ChatOptions | Mapping[str, Any] | None = None,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> Completion:
        """Warm the cache with the prompt, generating nothing (SPEC M9)."""
        return self._run(
            asks.generation(
                "prefill_only", model_id, prompt, messages, request_id, add_special, chat, options
            ),
            timeout,
        )

    def infer(
        self,
        model_id: str,
        prompt: Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        chat: ChatOptions | Mapping[str, Any] | None = None,
        timeout: float | None = _DEFAULT,
        idle_timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> Stream:
        """Start generating; iterate the :class:`Stream` for events as they come.

        ``timeout`` bounds the wait for the first event, ``idle_timeout`` the
        wait for each later one. Options as :meth:`complete`.
        """
        return self._stream(
            model_id,
            asks.generation(
                "infer", model_id, prompt, messages, request_id, add_special, chat, options
            ),
            timeout,
            idle_timeout,
        )

    def cancel(
        self, request_id: str, *, model_id: str | None = None, timeout: float | None = _DEFAULT
    ) -> bool:
        """Cancel a running request by id (from any thread). True when the worker
        was running it; its stream ends with ``done`` (``cancelled``). The
        client knows the model of the requests it started; for others give
        ``model_id``."""
        ask = self._cancel_ask(request_id, model_id)
        return False if ask is None else self._run(ask, timeout)

    def tokenize(
        self,
        model_id: str,
        text: str,
        *,
        add_special: bool = True,
        parse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[int]:
        return self._run(asks.tokenize(model_id, text, add_special, parse_special), timeout)

    def detokenize(
        self,
        model_id: str,
        tokens: Sequence[int],
        *,
        remove_special: bool = False,
        unparse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> str:
        return self._run(
            asks.detokenize(model_id, tokens, remove_special, unparse_special), timeout
        )

    def apply_chat_template(
        self,
        model_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> list[int]:
        """The prompt tokens ``messages`` render to with the model's chat template
        (``options``: ``add_generation_prompt``, ``tools``, ``enable_thinking``...)."""
        return self._run(asks.apply_chat_template(model_id, messages, options), timeout)

    def embed(
        self,
        model_id: str,
        text_or_tokens: Prompt,
        *,
        normalize: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[float]:
        """The pooled embedding of one text or token sequence."""
        return self._run(asks.embed(model_id, text_or_tokens, normalize), timeout)

    def load_adapter(
        self,
        model_id: str,
        path: str | os.PathLike[str],
        *,
        scale: float = 1.0,
        name: str | None = None,
        timeout: float | None = _DEFAULT,
    ) -> AdapterInfo:
        """Load a LoRA adapter on ``model_id``'s worker (waits for running requests)."""
        return self._run(asks.load_adapter(model_id, path, scale, name), timeout)

    def unload_adapter(self, model_id: str, name: str, *, timeout: float | None = _DEFAULT) -> None:
        return self._run(asks.unload_adapter(model_id, name), timeout)

    def set_adapter_scale(
        self, model_id: str, name: str, scale: float, *, timeout: float | None = _DEFAULT
    ) -> AdapterInfo:
        return self._run(asks.set_adapter_scale(model_id, name, scale), timeout)

    def list_adapters(
        self, model_id: str, *, timeout: float | None = _DEFAULT
    ) -> list[AdapterInfo]:
        return self._run(asks.list_adapters(model_id), timeout)

    def end_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        """Forget a session and free its sequence (its saved rows stay in the cache)."""
        return self._run(asks.end_session(model_id, session_id), timeout)

    def reset_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        """Empty a session's transcript and KV, keeping the session."""
        return self._run(asks.reset_session(model_id, session_id), timeout)

    def fork_session(
        self, model_id: str, source_id: str, new_id: str, *, timeout: float | None = _DEFAULT
    ) -> bool:
        """Copy session ``source_id`` into a new session ``new_id``. True when its
        KV was copied into a free sequence; False when the fork starts parked
        (its first request restores or prefills its transcript)."""
        return self._run(asks.fork_session(model_id, source_id, new_id), timeout)

    # -- internals: the I/O --------------------------------------------------

    def _run(self, ask: Ask[R], timeout: float | None) -> R:
        """Send ``ask`` (by the retry rule of :mod:`~llamad.client.routes`; to
        several daemons by :mod:`~llamad.client.router`'s) and wait for its
        answer."""
        limit = self._started(ask, timeout)
        try:
            if self._router is None:
                answer = self._run_at(self.endpoint, ask, limit)
            else:
                answer = self._spread(ask, lambda e: self._run_at(e, ask, limit))
        finally:
            self._finished(ask)
        return self._answered(ask, answer)

    def _run_at(self, endpoint: str, ask: Ask[R], limit: float | None) -> Any:
        if ask.model_id is None:
            return self._links(endpoint).front_call(ask.op, ask.body, ask.reply_type, limit)
        return self._links(endpoint).on_worker(
            ask.model_id,
            lambda a: a.call(ask.op, ask.body, timeout=limit, reply_type=ask.reply_type),
        )

    def _stream(
        self, model_id: str, ask: Ask[Completion], timeout: float | None, idle: float | None
    ) -> Stream:
        """Open the stream of generation ``ask`` (by the retry rule; on one of
        several daemons by the router's)."""
        first = self._t(timeout)

        def open_at(endpoint: str) -> tuple[str, StreamCall]:
            return endpoint, self._links(endpoint).on_worker(
                model_id, lambda a: a.stream(ask.op, ask.body, timeout=first, event_type=Event)
            )

        if self._router is None:
            endpoint, call = open_at(self.endpoint)
            return Stream(
                self,
                call,
                model_id=model_id,
                request_id=self._stream_started(ask),
                idle_timeout=self._idle(idle),
                on_end=self._ended,
                endpoint=endpoint,
            )
        endpoint, call = self._spread(ask, open_at, held=True)
        request_id = self._stream_started(ask)
        return Stream(
            self,
            call,
            model_id=model_id,
            request_id=request_id,
            idle_timeout=self._idle(idle),
            on_end=self._routed_end,
            on_error=partial(self._stream_failed, request_id),
            endpoint=endpoint,
            reopen=partial(self._reopen, ask, open_at),
        )

    def _reopen(
        self,
        ask: Ask[Completion],
        open_at: Callable[[str], tuple[str, StreamCall]],
        error: LlamadError,
    ) -> tuple[str, StreamCall] | None:
        """A stream that failed with ``error`` before its first event, opened
        again on another daemon when its own died (else ``None``: the error
        stands)."""
        endpoint = self._dead_under(ask, error)
        if endpoint is None or not self._gone(endpoint):
            return None
        self._lost(ask, endpoint)
        try:
            return self._spread(ask, open_at, held=True)
        except LlamadError:
            return None

    def _gone(self, endpoint: str) -> bool:
        """Whether the daemon at ``endpoint`` is gone (its front unreachable)."""
        try:
            self._links(endpoint).front_call(
                "status", NO_ARGS, DaemonStatus, STATUS_TIMEOUT, wait=False
            )
        except Unavailable:
            return True
        except LlamadError:
            return False
        return False

    def _spread(self, ask: Ask[Any], attempt: Callable[[str], T], *, held: bool = False) -> T:
        """``attempt`` ``ask`` on the daemons the router picks: every one of
        them, or the first that takes it. ``held``: a stream, whose request
        stays noted as running on its daemon once opened."""
        prefix = None
        if spread(ask.op) is Spread.ANY:
            self._read_loads()
            tokens, key, get = self._prompt_plan(ask)
            if get is not None:
                tokens = self._tokens_for(get)
            prefix = self._prefix(ask, tokens, key)
        targets = self._targets(ask, prefix)
        if self._everywhere(ask, targets):
            return self._everyone(ask, targets, attempt)
        error: LlamadError | None = None
        for endpoint in targets:
            self._sent_to(ask, endpoint)
            opened = False
            try:
                answer = attempt(endpoint)
                opened = held
            except LlamadError as exc:
                if not self._goes_on(ask, endpoint, exc) and not (
                    self._died_with(ask, exc) and self._gone(endpoint)
                ):
                    raise
                error = exc
                continue
            finally:
                if not opened:
                    self._done_at(endpoint, ask.request_id)
            self._took(ask, endpoint)
            return answer
        assert error is not None
        raise error

    def _everyone(self, ask: Ask[Any], targets: Sequence[str], attempt: Callable[[str], T]) -> T:
        answers: list[T] = []
        errors: list[LlamadError] = []
        for endpoint in targets:
            try:
                answers.append(attempt(endpoint))
            except LlamadError as exc:
                self._goes_on(ask, endpoint, exc)
                errors.append(exc)
            else:
                self._took(ask, endpoint)
        if errors:
            raise errors[0]
        return cast("T", combined(ask, answers))

    def _tokens_for(self, get: Ask[list[int]]) -> list[int] | None:
        """The prompt's token ids from the daemon the load alone would pick
        (one more round trip; ``None`` when it fails: route by load)."""
        assert get.model_id is not None
        endpoint = self.router.order(get.model_id)[0]
        try:
            return get.read(self._run_at(endpoint, get, STATUS_TIMEOUT))
        except LlamadError:
            return None

    def _read_loads(self) -> None:
        """Read the status (the load) of each daemon whose last read is stale."""
        for endpoint in self.router.stale():
            try:
                status = self._links(endpoint).front_call(
                    "status", NO_ARGS, DaemonStatus, STATUS_TIMEOUT, wait=False
                )
            except LlamadError:
                self.router.failed(endpoint)
            else:
                self._loaded(endpoint, status)

    def _links(self, endpoint: str | None = None) -> Links:
        """This thread's connections to ``endpoint`` (default: the first daemon;
        made on first use)."""
        if self._closed:
            raise ClientClosed("the llamad client is closed")
        endpoint = endpoint or self.endpoint
        by: dict[str, Links] | None = getattr(self._local, "links", None)
        if by is None:
            by = self._local.links = {}
        links = by.get(endpoint)
        if links is None or links.forks != FORKS[0]:
            # First use on this thread, or in a forked child (whose copies
            # of the parent's sockets must not be touched).
            links = Links(
                endpoint,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                name=self.name,
                curve=self.curve,
                wait_front=self._router is None,
            )
            by[endpoint] = links
            with self._lock:
                self._all_links.add(links)
        return links

    def _forget_route(self, model_id: str) -> None:
        for links in dict(getattr(self._local, "links", None) or {}).values():
            links.forget(model_id)
