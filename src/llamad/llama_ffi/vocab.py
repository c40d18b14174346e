"""Tokenizer calls over a raw ``llama_vocab*`` (SPEC L4).

The caller holds a lease on the model. Token ids are validated before they
reach llama.cpp: an out-of-range id makes its C++ tokenizer throw across the
C boundary, which aborts the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import InvalidToken
from llamad.llama_ffi.native import ffi, lib

__all__ = ["check_tokens", "detokenize", "to_token_array", "token_piece", "tokenize"]

_INT32_MAX = 2**31 - 1


def to_token_array(tokens: Sequence[int] | Any) -> Any:
    """A ``llama_token[]`` view of ``tokens``: zero-copy for a 4-byte integer
    buffer (``array('i')``, an int32 numpy array), one C-level copy for a list."""
    if isinstance(tokens, (list, tuple, range)):
        try:
            return ffi.new("llama_token[]", list(tokens))
        except (OverflowError, TypeError) as exc:
            raise InvalidToken(f"token ids must be 32-bit integers ({exc})") from None
    try:
        view = memoryview(tokens)  # type: ignore[arg-type]
    except TypeError:
        try:
            return ffi.new("llama_token[]", [int(t) for t in tokens])
        except (OverflowError, TypeError, ValueError) as exc:
            raise InvalidToken(f"token ids must be 32-bit integers ({exc})") from None
    if view.itemsize != 4 or view.format not in ("i", "l", "=i", "<i"):
        raise BadRequest(f"token buffer must hold int32 values, not format {view.format!r}")
    return ffi.from_buffer("llama_token[]", tokens)


def check_tokens(tokens: Sequence[int] | Any, n_vocab: int) -> Any:
    """Validate every id against ``n_vocab``; returns the ``llama_token[]``."""
    arr = to_token_array(tokens)
    n = len(arr)
    bad = int(lib.llamad_tokens_check(arr, n, n_vocab))
    if bad >= 0:
        raise InvalidToken(
            f"token id {arr[bad]} at index {bad} is outside [0, {n_vocab})",
            details={"index": bad, "token": int(arr[bad]), "n_vocab": n_vocab},
        )
    return arr


def tokenize(vocab: Any, text: str, add_special: bool, parse_special: bool) -> list[int]:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"text is not encodable as UTF-8: {exc}") from None
    if len(data) > _INT32_MAX:
        raise BadRequest("text longer than 2 GiB")
    capacity = len(data) + 8
    while True:
        out = ffi.new("llama_token[]", capacity)
        n = int(
            lib.llama_tokenize(vocab, data, len(data), out, capacity, add_special, parse_special)
        )
        if n >= 0:
            return list(out[0:n])
        if n == -(2**31):
            raise BadRequest("tokenization result exceeds 2**31 tokens")
        capacity = -n


def detokenize(
    vocab: Any,
    tokens: Sequence[int] | Any,
    n_vocab: int,
    remove_special: bool,
    unparse_special: bool,
) -> bytes:
    arr = check_tokens(tokens, n_vocab)
    n = len(arr)
    if n == 0:
        return b""
    capacity = max(64, n * 8)
    while True:
        buf = ffi.new("char[]", capacity)
        got = int(
            lib.llama_detokenize(vocab, arr, n, buf, capacity, remove_special, unparse_special)
        )
        if got >= 0:
            return bytes(ffi.buffer(buf, got))
        capacity = -got


def token_piece(vocab: Any, token: int, special: bool) -> bytes:
    buf = ffi.new("char[]", 64)
    n = int(lib.llama_token_to_piece(vocab, token, buf, 64, 0, special))
    if n < 0:
        buf = ffi.new("char[]", -n)
        n = int(lib.llama_token_to_piece(vocab, token, buf, -n, 0, special))
    return bytes(ffi.buffer(buf, max(n, 0)))
