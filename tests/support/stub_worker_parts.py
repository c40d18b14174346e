"""A worker process's parts with no model: ``WorkerSpec(parts="stub_worker_parts:stub_parts")``.

:func:`stub_parts` builds :class:`~llamad.model.stub.StubBackend` and a
:class:`~llamad.model.stub_cache.MemoryCache` whose async saves are reported
through a pipe as the real writer pool reports them, with a letters-only
vocabulary: fast tests of the worker process itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from llamad.errors import ConfigError
from llamad.llama_ffi.tool_calls import ToolFamily, tool_call_grammar
from llamad.model.backend import PackedState
from llamad.model.savepoints import SaveJob
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache
from llamad.model.worker_parts import WorkerParts
from llamad.model.worker_spec import WorkerSpec


class StubText:
    """A letters-only vocabulary matching :func:`~llamad.model.stub.letter_piece`:
    ``a``..``z`` are tokens 0..25 (other characters map by code point), so
    lowercase text round-trips."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab

    @property
    def max_token_bytes(self) -> int | None:
        # One token per character, and a character is at most 4 UTF-8 bytes.
        return 4

    def chat_prompt(self, messages: object, **options: Any) -> tuple[str, bool]:
        if not isinstance(messages, Sequence):
            raise ConfigError("messages must be a list")
        return "".join(
            f"{m['role']}{m['content']}" for m in messages if isinstance(m, Mapping)
        ), False

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return [(ord(c) - 97) % self.n_vocab for c in text]

    def detokenize(
        self, tokens: Sequence[int], *, remove_special: bool, unparse_special: bool
    ) -> str:
        return "".join(chr(97 + t % 26) for t in tokens)

    def apply_chat_template(self, messages: object, **options: Any) -> list[int]:
        text, _ = self.chat_prompt(messages)
        return self.tokenize(text, add_special=False, parse_special=True)

    def tool_grammar(self, tools: list[dict[str, Any]] | None, tool_choice: object) -> str | None:
        return tool_call_grammar(tools, tool_choice, ToolFamily.HERMES)


class StubCompletions:
    """Async saves of a :class:`MemoryCache` reported through a pipe, as the
    real writer pool reports them: the cache publishes at once, the loop learns
    of it when it reads the pipe."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._done: list[tuple[bytes, bool]] = []

    def fileno(self) -> int:
        return self._r

    def post(self, key: bytes, published: bool) -> None:
        self._done.append((key, published))
        os.write(self._w, b"\0")

    def drain(self) -> list[tuple[bytes, bool]]:
        while True:
            try:
                if len(os.read(self._r, 4096)) < 4096:
                    break
            except BlockingIOError:
                break
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


class StubCache(MemoryCache):
    """:class:`MemoryCache` whose accepted async saves are reported later."""

    def __init__(self, completions: StubCompletions) -> None:
        super().__init__()
        self.completions = completions

    def save(self, job: SaveJob, state: PackedState) -> bool:
        accepted = super().save(job, state)
        if accepted and not job.sync:
            self.completions.post(job.key, True)
        return accepted


def stub_parts(spec: WorkerSpec) -> WorkerParts:
    """:class:`StubBackend` sized like ``spec.context``, an in-memory cache; no model."""
    ctx = spec.context
    backend = StubBackend(n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, n_seq_max=ctx.n_seq_max)
    completions = StubCompletions()
    return WorkerParts(
        backend=backend,
        cache=StubCache(completions),
        text=StubText(backend.n_vocab),
        completions=completions,
        closers=[completions.close],
    )
