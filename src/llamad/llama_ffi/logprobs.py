"""Log-probabilities of one logits row, computed in C (SPEC M13).

A log-softmax over the default model's 49,152-token vocabulary costs about
13 ms per token in Python (measured here), more than the decode step itself;
the shim's ``llamad_logprobs`` does it in one pass (a fraction of a
millisecond) and also selects the top ``k`` tokens. The values are the
model's own distribution (the raw logits at temperature 1, before penalties,
grammar or truncation), as OpenAI-style ``logprobs`` report it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import InvalidToken, NoLogits
from llamad.llama_ffi.native import ffi, lib

__all__ = ["TokenLogprobs", "token_logprobs"]


class TokenLogprobs(NamedTuple):
    """``chosen``: the log-probability of the given token; ``top``: the ``k``
    most likely ``(token, logprob)``, most likely first (ties: smaller id first)."""

    chosen: float
    top: tuple[tuple[int, float], ...]


def token_logprobs(logits: Any, chosen: int, k: int) -> TokenLogprobs:
    """Log-probabilities from ``logits`` (a float32 buffer of the vocabulary's
    size, e.g. :meth:`Context.logits`, read in place) for token ``chosen`` and
    the top ``k``."""
    try:
        row = ffi.from_buffer("float[]", logits)
    except (TypeError, BufferError) as exc:
        raise BadRequest(f"logits must be a float32 buffer: {exc}") from None
    view = memoryview(logits)
    if view.itemsize != 4 or view.format not in ("f", "=f", "<f"):
        raise BadRequest(f"logits must hold float32 values, not format {view.format!r}")
    n_vocab = len(row)
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < n_vocab:
        raise InvalidToken(f"token {chosen!r} is outside [0, {n_vocab})")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise BadRequest(f"k must be an integer >= 0, not {k!r}")
    k = min(k, n_vocab)
    ids = ffi.new("llama_token[]", max(k, 1))
    values = ffi.new("float[]", max(k, 1))
    out = ffi.new("float *")
    n = int(lib.llamad_logprobs(row, n_vocab, chosen, k, ids, values, out))
    if n == -2:
        raise NoLogits("the logits row holds NaN or no finite value")
    if n < 0:  # pragma: no cover - every argument was checked above
        raise BadRequest("llamad_logprobs refused its arguments")
    return TokenLogprobs(float(out[0]), tuple((int(ids[i]), float(values[i])) for i in range(n)))
