"""plan_groups: every input whole in one decode of at most n_ubatch tokens."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamad.llama_ffi.embeddings import l2_normalize, plan_groups

pytestmark = pytest.mark.timeout(60)


@given(
    n_ubatch=st.integers(1, 64),
    data=st.data(),
    equal=st.booleans(),
)
def test_groups_cover_every_input_once_within_the_ubatch(
    n_ubatch: int, data: st.DataObject, equal: bool
) -> None:
    lengths = data.draw(st.lists(st.integers(1, n_ubatch), max_size=20))
    groups = plan_groups(lengths, n_ubatch, equal_lengths=equal)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))
    for g in groups:
        assert g == sorted(g)
        assert sum(lengths[i] for i in g) <= n_ubatch
        if equal:
            assert len({lengths[i] for i in g}) == 1


def test_small_inputs_share_one_decode() -> None:
    assert plan_groups([2, 3, 1], 8, equal_lengths=False) == [[0, 1, 2]]


def test_separate_streams_group_by_length() -> None:
    assert plan_groups([2, 3, 2, 3], 8, equal_lengths=True) == [[0, 2], [1, 3]]


def test_input_longer_than_a_ubatch_is_refused() -> None:
    with pytest.raises(ValueError):
        plan_groups([9], 8, equal_lengths=False)


def test_l2_normalize_gives_unit_length_and_keeps_zero() -> None:
    v = l2_normalize([3.0, 4.0])
    assert v == [0.6, 0.8]
    assert l2_normalize([0.0, 0.0]) == [0.0, 0.0]
