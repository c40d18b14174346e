"""One sequence of the context as the core sees it: the tokens its KV holds and its holder.

With ``kv_unified`` every sequence draws its KV cells from one pool of
``n_ctx``; the core counts a cell per token a sequence holds (a forked
sequence shares its prefix's cells in llama.cpp, so the count errs high,
never low) and never plans more rows than cells are free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llamad.model.active import ActiveRequest
    from llamad.model.sessions import Session

__all__ = ["Slot", "cells_used"]


@dataclass(eq=False)
class Slot:
    """Sequence ``seq``: ``kv`` is what its KV holds, position by position.

    ``owner`` is the request running on it; ``session`` the session pinning
    it (both may be set: a session's request runs on the session's sequence).
    """

    seq: int
    kv: list[int] = field(default_factory=list)
    owner: ActiveRequest | None = None
    session: Session | None = None


def cells_used(slots: Sequence[Slot]) -> int:
    return sum(len(slot.kv) for slot in slots)
