"""An inference context: batched decode, logits, sampling, sequence ops,
per-sequence KV state, embeddings and LoRA adapters (SPEC L3, L5-L7, L9-L11).

Every method takes the context's own lock, so calls on one context are
serialised while other contexts run in parallel (llama.cpp calls release the
GIL). Inputs are checked before they reach llama.cpp wherever llama.cpp would
abort instead of returning an error. Sampling is allowed only from rows that
produced logits in the last successful decode.
"""

from __future__ import annotations

import math
import threading
import weakref
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from llamad.errors import BadRequest, ContextOverflow
from llamad.llama_ffi.batch import Batch
from llamad.llama_ffi.embeddings import (
    check_mean_pooling_layout,
    effective_pooling,
    l2_normalize,
    plan_groups,
)
from llamad.llama_ffi.errors import (
    AdapterError,
    BatchTooLarge,
    BufferTooSmall,
    Closed,
    ContextCreateError,
    DecodeAborted,
    DecodeError,
    EmbeddingsUnavailable,
    GrammarError,
    InvalidSequence,
    InvalidToken,
    NoLogits,
    StateError,
    ThreadsExceedPool,
    Unsupported,
)
from llamad.llama_ffi.lifetime import NativeHandle
from llamad.llama_ffi.native import ffi, lib
from llamad.llama_ffi.options import ContextOptions, PoolingType
from llamad.llama_ffi.state import readable_view, writable_view

if TYPE_CHECKING:
    from llamad.llama_ffi.lora import LoraAdapter
    from llamad.llama_ffi.model import Model
    from llamad.llama_ffi.sampling import Sampler
    from llamad.llama_ffi.threadpool import Threadpool

__all__ = ["Context"]

log = structlog.get_logger("llamad.llama_ffi")

_DECODE_ERRORS = {
    2: "decode aborted",
    -1: "invalid input batch",
}


class _ProbeHolder:
    __slots__ = ("probe",)

    def __init__(self) -> None:
        self.probe: Callable[[], bool] | None = None


_ABORT_REASONS = {1: "stop", 2: "deadline", 3: "probe"}


@ffi.def_extern(onerror=lambda *_: False)  # type: ignore[untyped-decorator]
def _llamad_abort_probe(owner: Any) -> bool:
    """The abort check's call into Python (shim.c): the context's probe."""
    holder: _ProbeHolder = ffi.from_handle(owner)
    probe = holder.probe
    if probe is None:
        return False
    try:
        return bool(probe())
    except Exception:
        log.exception("llama.abort_probe_failed")
        return False


def _context_free(
    model_handle: NativeHandle, adapters: dict[LoraAdapter, float], pools: list[Threadpool]
) -> Any:
    # Order matters: the context goes first, then the adapters and threadpools
    # it referenced, then the model they all belong to.
    def free(ptr: Any) -> None:
        lib.llama_free(ptr)
        attached = list(adapters)
        adapters.clear()
        for adapter in attached:
            adapter.native_handle.release()
        leased, pools[:] = list(pools), []
        for pool in leased:
            pool.native_handle.release()
        model_handle.release()

    return free


class Context:
    """One ``llama_context`` over a :class:`Model` (which it keeps alive)."""

    def __init__(self, model: Model, options: ContextOptions | None = None) -> None:
        self.model = model
        self.options = opts = options or ContextOptions()
        model_handle = model.native_handle
        model_ptr = model_handle.acquire()  # raises Closed; released when we free
        try:
            if model.options.vocab_only or model.n_layer == 0:
                # llama.cpp asserts (aborts) building a context without weights.
                raise Unsupported("a vocab_only model has no weights to run a context on")
            if (
                opts.embeddings
                and effective_pooling(model.metadata, opts.pooling) is PoolingType.MEAN
            ):
                check_mean_pooling_layout(opts.n_ctx, opts.n_ubatch, opts.n_seq_max)
            params = lib.llama_context_default_params()
            params.n_ctx = opts.n_ctx
            params.n_batch = opts.n_batch
            params.n_ubatch = opts.n_ubatch
            params.n_seq_max = opts.n_seq_max
            params.n_threads = opts.n_threads
            params.n_threads_batch = opts.n_threads_batch
            params.flash_attn_type = int(opts.flash_attn)
            params.type_k = int(opts.type_k)
            params.type_v = int(opts.type_v)
            params.embeddings = opts.embeddings
            params.pooling_type = int(opts.pooling)
            params.kv_unified = opts.kv_unified
            params.offload_kqv = opts.offload_kqv
            params.swa_full = opts.swa_full
            params.rope_scaling_type = int(opts.rope_scaling_type)
            params.rope_freq_base = opts.rope_freq_base
            params.rope_freq_scale = opts.rope_freq_scale
            params.yarn_ext_factor = opts.yarn_ext_factor
            params.yarn_attn_factor = opts.yarn_attn_factor
            params.yarn_beta_fast = opts.yarn_beta_fast
            params.yarn_beta_slow = opts.yarn_beta_slow
            params.yarn_orig_ctx = opts.yarn_orig_ctx
            params.no_perf = True
            ptr = lib.llama_init_from_model(model_ptr, params)
            if ptr == ffi.NULL:
                raise ContextCreateError(
                    f"llama.cpp could not create a context with {opts} (see llama.log events)"
                )
        except BaseException:
            model_handle.release()
            raise

        self._lock = threading.RLock()
        self._adapters: dict[LoraAdapter, float] = {}
        # Attached threadpools (leased while attached): [pool, batch pool].
        self._pools: list[Threadpool] = []
        self._handle = NativeHandle(
            ptr, _context_free(model_handle, self._adapters, self._pools), "context"
        )
        self._finalizer = weakref.finalize(self, self._handle.close)
        self._mem = lib.llama_get_memory(ptr)
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        self.n_ctx_seq = int(lib.llama_n_ctx_seq(ptr))
        self.n_batch = int(lib.llama_n_batch(ptr))
        self.n_ubatch = int(lib.llama_n_ubatch(ptr))
        self.n_seq_max = int(lib.llama_n_seq_max(ptr))
        self.pooling = PoolingType(int(lib.llama_pooling_type(ptr)))
        # KV streams: one per sequence unless unified. A packed sequence state
        # records this count and restores only into a context with the same.
        self.n_stream = 1 if opts.kv_unified else self.n_seq_max
        self.n_vocab = model.n_vocab
        self.n_embd = model.n_embd
        self._embeddings_on = opts.embeddings
        # Output rows of the last successful decode -> their sequence.
        self._outputs: dict[int, int] = {}
        self._bad_row = ffi.new("int32_t *")
        self._scratch: Any = None  # llama_token_data[n_vocab], made on first sample
        self._sampled = ffi.new("llama_token *")
        self._work: Batch | None = None
        # The abort check (shim.c, llamad_abort_check): installed for the
        # context's life, disarmed outside decode(); see set_abort_probe.
        self._abort: Any = ffi.new("struct llamad_abort *")
        # The handle names a holder, not the context: no cycle keeps it alive.
        self._abort_holder = _ProbeHolder()
        self._abort_owner = ffi.new_handle(self._abort_holder)
        self._abort.owner = self._abort_owner
        self._abort_first_ns = 0
        lib.llamad_abort_install(ptr, self._abort)
        model._register_context(self)

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Free the context (waits for an in-flight call); the model is freed
        too if it was closed and this was its last user."""
        with self._lock:
            self._outputs.clear()
            self._finalizer()
            if self._work is not None:
                self._work.close()

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ptr(self) -> Any:
        if self._handle.closed:
            raise Closed("context is closed")
        return self._handle.ptr

    def _check_seq(self, seq_id: int, *, allow_any: bool = False) -> None:
        if not isinstance(seq_id, int) or isinstance(seq_id, bool):
            raise InvalidSequence(f"sequence id must be an integer, not {seq_id!r}")
        if allow_any and seq_id == -1:
            return
        if not 0 <= seq_id < self.n_seq_max:
            raise InvalidSequence(
                f"sequence id {seq_id} is outside [0, {self.n_seq_max})",
                details={"seq_id": seq_id, "n_seq_max": self.n_seq_max},
            )

    @staticmethod
    def _range(p0: int, p1: int | None) -> tuple[int, int]:
        if p0 < 0 or (p1 is not None and p1 < p0):
            raise BadRequest(f"invalid position range [{p0}, {p1})")
        return p0, (-1 if p1 is None else p1)

    # -- decode (SPEC L5) ----------------------------------------------------------

    def set_abort_probe(
        self, probe: Callable[[], bool] | None, every_s: float = 0.003, first_s: float = 0.010
    ) -> None:
        """Call ``probe`` from inside each :meth:`decode` that has run
        ``first_s`` seconds, then at most every ``every_s`` seconds (between
        graph nodes, on the decoding thread); when it answers true the decode
        stops (:class:`DecodeAborted`, reason ``probe``). ``None`` removes it.
        ``first_s``: a one-row generation step (~10 ms here) never pays for a
        probe (~20 us each on a loaded machine); a long prefill chunk, which a
        cancel must not wait for, probes all along. ggml checks between the
        nodes of a CPU graph only: on a GPU backend a decode is not stopped early."""
        if every_s <= 0 or first_s < 0:
            raise BadRequest(f"every_s must be > 0 and first_s >= 0, not {every_s}, {first_s}")
        self._abort_holder.probe = probe
        self._abort.probe_ns = round(every_s * 1e9)
        self._abort_first_ns = round(first_s * 1e9)

    def abort_now(self) -> None:
        """Stop the decode under way at its next graph node (reason ``stop``);
        safe from a signal handler or another thread. Only that decode: the
        next one starts unflagged."""
        self._abort.stop = 1

    @property
    def abort_stats(self) -> tuple[int, int]:
        """(checks, probes) of the abort check so far: node boundaries it saw
        while armed, and calls of the probe."""
        return int(self._abort.checks), int(self._abort.probes)

    def decode(
        self, batch: Batch, *, deadline: float | None = None, first_probe_s: float | None = None
    ) -> None:
        """Run one ``llama_decode`` over every row of ``batch``.

        Raises :class:`BatchTooLarge` beyond ``n_batch`` rows, and
        :class:`InvalidToken`, :class:`InvalidSequence` or
        :class:`ContextOverflow` (a position outside ``[0, n_ctx_seq)`` or no
        free KV slot) without calling llama.cpp where it would abort.

        The decode stops between graph nodes, raising :class:`DecodeAborted`,
        once ``deadline`` (``time.monotonic()`` seconds) passes, when the
        abort probe (:meth:`set_abort_probe`) answers true, or on
        :meth:`abort_now`; llama.cpp has then dropped the rows of the
        micro-batch it was computing (see :class:`DecodeAborted`).
        ``first_probe_s``: the probe's first call once this decode has run
        that long, instead of :meth:`set_abort_probe`'s ``first_s``.
        """
        with self._lock:
            ptr = self._ptr()
            raw = batch.native
            n = int(raw.n_tokens)
            if n == 0:
                raise BadRequest("cannot decode an empty batch")
            if n > self.n_batch:
                raise BatchTooLarge(
                    f"batch has {n} rows, the context's n_batch is {self.n_batch}",
                    details={"rows": n, "n_batch": self.n_batch},
                )
            self._check_batch(raw)
            self._outputs = {}
            gate = self._abort
            gate.reason = 0
            gate.deadline_ns = 0 if deadline is None else max(1, round(deadline * 1e9))
            gate.probing = int(self._abort_holder.probe is not None)
            first_ns = self._abort_first_ns if first_probe_s is None else round(first_probe_s * 1e9)
            gate.next_probe_ns = lib.llamad_monotonic_ns() + first_ns
            gate.armed = 1
            try:
                rc = int(lib.llama_decode(ptr, raw[0]))
            finally:
                gate.armed = 0
                gate.stop = 0
            if rc == 0:
                self._outputs = dict(zip(batch.output_rows, batch.output_seqs, strict=True))
                return
            if rc == 1:
                raise ContextOverflow(
                    "no free KV slot for the batch (context full)",
                    details={"rows": n, "n_ctx": self.n_ctx},
                )
            if rc == 2:
                reason = _ABORT_REASONS.get(int(gate.reason), "unknown")
                raise DecodeAborted(
                    f"llama_decode aborted ({reason})", details={"rc": rc, "reason": reason}
                )
            raise DecodeError(
                f"llama_decode failed: {_DECODE_ERRORS.get(rc, 'fatal error')} (rc={rc})",
                details={"rc": rc},
            )

    def _check_batch(self, raw: Any) -> None:
        kind = int(
            lib.llamad_batch_check(raw, self.n_vocab, self.n_seq_max, self.n_ctx_seq, self._bad_row)
        )
        if kind == 0:
            return
        row = int(self._bad_row[0])
        if kind == 1:
            raise InvalidToken(
                f"row {row}: token id {raw.token[row]} is outside [0, {self.n_vocab})",
                details={"row": row, "token": int(raw.token[row])},
            )
        if kind == 2:
            raise InvalidSequence(
                f"row {row}: sequence id {raw.seq_id[row][0]} is outside [0, {self.n_seq_max})",
                details={"row": row, "seq_id": int(raw.seq_id[row][0])},
            )
        raise ContextOverflow(
            f"row {row}: position {raw.pos[row]} is outside [0, {self.n_ctx_seq}) "
            "(the per-sequence context)",
            details={"row": row, "pos": int(raw.pos[row]), "n_ctx_seq": self.n_ctx_seq},
        )

    @property
    def output_rows(self) -> tuple[int, ...]:
        """Rows of the last decode that have logits."""
        with self._lock:
            return tuple(self._outputs)

    def _output_row(self, row: int) -> int:
        if row == -1 and self._outputs:
            return max(self._outputs)
        if row not in self._outputs:
            raise NoLogits(
                f"row {row} has no logits: the last decode produced logits for rows "
                f"{sorted(self._outputs) or 'none'}",
                details={"row": row},
            )
        return row

    def logits(self, row: int = -1) -> array[float]:
        """A copy of the ``n_vocab`` logits of ``row`` (-1: the last output row)."""
        with self._lock:
            ptr = self._ptr()
            row = self._output_row(row)
            p = lib.llama_get_logits_ith(ptr, row)
            if p == ffi.NULL:
                raise NoLogits(f"llama.cpp has no logits for row {row}")
            out = array("f")
            out.frombytes(ffi.buffer(p, self.n_vocab * 4))
            return out

    def sample(self, sampler: Sampler, row: int = -1) -> int:
        """Sample (and accept into ``sampler``) a token from ``row``'s logits."""
        with self._lock:
            ptr = self._ptr()
            row = self._output_row(row)
            if self._scratch is None:
                self._scratch = ffi.new("llama_token_data[]", self.n_vocab)
            with sampler.native_handle.lease() as chain:
                rc = int(
                    lib.llamad_sample(chain, ptr, row, self._scratch, self.n_vocab, self._sampled)
                )
            if rc == 1:
                raise NoLogits(f"llama.cpp has no logits for row {row}")
            if rc == 2:
                raise GrammarError(
                    "no token is allowed: the grammar (with the logit biases) rules out "
                    "every candidate"
                )
            return int(self._sampled[0])

    # -- threads (SPEC M14; see llamad.llama_ffi.threadpool) ------------------------------

    @property
    def threads(self) -> tuple[int, int]:
        """``(n_threads, n_threads_batch)`` the next decode computes on: the
        first for a single-row ubatch, the second for several rows."""
        with self._lock:
            ptr = self._ptr()
            return int(lib.llama_n_threads(ptr)), int(lib.llama_n_threads_batch(ptr))

    @property
    def threadpool(self) -> tuple[Threadpool, Threadpool] | None:
        """The attached ``(pool, batch pool)``, or None (ggml's own threads)."""
        with self._lock:
            return (self._pools[0], self._pools[1]) if self._pools else None

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        """Compute the next decodes on ``n_threads`` (single-row ubatches) and
        ``n_threads_batch`` (several rows; default: the same). Cheap: llama.cpp
        only stores the two numbers, so a caller may change them before every
        decode. Raises :class:`ThreadsExceedPool` beyond an attached pool."""
        batch = n_threads if n_threads_batch is None else n_threads_batch
        for name, value in (("n_threads", n_threads), ("n_threads_batch", batch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadRequest(f"{name} must be an integer >= 1, not {value!r}")
        with self._lock:
            ptr = self._ptr()
            self._check_pool_fits(n_threads, batch, self._pools)
            lib.llama_set_n_threads(ptr, n_threads, batch)

    def attach_threadpool(self, pool: Threadpool, batch_pool: Threadpool | None = None) -> None:
        """Compute on ``pool`` (single-row ubatches) and ``batch_pool``
        (several rows; default: ``pool``) instead of ggml's own threads.

        The context leases the pools until :meth:`detach_threadpool` or its
        close, so closing a pool early is safe. Raises
        :class:`ThreadsExceedPool` if the context's thread counts exceed a
        pool's size (lower them with :meth:`set_threads` first)."""
        bpool = pool if batch_pool is None else batch_pool
        with self._lock:
            ptr = self._ptr()
            n, nb = int(lib.llama_n_threads(ptr)), int(lib.llama_n_threads_batch(ptr))
            self._check_pool_fits(n, nb, [pool, bpool])
            leased: list[Threadpool] = []
            try:
                for p in (pool, bpool):
                    p.native_handle.acquire()  # raises Closed once the pool is closed
                    leased.append(p)
            except BaseException:
                for p in leased:
                    p.native_handle.release()
                raise
            lib.llama_attach_threadpool(ptr, pool.native_handle.ptr, bpool.native_handle.ptr)
            previous, self._pools[:] = list(self._pools), leased
            for p in previous:
                p.native_handle.release()

    def detach_threadpool(self) -> bool:
        """Go back to ggml's own threads; False if no pool was attached."""
        with self._lock:
            ptr = self._ptr()
            if not self._pools:
                return False
            lib.llama_detach_threadpool(ptr)
            previous, self._pools[:] = list(self._pools), []
            for p in previous:
                p.native_handle.release()
            return True

    @staticmethod
    def _check_pool_fits(n: int, nb: int, pools: Sequence[Threadpool]) -> None:
        if not pools:
            return
        for name, want, pool in (("n_threads", n, pools[0]), ("n_threads_batch", nb, pools[1])):
            if want > pool.n_threads:
                raise ThreadsExceedPool(
                    f"{name}={want} exceeds the attached threadpool's {pool.n_threads} threads",
                    details={"field": name, "threads": want, "pool_threads": pool.n_threads},
                )

    # -- convenience loops --------------------------------------------------------------

    def _work_batch(self) -> Batch:
        if self._work is None:
            self._work = Batch(self.n_batch)
        return self._work

    def next_pos(self, seq_id: int) -> int:
        """The position after the last one stored for ``seq_id`` (0 if empty)."""
        return self.seq_pos_max(seq_id) + 1

    def prefill(
        self, tokens: Sequence[int] | Any, seq_id: int = 0, start_pos: int | None = None
    ) -> int:
        """Decode ``tokens`` into ``seq_id`` in ``n_batch`` chunks; the last
        token's logits are then available. Returns the next position."""
        with self._lock:
            self._check_seq(seq_id)
            pos = self.next_pos(seq_id) if start_pos is None else start_pos
            toks = list(tokens) if not isinstance(tokens, list) else tokens
            if not toks:
                raise BadRequest("nothing to prefill")
            if pos + len(toks) > self.n_ctx_seq:
                raise ContextOverflow(
                    f"{len(toks)} tokens from position {pos} exceed n_ctx_seq={self.n_ctx_seq}",
                    details={"tokens": len(toks), "pos": pos, "n_ctx_seq": self.n_ctx_seq},
                )
            batch = self._work_batch()
            for start in range(0, len(toks), self.n_batch):
                chunk = toks[start : start + self.n_batch]
                batch.clear()
                batch.add_tokens(
                    chunk, seq_id, pos + start, logits_last=start + len(chunk) == len(toks)
                )
                self.decode(batch)
            return pos + len(toks)

    def generate(
        self, sampler: Sampler, n: int, seq_id: int = 0, *, stop_at_eog: bool = True
    ) -> list[int]:
        """Sample up to ``n`` tokens into ``seq_id``, starting from the logits of
        the last decode's final output row for that sequence."""
        with self._lock:
            self._check_seq(seq_id)
            rows = [r for r, s in self._outputs.items() if s == seq_id]
            if not rows:
                raise NoLogits(f"sequence {seq_id} has no logits to sample from; prefill first")
            row = max(rows)
            pos = self.next_pos(seq_id)
            batch = self._work_batch()
            out: list[int] = []
            eog = self.model.eog_tokens if stop_at_eog else frozenset()
            for i in range(n):
                token = self.sample(sampler, row)
                out.append(token)
                if token in eog or i == n - 1:
                    break
                batch.clear()
                row = batch.add(token, pos, seq_id, logits=True)
                self.decode(batch)
                pos += 1
            return out

    # -- sequence ops (SPEC L5) ------------------------------------------------------------

    def _forget_outputs(self, seq_id: int) -> None:
        if seq_id == -1:
            self._outputs.clear()
        else:
            self._outputs = {r: s for r, s in self._outputs.items() if s != seq_id}

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest stored position of ``seq_id`` (-1 if empty)."""
        with self._lock:
            self._ptr()
            self._check_seq(seq_id)
            return int(lib.llama_memory_seq_pos_max(self._mem, seq_id))

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest stored position of ``seq_id`` (-1 if empty)."""
        with self._lock:
            self._ptr()
            self._check_seq(seq_id)
            return int(lib.llama_memory_seq_pos_min(self._mem, seq_id))

    def seq_cell_end(self, seq_id: int = -1) -> int:
        """One past the highest KV cell holding ``seq_id`` (0: none), or with
        ``-1`` one past the highest cell in use of any sequence: what every
        decode attends over (before llama.cpp pads it). A sequence left in
        cells above freed ones keeps that span wide for every decode beside
        it; :meth:`pack_seq`, :meth:`seq_remove` and :meth:`unpack_seq` move
        it to the lowest free cells. ``-1`` from a memory without cells
        (llamad's patch 0004 to llama.cpp)."""
        with self._lock:
            self._ptr()
            self._check_seq(seq_id, allow_any=True)
            return int(lib.llama_memory_seq_cell_end(self._mem, seq_id))

    def seq_remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> bool:
        """Drop positions ``[p0, p1)`` of ``seq_id`` (-1: every sequence).
        Returns False if llama.cpp cannot remove a partial range (recurrent models)."""
        with self._lock:
            self._ptr()
            self._check_seq(seq_id, allow_any=True)
            a, b = self._range(p0, p1)
            self._forget_outputs(seq_id)
            return bool(lib.llama_memory_seq_rm(self._mem, seq_id, a, b))

    def seq_copy(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """Make ``dst`` share ``src``'s cells in ``[p0, p1)``.

        Without ``kv_unified`` each sequence has its own KV stream and only a
        whole-sequence copy is possible (it replaces ``dst``)."""
        with self._lock:
            self._ptr()
            self._check_seq(src)
            self._check_seq(dst)
            a, b = self._range(p0, p1)
            separate_streams = not self.options.kv_unified and self.n_seq_max > 1
            if separate_streams and src != dst and (a > 0 or b >= 0):
                raise Unsupported(
                    "partial seq_copy needs kv_unified=True (sequences have separate KV streams)"
                )
            self._forget_outputs(dst)
            lib.llama_memory_seq_cp(self._mem, src, dst, a, b)

    def seq_keep(self, seq_id: int) -> None:
        """Drop every sequence except ``seq_id``."""
        with self._lock:
            self._ptr()
            self._check_seq(seq_id)
            self._outputs = {r: s for r, s in self._outputs.items() if s == seq_id}
            lib.llama_memory_seq_keep(self._mem, seq_id)

    def seq_shift(self, seq_id: int, delta: int, p0: int = 0, p1: int | None = None) -> None:
        """Add ``delta`` to the positions in ``[p0, p1)`` of ``seq_id``."""
        with self._lock:
            self._ptr()
            self._check_seq(seq_id)
            a, b = self._range(p0, p1)
            if not lib.llama_memory_can_shift(self._mem):
                raise Unsupported("this model's memory cannot shift positions")
            lib.llama_memory_seq_add(self._mem, seq_id, a, b, delta)

    def clear(self, *, data: bool = False) -> None:
        """Empty every sequence (``data`` also zeroes the buffers)."""
        with self._lock:
            self._ptr()
            self._outputs.clear()
            lib.llama_memory_clear(self._mem, data)

    # -- KV state of one sequence (SPEC L7) -------------------------------------------------

    def seq_state_size(self, seq_id: int) -> int:
        """Bytes :meth:`pack_seq` will write for ``seq_id`` now."""
        with self._lock:
            ptr = self._ptr()
            self._check_seq(seq_id)
            return int(lib.llama_state_seq_get_size(ptr, seq_id))

    def pack_seq(self, seq_id: int, out: Any) -> int:
        """Write ``seq_id``'s KV state into the writable buffer ``out``
        (bytearray, memoryview, mmap, shared memory, :class:`StateBuffer`) with
        no intermediate copy. Returns the number of bytes written."""
        with self._lock:
            ptr = self._ptr()
            self._check_seq(seq_id)
            dst = writable_view(out)
            need = int(lib.llama_state_seq_get_size(ptr, seq_id))
            if len(dst) < need:
                raise BufferTooSmall(
                    f"state of sequence {seq_id} needs {need} bytes, buffer has {len(dst)}",
                    details={"needed": need, "size": len(dst)},
                )
            n = int(lib.llama_state_seq_get_data(ptr, dst, len(dst), seq_id))
            if n == 0:
                raise StateError(f"llama.cpp failed to pack sequence {seq_id}")
            return n

    def unpack_seq(self, seq_id: int, data: Any, nbytes: int | None = None) -> int:
        """Restore ``seq_id`` from a packed state held in any buffer (read in
        place). On failure the sequence is left empty and
        :class:`StateError` is raised. Returns the bytes consumed."""
        with self._lock:
            ptr = self._ptr()
            self._check_seq(seq_id)
            src = readable_view(data)
            size = len(src) if nbytes is None else nbytes
            if not 0 < size <= len(src):
                raise BadRequest(f"nbytes {nbytes} outside (0, {len(src)}]")
            self._forget_outputs(seq_id)
            n = int(lib.llama_state_seq_set_data(ptr, src, size, seq_id))
            if n == 0:
                raise StateError(
                    f"llama.cpp rejected the state for sequence {seq_id} "
                    "(corrupt, truncated, or from another model/context layout)"
                )
            return n

    # -- embeddings (SPEC L9) -----------------------------------------------------------------

    def embed(
        self,
        inputs: Sequence[Sequence[int]],
        *,
        normalize: bool = True,
        seq_ids: Sequence[int] | None = None,
    ) -> list[list[float]]:
        """Pooled embeddings of several token sequences, batched into as few
        decodes as pooling allows (see :mod:`llamad.llama_ffi.embeddings`).

        Needs a pooling type other than ``NONE`` (set ``ContextOptions.pooling``
        for generative models). Uses sequences ``seq_ids`` (default
        ``0..len(inputs)-1``), which must be empty, and leaves them empty.
        Each input must fit one ubatch (``n_ubatch`` tokens) so that pooling
        sees the whole sequence.
        """
        with self._lock:
            ptr = self._ptr()
            if self.pooling in (PoolingType.NONE, PoolingType.UNSPECIFIED):
                raise EmbeddingsUnavailable(
                    "this context has no pooling; create it with ContextOptions(pooling=MEAN)"
                )
            if not inputs:
                return []
            ids = list(range(len(inputs))) if seq_ids is None else list(seq_ids)
            if len(ids) != len(inputs) or len(set(ids)) != len(ids):
                raise BadRequest("seq_ids must be distinct, one per input")
            for sid, toks in zip(ids, inputs, strict=True):
                self._check_seq(sid)
                if int(lib.llama_memory_seq_pos_max(self._mem, sid)) >= 0:
                    raise InvalidSequence(f"sequence {sid} is in use; embed needs empty sequences")
                if not 0 < len(toks) <= self.n_ubatch:
                    raise BatchTooLarge(
                        f"an input of {len(toks)} tokens must be in [1, n_ubatch={self.n_ubatch}]"
                    )
            if not self._embeddings_on:
                # The real sizes are known now; a graph reserve after a memory
                # update would use exactly these (see check_mean_pooling_layout).
                worst = min(self.n_ctx, self.n_ubatch)
                if self.pooling is PoolingType.MEAN and worst % self.n_seq_max:
                    raise Unsupported(
                        f"mean pooling with n_seq_max={self.n_seq_max} needs "
                        f"min(n_ctx, n_ubatch)={worst} to be a multiple of n_seq_max"
                    )
            groups = plan_groups(
                [len(t) for t in inputs], self.n_ubatch, equal_lengths=self.n_stream > 1
            )
            out: list[list[float]] = [[] for _ in inputs]
            batch = Batch(self.n_ubatch)
            if not self._embeddings_on:
                lib.llama_set_embeddings(ptr, True)
            try:
                for group in groups:
                    batch.clear()
                    for i in group:
                        batch.add_tokens(inputs[i], ids[i], 0, logits_last=False)
                    batch.set_all_logits()
                    self.decode(batch)
                    for i in group:
                        out[i] = self._pooled(ptr, ids[i], normalize)
            finally:
                if not self._embeddings_on:
                    lib.llama_set_embeddings(ptr, False)
                for sid in ids:
                    lib.llama_memory_seq_rm(self._mem, sid, -1, -1)
                self._outputs = {}
                batch.close()
            return out

    def _pooled(self, ptr: Any, seq_id: int, normalize: bool) -> list[float]:
        p = lib.llama_get_embeddings_seq(ptr, seq_id)
        if p == ffi.NULL:
            raise EmbeddingsUnavailable(f"llama.cpp returned no embedding for sequence {seq_id}")
        vec = list(ffi.unpack(p, self.n_embd))
        return l2_normalize(vec) if normalize else vec

    # -- LoRA adapters (SPEC L10) --------------------------------------------------------------

    @property
    def adapters(self) -> tuple[tuple[LoraAdapter, float], ...]:
        """Attached adapters and their scales, in attach order."""
        with self._lock:
            return tuple(self._adapters.items())

    def set_adapter(self, adapter: LoraAdapter, scale: float = 1.0) -> None:
        """Attach ``adapter`` at ``scale`` (or change its scale). Scale 0 keeps
        it listed but out of the graph, so outputs equal the base model's."""
        if not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise BadRequest(f"adapter scale must be a finite number, not {scale!r}")
        if adapter.model is not self.model:
            raise AdapterError("the adapter was loaded for a different model")
        with self._lock:
            self._ptr()
            fresh = adapter not in self._adapters
            if fresh:
                adapter.native_handle.acquire()  # raises Closed once unloaded
            previous = self._adapters.get(adapter)
            self._adapters[adapter] = float(scale)
            try:
                self._apply_adapters()
            except BaseException:
                if fresh:
                    del self._adapters[adapter]
                    adapter.native_handle.release()
                elif previous is not None:
                    self._adapters[adapter] = previous
                raise

    def remove_adapter(self, adapter: LoraAdapter) -> bool:
        """Detach ``adapter``; returns False if it was not attached."""
        with self._lock:
            if adapter not in self._adapters:
                return False
            del self._adapters[adapter]
            try:
                if not self._handle.closed:
                    self._apply_adapters()
            finally:
                adapter.native_handle.release()
            return True

    def _apply_adapters(self) -> None:
        active = [(a, s) for a, s in self._adapters.items() if s != 0.0]
        n = len(active)
        ptrs = ffi.new("struct llama_adapter_lora *[]", max(n, 1))
        scales = ffi.new("float[]", max(n, 1))
        for i, (a, s) in enumerate(active):
            ptrs[i] = a.native_handle.ptr
            scales[i] = s
        rc = int(lib.llama_set_adapters_lora(self._ptr(), ptrs, n, scales))
        if rc != 0:
            raise AdapterError(f"llama.cpp refused the adapter set (rc={rc})")
        self._forget_outputs(-1)
