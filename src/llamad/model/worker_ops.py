"""The worker's op handlers: each turns one validated request into a core call.

Handlers run on the loop thread, between ticks, inside :meth:`Actor.poll`.
A request that can be refused at once (a bad prompt, ``overloaded``,
``sticky_busy``, ...) is refused by raising the typed error: the actor
answers it. An admitted request takes a stream or a deferred reply and is
registered with :class:`~llamad.model.deliveries.Deliveries`, whose
cancellation callback cancels it in the core when its client goes away.
Schemas: :mod:`llamad.model.wire`.

A text longer than :data:`INLINE_TEXT_CHARS` (a prompt, a chat's messages,
a ``tokenize`` or ``apply_chat_template`` body) is rendered and tokenized on
the text thread (:mod:`llamad.model.text_jobs`), not on the loop: the
request goes on from the loop once its tokens are there, and meanwhile the
worker serves everyone else. Before any tokenizing, a prompt text that
cannot fit the context is ``context_overflow``
(:func:`~llamad.model.requests.refuse_unfittable`: a text prompt at once on
the loop, a chat once rendered).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec
import structlog

from llamad.actors import Actor, PendingReply, Request, StreamSender
from llamad.errors import BadRequest, Unavailable
from llamad.llama_ffi.errors import Unsupported
from llamad.model.core import WorkerCore
from llamad.model.deliveries import Deliveries
from llamad.model.heartbeat import BusyMark
from llamad.model.requests import refuse_unfittable
from llamad.model.text_jobs import Outcome, TextJobs
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

__all__ = ["INLINE_TEXT_CHARS", "WorkerOps"]

log = structlog.get_logger("llamad.model")

T = TypeVar("T")

INLINE_TEXT_CHARS: Final = 16 << 10
"""The longest text tokenized on the loop (characters; a few ms at most);
longer ones go to the text thread. A chat counts its messages' strings."""


def _chat_options(chat: ChatOptions) -> dict[str, Any]:
    return {
        "add_generation_prompt": chat.add_generation_prompt,
        "continue_final_message": chat.continue_final_message,
        # tool_choice "none": the model is not told of the tools at all.
        "tools": None if chat.tool_choice == "none" else chat.tools,
        "enable_thinking": chat.enable_thinking,
        "system": chat.system,
    }


@dataclass(eq=False, slots=True)
class _Held:
    """A request and its client end, admitted once its tokens are there and no
    adapter change is waiting (``cancel`` asked before then: ``cancelled``)."""

    req: Request[InferBody]
    handle: StreamSender | PendingReply
    request_id: str
    prefill_only: bool = False
    tokens: list[int] | None = None
    cancel_asked: bool = False
    grammar: str | None = None
    """A tool_choice's grammar, replacing the request's (which has none)."""


def _utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _chars_in(value: object) -> int:
    """Characters in the strings of a decoded message tree (keys included)."""
    total = 0
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list | tuple):
            todo.extend(item)
    return total


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
        #: Requests whose text the text thread is rendering or tokenizing.
        self._preparing: dict[str, _Held] = {}
        self.text_jobs = TextJobs()

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
        # A handler (an embedding batch, an adapter load, a short text
        # tokenized inline) is loop time like a tick: it counts against
        # decode_timeout_ms too. A long text's tokenizing is not: it runs on
        # the text thread, outside any busy section.
        mark = self.mark

        def run(req: Request[Any]) -> Any:
            self.last_request_at = mark.clock()
            with mark.busy():
                return handler(req)

        return run

    # -- requests --------------------------------------------------------------------

    def _prompt(self, body: InferBody) -> list[int] | Callable[[], list[int]]:
        """The prompt's tokens, or the work that makes them on the text thread
        (a long text). A prompt that cannot fit the context is refused first."""
        text = self.parts.text
        n_ctx = self.core.config.n_ctx
        bound = text.max_token_bytes
        if body.messages is not None:
            messages, options = body.messages, _chat_options(body.chat)

            def chat() -> list[int]:
                # A template may leave messages out: only the rendered text
                # bounds the tokens.
                prompt, add_bos = text.chat_prompt(messages, **options)
                refuse_unfittable(_utf8_bytes(prompt), bound, n_ctx)
                return text.tokenize(prompt, add_special=add_bos, parse_special=True)

            return chat if _chars_in(messages) > INLINE_TEXT_CHARS else chat()
        if isinstance(body.prompt, str):
            prompt, add_special = body.prompt, body.add_special
            # At once, before it waits for the text thread: every character
            # is at least one byte (exactly one in ASCII).
            ascii_ = prompt.isascii()
            refuse_unfittable(len(prompt), bound, n_ctx, exact=ascii_)

            def tokens() -> list[int]:
                if not ascii_:
                    refuse_unfittable(_utf8_bytes(prompt), bound, n_ctx)
                return text.tokenize(prompt, add_special=add_special, parse_special=True)

            return tokens if len(prompt) > INLINE_TEXT_CHARS else tokens()
        assert body.prompt is not None
        return body.prompt

    def infer(self, req: Request[InferBody]) -> None:
        self._request(req, req.stream())

    def complete(self, req: Request[InferBody]) -> None:
        self._request(req, req.defer())

    def prefill_only(self, req: Request[InferBody]) -> None:
        self._request(req, req.defer(), prefill_only=True)

    def _request(
        self,
        req: Request[InferBody],
        handle: StreamSender | PendingReply,
        *,
        prefill_only: bool = False,
    ) -> None:
        # A refusal raises: the actor fails the handle with it.
        request_id = req.body.request_id or f"r{next(self._ids)}.{req.peer.process.pid}"
        if request_id in self._preparing:
            raise BadRequest(
                f"request {request_id!r} is already running", details={"field": "request_id"}
            )
        held = _Held(req, handle, request_id, prefill_only, grammar=self._tool_grammar(req.body))
        prompt = self._prompt(req.body)
        if isinstance(prompt, list):
            held.tokens = prompt
            self._admit(held)
            return
        self.text_jobs.submit(prompt, lambda outcome: self._prepared(held, outcome))
        self._preparing[request_id] = held

    def _tool_grammar(self, body: InferBody) -> str | None:
        """``tool_choice`` required or named: the grammar of one call, built
        before admission so a bad choice or schema is refused at once."""
        chat = body.chat
        if body.messages is None or chat.tool_choice in (None, "none", "auto"):
            return None
        if body.params.grammar is not None or body.params.json_schema is not None:
            raise BadRequest(
                "tool_choice required or named makes its own grammar: give no grammar"
                " or json_schema with it",
                details={"field": "tool_choice"},
            )
        return self.parts.text.tool_grammar(chat.tools, chat.tool_choice)

    def _prepared(self, held: _Held, outcome: Outcome[list[int]]) -> None:
        """On the loop: the text thread made ``held``'s tokens (or failed)."""
        self._preparing.pop(held.request_id, None)
        if held.handle.done:
            return  # its client went away meanwhile
        try:
            held.tokens = outcome.get()
            with self.mark.busy():
                self._admit(held)
        except Exception as exc:
            held.handle.fail(exc)

    def _admit(self, held: _Held) -> None:
        if self._changes:
            # An adapter change waits for the worker to drain; requests that
            # came after it wait behind it, so it cannot be starved.
            self._held.append(held)
            return
        self._start(held)

    def _start(self, held: _Held) -> None:
        body = held.req.body
        params = body.params
        if held.prefill_only and not params.prefill_only:
            params = msgspec.structs.replace(params, prefill_only=True)
        if held.grammar is not None:
            params = msgspec.structs.replace(params, grammar=held.grammar)
        assert held.tokens is not None
        request_id = held.request_id
        self.core.submit(
            request_id, held.tokens, params, waited_s=_waited(body, local=held.req.peer.local)
        )
        self.requests_total += 1
        handle = held.handle
        if isinstance(handle, StreamSender):
            self.deliveries.add_stream(request_id, handle, self._client_gone)
        else:
            self.deliveries.add_reply(request_id, handle, self._client_gone)
        if held.cancel_asked:
            self.core.cancel(request_id)  # ends ``cancelled`` like any other

    def _client_gone(self, request_id: str) -> None:
        # Observed at the next tick: the request ends ``cancelled``, takes its
        # finish save and frees its sequence (SPEC M7).
        self.core.cancel(request_id)

    def cancel(self, req: Request[CancelBody]) -> CancelReply:
        request_id = req.body.request_id
        waiting = self._preparing.get(request_id)
        if waiting is None:
            waiting = next((h for h in self._held if h.request_id == request_id), None)
        if waiting is not None and not waiting.handle.done:
            # Not in the core yet: cancelled as soon as it is.
            waiting.cancel_asked = True
            return CancelReply(True)
        return CancelReply(self.core.cancel(request_id))

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

    def tokenize(self, req: Request[TokenizeBody]) -> TokensReply | None:
        b = req.body
        text = self.parts.text

        def tokens() -> TokensReply:
            return TokensReply(
                text.tokenize(b.text, add_special=b.add_special, parse_special=b.parse_special)
            )

        return self._text_op(req, tokens, len(b.text))

    def detokenize(self, req: Request[DetokenizeBody]) -> TextReply:
        b = req.body
        text = self.parts.text.detokenize(
            b.tokens, remove_special=b.remove_special, unparse_special=b.unparse_special
        )
        return TextReply(text)

    def apply_chat_template(self, req: Request[ChatBody]) -> TokensReply | None:
        b = req.body
        text = self.parts.text

        def tokens() -> TokensReply:
            return TokensReply(text.apply_chat_template(b.messages, **_chat_options(b.chat)))

        return self._text_op(req, tokens, _chars_in(b.messages))

    def _text_op(self, req: Request[Any], work: Callable[[], T], chars: int) -> T | None:
        """``work()``'s reply now, or for a long text (``chars``) from the text
        thread (the reply deferred until then)."""
        if chars <= INLINE_TEXT_CHARS:
            return work()
        pending = req.defer()
        self.text_jobs.submit(work, lambda outcome: _answer(pending, outcome))
        return None

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

    def close(self) -> None:
        """At shutdown: requests still waiting for their tokens end
        ``unavailable``; the text thread takes no more work."""
        self.text_jobs.close()
        preparing, self._preparing = self._preparing, {}
        for held in preparing.values():
            held.handle.fail(Unavailable("the worker is shutting down"))

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


def _answer(pending: PendingReply, outcome: Outcome[Any]) -> None:
    if pending.done:
        return  # its client went away meanwhile
    try:
        pending.reply(outcome.get())
    except Exception as exc:
        pending.fail(exc)
