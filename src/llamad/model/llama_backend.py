"""The real :class:`~llamad.model.backend.Backend`: one llama.cpp context of one model.

:class:`LlamaBackend` carries the core's decisions out on a
:class:`llamad.llama_ffi.Context` created with ``kv_unified=True`` (every
sequence draws cells from one pool, so any sequence can restore any row of
the namespace) and ``n_seq_max`` sequences:

- ``decode``: the plan's spans go, in row order, into one
  :class:`~llamad.llama_ffi.Batch` of ``n_batch`` rows made once and cleared
  each tick (``Batch.add_tokens`` appends a span in C), then one
  ``llama_decode``. Batch rows are the plan's rows, so
  :meth:`BatchPlan.output_row` is the row ``sample`` reads; the backend checks
  that the logits rows it asked for are exactly the plan's. With a
  :class:`~llamad.model.threads.ThreadGovernor` (SPEC M14) each decode runs
  on the thread count the governor chooses, and the governor is told how
  long the ``llama_decode`` call took and how many KV cells it attended over.
- ``sample``: the request's sampler chain (:mod:`llamad.model.sampler_factory`)
  through ``Context.sample``; with ``logprobs`` the log-softmax of the raw
  logits row in C (:mod:`llamad.llama_ffi.logprobs`). ``row_logits`` copies a
  row out (a row's kept logits), ``sample_logits`` samples such a copy
  through the same chain (``Sampler.sample_logits``) with the same logprobs.
- ``pack``: a lease on a pre-faulted buffer of a :class:`StatePool`; the cache
  writer releases it from its own thread. ``unpack`` reads the payload in
  place (a mapping of the ``ram`` tier, a pooled buffer).

Like the core, it is driven from the loop thread only; only a lease's
``release`` may come from another thread.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections.abc import Callable
from typing import Final

import structlog

from llamad.errors import ConfigError, LlamadError
from llamad.llama_ffi.batch import Batch
from llamad.llama_ffi.context import Context
from llamad.llama_ffi.errors import NoLogits, StateError, Unsupported
from llamad.llama_ffi.logprobs import token_logprobs
from llamad.llama_ffi.model import Model
from llamad.llama_ffi.options import FlashAttn
from llamad.llama_ffi.sampling import Sampler
from llamad.llama_ffi.state_layout import plain_seq_state
from llamad.model.backend import Backend, Sampled, SamplerHandle
from llamad.model.planner import BatchPlan
from llamad.model.requests import RequestParams
from llamad.model.sampler_factory import sampler_params
from llamad.model.state_pool import StateLease, StatePool
from llamad.model.threads import ThreadGovernor

__all__ = ["GENERATION_FIRST_PROBE_S", "LlamaBackend"]

log = structlog.get_logger("llamad.model")

_PIECE_CACHE_MAX: Final = 1 << 16

GENERATION_FIRST_PROBE_S: Final = 0.030
"""A generation step's (one row per sequence) first probe for cancels, once it
has run this long: past a 4-stream step here (~20 ms), within the 50 ms a
cancel may take (issue 21). A slow step (a loaded machine) still probes from
then on, every ``INTERRUPT_PROBE_S``."""


def _internal(message: str, **details: object) -> LlamadError:
    return LlamadError(message, details={"where": "llama backend", **details})


class LlamaBackend:
    """Implements :class:`~llamad.model.backend.Backend` over ``ctx``.

    ``ctx`` must have ``kv_unified=True``; the backend does not own it (the
    worker closes the context after :meth:`close`). ``pool`` leases the
    buffers packed states go into (a private one by default).

    ``governor`` (optional) chooses each decode's thread count: before the
    decode, ``threads_for(rows, kv_cells)``; the count is applied with
    ``ctx.set_threads`` (only when it changes), capped by each of the counts
    the context was created with, so a context made with fewer batch threads
    than single-row threads keeps that split. After it, ``record(rows,
    seconds, kv_cells)`` with the time of the ``llama_decode`` call alone (on
    ``clock``), not the batch building. ``kv_cells`` is what the batch
    attends over (:meth:`attended_cells`), so that the governor judges a
    step against steps of comparable cost. A decode that raises is not
    recorded (``abandon()`` ends its busy mark instead).
    Without a governor the context's own counts are used.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        pool: StatePool | None = None,
        governor: ThreadGovernor | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not ctx.options.kv_unified:
            raise ConfigError(
                "the worker's context needs kv_unified=True: a row saved from one "
                "sequence must restore into any other",
                details={"field": "kv_unified"},
            )
        self.ctx = ctx
        self.model: Model = ctx.model
        self.pool = pool if pool is not None else StatePool()
        self._owns_pool = pool is None
        self._batch = Batch(ctx.n_batch)
        self._eog = self.model.eog_tokens
        self._pieces: dict[int, bytes] = {}
        self._n_vocab = self.model.n_vocab
        self._n_seq = ctx.n_seq_max
        self._masks_whole_pool = ctx.options.flash_attn is FlashAttn.OFF
        self.samplers_open = 0
        self.governor = governor
        self._clock = clock
        # The counts the context was made with: the most a governed decode uses
        # for a single row and for several.
        self._configured = ctx.threads
        self._threads = self._configured
        self.decode_deadline: float | None = None

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_seq_max(self) -> int:
        return self.ctx.n_seq_max

    # -- samplers ---------------------------------------------------------------------

    def open_sampler(self, params: RequestParams) -> SamplerHandle:
        """A chain for one request; ``bad_schema`` / ``invalid_grammar`` here, at submit."""
        sampler = Sampler(self.model, sampler_params(params))
        self.samplers_open += 1
        return sampler

    def close_sampler(self, sampler: SamplerHandle) -> None:
        if not isinstance(sampler, Sampler):
            raise _internal(f"not a sampler of this backend: {sampler!r}")
        if not sampler.closed:
            sampler.close()
            self.samplers_open -= 1

    # -- decode and sample ----------------------------------------------------------------

    def decode(self, plan: BatchPlan) -> None:
        batch = self._batch
        batch.clear()
        for span in plan.spans:
            batch.add_tokens(span.tokens, span.seq, span.pos, logits_last=span.want_logits)
        expected = tuple(plan.output_row(s.seq) for s in plan.spans if s.want_logits)
        if batch.output_rows != expected:
            # The rows sample() reads are the plan's; a mismatch would sample
            # one request from another's logits.
            raise _internal(
                "batch logits rows differ from the plan's",
                batch=list(batch.output_rows),
                plan=list(expected),
            )
        # A generation step (one row per sequence) probes for cancels only once
        # it runs long: the ~20-35 us probes on the decoding thread, while the
        # other threads wait at a barrier, cost a 4-stream step of ~20 ms here
        # 120-140 us of CPU (bench/step_probe.py --timing --cpu), with the
        # first probe at 10 ms. A prompt chunk probes from 10 ms on: a cancel
        # mid-prefill must not wait for its chunk.
        first = GENERATION_FIRST_PROBE_S if plan.n_rows == len(plan.spans) else None
        governor = self.governor
        if governor is None:
            self.ctx.decode(batch, deadline=self.decode_deadline, first_probe_s=first)
            return
        rows = batch.n_tokens
        cells = self.attended_cells(plan)
        n = governor.threads_for(rows, cells)
        try:
            single, several = self._configured
            threads = (min(n, single), min(n, several))
            if threads != self._threads:
                self.ctx.set_threads(*threads)
                self._threads = threads
            started = self._clock()
            self.ctx.decode(batch, deadline=self.decode_deadline, first_probe_s=first)
        except BaseException:
            governor.abandon()  # the step's busy mark ends; nothing is learnt from it
            raise
        governor.record(rows, self._clock() - started, cells)

    def set_interrupt(self, probe: Callable[[], bool] | None, every_s: float) -> None:
        """See :class:`~llamad.model.backend.Interruptible` (``Context.set_abort_probe``)."""
        self.ctx.set_abort_probe(probe, every_s)

    def attended_cells(self, plan: BatchPlan) -> int:
        """The KV cells a decode of ``plan`` attends over, per row, as the
        thread governor keys its steps (measured, ``bench/worker_bench_attention.py``).

        With flash attention (``on``, and ``auto``, which is on here) llama.cpp
        skips the cells other sequences hold: a row costs what its own
        sequence's length does (one row of a 16-token sequence beside a
        2,048-token one: 10.0 ms; over 2,048 cells of its own: 35.5 ms), so
        the plan's furthest position. Without it, every row attends over
        every used cell of the pool, masked (17.4 and 17.1 ms): the cells
        all sequences hold once the batch is in (a forked session's shared
        cells count twice; the governor only needs the order of size).
        """
        if not self._masks_whole_pool:
            return max((span.pos + len(span.tokens) for span in plan.spans), default=0)
        ctx = self.ctx
        held = sum(ctx.seq_pos_max(seq) + 1 for seq in range(self._n_seq))
        return held + plan.n_rows

    def sample(self, sampler: SamplerHandle, row: int, logprobs: int | None) -> Sampled:
        if not isinstance(sampler, Sampler):
            raise _internal(f"not a sampler of this backend: {sampler!r}")
        token = self.ctx.sample(sampler, row)
        if logprobs is None:
            return Sampled(token)
        lp = token_logprobs(self.ctx.logits(row), token, logprobs)
        return Sampled(token, lp.chosen, lp.top)

    def row_logits(self, row: int) -> bytes:
        """A copy of ``row``'s ``n_vocab`` logits, float32 little-endian."""
        values = self.ctx.logits(row)
        if sys.byteorder == "big":  # pragma: no cover - every CI host is little-endian
            values.byteswap()
        return values.tobytes()

    def sample_logits(self, sampler: SamplerHandle, logits: bytes, logprobs: int | None) -> Sampled:
        """:meth:`sample` from a row's kept logits (float32 LE, :meth:`row_logits`)."""
        if not isinstance(sampler, Sampler):
            raise _internal(f"not a sampler of this backend: {sampler!r}")
        if len(logits) != 4 * self._n_vocab:
            raise NoLogits(
                f"{len(logits)} bytes of logits, the vocabulary has {self._n_vocab} values",
                details={"n_vocab": self._n_vocab},
            )
        # An aligned copy in this host's order (the kept bytes lie at any
        # offset of a file's TLV): what C reads as float[].
        values = array("f")
        values.frombytes(logits)
        if sys.byteorder == "big":  # pragma: no cover - every CI host is little-endian
            values.byteswap()
        token = sampler.sample_logits(values)
        if logprobs is None:
            return Sampled(token)
        lp = token_logprobs(values, token, logprobs)
        return Sampled(token, lp.chosen, lp.top)

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    def piece(self, token: int) -> bytes:
        """The token's bytes; special tokens as their text (``<think>``, ``<|im_end|>``)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self.model.token_piece(token, special=True)
            if len(self._pieces) < _PIECE_CACHE_MAX:
                self._pieces[token] = cached
        return cached

    # -- sequences and state ------------------------------------------------------------------

    def seq_truncate(self, seq: int, keep: int) -> None:
        if not self.ctx.seq_remove(seq, keep):
            raise Unsupported(
                f"this model cannot drop positions {keep}.. of sequence {seq}",
                details={"seq": seq, "keep": keep},
            )

    def seq_copy(self, src: int, dst: int, n: int | None = None) -> None:
        self.ctx.seq_copy(src, dst, 0, n)

    def pack(self, seq: int) -> StateLease:
        need = self.ctx.seq_state_size(seq)
        if need <= 0:
            raise StateError(f"sequence {seq} has no state to pack", details={"seq": seq})
        return self.pool.fill(need, lambda out: self.ctx.pack_seq(seq, out))

    def unpack(self, seq: int, payload: memoryview) -> None:
        self.ctx.unpack_seq(seq, payload)

    def may_unpack_unchecked(self, payload: memoryview, n_tokens: int) -> bool:
        # llama.cpp's reader checks sizes and types itself; the positions it
        # takes as they come are checked here (llama_ffi.state_layout).
        return plain_seq_state(payload, n_tokens)

    def cell_end(self, seq: int) -> int:
        return self.ctx.seq_cell_end(seq)

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the batch (and the pool if the backend made it); the context stays."""
        self._batch.close()
        if self._owns_pool:
            self.pool.close()


def _is_a_backend(backend: LlamaBackend) -> Backend:
    """Never called: mypy checks here that the backend implements the protocol."""
    return backend
