"""Per-request parameters, validated once, the same way off the wire or in code (SPEC M6).

:class:`RequestParams` is a frozen msgspec Struct: the actor runtime decodes a
request body straight into it, and ``__post_init__`` (which msgspec runs after
decoding as well as on direct construction) checks every bound and every
combination, raising :class:`~llamad.errors.BadRequest` with the offending
field in ``details["field"]``. A worker never sees a half-valid request.

The sampler fields mirror :class:`llamad.llama_ffi.SamplerParams` (the shell
builds the chain from them); ``json_schema`` becomes a grammar in the shell
(:func:`llamad.llama_ffi.json_schema_to_gbnf`), so an invalid schema is
refused when the request's sampler is opened, before admission.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from llamad.errors import BadRequest, ContextOverflow, TranscriptMismatch
from llamad.llama_ffi.errors import InvalidToken

__all__ = [
    "MAX_LOGPROBS",
    "MAX_STOPS",
    "MAX_STOP_LENGTH",
    "MAX_TOKENS_LIMIT",
    "RequestParams",
    "checked_tokens",
    "parse_params",
    "refuse_unfittable",
    "target_tokens",
]

MAX_TOKENS_LIMIT: Final = 1 << 20
"""Largest ``max_tokens`` accepted: beyond any context llama.cpp builds today;
a larger number is a client bug, not a wish."""
MAX_STOPS: Final = 16
MAX_STOP_LENGTH: Final = 512
MAX_LOGPROBS: Final = 20
MAX_GRAMMAR_CHARS: Final = 1 << 20
MAX_ID_CHARS: Final = 256
KEY_BYTES: Final = 32
_U32: Final = 2**32 - 1


def _bad(field: str, message: str) -> BadRequest:
    return BadRequest(f"{field}: {message}", details={"field": field})


def _number(field: str, value: object, lo: float, hi: float, *, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(field, f"must be a finite number, got {value!r}")
    if value > hi or value < lo or (lo_open and value == lo):
        bracket = "(" if lo_open else "["
        raise _bad(field, f"must lie in {bracket}{lo}, {hi}], got {value!r}")


def _integer(field: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(field, f"must be an integer in [{lo}, {hi}], got {value!r}")


def _text(field: str, value: object, max_chars: int) -> None:
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise _bad(field, f"must be a non-empty string of at most {max_chars} characters")
    if "\x00" in value:
        raise _bad(field, "must not contain NUL")


class RequestParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Everything a completion request may set besides its tokens.

    Sampling: ``temperature`` (0 is greedy), ``top_k`` (0 off), ``top_p``,
    ``min_p``, ``repetition_penalty`` (1 off) over the last ``penalty_last_n``
    tokens, ``frequency_penalty`` / ``presence_penalty`` (0 off), ``seed``
    (``None``: random). Constraints: ``grammar`` (GBNF) or ``json_schema``.
    Output: ``max_tokens`` (``None``: until the context is full), ``stop``
    strings (trimmed from the reply and reported), ``logprobs`` (``None`` off;
    ``k``: each token's log-probability and the top ``k`` alternatives).
    ``prefill_only``: warm the cache, generate nothing (SPEC M9).
    Cache and sessions: ``session_id`` pins a sequence across requests;
    ``parent_key`` names the previous turn's ``finish_key``; ``cache_salt``
    splits the cache namespace per tenant; ``continue`` (``continue_`` in
    Python) extends the session with the request's tokens as a tail, and
    ``expect_committed`` refuses that unless the session's committed token
    count is what the caller last saw.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repetition_penalty: float = 1.0
    penalty_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    prefill_only: bool = False
    session_id: str | None = None
    parent_key: bytes | None = None
    cache_salt: str | None = None
    continue_: bool = msgspec.field(default=False, name="continue")
    expect_committed: int | None = None

    def __post_init__(self) -> None:
        _number("temperature", self.temperature, 0.0, 100.0)
        _integer("top_k", self.top_k, 0, 1 << 24)
        _number("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _number("min_p", self.min_p, 0.0, 1.0)
        _number("repetition_penalty", self.repetition_penalty, 0.0, 100.0, lo_open=True)
        _integer("penalty_last_n", self.penalty_last_n, -1, 1 << 24)
        _number("frequency_penalty", self.frequency_penalty, -100.0, 100.0)
        _number("presence_penalty", self.presence_penalty, -100.0, 100.0)
        if self.seed is not None:
            _integer("seed", self.seed, 0, _U32 - 1)
        if self.grammar is not None:
            _text("grammar", self.grammar, MAX_GRAMMAR_CHARS)
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise _bad("json_schema", "must be a JSON object")
        if self.grammar is not None and self.json_schema is not None:
            raise _bad("json_schema", "give a grammar or a JSON schema, not both")
        if self.max_tokens is not None:
            _integer("max_tokens", self.max_tokens, 1, MAX_TOKENS_LIMIT)
        if not isinstance(self.stop, tuple) or len(self.stop) > MAX_STOPS:
            raise _bad("stop", f"must be a list of at most {MAX_STOPS} strings")
        for s in self.stop:
            _text("stop", s, MAX_STOP_LENGTH)
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.session_id is not None:
            _text("session_id", self.session_id, MAX_ID_CHARS)
        if self.cache_salt is not None:
            _text("cache_salt", self.cache_salt, MAX_ID_CHARS)
        if self.parent_key is not None and (
            not isinstance(self.parent_key, bytes) or len(self.parent_key) != KEY_BYTES
        ):
            raise _bad("parent_key", f"must be {KEY_BYTES} bytes")
        if self.continue_:
            if self.session_id is None:
                raise _bad("continue", "extends a session: give its session_id")
            if self.parent_key is not None:
                raise _bad("parent_key", "a continuation extends its session, it has no parent")
        if self.expect_committed is not None:
            _integer("expect_committed", self.expect_committed, 0, 2**31 - 1)
            if not self.continue_:
                raise _bad("expect_committed", "applies to continue requests only")

    @property
    def salt(self) -> bytes | None:
        """``cache_salt`` as the bytes folded into the namespace."""
        return None if self.cache_salt is None else self.cache_salt.encode()


def parse_params(raw: object) -> RequestParams:
    """``raw`` (a decoded msgpack map, or keyword arguments) as :class:`RequestParams`.

    Type errors and unknown fields become :class:`~llamad.errors.BadRequest`
    naming the field, like the bounds checked in ``__post_init__``.
    """
    try:
        return msgspec.convert(raw, RequestParams)
    except msgspec.ValidationError as exc:
        message = str(exc)
        # msgspec ends its messages with " - at `$.field`" when it knows where.
        _, _, where = message.rpartition("at `$.")
        field = where.rstrip("`").split(".")[0].split("[")[0] if where else ""
        raise BadRequest(message, details={"field": field} if field else None) from None


def checked_tokens(tokens: Sequence[int], n_vocab: int) -> list[int]:
    """``tokens`` as a list, each an id of the vocabulary, else ``invalid_token``
    (llama.cpp would read past its embedding table)."""
    out = list(tokens)
    for i, t in enumerate(out):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise InvalidToken(
                f"token {i} ({t!r}) is outside [0, {n_vocab})",
                details={"index": i, "n_vocab": n_vocab},
            )
    return out


def target_tokens(
    tokens: list[int],
    params: RequestParams,
    *,
    transcript: list[int],
    committed: int,
    n_ctx: int,
) -> list[int]:
    """What the sequence must hold before generating: the prompt, or for
    ``continue`` the session's ``transcript`` plus the tail. Refuses a stale
    ``expect_committed`` (``transcript_mismatch``), an empty target and one
    longer than the context (``context_overflow``)."""
    if params.continue_:
        expected = params.expect_committed
        if expected is not None and expected != committed:
            raise TranscriptMismatch(
                f"session {params.session_id!r} has {committed} committed tokens, "
                f"the caller expected {expected}",
                details={"committed": committed, "expected": expected},
            )
        target = transcript + tokens
    else:
        target = tokens
    if not target:
        raise BadRequest("the prompt is empty", details={"field": "tokens"})
    if len(target) > n_ctx:
        raise ContextOverflow(
            f"{len(target)} tokens do not fit a context of {n_ctx}",
            details={"tokens": len(target), "n_ctx": n_ctx},
        )
    return target


def refuse_unfittable(
    n_bytes: int, max_token_bytes: int | None, n_ctx: int, *, exact: bool = True
) -> None:
    """``context_overflow`` for a prompt text of ``n_bytes`` (UTF-8; a lower
    bound unless ``exact``) that cannot fit ``n_ctx`` tokens, before anything
    tokenizes it.

    Sound, never a guess: where every byte of a text lands in one token and
    a token stands for at most ``max_token_bytes`` of them
    (:attr:`llamad.llama_ffi.Model.max_token_bytes`), the text makes at least
    ``ceil(n_bytes / max_token_bytes)`` tokens; BOS and a session's
    transcript only add to that. ``None`` (no such bound for the
    vocabulary): nothing is refused here, the tokens are counted instead.
    """
    if max_token_bytes is None or max_token_bytes <= 0:
        return
    fewest = -(-n_bytes // max_token_bytes)
    if fewest > n_ctx:
        size = f"{n_bytes} bytes" if exact else f"at least {n_bytes} bytes"
        raise ContextOverflow(
            f"the prompt cannot fit a context of {n_ctx} tokens: its text of {size} makes"
            f" at least {fewest} tokens (no token covers more than {max_token_bytes} bytes)",
            details={"bytes": n_bytes, "min_tokens": fewest, "n_ctx": n_ctx},
        )
