"""The narrow door from the worker core to a model (``Backend``), and what crosses it.

The core never touches llama.cpp: it plans a batch, asks the backend to run
it, and asks for one sampled token per logits row. The shell implements
:class:`Backend` over one :class:`llamad.llama_ffi.Context` (``kv_unified``,
``n_seq_max`` sequences); :class:`llamad.model.stub.StubBackend` implements it
with arithmetic so the core's tests need no model.

Every call happens on the loop thread between ticks (the core is not
thread-safe); a failure is raised as a :class:`~llamad.errors.LlamadError`
(the binding's typed errors already are).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import msgspec

from llamad.model.planner import BatchPlan
from llamad.model.requests import RequestParams

__all__ = ["Backend", "Interruptible", "PackedState", "Sampled", "SamplerHandle"]

SamplerHandle = object
"""Whatever :meth:`Backend.open_sampler` returns; the core only hands it back."""


class Sampled(msgspec.Struct, frozen=True):
    """One sampled token; with logprobs asked for, its log-probability and the
    ``top`` most likely alternatives as ``(token, logprob)``, most likely first."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class PackedState(Protocol):
    """One sequence's packed KV state, owned by whoever holds it.

    :meth:`Backend.pack` makes one; the core hands it to
    :meth:`llamad.model.cache_view_protocol.CacheView.save`, which owns it from then on
    and calls :meth:`release` once the bytes are written (or dropped). The
    shell's implementation is a lease on a pre-faulted buffer from a pool, so
    a pack never pays page faults and the write can run off the loop.
    """

    @property
    def nbytes(self) -> int: ...

    def view(self) -> memoryview:
        """The packed bytes (``nbytes`` long), valid until :meth:`release`."""
        ...

    def release(self) -> None: ...


class Backend(Protocol):
    """What the core needs from a model and its one context."""

    @property
    def n_vocab(self) -> int: ...

    def open_sampler(self, params: RequestParams) -> SamplerHandle:
        """A sampler chain for one request (grammar or JSON Schema compiled here).

        Called at submission, so an invalid grammar or schema is refused
        (``invalid_grammar``, ``bad_schema``) before the request is admitted.
        """
        ...

    def close_sampler(self, sampler: SamplerHandle) -> None: ...

    def decode(self, plan: BatchPlan) -> None:
        """One ``llama_decode`` over every span of ``plan``; spans are in row order
        and each is ``Batch.add_tokens(span.tokens, span.seq, span.pos,
        logits_last=span.want_logits)``."""
        ...

    def sample(self, sampler: SamplerHandle, row: int, logprobs: int | None) -> Sampled:
        """Sample (and accept into ``sampler``) from batch row ``row`` of the last
        decode (:meth:`BatchPlan.output_row`); ``logprobs`` is ``k`` or ``None``."""
        ...

    def row_logits(self, row: int) -> bytes:
        """A copy of batch row ``row``'s logits from the last decode: ``n_vocab``
        float32 values, little-endian (what a row keeps, :class:`~llamad.cache.kvc.KvcLogits`)."""
        ...

    def sample_logits(self, sampler: SamplerHandle, logits: bytes, logprobs: int | None) -> Sampled:
        """:meth:`sample` from given logits (``n_vocab`` float32 LE, as
        :meth:`row_logits` gives them) instead of a decoded row: the same chain
        (grammar, penalties, seeded draw) and the same logprobs, so logits kept
        from a decode sample exactly as that decode's row would have."""
        ...

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, …)."""
        ...

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` renders as in the reply. Special tokens render as
        their text, so markers such as ``<think>`` can be recognised."""
        ...

    def seq_truncate(self, seq: int, keep: int) -> None:
        """Drop positions ``keep..`` of ``seq`` (``keep=0`` clears it)."""
        ...

    def seq_copy(self, src: int, dst: int, n: int | None = None) -> None:
        """Make ``dst`` hold ``src``'s first ``n`` positions (``None``: all of
        them); ``dst`` is empty when called. In a unified KV the cells are
        shared, not copied (``llama_memory_seq_cp``)."""
        ...

    def pack(self, seq: int) -> PackedState:
        """``seq``'s whole state, packed."""
        ...

    def cell_end(self, seq: int) -> int:
        """One past the highest KV cell ``seq`` holds (0: none); ``-1``: one
        past the highest cell any sequence holds, the span every decode
        attends over. A result of ``-1`` says the backend cannot tell."""
        ...

    def unpack(self, seq: int, payload: memoryview) -> None:
        """Replace ``seq``'s state with a packed one."""
        ...

    def may_unpack_unchecked(self, payload: memoryview, n_tokens: int) -> bool:
        """Whether :meth:`unpack` may read ``payload`` (a row of ``n_tokens``
        tokens) before its checksum is known: whatever damage the checksum
        finds afterwards then only wrote wrong values into ``seq``'s own
        cells, which the caller drops. False: check first."""
        ...


@runtime_checkable
class Interruptible(Protocol):
    """A backend whose decode the shell can stop under way (a cancel, a
    shutdown, a deadline): its ``decode`` then raises
    :class:`~llamad.llama_ffi.errors.DecodeAborted` with the sequences of
    the batch as :func:`llamad.model.decoding.run_batch` expects them."""

    decode_deadline: float | None
    """``time.monotonic()`` after which the next decode stops (reason
    ``deadline``); ``None``: no deadline."""

    def set_interrupt(self, probe: Callable[[], bool] | None, every_s: float) -> None:
        """Call ``probe`` from inside each decode at most every ``every_s``
        seconds, on the loop's thread; true stops the decode (reason ``probe``)."""
        ...
