"""The longest-prefix index agrees with a brute-force scan, token-exactly."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.cache.prefix import PrefixIndex, check_token_bytes, common_prefix_len
from llamad.errors import BadRequest

pytestmark = pytest.mark.timeout(60)

NS = b"n" * 65
OTHER_NS = b"o" * 65


def le(tokens: list[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def key_of(tokens: list[int]) -> bytes:
    return b"k" + le(tokens)


def brute(rows: list[list[int]], prompt: list[int]) -> tuple[int, int]:
    """(longest prefix row length, longest common prefix length)."""
    best_prefix = 0
    best_common = 0
    for row in rows:
        shared = 0
        for a, b in zip(row, prompt, strict=False):
            if a != b:
                break
            shared += 1
        best_common = max(best_common, shared)
        if shared == len(row):
            best_prefix = max(best_prefix, len(row))
    return best_prefix, best_common


# Small alphabets make shared prefixes and mid-row divergence common; values
# past 255 make sure multi-byte token ids are compared as whole tokens.
token = st.sampled_from([0, 1, 2, 255, 256, 65536, 0xFFFFFFFF])
seqs = st.lists(token, min_size=1, max_size=12)


@given(rows=st.lists(seqs, max_size=25, unique_by=tuple), prompt=seqs)
@settings(max_examples=200, deadline=None)
def test_prefix_match_agrees_with_brute_force(rows: list[list[int]], prompt: list[int]) -> None:
    index = PrefixIndex()
    for row in rows:
        index.add(NS, le(row), key_of(row))
    match = index.match(NS, le(prompt))
    want_prefix, want_common = brute(rows, prompt)
    assert match.prefix_tokens == want_prefix
    assert match.common_tokens == want_common
    if want_prefix:
        assert match.prefix_key == key_of(prompt[:want_prefix])
    else:
        assert match.prefix_key is None
    if want_common:
        assert match.common_key is not None
        row = next(r for r in rows if key_of(r) == match.common_key)
        assert row[:want_common] == prompt[:want_common]
        assert match.common_row_tokens == len(row)
    else:
        assert match.common_key is None


@given(seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_prefix_match_agrees_with_brute_force_on_long_shared_runs(seed: int) -> None:
    # Rows and prompt are prefixes of one stream that diverge at random
    # points, so shared runs span hundreds of tokens and the search has to
    # gallop, halve and pinpoint the first differing token.
    rng = random.Random(seed)
    stream = [rng.choice([1, 2, 256, 0xFFFFFFFF]) for _ in range(1500)]

    def branch() -> list[int]:
        cut = rng.randrange(1, len(stream))
        tail = [rng.randrange(2**32) for _ in range(rng.randrange(0, 40))]
        return stream[:cut] + tail

    rows = {tuple(branch()) for _ in range(rng.randrange(1, 25))}
    prompt = branch()
    index = PrefixIndex()
    for row in rows:
        index.add(NS, le(list(row)), key_of(list(row)))
    match = index.match(NS, le(prompt))
    want_prefix, want_common = brute([list(r) for r in rows], prompt)
    assert (match.prefix_tokens, match.common_tokens) == (want_prefix, want_common)


@given(seed=st.integers(0, 2**32 - 1))
@settings(max_examples=300, deadline=None)
def test_prefix_match_agrees_with_brute_force_after_adds_and_removes(seed: int) -> None:
    # Rows are prefixes of a few streams, so chains of rows that are prefixes
    # of one another are the rule: removing a row must hand its
    # prefix-children to its own parent, and adding one must adopt the rows
    # it is now the longest prefix of.
    rng = random.Random(seed)
    streams = [[rng.choice([1, 2, 256]) for _ in range(12)] for _ in range(3)]

    def cut() -> list[int]:
        stream = rng.choice(streams)
        return stream[: rng.randrange(1, len(stream) + 1)]

    index = PrefixIndex()
    present: set[tuple[int, ...]] = set()
    for _ in range(rng.randrange(1, 40)):
        row = cut()
        if rng.random() < 0.6:
            index.add(NS, le(row), key_of(row))
            present.add(tuple(row))
        else:
            assert index.remove(NS, le(row)) == (tuple(row) in present)
            present.discard(tuple(row))
    rows = [list(r) for r in present]
    for _ in range(5):
        prompt = cut() + [rng.choice([1, 2, 256, 7]) for _ in range(rng.randrange(0, 3))]
        match = index.match(NS, le(prompt))
        want_prefix, want_common = brute(rows, prompt)
        assert (match.prefix_tokens, match.common_tokens) == (want_prefix, want_common)
        assert match.prefix_key == (key_of(prompt[:want_prefix]) if want_prefix else None)


def test_prefix_match_never_crosses_namespaces() -> None:
    index = PrefixIndex()
    index.add(OTHER_NS, le([1, 2, 3]), key_of([1, 2, 3]))
    match = index.match(NS, le([1, 2, 3, 4]))
    assert match.prefix_key is None and match.common_key is None


def test_common_prefix_counts_whole_tokens_only() -> None:
    index = PrefixIndex()
    # 0x01000000 and 0x02000000 share three little-endian bytes but no token.
    index.add(NS, le([7, 0x01000000]), key_of([7, 0x01000000]))
    match = index.match(NS, le([7, 0x02000000]))
    assert match.common_tokens == 1
    assert match.prefix_key is None


def test_prefix_walk_descends_past_diverging_rows() -> None:
    index = PrefixIndex()
    rows = [[1], [1, 2, 0], [1, 2, 3, 0], [1, 2, 3, 4, 0]]
    for row in rows:
        index.add(NS, le(row), key_of(row))
    match = index.match(NS, le([1, 2, 3, 4, 5]))
    assert match.prefix_key == key_of([1])
    assert match.common_tokens == 4
    assert match.common_key == key_of([1, 2, 3, 4, 0])


def test_prefix_walk_finds_a_prefix_row_far_below_the_neighbour() -> None:
    # Fifty rows diverging after [5, 7] sit between the only prefix row and
    # the prompt: more than the walk's first, nearby search covers.
    index = PrefixIndex()
    rows = [[5]] + [[5, 7, i] for i in range(50)]
    for row in rows:
        index.add(NS, le(row), key_of(row))
    match = index.match(NS, le([5, 7, 1000]))
    assert match.prefix_key == key_of([5])
    assert match.common_tokens == 2


def test_remove_forgets_a_row() -> None:
    index = PrefixIndex()
    index.add(NS, le([1, 2]), key_of([1, 2]))
    index.add(NS, le([1]), key_of([1]))
    assert index.remove(NS, le([1, 2]))
    assert not index.remove(NS, le([1, 2]))
    assert index.match(NS, le([1, 2, 3])).prefix_key == key_of([1])
    assert len(index) == 1
    assert index.remove(NS, le([1]))
    assert index.namespaces() == 0


def test_same_tokens_under_two_keys_is_rejected() -> None:
    index = PrefixIndex()
    index.add(NS, le([1]), b"a")
    index.add(NS, le([1]), b"a")
    assert len(index) == 1
    with pytest.raises(BadRequest):
        index.add(NS, le([1]), b"b")


def test_ragged_token_bytes_are_rejected() -> None:
    with pytest.raises(BadRequest):
        check_token_bytes(b"\x01\x02\x03")
    index = PrefixIndex()
    with pytest.raises(BadRequest):
        index.add(NS, b"\x01\x02\x03", b"k")
    with pytest.raises(BadRequest):
        index.match(NS, b"\x01\x02\x03")


@given(st.binary(max_size=3000), st.binary(max_size=3000))
@settings(max_examples=300, deadline=None)
def test_common_prefix_len_matches_naive(a: bytes, b: bytes) -> None:
    naive = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        naive += 1
    assert common_prefix_len(a, b) == naive
    assert common_prefix_len(a + a, a + b) == len(a) + naive
