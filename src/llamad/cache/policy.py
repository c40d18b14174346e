"""Save policy gates (SPEC C7): when a model worker should save, and at which length.

Everything here is arithmetic on token counts so the model worker's scheduler
can ask "save now?" between ticks without I/O, and the answers can be checked
exhaustively in unit tests. Evict and shutdown saves are unconditional and do
not pass through these gates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from llamad.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """Save thresholds for one model; invalid values refuse to construct.

    ``min_tokens``: no save of fewer tokens (a short prefill is cheaper than a
    restore round trip). ``cold_min_tokens`` / ``cold_max_tokens``: a cold save
    happens only after a prefill of at least the minimum and saves at most the
    maximum. ``continued_interval``: tokens generated between continued saves.
    ``boundary_trim_tokens`` / ``boundary_align_tokens``: a cold save drops this
    many tail tokens and rounds down to a multiple of the alignment, so a later
    prompt that extends this one (after retokenisation of its changed tail)
    still contains the saved prefix. ``session_resume_wait_ms``: how long a
    lookup with a parent key waits for an in-flight finish save.
    ``evict_save_timeout_ms``: cap on a synchronous evict or shutdown save.
    """

    min_tokens: int = 512
    cold_min_tokens: int = 512
    cold_max_tokens: int = 30_000
    continued_interval: int = 2048
    boundary_trim_tokens: int = 32
    boundary_align_tokens: int = 2048
    session_resume_wait_ms: int = 500
    evict_save_timeout_ms: int = 30_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"cache policy {f.name} must be a non-negative integer, got {value!r}",
                    details={"field": f.name},
                )
        for name in ("continued_interval", "boundary_align_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"cache policy {name} must be >= 1", details={"field": name})
        if self.cold_min_tokens > self.cold_max_tokens:
            raise ConfigError(
                "cache policy cold_min_tokens must not exceed cold_max_tokens",
                details={"field": "cold_min_tokens"},
            )

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, base: CachePolicy | None = None
    ) -> CachePolicy:
        """``base`` (default: SPEC defaults) with ``values`` applied; unknown keys refuse."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown cache policy key {unknown[0]!r}", details={"field": unknown[0]}
            )
        merged = asdict(base or cls())
        merged.update(values)
        return cls(**merged)

    def with_overrides(self, values: Mapping[str, Any]) -> CachePolicy:
        """This policy with a model's overrides applied (validated the same way)."""
        return CachePolicy.from_mapping(values, base=self)


class ColdSplit(NamedTuple):
    """A cold prompt split at its save boundary."""

    save_at: int
    """Token count to prefill, then save as a cold row."""
    tail: int
    """Tokens of the prompt after the boundary (prefilled after the save)."""


def trim_boundary(n_tokens: int, trim: int, align: int) -> int | None:
    """``n_tokens - trim`` rounded down to a multiple of ``align``; None if that is 0."""
    if n_tokens < 0 or trim < 0 or align < 1:
        raise ValueError("token counts must be >= 0 and align >= 1")
    boundary = (n_tokens - trim) // align * align
    return boundary if boundary > 0 else None


def cold_save_split(n_tokens: int, policy: CachePolicy) -> ColdSplit | None:
    """Where a cold prefill of ``n_tokens`` should be saved, or None for no cold save.

    Prompts longer than ``cold_max_tokens`` are saved at the aligned boundary
    below the cap rather than skipped: their prefix is the expensive part.
    """
    if n_tokens < max(policy.cold_min_tokens, policy.min_tokens):
        return None
    capped = min(n_tokens, policy.cold_max_tokens + policy.boundary_trim_tokens)
    boundary = trim_boundary(capped, policy.boundary_trim_tokens, policy.boundary_align_tokens)
    if boundary is None or boundary < max(policy.min_tokens, policy.cold_min_tokens):
        return None
    return ColdSplit(save_at=boundary, tail=n_tokens - boundary)


def should_continued_save(live_tokens: int, last_saved_at: int, policy: CachePolicy) -> bool:
    """True when ``continued_interval`` tokens have accumulated since the last save."""
    return (
        live_tokens >= policy.min_tokens
        and live_tokens - last_saved_at >= policy.continued_interval
    )


def should_finish_save(live_tokens: int, policy: CachePolicy) -> bool:
    """True when a finished sequence (prompt + reply) is long enough to keep."""
    return live_tokens >= policy.min_tokens
