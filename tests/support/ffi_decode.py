"""Decoding a sequence through the binding in small chunks (llama_ffi tests)."""

from __future__ import annotations

from collections.abc import Sequence

from llamad.llama_ffi import Batch, Context

__all__ = ["decode_rows"]


def decode_rows(ctx: Context, seq: int, tokens: Sequence[int], pos: int) -> list[float]:
    """Decode ``tokens`` into ``seq`` from ``pos`` in chunks of 15 rows (under
    64: ggml-cpu's grouped vector attention, never its tiled path); the last
    token's logits."""
    batch = Batch(64)
    for start in range(0, len(tokens), 15):
        chunk = tokens[start : start + 15]
        batch.clear()
        batch.add_tokens(chunk, seq, pos + start, logits_last=True)
        ctx.decode(batch)
    return list(ctx.logits(batch.n_tokens - 1))
