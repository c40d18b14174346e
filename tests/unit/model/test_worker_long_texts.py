"""Long texts on the worker (issue 17): a prompt that cannot fit the context is
refused before anything tokenizes it, and a long text is tokenized on the text
thread while the loop serves everyone else (stub parts, real actor sockets)."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from llamad.actors import Registry
from llamad.cache.policy import CachePolicy
from llamad.errors import ContextOverflow
from llamad.llama_ffi import ContextOptions
from llamad.model.config import WorkerConfig
from llamad.model.requests import refuse_unfittable
from llamad.model.results import FinishReason
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_ops import INLINE_TEXT_CHARS
from llamad.model.worker_parts import WorkerParts
from llamad.model.worker_proc import WorkerProcess
from llamad.model.worker_spec import WorkerSpec
from llamad.testing.launcher import wait_until
from stub_worker_parts import StubText, stub_parts

pytestmark = pytest.mark.timeout(60)

N_CTX = 256
LONG = INLINE_TEXT_CHARS + 1


# -- the bound itself ------------------------------------------------------------------


def test_a_text_is_refused_only_when_it_certainly_cannot_fit() -> None:
    # 4 bytes a token at most: 1024 bytes may still be 256 tokens.
    refuse_unfittable(N_CTX * 4, 4, N_CTX)
    with pytest.raises(ContextOverflow) as exc:
        refuse_unfittable(N_CTX * 4 + 1, 4, N_CTX)
    assert exc.value.details == {"bytes": N_CTX * 4 + 1, "min_tokens": N_CTX + 1, "n_ctx": N_CTX}
    # No bound for the vocabulary: nothing is refused unseen.
    refuse_unfittable(10**9, None, N_CTX)


# -- a stub worker whose tokenizer is watched ---------------------------------------------


class WatchedText(StubText):
    """:class:`StubText` that counts its calls and holds a long text until
    :data:`GATE` opens; ``bound`` is its ``max_token_bytes``."""

    def __init__(self, n_vocab: int, bound: int | None) -> None:
        super().__init__(n_vocab)
        self.bound = bound
        self.calls: list[int] = []
        self.long_started = threading.Event()

    @property
    def max_token_bytes(self) -> int | None:
        return self.bound

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.calls.append(len(text))
        if len(text) > INLINE_TEXT_CHARS:
            self.long_started.set()
            assert GATE.wait(30), "the test never opened the gate"
            return super().tokenize(text[:8], add_special=add_special, parse_special=True)
        return super().tokenize(text, add_special=add_special, parse_special=parse_special)


GATE = threading.Event()


@contextlib.contextmanager
def opened_at_exit() -> Iterator[None]:
    """Open :data:`GATE` on the way out, even on a failure (a pool waiting for
    a gated request would otherwise never end)."""
    try:
        yield
    finally:
        GATE.set()


def bounded_parts(spec: WorkerSpec) -> WorkerParts:
    parts = stub_parts(spec)
    return dataclasses.replace(parts, text=WatchedText(parts.backend.n_vocab, 4))


def unbounded_parts(spec: WorkerSpec) -> WorkerParts:
    parts = stub_parts(spec)
    return dataclasses.replace(parts, text=WatchedText(parts.backend.n_vocab, None))


class Running:
    def __init__(self, proc: WorkerProcess, root: Path) -> None:
        self.proc = proc
        self.root = root
        self.clients: list[WorkerClient] = []
        ready = threading.Event()
        self.thread = threading.Thread(target=proc.serve, kwargs={"ready": ready.set})
        self.thread.start()
        assert ready.wait(30), "the worker never reported ready"

    @property
    def text(self) -> WatchedText:
        text = self.proc.parts.text
        assert isinstance(text, WatchedText)
        return text

    def client(self, timeout: float = 60.0) -> WorkerClient:
        c = WorkerClient("stub", registry=Registry(self.root), timeout=timeout)
        self.clients.append(c)
        return c

    def stop(self) -> None:
        GATE.set()
        for c in self.clients:
            c.close()
        self.proc.actor.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def _running(parts: str) -> Iterator[Running]:
    GATE.clear()
    root = Path(tempfile.mkdtemp(prefix="lwt-", dir="/tmp"))
    sizes = {"n_ctx": N_CTX, "n_batch": 32, "n_seq_max": 2}
    policy = CachePolicy(
        min_tokens=4, cold_min_tokens=4, boundary_trim_tokens=0, boundary_align_tokens=4
    )
    spec = WorkerSpec(
        model_id="stub",
        model_path="/nonexistent/stub.gguf",
        context=ContextOptions(**sizes, n_ubatch=32, kv_unified=True, n_threads=1),
        worker=WorkerConfig(**sizes, max_queue=4, policy=policy),
        registry_root=str(root),
        parts=parts,
    )
    r = Running(WorkerProcess(spec), root)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def bounded() -> Iterator[Running]:
    yield from _running(f"{__name__}:bounded_parts")


@pytest.fixture
def unbounded() -> Iterator[Running]:
    yield from _running(f"{__name__}:unbounded_parts")


# -- (a) refused before it is tokenized --------------------------------------------------


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(bounded: Running) -> None:
    w = bounded.client()
    for prompt in ["a" * (N_CTX * 4 + 1), "é" * (N_CTX * 2 + 1), "a" * LONG]:
        with pytest.raises(ContextOverflow) as exc:
            w.complete(prompt, max_tokens=2)
        assert exc.value.details["n_ctx"] == N_CTX
    assert bounded.text.calls == []
    # One that may fit is tokenized (and then counted).
    with pytest.raises(ContextOverflow):
        w.complete("a" * (N_CTX * 4), max_tokens=2)
    assert bounded.text.calls == [N_CTX * 4]


def test_a_chat_that_cannot_fit_is_refused_once_rendered_before_it_is_tokenized(
    bounded: Running,
) -> None:
    w = bounded.client()
    for content in ["a" * (N_CTX * 4), "a" * LONG]:  # rendered on the loop, then on the thread
        with pytest.raises(ContextOverflow):
            w.complete(messages=[{"role": "user", "content": content}], max_tokens=2)
    assert bounded.text.calls == []


# -- (b) a long text does not hold the loop ----------------------------------------------


def test_a_long_prompt_is_tokenized_while_the_worker_serves_others(unbounded: Running) -> None:
    # Generous, and bounded: a loop held by the long text would answer never.
    long_client, other = unbounded.client(), unbounded.client(timeout=20.0)
    with ThreadPoolExecutor(1) as pool, opened_at_exit():
        # No bound for this vocabulary: only tokenizing tells whether it fits.
        long: Future[Any] = pool.submit(
            long_client.complete, "a" * LONG, max_tokens=2, temperature=0.0
        )
        assert unbounded.text.long_started.wait(30)
        # The loop is free: another client is answered, the status shows the
        # text thread at work, and no busy section runs (the heartbeat beats).
        assert other.complete("abcd", max_tokens=2).finish_reason is FinishReason.LENGTH
        assert other.status_from_loop().tokenizing == 1
        assert unbounded.proc.mark.since is None
        assert not long.done()
        GATE.set()
        done = long.result(30)
    assert done.finish_reason is FinishReason.LENGTH
    wait_until(lambda: other.status_from_loop().tokenizing == 0, "the text thread is idle")


def test_a_long_tokenize_op_does_not_hold_the_loop(unbounded: Running) -> None:
    # Generous, and bounded: a loop held by the long text would answer never.
    long_client, other = unbounded.client(), unbounded.client(timeout=20.0)
    with ThreadPoolExecutor(1) as pool, opened_at_exit():
        long: Future[list[int]] = pool.submit(long_client.tokenize, "a" * LONG)
        assert unbounded.text.long_started.wait(30)
        assert other.tokenize("abc") == [0, 1, 2]
        assert not long.done()
        GATE.set()
        assert long.result(30) == [0] * 8


def test_a_request_cancelled_while_its_text_is_tokenized_ends_cancelled(
    unbounded: Running,
) -> None:
    # Generous, and bounded: a loop held by the long text would answer never.
    long_client, other = unbounded.client(), unbounded.client(timeout=20.0)
    with ThreadPoolExecutor(1) as pool, opened_at_exit():
        long: Future[Any] = pool.submit(
            long_client.complete, "a" * LONG, request_id="long", max_tokens=50
        )
        assert unbounded.text.long_started.wait(30)
        assert other.cancel("long")
        GATE.set()
        assert long.result(30).finish_reason is FinishReason.CANCELLED
