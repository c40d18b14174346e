"""bench/soak.py's clients: the request mix, each request's outcome in the ledger.

Threads with a blocking :class:`llamad.Client` each, and tasks sharing one
:class:`llamad.AsyncClient` on an event loop, loop over a weighted mix of
request kinds until told to stop. Every request is written in the ledger
before it is sent and given one outcome per terminal the client sees (see
:mod:`bench.soak_report`). Prompts are token ids, so a reply can be checked
to continue its own prompt (a reply delivered to the wrong request is
"mismatched").
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from bench.soak_ledger import (
    CANCELLED,
    MISMATCH,
    OK,
    Ledger,
    error_outcome,
    untyped_outcome,
)
from llamad import AsyncClient, Client, Completion, DoneEvent, LlamadError

T = TypeVar("T")

#: kind -> weight. A session and a multi-turn resend are flows of several requests.
MIX: dict[str, int] = {
    "complete": 20,
    "stream": 20,
    "stream_break": 8,
    "stream_cancel": 6,
    "session": 10,
    "multiturn": 10,
    "embed": 10,
    "tokenize": 10,
}
ASYNC_MIX: dict[str, int] = {
    k: MIX[k] for k in ("complete", "stream", "stream_break", "embed", "tokenize")
}
WORDS = [
    *("river", "stone", "lamp", "cloud", "paper", "garden", "mirror", "copper"),
    *("window", "forest", "harbour", "lantern", "meadow", "thunder", "violet", "engine"),
]


@dataclass(frozen=True)
class Vocab:
    """Token ids of single words (tokenized once), to build prompts from."""

    words: list[list[int]]
    pool: list[list[int]]  # a few prompts sent again and again (exact hits, evictions)

    def prompt(self, rng: random.Random) -> list[int]:
        if rng.random() < 0.2:
            return list(rng.choice(self.pool))
        return [t for _ in range(rng.randint(40, 140)) for t in rng.choice(self.words)]


def build_vocab(client: Client, model: str) -> Vocab:
    words = [client.tokenize(model, f" {w}", add_special=False) for w in WORDS]
    rng = random.Random(7)
    pool = [[t for _ in range(rng.randint(60, 120)) for t in rng.choice(words)] for _ in range(6)]
    return Vocab(words, pool)


def continues(result: Completion, prompt: Sequence[int]) -> bool:
    """Whether ``result`` is a reply to ``prompt`` (its context holds it just
    before what was generated)."""
    body = result.context_tokens[: len(result.context_tokens) - len(result.generated)]
    return body[len(body) - len(prompt) :] == list(prompt)


def _done_outcome(result: Completion, prompt: Sequence[int]) -> str:
    if not continues(result, prompt):
        return MISMATCH
    return CANCELLED if result.cancelled else OK


def _options(rng: random.Random) -> dict[str, Any]:
    return {"max_tokens": rng.randint(4, 20), "temperature": rng.choice([0.0, 0.8]), "seed": 1}


@dataclass(frozen=True)
class Load:
    """What every client shares: the daemon, its models, prompts, the ledger,
    and the event that stops them."""

    endpoint: str
    models: list[str]
    vocab: Vocab
    ledger: Ledger
    stop: threading.Event


class Worker:
    """One blocking client's loop (a thread)."""

    def __init__(self, n: int, load: Load) -> None:
        self.n = n
        self.models = list(load.models)
        self.vocab = load.vocab
        self.ledger = load.ledger
        self.stop = load.stop
        self.rng = random.Random(1000 + n)
        self.client = Client(
            load.endpoint, timeout=120, connect_timeout=60, idle_timeout=60, name=f"soak-{n}"
        )
        self.flows = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                kind = self.rng.choices(list(MIX), weights=list(MIX.values()))[0]
                model = self.rng.choice(self.models)
                getattr(self, f"_{kind}")(model)
                self.flows += 1
        finally:
            self.client.close()

    def _one(self, kind: str, model: str, body: Callable[[str], tuple[str | None, T]]) -> T | None:
        """Run one request: ``body(rid)`` returns the outcome to record (``None``:
        it recorded its own) and a value for the flow."""
        rid = self.ledger.start(kind, model)
        try:
            outcome, value = body(rid)
        except LlamadError as exc:
            self.ledger.end(rid, error_outcome(exc.code))
            return None
        except Exception as exc:  # an untyped failure is what the soak looks for
            self.ledger.end(rid, untyped_outcome(exc))
            return None
        if outcome is not None:
            self.ledger.end(rid, outcome)
        return value

    def _complete_req(
        self, kind: str, model: str, prompt: list[int], **kw: Any
    ) -> Completion | None:
        def body(rid: str) -> tuple[str | None, Completion]:
            r = self.client.complete(model, prompt, request_id=rid, add_special=False, **kw)
            return _done_outcome(r, prompt), r

        return self._one(kind, model, body)

    def _complete(self, model: str) -> None:
        self._complete_req("complete", model, self.vocab.prompt(self.rng), **_options(self.rng))

    def _streamed(
        self, kind: str, model: str, leave_after: int | None, cancel_after: int | None
    ) -> None:
        prompt = self.vocab.prompt(self.rng)

        def body(rid: str) -> tuple[str | None, None]:
            stream = self.client.infer(
                model, prompt, request_id=rid, add_special=False, **_options(self.rng)
            )
            tokens = dones = 0
            for event in stream:
                if dones:
                    return untyped_outcome(RuntimeError("an event after done")), None
                if isinstance(event, DoneEvent):
                    dones += 1
                    self.ledger.end(rid, _done_outcome(event.result, prompt))
                    continue
                tokens += 1
                if tokens == leave_after:
                    break  # closing the stream cancels the request on the worker
                if tokens == cancel_after:
                    stream.cancel()  # the worker stops it; a cancelled done follows
            if dones:
                return None, None
            if leave_after is not None and tokens == leave_after:
                return CANCELLED, None
            return untyped_outcome(RuntimeError("the stream ended without a terminal")), None

        self._one(kind, model, body)

    def _stream(self, model: str) -> None:
        self._streamed("stream", model, None, None)

    def _stream_break(self, model: str) -> None:
        self._streamed("stream_break", model, self.rng.randint(1, 3), None)

    def _stream_cancel(self, model: str) -> None:
        self._streamed("stream_cancel", model, None, self.rng.randint(1, 3))

    def _session(self, model: str) -> None:
        sid = f"soak-s{self.n}-{self.flows}"
        try:
            first = self._complete_req(
                "session", model, self.vocab.prompt(self.rng), session_id=sid, **_options(self.rng)
            )
            for _ in range(self.rng.randint(1, 2)):
                if first is None:
                    break
                tail = self.vocab.words[self.rng.randrange(len(self.vocab.words))] * 3
                first = self._complete_req(
                    "session_continue",
                    model,
                    tail,
                    session_id=sid,
                    continue_=True,
                    **_options(self.rng),
                )
        finally:
            self._one("end_session", model, lambda rid: self._end_session(model, sid))

    def _end_session(self, model: str, sid: str) -> tuple[str, None]:
        self.client.end_session(model, sid)
        return OK, None

    def _multiturn(self, model: str) -> None:
        first = self._complete_req(
            "multiturn", model, self.vocab.prompt(self.rng), **_options(self.rng)
        )
        if first is None:
            return
        follow = self.vocab.words[self.rng.randrange(len(self.vocab.words))] * 4
        self._complete_req(
            "multiturn_resend",
            model,
            [*first.context_tokens, *follow],
            parent_key=first.finish_key,
            **_options(self.rng),
        )

    def _embed(self, model: str) -> None:
        text = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(3, 30)))

        def body(rid: str) -> tuple[str | None, None]:
            v = self.client.embed(model, text)
            return (OK if v else untyped_outcome(RuntimeError("an empty embedding"))), None

        self._one("embed", model, body)

    def _tokenize(self, model: str) -> None:
        text = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(3, 60)))

        def body(rid: str) -> tuple[str | None, None]:
            ids = self.client.tokenize(model, text, add_special=False)
            return (OK if ids else untyped_outcome(RuntimeError("no tokens"))), None

        self._one("tokenize", model, body)


@dataclass(frozen=True)
class _AsyncRequest:
    client: AsyncClient
    ledger: Ledger
    kind: str
    model: str
    prompt: list[int]
    text: str
    options: dict[str, Any]
    leave_after: int | None

    async def body(self, rid: str) -> str | None:
        """The request; the outcome to record (``None``: recorded already)."""
        c, model = self.client, self.model
        if self.kind == "embed":
            return OK if await c.embed(model, self.text) else untyped_outcome(RuntimeError("empty"))
        if self.kind == "tokenize":
            ids = await c.tokenize(model, self.text, add_special=False)
            return OK if ids else untyped_outcome(RuntimeError("no tokens"))
        if self.kind == "complete":
            r = await c.complete(
                model, self.prompt, request_id=rid, add_special=False, **self.options
            )
            return _done_outcome(r, self.prompt)
        s = await c.infer(model, self.prompt, request_id=rid, add_special=False, **self.options)
        tokens = dones = 0
        async for event in s:
            if dones:
                return untyped_outcome(RuntimeError("an event after done"))
            if isinstance(event, DoneEvent):
                dones += 1
                self.ledger.end(rid, _done_outcome(event.result, self.prompt))
                continue
            tokens += 1
            if tokens == self.leave_after:
                await s.aclose()  # the request is cancelled on the worker
                return CANCELLED
        return (
            None if dones else untyped_outcome(RuntimeError("the stream ended without a terminal"))
        )

    async def run(self) -> None:
        rid = self.ledger.start(f"async_{self.kind}", self.model)
        try:
            outcome = await self.body(rid)
        except LlamadError as exc:
            self.ledger.end(rid, error_outcome(exc.code))
            return
        except Exception as exc:  # an untyped failure is what the soak looks for
            self.ledger.end(rid, untyped_outcome(exc))
            return
        if outcome is not None:
            self.ledger.end(rid, outcome)


async def _async_task(n: int, client: AsyncClient, load: Load) -> None:
    rng = random.Random(2000 + n)
    while not load.stop.is_set():
        kind = rng.choices(list(ASYNC_MIX), weights=list(ASYNC_MIX.values()))[0]
        await _AsyncRequest(
            client,
            load.ledger,
            kind.removesuffix("_break"),
            rng.choice(list(load.models)),
            load.vocab.prompt(rng),
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))),
            _options(rng),
            rng.randint(1, 3) if kind == "stream_break" else None,
        ).run()


def run_async_clients(tasks: int, load: Load) -> None:
    """``tasks`` tasks sharing one AsyncClient, until ``load.stop`` (run in a thread)."""

    async def main() -> None:
        async with AsyncClient(
            load.endpoint, timeout=120, connect_timeout=60, idle_timeout=60
        ) as client:
            await asyncio.gather(*(_async_task(i, client, load) for i in range(tasks)))

    asyncio.run(main())
