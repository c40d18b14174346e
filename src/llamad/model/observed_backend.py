"""The backend as the shell drives it: a hook just before and after each decode.

The core calls ``Backend.decode`` once per tick, after it has admitted,
resolved and planned. The shell needs that moment: it publishes the worker's
status right before a decode that may take seconds (SPEC M10), and times the
decode for ``tokens/s``. :class:`ObservedBackend` forwards every other call
untouched (bound methods copied once, so a sample costs no extra frame).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llamad.model.backend import Backend, PackedState, Sampled, SamplerHandle
from llamad.model.planner import BatchPlan
from llamad.model.requests import RequestParams

__all__ = ["ObservedBackend"]


class ObservedBackend:
    """``inner`` with ``before(plan)`` and ``after(plan, seconds)`` around each decode."""

    def __init__(
        self,
        inner: Backend,
        *,
        before: Callable[[BatchPlan], None],
        after: Callable[[BatchPlan, float], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self._before = before
        self._after = after
        self._clock = clock
        self.open_sampler: Callable[[RequestParams], SamplerHandle] = inner.open_sampler
        self.close_sampler: Callable[[SamplerHandle], None] = inner.close_sampler
        self.sample: Callable[[SamplerHandle, int, int | None], Sampled] = inner.sample
        self.row_logits: Callable[[int], bytes] = inner.row_logits
        self.sample_logits: Callable[[SamplerHandle, bytes, int | None], Sampled] = (
            inner.sample_logits
        )
        self.is_eog: Callable[[int], bool] = inner.is_eog
        self.piece: Callable[[int], bytes] = inner.piece
        self.seq_truncate: Callable[[int, int], None] = inner.seq_truncate
        self.pack: Callable[[int], PackedState] = inner.pack
        self.unpack: Callable[[int, memoryview], None] = inner.unpack
        self.may_unpack_unchecked: Callable[[memoryview, int], bool] = inner.may_unpack_unchecked
        self.cell_end: Callable[[int], int] = inner.cell_end

    @property
    def n_vocab(self) -> int:
        return self.inner.n_vocab

    def seq_copy(self, src: int, dst: int, n: int | None = None) -> None:
        self.inner.seq_copy(src, dst, n)

    def decode(self, plan: BatchPlan) -> None:
        self._before(plan)
        started = self._clock()
        try:
            self.inner.decode(plan)
        finally:
            self._after(plan, self._clock() - started)


def _is_a_backend(backend: ObservedBackend) -> Backend:
    """Never called: mypy checks here that the wrapper implements the protocol."""
    return backend
