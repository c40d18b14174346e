"""Typed calls to one model worker's actor (what the front and tests use).

A thin layer over :class:`llamad.actors.Client`: it builds the op bodies of
:mod:`llamad.model.wire` and decodes answers into the core's result types,
so a caller writes ``worker.complete("Hello", max_tokens=8).reply``. Errors
arrive as the typed exceptions the worker raised (``sticky_busy``,
``context_overflow``, ...), and a worker that dies fails every open call and
stream with ``worker_crashed`` within about 0.1 s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from llamad.actors import Client, Registry, StreamCall
from llamad.model.requests import RequestParams
from llamad.model.results import Completion, Event
from llamad.model.status_board import WorkerSnapshot, read_status, status_path
from llamad.model.wire import ChatOptions, EmbedReply, ForkReply, InferBody, TextReply, TokensReply
from llamad.model.worker_spec import worker_actor_name

__all__ = ["InferStream", "WorkerClient"]

Prompt = str | Sequence[int] | None


class InferStream:
    """An ``infer`` stream: iterate for events; :attr:`result` once it ended."""

    def __init__(self, call: StreamCall) -> None:
        self.call = call

    def __iter__(self) -> Iterator[Event]:
        for message in self.call:
            yield message.body

    @property
    def result(self) -> Completion | None:
        raw = self.call.result
        return None if raw is None else msgspec.convert(raw, Completion)

    def cancel(self) -> None:
        """Abandon the stream: the worker cancels the request and frees its sequence."""
        self.call.cancel()

    def __enter__(self) -> InferStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class WorkerClient:
    """Calls to the worker of ``model_id`` (found in ``registry``, following restarts)."""

    def __init__(
        self,
        model_id: str,
        *,
        registry: Registry | None = None,
        timeout: float | None = 120.0,
        connect_timeout: float = 5.0,
        client_name: str = "",
    ) -> None:
        self.model_id = model_id
        self.registry = registry if registry is not None else Registry()
        self.actor = Client(
            name=worker_actor_name(model_id),
            registry=self.registry,
            timeout=timeout,
            connect_timeout=connect_timeout,
            client_name=client_name,
        )

    def close(self) -> None:
        self.actor.close()

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def body(
        prompt: Prompt = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        request_id: str | None = None,
        chat: ChatOptions | None = None,
        add_special: bool = True,
        **params: Any,
    ) -> InferBody:
        """The request body for ``prompt`` (text or token ids) or ``messages``."""
        return InferBody(
            prompt=prompt if prompt is None or isinstance(prompt, str) else list(prompt),
            messages=messages,
            params=RequestParams(**params),
            chat=chat or ChatOptions(),
            request_id=request_id,
            add_special=add_special,
        )

    def complete(
        self, prompt: Prompt = None, *, timeout: float | None = None, **kw: Any
    ) -> Completion:
        body = self.body(prompt, **kw)
        result: Completion = self.actor.call(
            "complete", body, timeout=timeout or self.actor.timeout, reply_type=Completion
        )
        return result

    def prefill_only(
        self, prompt: Prompt = None, *, timeout: float | None = None, **kw: Any
    ) -> Completion:
        body = self.body(prompt, **kw)
        result: Completion = self.actor.call(
            "prefill_only", body, timeout=timeout or self.actor.timeout, reply_type=Completion
        )
        return result

    def infer(
        self, prompt: Prompt = None, *, event_timeout: float | None = None, **kw: Any
    ) -> InferStream:
        body = self.body(prompt, **kw)
        return InferStream(
            self.actor.stream("infer", body, timeout=event_timeout, event_type=Event)
        )

    def cancel(self, request_id: str) -> bool:
        return bool(self.actor.call("cancel", {"request_id": request_id})["cancelled"])

    def end_session(self, session_id: str) -> None:
        self.actor.call("end_session", {"session_id": session_id})

    def reset_session(self, session_id: str) -> None:
        self.actor.call("reset_session", {"session_id": session_id})

    def fork_session(self, source_id: str, new_id: str) -> bool:
        reply: ForkReply = self.actor.call(
            "fork_session", {"source_id": source_id, "new_id": new_id}, reply_type=ForkReply
        )
        return reply.copied

    def status(self) -> WorkerSnapshot:
        """The worker's status without waiting on its loop (SPEC M10).

        On the worker's host this reads the status board the live worker
        publishes (microseconds, even in the middle of a long tick); elsewhere,
        or before the worker has published, it asks the worker's ``status``
        op, which is answered between ticks.
        """
        name = worker_actor_name(self.model_id)
        entry = self.registry.lookup(name)
        if entry is not None:
            snapshot = read_status(status_path(self.registry.root, name))
            if snapshot is not None and snapshot.instance == entry.instance:
                return snapshot
        return self.status_from_loop()

    def status_from_loop(self) -> WorkerSnapshot:
        """The ``status`` op: a fresh snapshot, answered between two ticks."""
        snapshot: WorkerSnapshot = self.actor.call("status", {}, reply_type=WorkerSnapshot)
        return snapshot

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        body = {"text": text, "add_special": add_special, "parse_special": parse_special}
        reply: TokensReply = self.actor.call("tokenize", body, reply_type=TokensReply)
        return reply.tokens

    def detokenize(self, tokens: Sequence[int], **options: bool) -> str:
        reply: TextReply = self.actor.call(
            "detokenize", {"tokens": list(tokens), **options}, reply_type=TextReply
        )
        return reply.text

    def apply_chat_template(self, messages: list[dict[str, Any]], **options: Any) -> list[int]:
        body = {"messages": messages, "chat": msgspec.to_builtins(ChatOptions(**options))}
        reply: TokensReply = self.actor.call("apply_chat_template", body, reply_type=TokensReply)
        return reply.tokens

    def embed(
        self, inputs: Sequence[str | Sequence[int]], *, normalize: bool = True
    ) -> list[list[float]]:
        items = [i if isinstance(i, str) else list(i) for i in inputs]
        reply: EmbedReply = self.actor.call(
            "embed", {"inputs": items, "normalize": normalize}, reply_type=EmbedReply
        )
        return reply.embeddings
