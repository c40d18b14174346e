"""Longest-prefix index: which saved rows share a prefix with a prompt.

Per namespace (the key header: fingerprint, quant byte, ctx hash) the index
keeps every saved row's token ids, as the u32 little-endian bytes the key is
computed from, in one sorted list. Token ids have a fixed width, so "row is a
token prefix of the prompt" is "row's bytes are a byte prefix of the prompt's
bytes", and a common prefix in bytes, floored to a multiple of four, is a
common prefix in tokens.

Two facts about a sorted list of byte strings do all the work:

* every row that is a prefix of the prompt sorts at or before the prompt, and
  any string between such a row and the prompt starts with that row; so the
  longest prefix row is found by looking at the string just before the prompt
  and, when it diverges, searching again below the divergence point;
* the string sharing the longest common prefix with the prompt is one of the
  prompt's two neighbours in sorted order.

Both take O(log n) comparisons (plus one re-search per row that diverges in
the middle of the walk, which needs unusually shaped data to happen more than
once), and every comparison is a C-level ``memcmp`` over bytes. Where a row
and the prompt part ways is found by galloping, then bisecting over whole
tokens (:func:`_shared_bytes`), so even a 30,000-token run costs a few dozen
``startswith`` calls.

Why little-endian and not big-endian (which would make byte order equal
numeric token order): nothing here needs numeric order, only the prefix
relation, which any fixed-width encoding preserves; keeping the key's own
encoding means a row shares its token bytes with the save that produced it
and a prompt is never re-encoded on the lookup path. Nothing here is trusted
blindly either: cache-meta checks the winner's own tokens against the
prompt before answering (see :meth:`llamad.cache.meta.CacheMeta.longest_prefix`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import NamedTuple

from llamad.cache.key import TOKEN_BYTES
from llamad.errors import BadRequest

# The first probe compares this many bytes; each further probe doubles it, so a
# long equal run costs O(n) bytes of memcmp and O(log n) Python calls.
_FIRST_STRIDE = 256
# The same for whole tokens, growing 4x per probe (fewer Python-level steps;
# the windows it leaves are halved anyway). Once the differing window is this
# small, one XOR of the two windows as big integers locates the first
# differing byte.
_FIRST_TOKEN_STRIDE = 16 * TOKEN_BYTES
_XOR_WINDOW = 512
# Rows below a diverging neighbour searched before the whole list (see match).
_NEAR_ROWS = 32

__all__ = [
    "PrefixIndex",
    "PrefixMatch",
    "check_token_bytes",
    "common_prefix_len",
]


def check_token_bytes(data: bytes) -> bytes:
    """``data`` if it is whole u32 token ids, else :class:`BadRequest`."""
    if len(data) % TOKEN_BYTES:
        raise BadRequest(
            f"token bytes must be a multiple of {TOKEN_BYTES} long, got {len(data)}",
            details={"field": "tokens"},
        )
    return data


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


def _shared_bytes(a: bytes, b: bytes, start: int = 0) -> int:
    """Bytes of the whole tokens ``a`` and ``b`` share at their start.

    :func:`common_prefix_len` floored to a multiple of :data:`TOKEN_BYTES`.
    ``start`` (a token boundary) is a length the caller already knows to be
    shared. Gallops to a window holding the first difference, halves it on
    token boundaries down to :data:`_XOR_WINDOW` bytes, then reads the
    difference's position off the XOR of the two windows: few Python-level
    steps, since in cache-meta's loop each costs far more than the
    ``memcmp`` it runs.
    """
    n = min(len(a), len(b)) // TOKEN_BYTES * TOKEN_BYTES
    view = memoryview(b)
    lo = start
    stride = _FIRST_TOKEN_STRIDE
    while True:
        hi = lo + stride
        if hi >= n:
            hi = n
            if a.startswith(view[lo:n], lo):
                return n
            break
        if not a.startswith(view[lo:hi], lo):
            break
        lo = hi
        stride *= 4
    # Invariant: a[:lo] == b[:lo], a[:hi] != b[:hi], both on token boundaries.
    while hi - lo > _XOR_WINDOW:
        mid = (lo + hi) // (2 * TOKEN_BYTES) * TOKEN_BYTES
        if a.startswith(view[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    diff = int.from_bytes(a[lo:hi], "big") ^ int.from_bytes(b[lo:hi], "big")
    # The first differing byte is the XOR's most significant non-zero one.
    first = (hi - lo) - (diff.bit_length() + 7) // 8
    return lo + first // TOKEN_BYTES * TOKEN_BYTES


class PrefixMatch(NamedTuple):
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
    """One namespace: sorted token strings and their keys."""

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

    def add(self, namespace: bytes, tokens: bytes, key: bytes) -> None:
        """Index a row given its u32 little-endian token bytes (kept by reference)."""
        check_token_bytes(tokens)
        if not tokens:
            raise BadRequest("an indexed row needs at least one token", details={"field": "tokens"})
        space = self._spaces.get(namespace)
        if space is None:
            space = self._spaces[namespace] = _Space()
        existing = space.keys.get(tokens)
        if existing is not None:
            if existing != key:
                raise BadRequest(
                    "the same namespace and tokens were indexed under two keys",
                    details={"field": "key"},
                )
            return
        insort(space.rows, tokens)
        space.keys[tokens] = key
        self._count += 1

    def remove(self, namespace: bytes, tokens: bytes) -> bool:
        """Forget a row; returns whether it was indexed."""
        space = self._spaces.get(namespace)
        if space is None or space.keys.pop(tokens, None) is None:
            return False
        at = bisect_left(space.rows, tokens)
        del space.rows[at]
        self._count -= 1
        if not space.rows:
            del self._spaces[namespace]
        return True

    def match(self, namespace: bytes, prompt: bytes) -> PrefixMatch:
        """Longest prefix row and best common-prefix row for a prompt.

        ``prompt`` is the prompt's u32 little-endian token bytes.
        """
        check_token_bytes(prompt)
        space = self._spaces.get(namespace)
        if space is None or not prompt:
            return _NO_MATCH
        rows = space.rows
        at = bisect_right(rows, prompt)
        probes = max(1, len(rows).bit_length())

        # Best common prefix: one of the two neighbours of the prompt. The left
        # neighbour is also where the longest-prefix walk starts, and in the
        # common case (a prompt extending a saved row) it is that row.
        prefix: bytes | None = None
        common: bytes | None = None
        common_len = 0
        left_shared = 0
        if at > 0:
            left = rows[at - 1]
            probes += 1
            if prompt.startswith(left):
                prefix = left
                left_shared = len(left)
            else:
                left_shared = _shared_bytes(left, prompt)
            if left_shared:
                common, common_len = left, left_shared
        if at < len(rows):
            right = rows[at]
            probes += 1
            # The right neighbour only matters if it shares at least as much
            # as the left one: one memcmp decides, and the search for its
            # exact length starts from there.
            if not left_shared:
                shared = _shared_bytes(right, prompt)
            elif right.startswith(memoryview(prompt)[:left_shared]):
                shared = _shared_bytes(right, prompt, left_shared)
            else:
                shared = -1
            if shared > common_len or (
                shared == common_len and common is not None and len(right) < len(common)
            ):
                common, common_len = right, shared

        # Longest prefix, when the left neighbour is not one: the answer is a
        # prefix of prompt[:shared]; everything from the candidate up sorts
        # above that, so search again strictly below it.
        below = at - 1
        shared = left_shared if prefix is None else 0
        while shared:
            limit = prompt[:shared]
            # The answer usually sits a few rows below (the same conversation's
            # shorter saves): search those first, the rest only if it may lie
            # further down. Fewer rows touched, and rows are scattered in memory.
            lo = below - _NEAR_ROWS if below > _NEAR_ROWS else 0
            hi = bisect_right(rows, limit, lo, below)
            probes += max(1, (below - lo).bit_length())
            if hi == lo and lo:
                hi = bisect_right(rows, limit, 0, lo)
                probes += max(1, lo.bit_length())
            if hi == 0:
                break
            below = hi - 1
            candidate = rows[below]
            probes += 1
            if prompt.startswith(candidate):
                prefix = candidate
                break
            shared = _shared_bytes(candidate, limit)

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
