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
from typing import Any, Final, TypeVar, overload

import msgspec

from llamad import logs
from llamad.actors.client import Client as ActorClient
from llamad.actors.curve import CurveClient
from llamad.actors.errors import ClientClosed
from llamad.actors.sockets import FORKS
from llamad.client import bodies as ops
from llamad.client.bodies import AdapterInfo, Prompt
from llamad.client.routes import Links
from llamad.client.stream import Stream
from llamad.config import client_curve, client_endpoint
from llamad.errors import ModelNotFound
from llamad.front.wire import DaemonStatus, GcReport, LoadProgress, ModelInfo, ModelStatus, NoArgs
from llamad.model.results import Completion, Event
from llamad.model.wire import (
    CancelReply,
    ChatOptions,
    EmbedReply,
    ForkReply,
    TextReply,
    TokensReply,
)

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_IDLE_TIMEOUT", "DEFAULT_TIMEOUT", "Client"]

T = TypeVar("T")

DEFAULT_TIMEOUT: Final = 300.0
"""Seconds a call may take by default (a long prompt on a CPU, queued behind others)."""
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
"""Seconds to wait for the daemon or a worker to be reachable (a restart in progress)."""
DEFAULT_IDLE_TIMEOUT: Final = 60.0
"""Seconds a stream may go without an event once its first one has arrived."""

_DEFAULT: Final[Any] = object()
_NO_ARGS: Final = NoArgs()


class Client:
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
    ) -> None:
        # A library user's program never sees llamad's debug lines unless it
        # configured logging itself (llamad/logs.py says how).
        logs.library_default()
        if endpoint is None:
            endpoint = client_endpoint(config)
        if curve is None and endpoint.startswith("tcp://"):
            curve = client_curve(config)
        self.endpoint = endpoint
        self.curve = curve
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.name = name or f"llamad-client-{os.getpid()}"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all_links: weakref.WeakSet[Links] = weakref.WeakSet()
        self._running: dict[str, str] = {}  # request id -> model id, for cancel()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every thread's sockets. Idempotent; the client is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
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
        body = ops.load_model_body(model_id, path, options)
        call = self._links().front.stream(
            "load_model", body, timeout=self._t(timeout), event_type=LoadProgress
        )
        for message in call:
            if progress is not None:
                progress(message.body.fraction)
        self._forget_route(model_id)
        return _convert(call.result, ModelInfo)

    def unload(self, model_id: str, *, timeout: float | None = _DEFAULT) -> None:
        """Stop ``model_id``'s worker (its shutdown saves run; its cache rows stay)."""
        self._front_call("unload", ops.model_ref(model_id), None, timeout)
        self._forget_route(model_id)

    def list_models(self, *, timeout: float | None = _DEFAULT) -> list[ModelInfo]:
        result: list[ModelInfo] = self._front_call(
            "list_models", _NO_ARGS, list[ModelInfo], timeout
        )
        return result

    def model_info(self, model_id: str, *, timeout: float | None = _DEFAULT) -> ModelInfo:
        result: ModelInfo = self._front_call(
            "model_info", ops.model_ref(model_id), ModelInfo, timeout
        )
        return result

    @overload
    def status(self, model_id: None = None, *, timeout: float | None = ...) -> DaemonStatus: ...
    @overload
    def status(self, model_id: str, *, timeout: float | None = ...) -> ModelStatus: ...
    def status(
        self, model_id: str | None = None, *, timeout: float | None = _DEFAULT
    ) -> DaemonStatus | ModelStatus:
        """The daemon's status, or one model's (its info and its worker's
        published snapshot: read without waiting on a busy worker)."""
        daemon: DaemonStatus = self._front_call("status", _NO_ARGS, DaemonStatus, timeout)
        if model_id is None:
            return daemon
        for model in daemon.models:
            if model.info.model_id == model_id:
                return model
        raise ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})

    def counters(self, *, timeout: float | None = _DEFAULT) -> dict[str, int]:
        """The cache's counters (SPEC C10)."""
        result: dict[str, int] = self._front_call("counters", _NO_ARGS, dict[str, int], timeout)
        return result

    def evict_bytes(
        self, n: int, tiers: Iterable[str] | None = None, *, timeout: float | None = _DEFAULT
    ) -> int:
        """Evict at least ``n`` bytes of cache rows (LRU, unpinned) from ``tiers``
        (default all); the bytes freed."""
        result: int = self._front_call("evict_bytes", ops.evict_body(n, tiers), int, timeout)
        return result

    def gc(self, *, timeout: float | None = _DEFAULT) -> GcReport:
        """Run the cache's garbage collection now."""
        result: GcReport = self._front_call("gc", _NO_ARGS, GcReport, timeout)
        return result

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
        return self._generate(
            "complete",
            model_id=model_id,
            prompt=prompt,
            messages=messages,
            request_id=request_id,
            add_special=add_special,
            chat=chat,
            timeout=timeout,
            options=options,
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
        return self._generate(
            "prefill_only",
            model_id=model_id,
            prompt=prompt,
            messages=messages,
            request_id=request_id,
            add_special=add_special,
            chat=chat,
            timeout=timeout,
            options=options,
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
        rid = request_id or ops.new_request_id()
        body = ops.infer_body(
            prompt,
            messages=messages,
            request_id=rid,
            add_special=add_special,
            chat=chat,
            options=options,
        )
        first = self._t(timeout)
        idle = self.idle_timeout if idle_timeout is _DEFAULT else idle_timeout
        call = self._on_worker(
            model_id, lambda a: a.stream("infer", body, timeout=first, event_type=Event)
        )
        self._note_running(rid, model_id)
        return Stream(
            self, call, model_id=model_id, request_id=rid, idle_timeout=idle, on_end=self._ended
        )

    def cancel(
        self, request_id: str, *, model_id: str | None = None, timeout: float | None = _DEFAULT
    ) -> bool:
        """Cancel a running request by id (from any thread). True when the worker
        was running it; its stream ends with ``done`` (``cancelled``). The
        client knows the model of the requests it started; for others give
        ``model_id``."""
        model = model_id or self._running.get(request_id)
        if model is None:
            return False
        reply: CancelReply = self._on_worker(
            model,
            lambda a: a.call(
                "cancel",
                ops.cancel_body(request_id),
                timeout=self._t(timeout),
                reply_type=CancelReply,
            ),
        )
        return reply.cancelled

    def tokenize(
        self,
        model_id: str,
        text: str,
        *,
        add_special: bool = True,
        parse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[int]:
        body = ops.tokenize_body(text, add_special=add_special, parse_special=parse_special)
        reply: TokensReply = self._worker_call(model_id, "tokenize", body, TokensReply, timeout)
        return reply.tokens

    def detokenize(
        self,
        model_id: str,
        tokens: Sequence[int],
        *,
        remove_special: bool = False,
        unparse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> str:
        body = ops.detokenize_body(
            tokens, remove_special=remove_special, unparse_special=unparse_special
        )
        reply: TextReply = self._worker_call(model_id, "detokenize", body, TextReply, timeout)
        return reply.text

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
        body = ops.chat_body(messages, options)
        reply: TokensReply = self._worker_call(
            model_id, "apply_chat_template", body, TokensReply, timeout
        )
        return reply.tokens

    def embed(
        self,
        model_id: str,
        text_or_tokens: Prompt,
        *,
        normalize: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[float]:
        """The pooled embedding of one text or token sequence."""
        body = ops.embed_body(text_or_tokens, normalize=normalize)
        reply: EmbedReply = self._worker_call(model_id, "embed", body, EmbedReply, timeout)
        return reply.embeddings[0]

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
        body = ops.adapter_body(path, scale=scale, name=name)
        result: AdapterInfo = self._worker_call(
            model_id, "load_adapter", body, AdapterInfo, timeout
        )
        return result

    def unload_adapter(self, model_id: str, name: str, *, timeout: float | None = _DEFAULT) -> None:
        self._worker_call(model_id, "unload_adapter", ops.adapter_ref(name), None, timeout)

    def set_adapter_scale(
        self, model_id: str, name: str, scale: float, *, timeout: float | None = _DEFAULT
    ) -> AdapterInfo:
        body = ops.adapter_scale_body(name, scale)
        result: AdapterInfo = self._worker_call(
            model_id, "set_adapter_scale", body, AdapterInfo, timeout
        )
        return result

    def list_adapters(
        self, model_id: str, *, timeout: float | None = _DEFAULT
    ) -> list[AdapterInfo]:
        result: list[AdapterInfo] = self._worker_call(
            model_id, "list_adapters", _NO_ARGS, list[AdapterInfo], timeout
        )
        return result

    def end_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        """Forget a session and free its sequence (its saved rows stay in the cache)."""
        self._worker_call(model_id, "end_session", ops.session_body(session_id), None, timeout)

    def reset_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        """Empty a session's transcript and KV, keeping the session."""
        self._worker_call(model_id, "reset_session", ops.session_body(session_id), None, timeout)

    def fork_session(
        self, model_id: str, source_id: str, new_id: str, *, timeout: float | None = _DEFAULT
    ) -> bool:
        """Copy session ``source_id`` into a new session ``new_id``. True when its
        KV was copied into a free sequence; False when the fork starts parked
        (its first request restores or prefills its transcript)."""
        body = ops.fork_body(source_id, new_id)
        reply: ForkReply = self._worker_call(model_id, "fork_session", body, ForkReply, timeout)
        return reply.copied

    # -- internals -----------------------------------------------------------

    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is _DEFAULT else timeout

    def _generate(
        self,
        op: str,
        *,
        model_id: str,
        prompt: Prompt | None,
        messages: Sequence[Mapping[str, Any]] | None,
        request_id: str | None,
        add_special: bool,
        chat: ChatOptions | Mapping[str, Any] | None,
        timeout: float | None,
        options: Mapping[str, Any],
    ) -> Completion:
        rid = request_id or ops.new_request_id()
        body = ops.infer_body(
            prompt,
            messages=messages,
            request_id=rid,
            add_special=add_special,
            chat=chat,
            options=options,
        )
        limit = self._t(timeout)
        self._note_running(rid, model_id)
        try:
            result: Completion = self._on_worker(
                model_id, lambda a: a.call(op, body, timeout=limit, reply_type=Completion)
            )
        finally:
            self._ended(rid)
        return result

    def _worker_call(
        self, model_id: str, op: str, body: Any, reply_type: Any, timeout: float | None
    ) -> Any:
        limit = self._t(timeout)
        rtype = Any if reply_type is None else reply_type
        return self._on_worker(
            model_id, lambda a: a.call(op, body, timeout=limit, reply_type=rtype)
        )

    def _note_running(self, request_id: str, model_id: str) -> None:
        with self._lock:
            self._running[request_id] = model_id

    def _ended(self, request_id: str) -> None:
        with self._lock:
            self._running.pop(request_id, None)

    def _links(self) -> Links:
        """This thread's connections (made on first use)."""
        if self._closed:
            raise ClientClosed("the llamad client is closed")
        links: Links | None = getattr(self._local, "links", None)
        if links is None or links.forks != FORKS[0]:
            # First use on this thread, or in a forked child (whose copies
            # of the parent's sockets must not be touched).
            links = Links(
                self.endpoint,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                name=self.name,
                curve=self.curve,
            )
            self._local.links = links
            with self._lock:
                self._all_links.add(links)
        return links

    def _front_call(self, op: str, body: Any, reply_type: Any, timeout: float | None) -> Any:
        return self._links().front_call(op, body, reply_type, self._t(timeout))

    def _forget_route(self, model_id: str) -> None:
        self._links().forget(model_id)

    def _on_worker(self, model_id: str, send: Callable[[ActorClient], T]) -> T:
        return self._links().on_worker(model_id, send)


def _convert(raw: Any, typ: type[T]) -> T:
    return msgspec.convert(raw, typ)
