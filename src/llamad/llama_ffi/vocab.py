"""Tokenizer calls over a raw ``llama_vocab*`` (SPEC L4).

The caller holds a lease on the model. Token ids are validated before they
reach llama.cpp: an out-of-range id makes its C++ tokenizer throw across the
C boundary, which aborts the process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import InvalidToken
from llamad.llama_ffi.native import ffi, lib

__all__ = [
    "check_tokens",
    "detokenize",
    "longest_piece",
    "pieces_cover_text",
    "to_token_array",
    "token_piece",
    "tokenize",
]

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


def longest_piece(vocab: Any, n_vocab: int) -> int:
    """The most bytes any token of ``vocab`` renders as (special tokens as
    their text, which is what ``parse_special`` matches in a prompt)."""
    size = 256
    buf = ffi.new("char[]", size)
    longest = 0
    for token in range(n_vocab):
        n = int(lib.llama_token_to_piece(vocab, token, buf, size, 0, True))
        # A negative count is the size the piece needs: its length all the same.
        longest = max(longest, abs(n))
    return longest


# The tokenizers of llama.cpp (src/llama-vocab.cpp at the pinned commit) that
# never drop or merge input text: every byte of a prompt lands in exactly one
# token, and a token covers exactly the bytes its piece renders as. SPM
# ("llama") only escapes spaces as U+2581, which the piece unescapes; BPE
# ("gpt2") maps bytes one to one. WPM ("bert") drops control characters and
# UGM ("t5") normalizes and collapses whitespace, so many bytes can become no
# token at all; the others (rwkv, plamo2, hybriddna, whitespace, gemma4) are
# left out for want of a reason to trust them.
_BYTEWISE_TOKENIZERS = frozenset({"llama", "gpt2"})
# A special token with LSTRIP/RSTRIP swallows the whitespace beside it, however
# long. llama.cpp sets those by name in llama_vocab::impl::load; these are its
# rules (a vocabulary they match gets no bound).
_STRIPPING_PRE = ("jina-v2-de", "jina-v2-es", "jina-v2-code", "whitespace")
_STRIPPING_ARCH = ("nomic-bert-moe", "jina-bert-v3")
_STRIPPING_NAME = ("phi-3", "phi3", "modern-bert")


def pieces_cover_text(metadata: Mapping[str, str]) -> bool:
    """Whether text of ``B`` bytes certainly makes at least ``ceil(B / L)``
    tokens, ``L`` being :func:`longest_piece`, for the vocabulary these GGUF
    ``metadata`` describe (see the rules above)."""
    if metadata.get("tokenizer.ggml.model") not in _BYTEWISE_TOKENIZERS:
        return False
    pre = metadata.get("tokenizer.ggml.pre", "")
    arch = metadata.get("general.architecture", "")
    name = metadata.get("general.name", "").lower()
    return not (
        any(p in pre for p in _STRIPPING_PRE)
        or any(a in arch for a in _STRIPPING_ARCH)
        or any(n in name for n in _STRIPPING_NAME)
    )
