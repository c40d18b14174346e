"""The worker's op handlers: each turns one validated request into a core call.

Handlers run on the loop thread, between ticks, inside :meth:`Actor.poll`.
A request that can be refused at once (a bad prompt, ``overloaded``,
``sticky_busy``, ...) is refused by raising the typed error: the actor
answers it. An admitted request takes a stream or a deferred reply and is
registered with :class:`~llamad.model.deliveries.Deliveries`, whose
cancellation callback cancels it in the core when its client goes away.
Schemas: :mod:`llamad.model.wire`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from llamad.actors import Actor, PendingReply, Request, StreamSender
from llamad.llama_ffi.errors import Unsupported
from llamad.model.core import WorkerCore
from llamad.model.deliveries import Deliveries
from llamad.model.heartbeat import BusyMark
from llamad.model.wire import (
    OPS,
    AdapterRef,
    AdapterScaleBody,
    CancelBody,
    CancelReply,
    ChatBody,
    ChatOptions,
    DetokenizeBody,
    EmbedBody,
    EmbedReply,
    ForkBody,
    ForkReply,
    InferBody,
    LoadAdapterBody,
    NoArgs,
    SessionBody,
    TextReply,
    TokenizeBody,
    TokensReply,
    WorkerSnapshot,
)
from llamad.model.worker_parts import Adapters, WorkerParts
from llamad.paths import contained_model_path

__all__ = ["WorkerOps"]

log = structlog.get_logger("llamad.model")


def _chat_options(chat: ChatOptions) -> dict[str, Any]:
    return {
        "add_generation_prompt": chat.add_generation_prompt,
        "continue_final_message": chat.continue_final_message,
        "tools": chat.tools,
        "enable_thinking": chat.enable_thinking,
        "system": chat.system,
    }


@dataclass(eq=False, slots=True)
class _Held:
    """A request and its client end, admitted now or after an adapter change."""

    req: Request[InferBody]
    handle: StreamSender | PendingReply
    prefill_only: bool = False


_MAX_WAITED_S = 600.0


def _waited(body: InferBody, *, local: bool) -> float:
    """How long before now the client sent the request, by its ``sent_at``:
    only from a client on this host (``time.monotonic()`` is host-wide on
    Linux) and only when plausible; else 0."""
    sent = body.sent_at
    if not local or sent is None or not math.isfinite(sent):
        return 0.0
    waited = time.monotonic() - sent
    return waited if 0.0 <= waited <= _MAX_WAITED_S else 0.0


class WorkerOps:
    """The handlers of :data:`llamad.model.wire.OPS` for one worker."""

    def __init__(
        self,
        core: WorkerCore,
        parts: WorkerParts,
        deliveries: Deliveries,
        mark: BusyMark,
        snapshot: Callable[[], WorkerSnapshot],
        *,
        adapter_dirs: tuple[str, ...] | None = None,
    ) -> None:
        self.core = core
        #: Where ``load_adapter`` may read (``None``: anywhere), see :class:`WorkerSpec`.
        self.adapter_dirs = adapter_dirs
        self.parts = parts
        self.deliveries = deliveries
        self.mark = mark
        self.snapshot = snapshot
        self.requests_total = 0
        #: When an op other than ``status`` last ran (the board's ``last_request_at``).
        self.last_request_at: float | None = None
        self._ids = itertools.count(1)
        self._changes: deque[tuple[Callable[[Adapters], Any], PendingReply]] = deque()
        self._held: deque[_Held] = deque()

    def register(self, actor: Actor) -> None:
        handlers: dict[str, Callable[[Request[Any]], Any]] = {
            "infer": self.infer,
            "complete": self.complete,
            "prefill_only": self.prefill_only,
            "cancel": self.cancel,
            "end_session": self.end_session,
            "reset_session": self.reset_session,
            "fork_session": self.fork_session,
            "status": self.status,
            "tokenize": self.tokenize,
            "detokenize": self.detokenize,
            "apply_chat_template": self.apply_chat_template,
            "embed": self.embed,
            "load_adapter": self.load_adapter,
            "unload_adapter": self.unload_adapter,
            "set_adapter_scale": self.set_adapter_scale,
            "list_adapters": self.list_adapters,
        }
        assert handlers.keys() == OPS.keys()
        for name, spec in OPS.items():
            handler = handlers[name]
            # status only reads a snapshot: it must not show itself as busy.
            actor.add_op(spec, handler if name == "status" else self._busy(handler))

    def _busy(self, handler: Callable[[Request[Any]], Any]) -> Callable[[Request[Any]], Any]:
        # A handler (a long tokenize, an embedding batch, an adapter load) is
        # loop time like a tick: it counts against decode_timeout_ms too.
        mark = self.mark

        def run(req: Request[Any]) -> Any:
            self.last_request_at = mark.clock()
            with mark.busy():
                return handler(req)

        return run

    # -- requests --------------------------------------------------------------------

    def _tokens(self, body: InferBody) -> list[int]:
        if body.messages is not None:
            return self.parts.text.apply_chat_template(body.messages, **_chat_options(body.chat))
        if isinstance(body.prompt, str):
            return self.parts.text.tokenize(
                body.prompt, add_special=body.add_special, parse_special=True
            )
        assert body.prompt is not None
        return body.prompt

    def _submit(self, req: Request[InferBody], *, prefill_only: bool = False) -> str:
        body = req.body
        params = body.params
        if prefill_only and not params.prefill_only:
            params = msgspec.structs.replace(params, prefill_only=True)
        request_id = body.request_id or f"r{next(self._ids)}.{req.peer.process.pid}"
        self.core.submit(
            request_id, self._tokens(body), params, waited_s=_waited(body, local=req.peer.local)
        )
        self.requests_total += 1
        return request_id

    def infer(self, req: Request[InferBody]) -> None:
        self._request(_Held(req, req.stream()))

    def complete(self, req: Request[InferBody]) -> None:
        self._request(_Held(req, req.defer()))

    def prefill_only(self, req: Request[InferBody]) -> None:
        self._request(_Held(req, req.defer(), prefill_only=True))

    def _request(self, held: _Held) -> None:
        if self._changes:
            # An adapter change waits for the worker to drain; requests that
            # came after it wait behind it, so it cannot be starved.
            self._held.append(held)
            return
        self._start(held)  # a refusal raises: the actor fails the handle with it

    def _start(self, held: _Held) -> None:
        request_id = self._submit(held.req, prefill_only=held.prefill_only)
        handle = held.handle
        if isinstance(handle, StreamSender):
            self.deliveries.add_stream(request_id, handle, self._client_gone)
        else:
            self.deliveries.add_reply(request_id, handle, self._client_gone)

    def _client_gone(self, request_id: str) -> None:
        # Observed at the next tick: the request ends ``cancelled``, takes its
        # finish save and frees its sequence (SPEC M7).
        self.core.cancel(request_id)

    def cancel(self, req: Request[CancelBody]) -> CancelReply:
        return CancelReply(self.core.cancel(req.body.request_id))

    # -- sessions ----------------------------------------------------------------------

    def end_session(self, req: Request[SessionBody]) -> None:
        self.core.end_session(req.body.session_id)

    def reset_session(self, req: Request[SessionBody]) -> None:
        self.core.reset_session(req.body.session_id)

    def fork_session(self, req: Request[ForkBody]) -> ForkReply:
        return ForkReply(self.core.fork_session(req.body.source_id, req.body.new_id))

    def status(self, req: Request[NoArgs]) -> WorkerSnapshot:
        return self.snapshot()

    # -- text, embeddings, adapters (SPEC M11) ------------------------------------------

    def tokenize(self, req: Request[TokenizeBody]) -> TokensReply:
        b = req.body
        tokens = self.parts.text.tokenize(
            b.text, add_special=b.add_special, parse_special=b.parse_special
        )
        return TokensReply(tokens)

    def detokenize(self, req: Request[DetokenizeBody]) -> TextReply:
        b = req.body
        text = self.parts.text.detokenize(
            b.tokens, remove_special=b.remove_special, unparse_special=b.unparse_special
        )
        return TextReply(text)

    def apply_chat_template(self, req: Request[ChatBody]) -> TokensReply:
        b = req.body
        return TokensReply(self.parts.text.apply_chat_template(b.messages, **_chat_options(b.chat)))

    def embed(self, req: Request[EmbedBody]) -> EmbedReply:
        embeddings = self.parts.embeddings
        if embeddings is None:
            raise Unsupported("this worker has no embedding support")
        return EmbedReply(embeddings.embed(req.body.inputs, normalize=req.body.normalize))

    def _adapters(self) -> Adapters:
        if self.parts.adapters is None:
            raise Unsupported("this worker has no adapter support")
        return self.parts.adapters

    def load_adapter(self, req: Request[LoadAdapterBody]) -> Any:
        b = req.body
        path = b.path
        if self.adapter_dirs is not None:
            # Like a model path (SPEC D5): the resolved file must lie in an
            # allowed directory, checked before anything opens it.
            path = str(contained_model_path(b.path, self.adapter_dirs, "path"))
        return self._change(req, lambda a: a.load(b.name or b.path, path, b.scale))

    def unload_adapter(self, req: Request[AdapterRef]) -> Any:
        return self._change(req, lambda a: a.unload(req.body.name))

    def set_adapter_scale(self, req: Request[AdapterScaleBody]) -> Any:
        return self._change(req, lambda a: a.set_scale(req.body.name, req.body.scale))

    def list_adapters(self, req: Request[NoArgs]) -> list[Any]:
        return list(self._adapters().list_adapters())

    def _change(self, req: Request[Any], change: Callable[[Adapters], Any]) -> Any:
        """Apply an adapter change now if the worker holds no request, else once
        it has drained (the caller's reply is deferred until then).

        An adapter applies to the whole context at once: a request admitted
        under the old namespace that decoded under the new adapters would save
        rows whose key does not describe their bytes.
        """
        adapters = self._adapters()
        if not self._changes and not self.core.requests:
            return change(adapters)
        self._changes.append((change, req.defer()))
        log.info("model.adapter_change_waits", running=len(self.core.requests))
        return None

    def settle(self) -> None:
        """Between ticks: apply adapter changes once no request is left, then
        submit the requests that waited behind them, in arrival order."""
        while self._changes and not self.core.requests:
            change, pending = self._changes.popleft()
            if pending.done:
                continue  # its client went away
            with self.mark.busy():
                try:
                    pending.reply(change(self._adapters()))
                except Exception as exc:
                    pending.fail(exc)
        while self._held and not self._changes:
            held = self._held.popleft()
            if held.handle.done:
                continue
            try:
                with self.mark.busy():
                    self._start(held)
            except Exception as exc:
                held.handle.fail(exc)
