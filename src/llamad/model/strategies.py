"""Batch strategies: how one tick's ``n_batch`` rows are shared out (SPEC M4).

Every tick the planner offers a strategy two lists of :class:`Work`, each in
admission order: *decodes* (a sequence that needs one row with logits: a
generating sequence's last sampled token, or a prompt's held-back last
token) and *prefills* (a run of prompt tokens, already capped at the chunk
size and at any save boundary). The strategy answers how many tokens each
gets and in which order their rows go; it never sees tokens or positions.
The planner checks the answer (a custom strategy that over-allocates is a
bug, refused before anything reaches llama.cpp).

- ``decode_maximal`` (default): every decode first, prefills fill the rest,
  oldest first. Keeps inter-token latency flat while prompts stream in.
- ``prefill_priority``: prefills first, decodes take what is left. Finishes
  prompts sooner (time to first token) at the cost of stalling generation.
- ``balanced``: half the budget is reserved for each kind; whatever one
  kind leaves unused goes to the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple, Protocol

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "Allocation",
    "Balanced",
    "BatchStrategy",
    "DecodeMaximal",
    "PrefillPriority",
    "Work",
    "strategy_named",
]


class Work(NamedTuple):
    """One sequence's claim on this tick."""

    seq: int
    order: int
    """Admission order (smaller is older): FIFO among equals."""
    available: int
    """Most tokens the sequence can take this tick (1 for a decode)."""


class Allocation(NamedTuple):
    work: Work
    tokens: int


class BatchStrategy(Protocol):
    """Shares ``budget`` rows between decodes and prefills (both in admission order)."""

    name: str

    def allocate(
        self, decodes: Sequence[Work], prefills: Sequence[Work], budget: int
    ) -> list[Allocation]:
        """Allocations in batch row order; each ``0 < tokens <= work.available``,
        no sequence twice, at most ``budget`` tokens in all."""
        ...


def _fill(works: Sequence[Work], budget: int, out: list[Allocation]) -> int:
    """Give each work, oldest first, as much as it can take; returns what is left."""
    for work in works:
        if budget <= 0:
            break
        take = min(work.available, budget)
        if take > 0:
            out.append(Allocation(work, take))
            budget -= take
    return budget


class DecodeMaximal:
    """Decodes first, then prefill chunks in admission order."""

    name = "decode_maximal"

    def allocate(
        self, decodes: Sequence[Work], prefills: Sequence[Work], budget: int
    ) -> list[Allocation]:
        out: list[Allocation] = []
        budget = _fill(decodes, budget, out)
        _fill(prefills, budget, out)
        return out


class PrefillPriority:
    """Prefill chunks first, decodes take the remainder."""

    name = "prefill_priority"

    def allocate(
        self, decodes: Sequence[Work], prefills: Sequence[Work], budget: int
    ) -> list[Allocation]:
        out: list[Allocation] = []
        budget = _fill(prefills, budget, out)
        _fill(decodes, budget, out)
        return out


class Balanced:
    """Half the budget for each kind; the unused part of one half goes to the other."""

    name = "balanced"

    def allocate(
        self, decodes: Sequence[Work], prefills: Sequence[Work], budget: int
    ) -> list[Allocation]:
        prefill_demand = sum(w.available for w in prefills)
        # Decodes are guaranteed the larger half (a budget of 1 still decodes),
        # and take more only when prefills cannot use their half.
        decode_budget = budget - min(budget // 2, prefill_demand)
        out: list[Allocation] = []
        left = _fill(decodes, decode_budget, out)
        _fill(prefills, budget - decode_budget + left, out)
        return out


STRATEGIES: Final[Mapping[str, Callable[[], BatchStrategy]]] = {
    DecodeMaximal.name: DecodeMaximal,
    PrefillPriority.name: PrefillPriority,
    Balanced.name: Balanced,
}
"""Strategies a configuration may name."""

DEFAULT_STRATEGY: Final = DecodeMaximal.name


def strategy_named(name: str) -> BatchStrategy:
    """A fresh instance of the strategy called ``name`` (KeyError if unknown;
    :class:`~llamad.model.config.WorkerConfig` refuses unknown names first)."""
    return STRATEGIES[name]()
