"""A deterministic stand-in for a model: :class:`StubBackend` (erllama's model_stub idea).

Its "model" is a hash chain: the logits of position ``p`` of a sequence are
derived from a digest of that sequence's tokens ``0..p``, so the next token
depends on exactly the tokens the sequence holds, as a real model's does.
Restoring a packed state and decoding the same last token therefore
reproduces a cold run, and any bookkeeping slip of the core (a wrong
position, a token fed twice, a truncation forgotten) changes the output or
trips a check.

It is strict where llama.cpp would fail or silently misbehave: a row whose
position is not the sequence's next one, more rows than ``n_batch``, more
tokens than ``n_ctx`` cells, a token outside the vocabulary, sampling a row
that has no logits. With ``batch_sensitive`` the logits also depend on how
many rows the sequence had in that batch, as they do on a GPU where another
batch shape runs other kernels: the core's held-back last token is what keeps
warm and cold replies equal then.

A row's logits (:meth:`StubBackend.row_logits`) are the candidates' scores in
a float32 vector (every other token ``-inf``), and :meth:`StubBackend.sample`
samples through them, so a row's kept logits sample exactly as its decode did.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llamad.errors import ContextOverflow
from llamad.llama_ffi.errors import (
    BatchTooLarge,
    DecodeAborted,
    GrammarError,
    InvalidSequence,
    InvalidToken,
    NoLogits,
    StateError,
)
from llamad.model.backend import Backend, Sampled, SamplerHandle
from llamad.model.planner import BatchPlan
from llamad.model.requests import RequestParams

__all__ = ["StubBackend", "StubPacked", "StubSampler", "letter_piece"]

_MAGIC = b"STUBKV1\x00"
_CANDIDATES = 8


def letter_piece(token: int) -> bytes:
    """The default rendering: one lowercase letter per token (``a`` + token % 26)."""
    return bytes((97 + token % 26,))


@dataclass(eq=False)
class StubSampler:
    params: RequestParams
    rng: random.Random
    closed: bool = False
    accepted: list[int] = field(default_factory=list)


@dataclass(eq=False)
class StubPacked:
    """A packed stub state: the magic, then the tokens as u32 little-endian."""

    data: bytes
    released: bool = False

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def view(self) -> memoryview:
        return memoryview(self.data)

    def release(self) -> None:
        self.released = True


def _link(prev: bytes, token: int) -> bytes:
    return hashlib.blake2b(prev + token.to_bytes(4, "little"), digest_size=16).digest()


class StubBackend:
    """Implements :class:`~llamad.model.backend.Backend` with a hash-chain "model".

    ``eog``: tokens that end generation. ``rule``: replaces the greedy choice
    with ``rule(tokens of the sequence so far)`` (scripted replies in tests).
    ``piece``: how a token renders (default :func:`letter_piece`).
    """

    def __init__(
        self,
        *,
        n_vocab: int = 256,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_seq_max: int = 4,
        eog: Sequence[int] = (),
        rule: Callable[[Sequence[int]], int] | None = None,
        piece: Callable[[int], bytes] = letter_piece,
        batch_sensitive: bool = False,
    ) -> None:
        self._n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.eog = frozenset(eog)
        self.rule = rule
        self._piece = piece
        self.batch_sensitive = batch_sensitive
        self.tokens: dict[int, list[int]] = {s: [] for s in range(n_seq_max)}
        self._chains: dict[int, list[bytes]] = {s: [] for s in range(n_seq_max)}
        # The KV cell of each position of each sequence: seq_copy shares cells,
        # as llama.cpp's unified KV does, so the pool counts a shared cell once.
        # A new position takes the lowest free cell above its sequence's
        # highest one, else the lowest free cell (llamad's patch 0001 to
        # llama.cpp), so cells freed below a sequence stay holes and
        # cell_end shows what a real pool would.
        self._cells: dict[int, list[int]] = {s: [] for s in range(n_seq_max)}
        self._top: dict[int, int] = {s: 0 for s in range(n_seq_max)}
        """One past each sequence's highest cell."""
        self._refs: dict[int, int] = {}
        """Each cell in use: how many sequences hold it."""
        self.copies: list[tuple[int, int, int]] = []
        """Every seq_copy: (src, dst, positions shared)."""
        self._outputs: dict[int, tuple[int, bytes]] = {}
        self.decoded: list[BatchPlan] = []
        self.logits_sampled = 0
        """Samples taken from given logits (:meth:`sample_logits`), not from a decode's row."""
        self.samplers_open = 0
        self.packs = 0
        self.unpacks = 0
        self.abort_next: tuple[str, int] | None = None
        """(reason, rows): the next decode stops under way, as llama.cpp's
        abort check stops one: its first ``rows`` rows stay in the KV (earlier
        micro-batches), the rest never land, and it raises
        :class:`DecodeAborted` with ``reason``."""
        self.decode_deadline: float | None = None
        self.probe: Callable[[], bool] | None = None
        """Called once per decode before any row lands (the shell's interrupt
        check, :meth:`set_interrupt`); true stops the decode (reason ``probe``)
        once ``probe_rows`` rows have landed."""
        self.probe_rows = 0
        self.aborts = 0

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    # -- samplers -----------------------------------------------------------------------

    def open_sampler(self, params: RequestParams) -> SamplerHandle:
        if params.grammar is not None and not params.grammar.lstrip().startswith("root"):
            raise GrammarError("the stub accepts grammars whose first rule is root")
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        self.samplers_open += 1
        return StubSampler(params, random.Random(seed))

    def close_sampler(self, sampler: SamplerHandle) -> None:
        assert isinstance(sampler, StubSampler) and not sampler.closed
        sampler.closed = True
        self.samplers_open -= 1

    # -- decode and sample -----------------------------------------------------------------

    def decode(self, plan: BatchPlan) -> None:
        if plan.n_rows == 0:
            raise InvalidToken("cannot decode an empty batch")
        if plan.n_rows > self.n_batch:
            raise BatchTooLarge(f"{plan.n_rows} rows exceed n_batch {self.n_batch}")
        cells = self.cells_used + plan.n_rows
        if cells > self.n_ctx:
            raise ContextOverflow(f"{cells} KV cells needed, the context has {self.n_ctx}")
        for span in plan.spans:
            if span.seq not in self.tokens:
                raise InvalidSequence(f"sequence {span.seq} is outside [0, {self.n_seq_max})")
            if span.pos != len(self.tokens[span.seq]):
                raise InvalidSequence(
                    f"sequence {span.seq}: row at position {span.pos}, "
                    f"but the sequence holds {len(self.tokens[span.seq])} tokens"
                )
            for t in span.tokens:
                if not 0 <= t < self._n_vocab:
                    raise InvalidToken(f"token {t} is outside [0, {self._n_vocab})")
        self._outputs = {}
        abort = self.abort_next
        self.abort_next = None
        if abort is None and self.probe is not None and self.probe():
            abort = ("probe", self.probe_rows)
        row = 0
        for span in plan.spans:
            for token in span.tokens:
                if abort is not None and row >= abort[1]:
                    self._outputs = {}
                    self.aborts += 1
                    raise DecodeAborted(
                        f"stub decode aborted ({abort[0]})", details={"reason": abort[0]}
                    )
                self._append(span.seq, token)
                row += 1
            if span.want_logits:
                digest = self._chains[span.seq][-1]
                if self.batch_sensitive:
                    digest = _link(digest, len(span.tokens))
                self._outputs[row - 1] = (span.seq, digest)
        self.decoded.append(plan)

    @property
    def cells_used(self) -> int:
        """KV cells held by any sequence (a shared cell once)."""
        return len(self._refs)

    def cell_end(self, seq: int) -> int:
        if seq == -1:
            return max(self._top.values(), default=0)
        return self._top[seq]

    def _set_cells(self, seq: int, cells: list[int]) -> None:
        refs = self._refs
        for c in self._cells[seq]:
            refs[c] -= 1
            if not refs[c]:
                del refs[c]
        for c in cells:
            refs[c] = refs.get(c, 0) + 1
        self._cells[seq] = cells
        self._top[seq] = max(cells, default=-1) + 1

    def _append(self, seq: int, token: int) -> None:
        chain = self._chains[seq]
        chain.append(_link(chain[-1] if chain else b"", token))
        self.tokens[seq].append(token)
        refs = self._refs
        cell = self._top[seq]
        while cell in refs:
            cell += 1
        if cell >= self.n_ctx:  # nothing free above: the lowest free cell
            cell = next(c for c in range(self.n_ctx) if c not in refs)
        refs[cell] = 1
        self._cells[seq].append(cell)
        self._top[seq] = max(self._top[seq], cell + 1)

    def _candidates(self, digest: bytes) -> list[tuple[int, float]]:
        seen: dict[int, float] = {}
        for i in range(_CANDIDATES):
            token = struct.unpack_from("<I", digest, (i * 2) % 13)[0] % self._n_vocab
            seen.setdefault(token, -float(i))
        return sorted(seen.items(), key=lambda kv: -kv[1])

    def row_logits(self, row: int) -> bytes:
        if row not in self._outputs:
            raise NoLogits(f"row {row} has no logits in the last decode")
        seq, digest = self._outputs[row]
        cands = self._candidates(digest)
        if self.rule is not None:
            forced = self.rule(self.tokens[seq]) % self._n_vocab
            cands = [(forced, 0.0)] + [(t, s - 1.0) for t, s in cands if t != forced]
        vector = array("f", [-math.inf]) * self._n_vocab
        for token, score in cands:
            vector[token] = score
        return vector.tobytes()

    def sample(self, sampler: SamplerHandle, row: int, logprobs: int | None) -> Sampled:
        return self._draw(sampler, self.row_logits(row), logprobs)

    def sample_logits(self, sampler: SamplerHandle, logits: bytes, logprobs: int | None) -> Sampled:
        self.logits_sampled += 1
        return self._draw(sampler, logits, logprobs)

    def _draw(self, sampler: SamplerHandle, logits: bytes, logprobs: int | None) -> Sampled:
        assert isinstance(sampler, StubSampler) and not sampler.closed
        if len(logits) != 4 * self._n_vocab:
            raise NoLogits(f"{len(logits)} bytes of logits, the vocabulary has {self._n_vocab}")
        vector = array("f", logits)
        cands = sorted(
            ((t, float(s)) for t, s in enumerate(vector) if s > -math.inf),
            key=lambda ts: (-ts[1], ts[0]),
        )
        if not cands:
            raise NoLogits("no token has a finite logit")
        norm = math.log(sum(math.exp(s) for _, s in cands))
        logps = [(t, s - norm) for t, s in cands]
        params = sampler.params
        if params.temperature <= 0.0:
            token = logps[0][0]
        else:
            pool = logps[: params.top_k] if params.top_k > 0 else logps
            weights = [math.exp(lp / params.temperature) for _, lp in pool]
            token = sampler.rng.choices([t for t, _ in pool], weights)[0]
        sampler.accepted.append(token)
        chosen = next(lp for t, lp in logps if t == token)
        if logprobs is None:
            return Sampled(token)
        return Sampled(token, chosen, tuple(logps[:logprobs]))

    def is_eog(self, token: int) -> bool:
        return token in self.eog

    def piece(self, token: int) -> bytes:
        return self._piece(token)

    # -- sequences and state ---------------------------------------------------------------

    def set_interrupt(self, probe: Callable[[], bool] | None, every_s: float) -> None:
        self.probe = probe

    def seq_truncate(self, seq: int, keep: int) -> None:
        if keep < 0:
            raise InvalidSequence(f"cannot keep {keep} tokens")
        del self.tokens[seq][keep:]
        del self._chains[seq][keep:]
        self._set_cells(seq, self._cells[seq][:keep])

    def seq_copy(self, src: int, dst: int, n: int | None = None) -> None:
        if self.tokens[dst]:
            raise InvalidSequence(f"sequence {dst} is not empty")
        held = len(self.tokens[src])
        n = held if n is None else n
        if not 0 <= n <= held:
            raise InvalidSequence(f"sequence {src} holds {held} positions, not {n}")
        self.tokens[dst] = self.tokens[src][:n]
        self._chains[dst] = self._chains[src][:n]
        self._set_cells(dst, self._cells[src][:n])
        self.copies.append((src, dst, n))

    def pack(self, seq: int) -> StubPacked:
        self.packs += 1
        tokens = self.tokens[seq]
        return StubPacked(_MAGIC + struct.pack(f"<{len(tokens)}I", *tokens))

    def may_unpack_unchecked(self, payload: memoryview, n_tokens: int) -> bool:
        return True  # its unpack parses in Python and raises StateError on damage

    def unpack(self, seq: int, payload: memoryview) -> None:
        data = bytes(payload)
        if not data.startswith(_MAGIC) or (len(data) - len(_MAGIC)) % 4:
            raise StateError("not a stub state")
        body = data[len(_MAGIC) :]
        tokens = list(struct.unpack(f"<{len(body) // 4}I", body))
        self.unpacks += 1
        self.tokens[seq] = []
        self._chains[seq] = []
        self._set_cells(seq, [])
        for t in tokens:
            self._append(seq, t)


def _is_a_backend(stub: StubBackend) -> Backend:
    """Never called: mypy checks here that the stub implements the protocol."""
    return stub
