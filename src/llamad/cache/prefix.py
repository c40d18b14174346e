"""Longest-prefix index: which saved rows share a prefix with a prompt.

Per namespace (the key header: fingerprint, quant byte, ctx hash) the index
keeps every saved row's token ids encoded as **u32 big-endian** bytes in one
sorted list. Fixed-width big-endian encoding makes byte order equal token
order, and turns "row is a token prefix of the prompt" into "row's bytes are a
byte prefix of the prompt's bytes" (as long as prefix lengths are floored to a
multiple of four).

Two facts about a sorted list of strings do all the work:

* every row that is a prefix of the prompt sorts at or before the prompt, and
  any string between such a row and the prompt starts with that row; so the
  longest prefix row is found by looking at the string just before the prompt
  and, when it diverges, searching again below the divergence point;
* the string sharing the longest common prefix with the prompt is one of the
  prompt's two neighbours in sorted order.

Both take O(log n) comparisons (plus one re-search per row that diverges in
the middle of the walk, which needs unusually shaped data to happen more than
once), and every comparison is a C-level ``memcmp`` over bytes. Nothing here
trusts the result blindly: cache-meta re-derives the winner's key with
:meth:`llamad.cache.key.Namespace.key` before answering.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

from llamad.errors import BadRequest

TOKEN_BYTES = 4
# The first probe compares this many bytes; each further probe doubles it, so a
# long equal run costs O(n) bytes of memcmp and O(log n) Python calls.
_FIRST_STRIDE = 256

__all__ = [
    "TOKEN_BYTES",
    "PrefixIndex",
    "PrefixMatch",
    "common_prefix_len",
    "tokens_be",
    "tokens_le",
]


def _swapped(data: bytes) -> bytes:
    if len(data) % TOKEN_BYTES:
        raise BadRequest(
            f"token bytes must be a multiple of {TOKEN_BYTES} long, got {len(data)}",
            details={"field": "tokens"},
        )
    words = array("I")
    if words.itemsize != TOKEN_BYTES:  # pragma: no cover - every Linux/macOS ABI has 4-byte I
        raise RuntimeError("array('I') is not 32 bits on this platform")
    words.frombytes(data)
    words.byteswap()
    return words.tobytes()


def tokens_be(tokens_le_bytes: bytes) -> bytes:
    """Re-encode u32 little-endian token ids (the key's encoding) as big-endian."""
    if sys.byteorder == "little":
        return _swapped(tokens_le_bytes)
    return bytes(tokens_le_bytes)  # pragma: no cover - big-endian hosts


def tokens_le(tokens_be_bytes: bytes) -> bytes:
    """Inverse of :func:`tokens_be`."""
    return tokens_be(tokens_be_bytes)


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length in bytes of the longest common prefix of ``a`` and ``b``.

    Galloping then bisecting keeps the Python-level work logarithmic while the
    byte comparisons themselves run at memcmp speed.
    """
    n = min(len(a), len(b))
    view = memoryview(b)
    lo = 0
    stride = _FIRST_STRIDE
    hi = n
    while lo < n:
        hi = min(n, lo + stride)
        if not a.startswith(view[lo:hi], lo):
            break
        lo = hi
        stride *= 2
    else:
        return n
    # Invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi].
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(view[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """What the index knows about one prompt in one namespace.

    ``prefix_key``/``prefix_tokens``: the longest saved row whose tokens are a
    prefix of the prompt (possibly the whole prompt). ``common_key``: a saved
    row sharing the most leading tokens with the prompt (``common_tokens`` of
    them; the row itself is ``common_row_tokens`` long and may continue past
    the divergence point, in which case a restore must truncate it).
    ``probes``: string comparisons made, for the ``longest_prefix_probes``
    counter.
    """

    prefix_key: bytes | None
    prefix_tokens: int
    common_key: bytes | None
    common_tokens: int
    common_row_tokens: int
    probes: int


_NO_MATCH = PrefixMatch(None, 0, None, 0, 0, 0)


class _Space:
    """One namespace: sorted big-endian token strings and their keys."""

    __slots__ = ("keys", "rows")

    def __init__(self) -> None:
        self.rows: list[bytes] = []
        self.keys: dict[bytes, bytes] = {}


class PrefixIndex:
    """Sorted-string index over saved rows, one sorted list per namespace.

    Rows are identified by ``(namespace, tokens)``; their cache key is carried
    along so a match can be turned into an index row. Adding a row that is
    already present with the same key is a no-op; with another key it is an
    error (the key is a function of namespace and tokens, so that can only be
    a caller bug).
    """

    def __init__(self) -> None:
        self._spaces: dict[bytes, _Space] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def namespaces(self) -> int:
        """How many namespaces currently hold at least one row."""
        return len(self._spaces)

    def add(self, namespace: bytes, tokens_le_bytes: bytes, key: bytes) -> None:
        """Index a row given its u32 little-endian token bytes."""
        self.add_be(namespace, tokens_be(tokens_le_bytes), key)

    def add_be(self, namespace: bytes, be: bytes, key: bytes) -> None:
        """Index a row given its tokens already in big-endian encoding."""
        if not be:
            raise BadRequest("an indexed row needs at least one token", details={"field": "tokens"})
        space = self._spaces.get(namespace)
        if space is None:
            space = self._spaces[namespace] = _Space()
        existing = space.keys.get(be)
        if existing is not None:
            if existing != key:
                raise BadRequest(
                    "the same namespace and tokens were indexed under two keys",
                    details={"field": "key"},
                )
            return
        insort(space.rows, be)
        space.keys[be] = key
        self._count += 1

    def remove(self, namespace: bytes, tokens_le_bytes: bytes) -> bool:
        """Forget a row; returns whether it was indexed."""
        return self.remove_be(namespace, tokens_be(tokens_le_bytes))

    def remove_be(self, namespace: bytes, be: bytes) -> bool:
        """Forget a row given its big-endian tokens; returns whether it was indexed."""
        space = self._spaces.get(namespace)
        if space is None or space.keys.pop(be, None) is None:
            return False
        at = bisect_left(space.rows, be)
        del space.rows[at]
        self._count -= 1
        if not space.rows:
            del self._spaces[namespace]
        return True

    def contains(self, namespace: bytes, tokens_le_bytes: bytes) -> bool:
        space = self._spaces.get(namespace)
        return space is not None and tokens_be(tokens_le_bytes) in space.keys

    def match(self, namespace: bytes, prompt_le: bytes) -> PrefixMatch:
        """Longest prefix row and best common-prefix row for a prompt.

        ``prompt_le`` is the prompt's u32 little-endian token bytes.
        """
        return self.match_be(namespace, tokens_be(prompt_le))

    def match_be(self, namespace: bytes, prompt: bytes) -> PrefixMatch:
        """:meth:`match` for a prompt already in big-endian encoding."""
        space = self._spaces.get(namespace)
        if space is None or not prompt:
            return _NO_MATCH
        rows = space.rows
        at = bisect_right(rows, prompt)
        probes = max(1, len(rows).bit_length())

        # Best common prefix: one of the two neighbours of the prompt.
        common: bytes | None = None
        common_len = 0
        for neighbour in (rows[at - 1] if at > 0 else None, rows[at] if at < len(rows) else None):
            if neighbour is None:
                continue
            probes += 1
            shared = common_prefix_len(neighbour, prompt) // TOKEN_BYTES * TOKEN_BYTES
            if shared > common_len or (
                shared == common_len and common is not None and len(neighbour) < len(common)
            ):
                common, common_len = neighbour, shared

        # Longest prefix: walk down from the string just at or below the prompt.
        prefix: bytes | None = None
        hi = at
        limit = prompt
        while hi > 0:
            candidate = rows[hi - 1]
            probes += 1
            if prompt.startswith(candidate):
                prefix = candidate
                break
            shared = common_prefix_len(candidate, limit) // TOKEN_BYTES * TOKEN_BYTES
            if shared == 0:
                break
            # The answer is a prefix of prompt[:shared]; everything in
            # rows[hi-1:] sorts above that, so search again strictly below.
            limit = prompt[:shared]
            hi = bisect_right(rows, limit, 0, hi - 1)
            probes += max(1, hi.bit_length())

        if common is None or common_len == 0:
            common_key = None
            common_row_tokens = 0
        else:
            if prefix is not None and len(prefix) >= common_len:
                # A row that is wholly shared is always the better report.
                common = prefix
            common_key = space.keys[common]
            common_row_tokens = len(common) // TOKEN_BYTES
        return PrefixMatch(
            prefix_key=None if prefix is None else space.keys[prefix],
            prefix_tokens=0 if prefix is None else len(prefix) // TOKEN_BYTES,
            common_key=common_key,
            common_tokens=common_len // TOKEN_BYTES,
            common_row_tokens=common_row_tokens,
            probes=probes,
        )

    def row_tokens_be(self, namespace: bytes, key: bytes) -> bytes | None:
        """Slow reverse lookup (key → tokens) for diagnostics; O(rows in namespace)."""
        space = self._spaces.get(namespace)
        if space is None:
            return None
        for be, k in space.keys.items():
            if k == key:
                return be
        return None
