"""Pooled embeddings through the worker (SPEC M11, L9).

Embeddings never run on the generation context: its sequences belong to
requests and sessions, and switching it into embeddings mode between ticks
would cost every sequence a graph rebuild. An :class:`Embedder` instead makes
a small context of its own on the first call (``embeddings=True``, one KV
pool, ``n_seq_max`` inputs per decode) and keeps it for later calls; it holds
a few MB at the default size. Inputs are grouped ``n_seq_max`` at a time and
each group runs as few decodes as pooling allows
(:meth:`llamad.llama_ffi.Context.embed`), so a batch of inputs gives the
vectors each would give alone.

The embedding context mirrors the generation context's LoRA adapters (the
served model is the base model with its adapters): before each call it
attaches, rescales or detaches to match ``mirror.adapters``.

Pooling is the model's own when its GGUF names one, else mean pooling (a
generative model such as the default one names none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from llamad.errors import BadRequest, ConfigError
from llamad.llama_ffi.context import Context
from llamad.llama_ffi.embeddings import effective_pooling
from llamad.llama_ffi.model import Model
from llamad.llama_ffi.options import ContextOptions, PoolingType

__all__ = ["MAX_EMBED_INPUTS", "Embedder", "EmbedderOptions"]

log = structlog.get_logger("llamad.model")

MAX_EMBED_INPUTS: Final = 1024
"""Most inputs one call may embed (a request, not a bulk job)."""


def _field(name: str, ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(f"embedder {name}: {message}", details={"field": name})


@dataclass(frozen=True, slots=True)
class EmbedderOptions:
    """The embedding context: ``n_ctx`` is the longest input in tokens (each
    input is pooled within one ubatch, so ``n_ubatch = n_batch = n_ctx``),
    ``n_seq_max`` inputs share a decode, ``n_threads`` runs it. Mean pooling
    needs ``n_ctx`` to be a multiple of ``n_seq_max``."""

    n_ctx: int = 512
    n_seq_max: int = 4
    n_threads: int = 1
    pooling: PoolingType = PoolingType.UNSPECIFIED

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_seq_max", "n_threads"):
            value = getattr(self, name)
            _field(
                name,
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                f"must be an integer >= 1, got {value!r}",
            )
        _field(
            "n_ctx",
            self.n_ctx % self.n_seq_max == 0,
            f"must be a multiple of n_seq_max ({self.n_seq_max}) for mean pooling",
        )
        _field(
            "pooling",
            isinstance(self.pooling, PoolingType) and self.pooling is not PoolingType.NONE,
            "must be a pooling type other than NONE",
        )


class Embedder:
    """Embeds token sequences or texts with ``model`` on a lazily made context."""

    def __init__(
        self,
        model: Model,
        options: EmbedderOptions | None = None,
        *,
        mirror: Context | None = None,
    ) -> None:
        self.model = model
        self.options = options or EmbedderOptions()
        self.mirror = mirror
        self._ctx: Context | None = None

    @property
    def context(self) -> Context | None:
        """The embedding context, once the first call made it."""
        return self._ctx

    def _context(self) -> Context:
        if self._ctx is None or self._ctx.closed:
            opts = self.options
            pooling = opts.pooling
            if effective_pooling(self.model.metadata, pooling) is PoolingType.NONE:
                pooling = PoolingType.MEAN
            self._ctx = self.model.context(
                ContextOptions(
                    n_ctx=opts.n_ctx,
                    n_batch=opts.n_ctx,
                    n_ubatch=opts.n_ctx,
                    n_seq_max=opts.n_seq_max,
                    n_threads=opts.n_threads,
                    n_threads_batch=opts.n_threads,
                    embeddings=True,
                    pooling=pooling,
                    kv_unified=True,
                )
            )
            log.info("model.embedder_ready", n_ctx=opts.n_ctx, n_seq_max=opts.n_seq_max)
        self._sync_adapters(self._ctx)
        return self._ctx

    def _sync_adapters(self, ctx: Context) -> None:
        want = dict(self.mirror.adapters) if self.mirror is not None else {}
        for adapter, _ in ctx.adapters:
            if adapter not in want:
                ctx.remove_adapter(adapter)
        have = dict(ctx.adapters)
        for adapter, scale in want.items():
            if have.get(adapter) != scale:
                ctx.set_adapter(adapter, scale)

    def tokens_of(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Each input as token ids (texts tokenized with the model's specials)."""
        if isinstance(inputs, str | bytes) or not isinstance(inputs, Sequence):
            raise BadRequest("inputs must be a list", details={"field": "inputs"})
        if not 1 <= len(inputs) <= MAX_EMBED_INPUTS:
            raise BadRequest(
                f"give between 1 and {MAX_EMBED_INPUTS} inputs", details={"field": "inputs"}
            )
        out: list[list[int]] = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                tokens = self.model.tokenize(item)
            elif isinstance(item, list | tuple):
                tokens = [*item]
                self.model.check_tokens(tokens)
            else:
                raise BadRequest(
                    f"inputs[{i}] must be a text or a list of token ids",
                    details={"field": f"inputs[{i}]"},
                )
            if not 1 <= len(tokens) <= self.options.n_ctx:
                raise BadRequest(
                    f"inputs[{i}] has {len(tokens)} tokens; an input needs 1 to "
                    f"{self.options.n_ctx} (the embedder's n_ctx)",
                    details={"field": f"inputs[{i}]", "tokens": len(tokens)},
                )
            out.append(tokens)
        return out

    def embed(
        self, inputs: Sequence[str | Sequence[int]], *, normalize: bool = True
    ) -> list[list[float]]:
        """One pooled vector per input (unit length with ``normalize``)."""
        if not isinstance(normalize, bool):
            raise BadRequest("normalize must be a boolean", details={"field": "normalize"})
        tokens = self.tokens_of(inputs)
        ctx = self._context()
        width = ctx.n_seq_max
        vectors: list[list[float]] = []
        for start in range(0, len(tokens), width):
            vectors.extend(ctx.embed(tokens[start : start + width], normalize=normalize))
        return vectors

    def close(self) -> None:
        """Free the embedding context (the next call makes a new one)."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
