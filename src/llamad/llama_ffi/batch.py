"""A reusable decode batch mixing rows from many sequences (SPEC L5).

Each row is one token of one sequence at one position, optionally asking for
logits. Runs of prompt tokens are appended by a C helper (a 2048-token
prefill costs microseconds, not a Python loop); single decode rows go through
:meth:`Batch.add`. The batch remembers which rows asked for logits so that the
context can refuse to sample a row that has none.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import BatchTooLarge, Closed, InvalidToken
from llamad.llama_ffi.native import ffi, lib
from llamad.llama_ffi.vocab import to_token_array

__all__ = ["Batch"]

_INT32_MAX = 2**31 - 1


def _free_batch(raw: Any) -> None:
    lib.llama_batch_free(raw[0])


class Batch:
    """Up to ``capacity`` rows; reuse it across steps with :meth:`clear`."""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise BadRequest(f"batch capacity must be a positive integer, not {capacity!r}")
        self.capacity = capacity
        self._raw = ffi.new("llama_batch *", lib.llama_batch_init(capacity, 0, 1))
        if self._raw.token == ffi.NULL:  # pragma: no cover - allocation failure
            raise MemoryError(f"llama_batch_init({capacity}) failed")
        self._raw.n_tokens = 0
        self._outputs: list[int] = []
        self._output_seq: list[int] = []
        self._finalizer = weakref.finalize(self, _free_batch, self._raw)

    def __len__(self) -> int:
        return int(self._raw.n_tokens)

    @property
    def n_tokens(self) -> int:
        return int(self._raw.n_tokens)

    @property
    def output_rows(self) -> tuple[int, ...]:
        """Rows that asked for logits, in row order."""
        return tuple(self._outputs)

    @property
    def output_seqs(self) -> tuple[int, ...]:
        """The sequence of each output row (parallel to :attr:`output_rows`)."""
        return tuple(self._output_seq)

    def _live(self) -> Any:
        if not self._finalizer.alive:
            raise Closed("batch is closed")
        return self._raw

    def clear(self) -> None:
        """Forget every row (the memory is kept for reuse)."""
        self._live().n_tokens = 0
        self._outputs.clear()
        self._output_seq.clear()

    def add(self, token: int, pos: int, seq_id: int, *, logits: bool = False) -> int:
        """Append one row; returns its index."""
        raw = self._live()
        row = int(raw.n_tokens)
        if row >= self.capacity:
            raise BatchTooLarge(f"batch is full ({self.capacity} rows)")
        try:
            raw.token[row] = token
            raw.pos[row] = pos
            raw.seq_id[row][0] = seq_id
        except (OverflowError, TypeError) as exc:
            raise InvalidToken(f"row values must be 32-bit integers ({exc})") from None
        raw.n_seq_id[row] = 1
        raw.logits[row] = 1 if logits else 0
        raw.n_tokens = row + 1
        if logits:
            self._outputs.append(row)
            self._output_seq.append(seq_id)
        return row

    def add_tokens(
        self,
        tokens: Sequence[int] | Any,
        seq_id: int,
        start_pos: int,
        *,
        logits_last: bool = True,
    ) -> int:
        """Append ``tokens`` of one sequence at positions ``start_pos, start_pos+1, …``.

        ``tokens`` may be a list or any int32 buffer (read without a copy).
        Returns the first new row; with ``logits_last`` the last row asks for
        logits. The batch is unchanged if the tokens do not fit.
        """
        raw = self._live()
        arr = to_token_array(tokens)
        n = len(arr)
        if not (0 <= start_pos <= _INT32_MAX - n) or not (0 <= seq_id <= _INT32_MAX):
            raise BadRequest(f"invalid start_pos {start_pos} / seq_id {seq_id}")
        first = int(
            lib.llamad_batch_add_seq(
                raw, self.capacity, arr, n, start_pos, seq_id, 1 if logits_last else 0
            )
        )
        if first < 0:
            raise BatchTooLarge(
                f"{n} tokens do not fit: {self.n_tokens} of {self.capacity} rows used",
                details={"rows": n, "used": self.n_tokens, "capacity": self.capacity},
            )
        if logits_last and n > 0:
            self._outputs.append(first + n - 1)
            self._output_seq.append(seq_id)
        return first

    def set_all_logits(self) -> None:
        """Ask for output on every row (embeddings need every token)."""
        raw = self._live()
        n = int(raw.n_tokens)
        ffi.memmove(raw.logits, b"\x01" * n, n)
        self._outputs = list(range(n))
        self._output_seq = [int(raw.seq_id[i][0]) for i in range(n)]

    @property
    def native(self) -> Any:
        """The ``llama_batch *`` (for the binding's own calls)."""
        return self._live()

    def close(self) -> None:
        """Free the native arrays now (also happens on garbage collection)."""
        self._finalizer()

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
