"""Pins (SPEC C4): which process holds which row, so the row is not evicted while read.

Every lookup that hands out a row, and ``checkout``, pins it for the caller's
process; ``checkin`` releases the pin. A row counts its pins (``row.pins``)
so eviction can skip it without asking this table; the table remembers who
holds what, so a process that dies loses all its pins at once.

A pin refers to the *object* it pinned (cache-meta pins one copy of a row,
:class:`llamad.cache.rows.Copy`), not to its key: a row dropped while pinned
(a loader found it corrupt) and saved again under the same key is another
row, and checking the old pin in must not touch the new one.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from llamad.cache.reservation import Owner

__all__ = ["PinTable", "Pinnable"]


class Pinnable(Protocol):
    """A row that counts its pins."""

    pins: int


R = TypeVar("R", bound=Pinnable)


class PinTable(Generic[R]):
    """Pin id → (owner, row), and owner → pin ids."""

    def __init__(self) -> None:
        self._pins: dict[int, tuple[Owner, R]] = {}
        self._by_owner: dict[Owner, set[int]] = {}

    def __len__(self) -> int:
        return len(self._pins)

    def add(self, pin: int, owner: Owner, row: R) -> None:
        """Record a new pin (``pin`` is a fresh id) and count it on ``row``."""
        row.pins += 1
        self._pins[pin] = (owner, row)
        held = self._by_owner.get(owner)
        if held is None:
            self._by_owner[owner] = {pin}
        else:
            held.add(pin)

    def release(self, pin: int) -> bool:
        """Release a pin; returns whether it was held."""
        return self.take(pin) is not None

    def take(self, pin: int) -> R | None:
        """Release a pin; returns what it pinned (None when it was not held)."""
        held = self._pins.pop(pin, None)
        if held is None:
            return None
        owner, row = held
        pins = self._by_owner.get(owner)
        if pins is not None:
            pins.discard(pin)
            if not pins:
                del self._by_owner[owner]
        row.pins -= 1
        return row

    def of_owner(self, owner: Owner) -> list[int]:
        """The pins ``owner`` holds, oldest first."""
        return sorted(self._by_owner.get(owner, ()))

    def owners(self) -> set[Owner]:
        return set(self._by_owner)
