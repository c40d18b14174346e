"""Reservations: a writer's claim on a key while it publishes (SPEC C5).

A :class:`SaveIntent` says what a writer is about to publish and is checked
before cache-meta takes it (the key must be ``sha256(namespace || tokens)``);
a :class:`Reservation` is cache-meta's record of that writer's progress
through the protocol, and :class:`Stage` is how far it got. The transitions
themselves live in :class:`llamad.cache.meta.CacheMeta`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.key import HEADER_LEN, KEY_LEN, TOKEN_BYTES, row_key
from llamad.cache.kvc import MAX_TOKENS, KvcMeta, SaveReason
from llamad.cache.tier_kind import TierKind, check_save_tier

__all__ = [
    "Adopted",
    "Grant",
    "Owner",
    "Reservation",
    "SaveIntent",
    "Stage",
    "check_bytes",
    "check_tokens",
]

Owner = int
"""Who holds a pin, a reservation or a waiter: the OS pid of that process."""


class Stage(IntEnum):
    """How far the writer of a reservation has got."""

    RESERVED = 1
    CHECKED = 2
    LINKED = 3


def check_bytes(field_name: str, value: object, length: int | None = None) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise InvalidCacheValue(field_name, f"expected bytes, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise InvalidCacheValue(field_name, f"expected {length} bytes, got {len(value)}")
    return bytes(value)


def check_tokens(value: object) -> bytes:
    data = check_bytes("tokens", value)
    if not data or len(data) % TOKEN_BYTES:
        raise InvalidCacheValue("tokens", "expected a non-empty multiple of 4 bytes (u32 LE ids)")
    if len(data) // TOKEN_BYTES > MAX_TOKENS:
        raise InvalidCacheValue("tokens", f"more than {MAX_TOKENS} tokens")
    return data


@dataclass(frozen=True, slots=True)
class SaveIntent:
    """What a writer is about to publish; validated at construction.

    ``namespace`` is :meth:`llamad.cache.key.Namespace.header` (65 bytes),
    ``tokens`` the u32 little-endian token ids, ``size`` the expected
    ``.kvc`` file size. ``tier`` is where the row goes, or ``None`` to let
    cache-meta choose (the fastest tier with room; its reply names it).
    cache-meta re-derives the key from namespace and tokens, so an index row
    can never claim tokens it was not saved from.
    """

    key: bytes
    namespace: bytes
    tokens: bytes
    tier: TierKind | None
    size: int
    reason: SaveReason

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", check_bytes("key", self.key, KEY_LEN))
        object.__setattr__(self, "namespace", check_bytes("namespace", self.namespace, HEADER_LEN))
        object.__setattr__(self, "tokens", check_tokens(self.tokens))
        object.__setattr__(self, "tier", check_save_tier(self.tier, "tier"))
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size <= 0:
            raise InvalidCacheValue("size", f"{self.size!r} is not a positive byte count")
        try:
            object.__setattr__(self, "reason", SaveReason(self.reason))
        except ValueError:
            raise InvalidCacheValue("reason", f"{self.reason!r} is not a save reason") from None
        if row_key(self.namespace, self.tokens) != self.key:
            raise InvalidCacheValue("key", "does not match sha256(namespace || tokens)")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // TOKEN_BYTES


class Grant(NamedTuple):
    """cache-meta's yes to a save: the reservation token and the tier to write to."""

    token: int
    tier: TierKind


@dataclass(slots=True)
class Reservation:
    """An in-flight save: who writes it, to which tier, how far it got, when it expires."""

    token: int
    intent: SaveIntent
    owner: Owner
    stage: Stage
    deadline: float
    tier: TierKind
    location: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "key": self.intent.key.hex(),
            "tier": self.tier,
            "size": self.intent.size,
            "n_tokens": self.intent.n_tokens,
            "owner": self.owner,
            "stage": self.stage.name.lower(),
            "deadline": self.deadline,
            "location": self.location,
            "status": "reserved",
        }


@dataclass(frozen=True, slots=True)
class Adopted:
    """A final file a :class:`RowStore` validated for an abandoned reservation."""

    meta: KvcMeta
    location: str
