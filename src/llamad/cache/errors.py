"""Typed errors of the cache storage layer (key, file format, tiers, publish, writer).

Each class has a stable ``code`` (see :mod:`llamad.errors`); a caller that only
needs "this row cannot be used" catches :class:`CacheError`.
"""

from __future__ import annotations

from typing import Any

from llamad.errors import BadRequest, LlamadError


class CacheError(LlamadError):
    """Base of every cache failure."""

    code = "cache_error"


class InvalidCacheValue(BadRequest, ValueError):
    """A key component, token id or cache argument is malformed.

    A ``bad_request`` (a subclass, with a code of its own so it survives the
    wire as itself) and also a ``ValueError`` so plain Python callers can catch
    it idiomatically.
    """

    code = "invalid_cache_value"
    detail_attrs = ("field",)

    def __init__(self, field: str, problem: str, **details: Any) -> None:
        super().__init__(f"{field}: {problem}", details={"field": field, **details})
        self.field = field


class KvcCorrupt(CacheError):
    """A ``.kvc`` file (or buffer) failed validation and must never be restored.

    ``reason`` is a short stable word naming the check that failed
    (``truncated``, ``magic``, ``version``, ``header_crc``, ``tlv``, ``tlv_crc``,
    ``length``, ``payload_crc``, ``key_mismatch``, ``field``).
    """

    code = "kvc_corrupt"
    detail_attrs = ("reason",)

    def __init__(self, reason: str, message: str = "", **details: Any) -> None:
        super().__init__(message or reason, details={"reason": reason, **details})
        self.reason = reason


class FingerprintMismatch(CacheError):
    """The model file does not match the fingerprint the caller supplied."""

    code = "fingerprint_mismatch"


class GgufMalformed(CacheError):
    """The GGUF file cannot be walked for a ``gguf_chunked`` fingerprint."""

    code = "gguf_malformed"


class TierError(CacheError):
    """A tier operation failed for a reason other than corruption (I/O, naming)."""

    code = "tier_error"


class TierFull(TierError):
    """The tier's filesystem has no room for the file (ENOSPC / EDQUOT)."""

    code = "tier_full"


class TierLocked(TierError):
    """Another live cache-meta owns this tier: this one refuses to start, having touched nothing.

    ``details``: ``tier``, ``lock`` (the lock file's path) and ``holder_pid``
    (the owner's pid as it wrote it, for the message; the lock decides).
    """

    code = "tier_locked"


class SaveRefused(CacheError):
    """A save was refused before any byte was written (back-pressure or policy)."""

    code = "save_refused"


class PublishAbandoned(CacheError):
    """The writer gave up cleanly: its reservation was superseded or cancelled."""

    code = "publish_abandoned"


# cache-meta refusals (meta engineer). The writer tells them apart: an
# already-cached or in-flight key counts as ``duplicate_dropped``, a full tier
# as ``saves_dropped``.


class AlreadyCached(SaveRefused):
    """``reserve_save`` for a key that is already published: nothing to write."""

    code = "already_cached"


class SaveInFlight(SaveRefused):
    """Another writer holds a live reservation for this key."""

    code = "save_in_flight"


class CacheFull(SaveRefused):
    """The tier cannot make room: the row exceeds its quota or the rest is pinned."""

    code = "cache_full"
