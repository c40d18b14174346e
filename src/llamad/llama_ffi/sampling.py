"""Sampler chains built from a frozen :class:`SamplerParams` (SPEC L6).

Chain order follows llama.cpp's own common sampler: logit bias, penalties,
grammar, then either greedy or top-k → typical → top-p → min-p → temperature
→ a seeded draw. The grammar sits before any truncation so that top-k can
never leave only tokens the grammar forbids.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llamad.errors import ConfigError
from llamad.llama_ffi.errors import GrammarError, InvalidToken, NoLogits
from llamad.llama_ffi.inputs import c_string
from llamad.llama_ffi.lifetime import NativeHandle
from llamad.llama_ffi.native import ffi, lib, llama_errors
from llamad.llama_ffi.vocab import check_tokens

if TYPE_CHECKING:
    from llamad.llama_ffi.model import Model

__all__ = ["Sampler", "SamplerParams", "grammar_problem"]

#: What llama.cpp adds after the specific reason once a grammar fails to
#: parse: it says nothing more.
_GENERIC = "failed to parse grammar"
_REASON_CHARS = 200

_U32_MAX = 2**32 - 1


def _fail(name: str, message: str) -> None:
    raise ConfigError(f"{name}: {message}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplerParams:
    """Every L6 sampler; the defaults match llama.cpp's command-line tools.

    ``temperature <= 0`` or ``greedy=True`` picks the most likely token.
    ``seed=None`` draws a fresh random seed. ``logit_bias`` maps token id to
    an additive bias (``-inf`` bans a token). ``grammar`` is GBNF text whose
    start rule is ``grammar_root``. Penalties look at the last
    ``penalty_last_n`` accepted tokens (0 disables, -1 means the context).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    greedy: bool = False
    grammar: str | None = None
    grammar_root: str = "root"
    min_keep: int = 1

    def __post_init__(self) -> None:
        bias = self.logit_bias
        if isinstance(bias, Mapping):
            bias = tuple(bias.items())
        try:
            bias = tuple(sorted((int(t), float(b)) for t, b in bias))
        except (TypeError, ValueError):
            _fail("logit_bias", "must map token ids to numbers")
        object.__setattr__(self, "logit_bias", bias)
        for t, b in bias:
            if t < 0:
                _fail("logit_bias", f"token id {t} is negative")
            if math.isnan(b) or b == math.inf:
                _fail("logit_bias", f"bias for token {t} must be finite or -inf")
        if not _finite(self.temperature):
            _fail("temperature", "must be a finite number")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            _fail("top_k", "must be an integer >= 0 (0 disables)")
        for name in ("top_p", "typical_p"):
            v = getattr(self, name)
            if not _finite(v) or not 0.0 < v <= 1.0:
                _fail(name, "must be in (0, 1] (1 disables)")
        if not _finite(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            _fail("min_p", "must be in [0, 1] (0 disables)")
        if not _finite(self.repeat_penalty) or self.repeat_penalty <= 0:
            _fail("repeat_penalty", "must be > 0 (1 disables)")
        for name in ("frequency_penalty", "presence_penalty"):
            if not _finite(getattr(self, name)):
                _fail(name, "must be a finite number (0 disables)")
        if not isinstance(self.penalty_last_n, int) or self.penalty_last_n < -1:
            _fail("penalty_last_n", "must be >= -1")
        if self.seed is not None and (
            not isinstance(self.seed, int) or not 0 <= self.seed < _U32_MAX
        ):
            _fail("seed", f"must be in [0, {_U32_MAX - 1}] or None for a random seed")
        if self.grammar is not None and not isinstance(self.grammar, str):
            _fail("grammar", "must be GBNF text")
        if not isinstance(self.grammar_root, str) or not self.grammar_root:
            _fail("grammar_root", "must be a rule name")
        # Both travel to llama.cpp as C strings (see llama_ffi.inputs).
        if self.grammar is not None:
            c_string(self.grammar, "grammar", ConfigError)
        c_string(self.grammar_root, "grammar_root", ConfigError)
        if not isinstance(self.min_keep, int) or self.min_keep < 1:
            _fail("min_keep", "must be >= 1")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature <= 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repeat_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        ) and self.penalty_last_n != 0


def grammar_problem(said: list[str]) -> str:
    """Why llama.cpp refused a grammar, from what it logged (:func:`llama_errors`).

    The parser's message ends with the whole grammar text after a blank
    line, and its reason quotes the rest of the grammar from where it
    stopped ("expecting ::= at ..."): the sender has that text already and
    it may be long, so the reason is put on one line and cut at
    :data:`_REASON_CHARS`.
    """
    reasons: list[str] = []
    for message in said:
        head = " ".join(message.split("\n\n", 1)[0].split())
        if len(head) > _REASON_CHARS:
            head = head[: _REASON_CHARS - 1] + "…"
        if head and head != _GENERIC and head not in reasons:
            reasons.append(head)
    if not reasons:
        return "llama.cpp refused it without saying why (is its log level off?)"
    return "; ".join(reasons)


def _free_chain(model_handle: NativeHandle) -> Any:
    def free(ptr: Any) -> None:
        lib.llama_sampler_free(ptr)
        model_handle.release()

    return free


class Sampler:
    """A native sampler chain for one model; keeps the model alive while open.

    Use it with :meth:`Context.sample`, which also accepts the sampled token
    into the chain (advancing the grammar and the penalty history).
    """

    def __init__(self, model: Model, params: SamplerParams | None = None) -> None:
        self.model = model
        self.params = p = params or SamplerParams()
        for t, _ in p.logit_bias:
            if t >= model.n_vocab:
                raise InvalidToken(f"logit_bias token {t} is outside [0, {model.n_vocab})")
        model_handle = model.native_handle
        model_ptr = model_handle.acquire()
        chain = ffi.NULL
        try:
            vocab = lib.llama_model_get_vocab(model_ptr)
            chain_params = lib.llama_sampler_chain_default_params()
            chain_params.no_perf = True
            chain = lib.llama_sampler_chain_init(chain_params)
            self._grammar_index = -1

            def add(part: Any) -> None:
                # Added at once: the chain owns (and frees) it from here on.
                lib.llama_sampler_chain_add(chain, part)

            if p.logit_bias:
                biases = ffi.new("llama_logit_bias[]", len(p.logit_bias))
                for i, (t, b) in enumerate(p.logit_bias):
                    biases[i].token = t
                    biases[i].bias = b
                add(lib.llama_sampler_init_logit_bias(model.n_vocab, len(p.logit_bias), biases))
            if p.has_penalties:
                add(
                    lib.llama_sampler_init_penalties(
                        model.n_vocab,
                        p.penalty_last_n,
                        p.repeat_penalty,
                        p.frequency_penalty,
                        p.presence_penalty,
                    )
                )
            if p.grammar is not None:
                with llama_errors() as said:
                    grammar = lib.llama_sampler_init_grammar(
                        vocab, p.grammar.encode("utf-8"), p.grammar_root.encode("utf-8")
                    )
                if grammar == ffi.NULL:
                    reason = grammar_problem(said)
                    raise GrammarError(
                        f"the grammar is invalid: {reason}",
                        details={"root": p.grammar_root, "reason": reason},
                    )
                self._grammar_index = int(lib.llama_sampler_chain_n(chain))
                add(grammar)
            if p.is_greedy:
                add(lib.llama_sampler_init_greedy())
            else:
                if p.top_k > 0:
                    add(lib.llama_sampler_init_top_k(p.top_k))
                if p.typical_p < 1.0:
                    add(lib.llama_sampler_init_typical(p.typical_p, p.min_keep))
                if p.top_p < 1.0:
                    add(lib.llama_sampler_init_top_p(p.top_p, p.min_keep))
                if p.min_p > 0.0:
                    add(lib.llama_sampler_init_min_p(p.min_p, p.min_keep))
                add(lib.llama_sampler_init_temp(p.temperature))
                seed = lib.LLAMA_DEFAULT_SEED if p.seed is None else p.seed
                add(lib.llama_sampler_init_dist(seed))
        except BaseException:
            if chain != ffi.NULL:
                lib.llama_sampler_free(chain)
            model_handle.release()
            raise
        self._handle = NativeHandle(chain, _free_chain(model_handle), "sampler")
        self._finalizer = weakref.finalize(self, self._handle.close)

    @property
    def native_handle(self) -> NativeHandle:
        return self._handle

    @property
    def names(self) -> list[str]:
        """The llama.cpp names of the chain's samplers, in order."""
        with self._handle.lease() as chain:
            return [
                ffi.string(lib.llama_sampler_name(lib.llama_sampler_chain_get(chain, i))).decode()
                for i in range(int(lib.llama_sampler_chain_n(chain)))
            ]

    @property
    def seed(self) -> int:
        """The seed in use (the random one if ``params.seed`` was None)."""
        with self._handle.lease() as chain:
            return int(lib.llama_sampler_get_seed(chain))

    def sample_logits(self, logits: Any) -> int:
        """Sample (and accept) a token from a logits row the caller holds: the
        model's ``n_vocab`` float32 values in this host's order (e.g. a copy of
        :meth:`Context.logits` kept from an earlier decode).

        The candidates, the chain and its checks are those of
        :meth:`Context.sample`, so the same logits give the same token and
        leave the chain (grammar, penalties, the seeded draw) in the same
        state. Raises :class:`NoLogits` for a row of another size or type,
        and :class:`GrammarError` when the chain rules out every candidate.
        """
        try:
            view = memoryview(logits)
        except TypeError:
            raise NoLogits(f"logits must be float32 values, not {type(logits).__name__}") from None
        if view.itemsize != 4 or view.format not in ("f", "=f") or not view.contiguous:
            raise NoLogits(f"logits must be contiguous float32 values, not {view.format!r}")
        n_vocab = self.model.n_vocab
        if view.nbytes != 4 * n_vocab:
            raise NoLogits(
                f"{view.nbytes // 4} logits, the model's vocabulary has {n_vocab}",
                details={"n_vocab": n_vocab},
            )
        row = ffi.from_buffer("float[]", logits)
        scratch = ffi.new("llama_token_data[]", n_vocab)
        out = ffi.new("llama_token *")
        with self._handle.lease() as chain:
            rc = int(lib.llamad_sample_logits(chain, row, scratch, n_vocab, out))
        if rc == 1:  # pragma: no cover - the size was checked above
            raise NoLogits("llamad_sample_logits refused the row")
        if rc == 2:
            raise GrammarError(
                "no token is allowed: the grammar (with the logit biases) rules out every candidate"
            )
        return int(out[0])

    def accept(self, tokens: Iterable[int]) -> None:
        """Feed tokens (e.g. the prompt) into the penalty history.

        The grammar is skipped: it constrains only what is generated, and
        feeding it text it does not match would abort inside llama.cpp.
        """
        arr = check_tokens(list(tokens), self.model.n_vocab)
        with self._handle.lease() as chain:
            n = int(lib.llama_sampler_chain_n(chain))
            members = [
                lib.llama_sampler_chain_get(chain, i) for i in range(n) if i != self._grammar_index
            ]
            for t in arr:
                for member in members:
                    lib.llama_sampler_accept(member, t)

    def reset(self) -> None:
        """Forget accepted tokens and restart the grammar."""
        with self._handle.lease() as chain:
            lib.llama_sampler_reset(chain)

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
