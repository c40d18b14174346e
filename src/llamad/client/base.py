"""What the two public clients, and their two streams, share: all but the waiting.

:class:`~llamad.client.sync.Client` and :class:`~llamad.client.aio.AsyncClient`
extend :class:`ClientBase`: where the daemon is (endpoint, CURVE keys, from
the configuration), the timeouts and their defaults, the requests running
(so ``cancel(request_id)`` knows their model), and what an answer does
besides being returned (a loaded or unloaded model's route is stale). Each
method's request is an :class:`~llamad.client.asks.Ask`; a client's
``_run`` only sends it and waits.

:class:`~llamad.client.stream.Stream` and
:class:`~llamad.client.aio_stream.AsyncStream` extend :class:`StreamBase`:
the terminal (a ``done`` event carrying the :class:`Completion`, or the
error), the switch from the first-event timeout to the idle one, and the
client's note of the running request, dropped exactly once.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, Protocol, TypeVar

import msgspec

from llamad import logs
from llamad.actors.curve import CurveClient
from llamad.client import asks
from llamad.client.affinity import Affinity
from llamad.client.asks import Ask
from llamad.client.bodies import read_end
from llamad.client.router import Router, Spread, spread
from llamad.config import client_curve, client_endpoint
from llamad.errors import (
    Cancelled,
    LlamadError,
    NoSession,
    Overloaded,
    Unavailable,
    WorkerCrashed,
)
from llamad.front.wire import DaemonStatus, GcReport
from llamad.model.results import Completion, DoneEvent, ThinkingEvent, TokenEvent, ToolCallEvent

__all__ = [
    "DEFAULT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "ClientBase",
    "StreamBase",
    "StreamEvent",
]

R = TypeVar("R")

DEFAULT_TIMEOUT: Final = 300.0
"""Seconds a call may take by default (a long prompt on a CPU, queued behind others)."""
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
"""Seconds to wait for the daemon or a worker to be reachable (a restart in progress)."""
DEFAULT_IDLE_TIMEOUT: Final = 60.0
"""Seconds a stream may go without an event once its first one has arrived."""
STATUS_TIMEOUT: Final = 2.0
"""Seconds a client of several daemons waits for one's status (its load)."""
DEFAULT: Final[Any] = object()
"""A ``timeout=`` left to the client's own."""

StreamEvent = TokenEvent | ThinkingEvent | ToolCallEvent | DoneEvent
"""What iterating a stream yields (``done`` last)."""


class ClientBase:
    """The state both public clients keep (see the module doc); arguments as
    :class:`~llamad.Client`."""

    _default_name = "llamad-client"

    def __init__(  # noqa: PLR0917 - the clients' own keywords, passed on in order
        self,
        endpoint: str | None,
        config: str | os.PathLike[str] | None,
        timeout: float | None,
        connect_timeout: float,
        idle_timeout: float | None,
        name: str,
        curve: CurveClient | None,
        endpoints: Sequence[str] | None = None,
    ) -> None:
        # A library user's program never sees llamad's debug lines unless it
        # configured logging itself (llamad/logs.py says how).
        logs.library_default()
        if endpoints is not None:
            if endpoint is not None:
                raise TypeError("give endpoint= or endpoints=, not both")
            if isinstance(endpoints, str) or not endpoints:
                raise ValueError(f"endpoints= takes a non-empty list, got {endpoints!r}")
            endpoint = endpoints[0]
        if endpoint is None:
            endpoint = client_endpoint(config)
        every = endpoints if endpoints is not None else [endpoint]
        if curve is None and any(e.startswith("tcp://") for e in every):
            curve = client_curve(config)
        self.endpoint = endpoint
        """The daemon's endpoint (a client of several: the first)."""
        self.endpoints: tuple[str, ...] = tuple(endpoints) if endpoints else (endpoint,)
        self._router: Router | None = Router(self.endpoints) if len(self.endpoints) > 1 else None
        """The choice of a daemon per request; ``None`` for one daemon (no cost)."""
        self._affinity: Affinity | None = Affinity() if self._router is not None else None
        """What the daemons' KV events say they hold (several daemons only)."""
        self._where: dict[str, str] = {}  # request id -> endpoint running it (several daemons)
        self.curve = curve
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.name = name or f"{self._default_name}-{os.getpid()}"
        self._lock = threading.Lock()
        self._running: dict[str, str] = {}  # request id -> model id, for cancel()
        self._closed = False

    def _forget_route(self, model_id: str) -> None:
        """Drop the cached route (and connection) of ``model_id``."""
        raise NotImplementedError

    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is DEFAULT else timeout

    def _idle(self, idle_timeout: float | None) -> float | None:
        return self.idle_timeout if idle_timeout is DEFAULT else idle_timeout

    def _started(self, ask: Ask[Any], timeout: float | None) -> float | None:
        """``ask`` is about to be sent: note a generation as running; its time limit."""
        limit = self._t(timeout)
        if ask.request_id is not None and ask.model_id is not None:
            self._note_running(ask.request_id, ask.model_id)
        return limit

    def _stream_started(self, ask: Ask[Any]) -> str:
        """The stream of generation ``ask`` is open: note it as running; its request id."""
        assert ask.request_id is not None and ask.model_id is not None
        self._note_running(ask.request_id, ask.model_id)
        return ask.request_id

    def _finished(self, ask: Ask[Any]) -> None:
        """``ask`` was answered, or failed."""
        if ask.request_id is not None:
            self._ended(ask.request_id)

    def _answered(self, ask: Ask[R], answer: Any) -> R:
        """What the method returns of ``ask``'s decoded ``answer``."""
        if ask.forgets is not None:
            self._forget_route(ask.forgets)
        return ask.read(answer)

    def _cancel_ask(self, request_id: str, model_id: str | None) -> Ask[bool] | None:
        """How to cancel ``request_id`` on ``model_id``'s worker (by default the
        model this client started it on); ``None`` when that is unknown."""
        model = model_id or self._running.get(request_id)
        if model is None:
            return None
        return asks.cancel(model, request_id)

    def _note_running(self, request_id: str, model_id: str) -> None:
        with self._lock:
            self._running[request_id] = model_id

    def _ended(self, request_id: str) -> None:
        with self._lock:
            self._running.pop(request_id, None)

    # -- several daemons: the decisions (the clients do the waiting) -----------

    @property
    def router(self) -> Router:
        assert self._router is not None, "a client of one daemon routes nothing"
        return self._router

    def _targets(self, ask: Ask[Any], prefix: dict[str, int] | None = None) -> list[str]:
        """The daemons to send ``ask`` to, in order (``docs/internals/client.md``,
        "Several daemons"): all of them for :attr:`Spread.ALL` and an unknown
        request's ``cancel``, else the first of them that takes it."""
        router = self.router
        how = spread(ask.op)
        if how is Spread.ALL:
            return list(self.endpoints)
        if how is Spread.FIRST:
            return router.live()
        if how is Spread.REQUEST:
            at = self._where.get(ask.body.request_id)
            return [at] if at is not None else list(self.endpoints)
        session = _session_of(ask)
        if how is Spread.SESSION:
            at = router.session(session) if session is not None else None
            return [at] if at is not None else router.live()
        assert ask.model_id is not None
        return router.order(
            ask.model_id, prefix=prefix, session_id=session, spread_key=_spread_key(ask)
        )

    def _everywhere(self, ask: Ask[Any], targets: Sequence[str]) -> bool:
        """Whether ``ask`` goes to every one of ``targets`` (else to the first that takes it)."""
        how = spread(ask.op)
        return how is Spread.ALL or (how is Spread.REQUEST and len(targets) > 1)

    def _goes_on(self, ask: Ask[Any], endpoint: str, error: LlamadError) -> bool:
        """``ask`` failed on ``endpoint`` with ``error``: whether the next target
        is tried. Unreachable (``unavailable``: nothing was run there) marks the
        daemon down and goes on; a full queue goes on to a less busy daemon; a
        session op on a session this client never saw goes on looking for it."""
        if isinstance(error, Unavailable):
            self.router.failed(endpoint)
            return True
        if isinstance(error, WorkerCrashed):
            # Sent, and it died there: never resent, but the next request
            # goes elsewhere while that daemon (or its worker) comes back.
            self.router.failed(endpoint)
            return False
        how = spread(ask.op)
        if how is Spread.ANY and isinstance(error, Overloaded):
            return True
        return how is Spread.SESSION and isinstance(error, NoSession)

    def _took(self, ask: Ask[Any], endpoint: str) -> None:
        """``endpoint`` answered ``ask``: it is up, and a session it now holds
        (or no longer holds) is noted."""
        router = self.router
        router.reached(endpoint)
        session = _session_of(ask)
        if session is None:
            return
        if ask.op == "end_session":
            router.unbind(session)
        elif ask.op == "fork_session":
            router.bind(ask.body.new_id, endpoint)
        else:
            router.bind(session, endpoint)

    def _sent_to(self, ask: Ask[Any], endpoint: str) -> None:
        """A generation ``ask`` is being sent to ``endpoint``."""
        if ask.request_id is not None:
            with self._lock:
                self._where[ask.request_id] = endpoint
            self.router.started(endpoint)

    def _done_at(self, endpoint: str, request_id: str | None) -> None:
        """A generation sent to ``endpoint`` ended (any way)."""
        if request_id is not None:
            with self._lock:
                self._where.pop(request_id, None)
            self.router.ended(endpoint)

    def _routed_end(self, request_id: str) -> None:
        """A stream a client of several opened ended (any way)."""
        self._ended(request_id)
        endpoint = self._where.get(request_id)
        if endpoint is not None:
            self._done_at(endpoint, request_id)

    def _stream_failed(self, request_id: str, error: LlamadError) -> None:
        """Stream ``request_id`` ended with ``error``: a daemon that died under
        it is down, so the next request goes elsewhere."""
        endpoint = self._where.get(request_id)
        if endpoint is not None and isinstance(error, (WorkerCrashed, Unavailable)):
            self.router.failed(endpoint)

    @staticmethod
    def _died_with(ask: Ask[Any], error: LlamadError) -> bool:
        """Whether ``ask`` may be sent again elsewhere if its daemon is gone: a
        request on a model (nothing of it reached the caller) whose worker
        died under it. A worker that died while its daemon lives may have
        been killed by the request itself: that one is never resent."""
        return isinstance(error, WorkerCrashed) and spread(ask.op) is Spread.ANY

    def _dead_under(self, ask: Ask[Any], error: LlamadError) -> str | None:
        """The daemon a stream failed on before its first event, when the
        failure says it may be gone (else ``None``)."""
        if ask.request_id is None or not self._died_with(ask, error):
            return None
        return self._where.get(ask.request_id)

    def _lost(self, ask: Ask[Any], endpoint: str) -> None:
        """``ask``'s daemon ``endpoint`` is gone: down, and the request no longer runs there."""
        self._done_at(endpoint, ask.request_id)
        self.router.failed(endpoint)

    def _loaded(self, endpoint: str, status: DaemonStatus) -> None:
        """A status read of ``endpoint``: its load, its models' namespaces and
        where it publishes its KV events."""
        self.router.loaded(endpoint, pending_of(status))
        if self._affinity is not None:
            self._affinity.learn(endpoint, status)

    @property
    def affinity(self) -> Affinity | None:
        """What the daemons' KV events say they hold (a client of several)."""
        return self._affinity

    def _prompt_plan(
        self, ask: Ask[Any]
    ) -> tuple[list[int] | None, Hashable | None, Ask[list[int]] | None]:
        """For a generation worth routing by cache affinity (some daemon holds
        blocks of its model): its token ids when known (given as ids, or kept
        from an earlier request), else the key to keep them under and the
        ``tokenize`` or ``apply_chat_template`` that gets them from a daemon.
        ``(None, None, None)``: route by load alone."""
        affinity = self._affinity
        if (
            affinity is None
            or ask.op not in GENERATIONS
            or ask.model_id is None
            or not affinity.worth_it(ask.model_id)
        ):
            return None, None, None
        body = ask.body
        model = ask.model_id
        if body.prompt is not None and not isinstance(body.prompt, str):
            return list(body.prompt), None, None
        get: Ask[list[int]]
        key: Hashable
        if isinstance(body.prompt, str):
            # As the worker tokenizes a text prompt (worker_ops._prompt).
            key = (model, "text", body.add_special, body.prompt)
            get = asks.tokenize(model, body.prompt, body.add_special, True)
        elif body.messages is not None:
            key = (model, "chat", _json(body.messages), _json(body.chat))
            get = asks.apply_chat_template(model, body.messages, msgspec.structs.asdict(body.chat))
        else:
            return None, None, None
        tokens = affinity.tokens(key)
        return (tokens, None, None) if tokens is not None else (None, key, get)

    def _prefix(
        self, ask: Ask[Any], tokens: list[int] | None, key: Hashable | None
    ) -> dict[str, int] | None:
        """Per daemon, the prompt's leading blocks it holds (``None``: no tokens)."""
        if tokens is None or self._affinity is None or ask.model_id is None:
            return None
        if key is not None:
            self._affinity.keep(key, tokens)
        return self._affinity.prefix(ask.model_id, tokens, ask.body.params.salt)


GENERATIONS: Final = frozenset({"complete", "infer", "prefill_only"})

_json = msgspec.json.Encoder().encode


SPREAD_CHARS: Final = 256
"""How much of a prompt's start picks its daemon among equally loaded ones."""


def _spread_key(ask: Ask[Any]) -> int:
    """A stable hash of the start of ``ask``'s prompt (crc32: the same in every
    process), or 0 for an op without one."""
    body = ask.body
    prompt = getattr(body, "prompt", None)
    if isinstance(prompt, str):
        start = prompt[:SPREAD_CHARS].encode("utf-8", "surrogatepass")
    elif prompt is not None:
        start = _json(list(prompt[:64]))
    elif getattr(body, "messages", None) is not None:
        start = _json(body.messages)[:SPREAD_CHARS]
    else:
        return 0
    return zlib.crc32(start)


def _session_of(ask: Ask[Any]) -> str | None:
    """The session ``ask`` is about (a generation's ``session_id``, a session
    op's session, a fork's source), if any."""
    body = ask.body
    params = getattr(body, "params", None)
    if params is not None:
        session: str | None = getattr(params, "session_id", None)
        return session
    return getattr(body, "session_id", None) or getattr(body, "source_id", None)


def pending_of(status: DaemonStatus) -> dict[str, int]:
    """Each model's requests admitted or queued, from a daemon's status."""
    out: dict[str, int] = {}
    for model in status.models:
        if model.worker is not None:
            out[model.info.model_id] = model.worker.status.pending_len
    return out


def combined(ask: Ask[Any], answers: Sequence[Any]) -> Any:
    """The one answer of an op sent to every daemon: bytes evicted and gc
    counts summed, a cancel true if any daemon ran the request, else the
    first daemon's answer (a model's info, as loaded there)."""
    if ask.op == "evict_bytes":
        return sum(answers)
    if ask.op == "gc":
        return GcReport(*(sum(getattr(a, f) for a in answers) for f in GcReport.__struct_fields__))
    if ask.op == "cancel":
        return next((a for a in answers if a.cancelled), answers[0])
    return answers[0]


class _Timed(Protocol):
    timeout: float | None


class StreamBase:
    """A running ``infer`` request, apart from the waiting (see the module doc).

    ``request_id`` names it for ``cancel``; ``model_id`` is the model
    serving it, ``endpoint`` the daemon (of a client of several, the one
    the router picked). :attr:`result` is the :class:`Completion` once the ``done``
    event has arrived; :attr:`error` the error that ended it instead.
    """

    def __init__(
        self,
        *,
        model_id: str,
        request_id: str,
        idle_timeout: float | None,
        on_end: Callable[[str], None],
        on_error: Callable[[LlamadError], None] | None = None,
        endpoint: str = "",
    ) -> None:
        self.model_id = model_id
        self.endpoint = endpoint
        self._on_error = on_error
        self.request_id = request_id
        self._idle_timeout = idle_timeout
        self._on_end: Callable[[str], None] | None = on_end
        self._events_seen = 0
        self.result: Completion | None = None
        self.error: LlamadError | None = None

    @property
    def finished(self) -> bool:
        """Whether the terminal (``done`` or an error) arrived, or the stream was closed."""
        return self._on_end is None

    def _done(self, end: Any) -> DoneEvent:
        """The stream's END arrived, with ``end`` (its body): its ``done`` event."""
        self.result = result = read_end(end, Completion)
        self._ended()
        return DoneEvent(result=result)

    def _failed(self, error: LlamadError) -> None:
        """The stream ended with ``error`` (raised by the caller)."""
        self.error = error
        if self._on_error is not None:
            self._on_error(error)
        self._ended()

    def _arrived(self, call: _Timed, event: StreamEvent) -> StreamEvent:
        if self._events_seen == 0:
            # The first event came within the first-token timeout; from
            # now on each must come within the idle timeout.
            call.timeout = self._idle_timeout
        self._events_seen += 1
        return event

    def _outcome(self) -> Completion:
        """The :class:`Completion` of a stream consumed to its end, or its error
        raised; :class:`~llamad.errors.Cancelled` for a stream closed before its
        end (it has no :class:`Completion`: the worker cancelled the request
        and the rest of its events were never read)."""
        if self.result is not None:
            return self.result
        if self.error is not None:
            raise self.error
        raise Cancelled(
            f"stream {self.request_id!r} was closed before its done event (a break out of"
            " its loop, close(), the with block's end): its request was cancelled and has"
            " no Completion; use stream.cancel() and read on for the partial reply",
            details={"reason": "closed", "request_id": self.request_id},
        )

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end(self.request_id)

    def __del__(self) -> None:
        # The actors stream call cancels itself on the worker when it is
        # collected; only the client's note of the running request is left
        # to drop.
        if self._on_end is not None:
            self._ended()
