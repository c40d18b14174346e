"""The model worker core's configuration, validated at construction (SPEC M2, M4, C7).

A :class:`WorkerConfig` describes one live context as the scheduler sees it
(its sizes, the admission bounds, the batch strategy, the save policy and the
stream markers). Invalid values refuse to construct with a
:class:`~llamad.errors.ConfigError` naming the field: a worker with a bad
configuration never starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from llamad.cache.policy import CachePolicy
from llamad.errors import ConfigError
from llamad.model.strategies import DEFAULT_STRATEGY, STRATEGIES

__all__ = ["DEFAULT_STRATEGY", "MarkerPair", "WorkerConfig", "default_chunk_size"]


class MarkerPair(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The text that opens and closes a marked section of the output
    (``<think>`` … ``</think>``, ``<tool_call>`` … ``</tool_call>``)."""

    open: str
    close: str

    def __post_init__(self) -> None:
        for name in ("open", "close"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(
                    f"marker {name} must be a non-empty string", details={"field": name}
                )


def default_chunk_size(n_batch: int) -> int:
    """SPEC M4's default ``prefill_chunk_size``: ``max(64, n_batch // 4)``, at most ``n_batch``."""
    return min(n_batch, max(64, n_batch // 4))


def _positive(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"worker {name} must be an integer >= {minimum}, got {value!r}",
            details={"field": name},
        )
    return value


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What the core needs to know about its context and its duties.

    ``n_ctx``: KV cells of the context (with ``kv_unified`` one pool shared by
    every sequence, and the most positions one sequence may use).
    ``n_batch``: most rows one ``llama_decode`` may carry. ``n_seq_max``:
    sequences, so the most requests decoding at once; at most ``n_batch`` so
    every active sequence can have its decode row in every tick.
    ``max_queue``: requests waiting for a sequence before ``overloaded`` (0: no
    queue). ``prefill_chunk_size``: most prompt tokens one sequence prefills
    per tick (``None``: :func:`default_chunk_size`). ``strategy``: the batch
    strategy's name (:data:`llamad.model.strategies.STRATEGIES`).
    ``policy``: when to save (SPEC C7). ``thinking`` / ``tool_call``: markers
    surfaced as their own stream events (``None``: not recognised).
    ``miss_window``: prompt tokens decoded on each side of the divergence
    point in a ``cache_miss`` explanation. ``live_reuse``: a finished
    request's KV stays in its sequence as an idle entry that the next request
    sharing a prefix reuses in place or shares (SPEC M18); off, a sequence is
    cleared when its request ends and only sessions keep KV.
    ``release_saved_idle``: when a request starts, the idle entries whose KV
    is exactly a row a tier has published or is writing are cleared (but any the request
    reuses), so that the decodes beside them do not attend over their
    cells; off, idle entries stay until a sequence or cells are needed.
    """

    n_ctx: int
    n_batch: int = 2048
    n_seq_max: int = 1
    max_queue: int = 64
    prefill_chunk_size: int | None = None
    strategy: str = DEFAULT_STRATEGY
    policy: CachePolicy = field(default_factory=CachePolicy)
    thinking: MarkerPair | None = None
    tool_call: MarkerPair | None = None
    miss_window: int = 16
    live_reuse: bool = True
    release_saved_idle: bool = True

    def __post_init__(self) -> None:
        _positive("n_ctx", self.n_ctx)
        _positive("n_batch", self.n_batch)
        _positive("n_seq_max", self.n_seq_max)
        _positive("max_queue", self.max_queue, minimum=0)
        _positive("miss_window", self.miss_window, minimum=0)
        if self.n_seq_max > self.n_batch:
            raise ConfigError(
                f"worker n_seq_max ({self.n_seq_max}) must not exceed n_batch "
                f"({self.n_batch}): every active sequence needs its decode row in each tick",
                details={"field": "n_seq_max"},
            )
        chunk = self.prefill_chunk_size
        if chunk is None:
            object.__setattr__(self, "prefill_chunk_size", default_chunk_size(self.n_batch))
        else:
            _positive("prefill_chunk_size", chunk)
            if chunk > self.n_batch:
                raise ConfigError(
                    f"worker prefill_chunk_size ({chunk}) must not exceed n_batch ({self.n_batch})",
                    details={"field": "prefill_chunk_size"},
                )
        if self.strategy not in STRATEGIES:
            known = ", ".join(sorted(STRATEGIES))
            raise ConfigError(
                f"unknown batch strategy {self.strategy!r} (known: {known})",
                details={"field": "strategy"},
            )
        for flag in ("live_reuse", "release_saved_idle"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"worker {flag} must be a boolean", details={"field": flag})
        if not isinstance(self.policy, CachePolicy):
            raise ConfigError("worker policy must be a CachePolicy", details={"field": "policy"})
        for name in ("thinking", "tool_call"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, MarkerPair):
                raise ConfigError(f"worker {name} must be a MarkerPair", details={"field": name})
        markers = [m for m in (self.thinking, self.tool_call) if m is not None]
        opens = [m.open for m in markers]
        if len(set(opens)) != len(opens):
            raise ConfigError(
                "thinking and tool_call markers must open differently",
                details={"field": "tool_call"},
            )

    @property
    def chunk(self) -> int:
        """``prefill_chunk_size`` as resolved at construction (never ``None``)."""
        assert self.prefill_chunk_size is not None
        return self.prefill_chunk_size
