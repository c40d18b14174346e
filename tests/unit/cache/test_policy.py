"""Save policy arithmetic and validation (SPEC C7)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamad.cache.policy import (
    CachePolicy,
    ColdSplit,
    cold_save_split,
    should_continued_save,
    should_finish_save,
    trim_boundary,
)
from llamad.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

counts = st.integers(0, 200_000)
policies = st.builds(
    CachePolicy,
    min_tokens=st.integers(0, 4096),
    cold_min_tokens=st.integers(0, 4096),
    cold_max_tokens=st.integers(4096, 60_000),
    continued_interval=st.integers(1, 8192),
    boundary_trim_tokens=st.integers(0, 256),
    boundary_align_tokens=st.integers(1, 4096),
)


def test_defaults_are_the_spec_values() -> None:
    p = CachePolicy()
    assert (p.min_tokens, p.cold_min_tokens, p.cold_max_tokens) == (512, 512, 30_000)
    assert (p.continued_interval, p.boundary_trim_tokens, p.boundary_align_tokens) == (
        2048,
        32,
        2048,
    )
    assert (p.session_resume_wait_ms, p.evict_save_timeout_ms) == (500, 30_000)


@given(counts, st.integers(0, 300), st.integers(1, 4096))
def test_trim_boundary_is_the_largest_aligned_length_within_the_trim(
    n: int, trim: int, align: int
) -> None:
    b = trim_boundary(n, trim, align)
    if b is None:
        assert n - trim < align
    else:
        assert b % align == 0
        assert 0 < b <= n - trim < b + align


def test_trim_boundary_examples() -> None:
    assert trim_boundary(5000, 32, 2048) == 4096
    assert trim_boundary(4127, 32, 2048) == 2048
    assert trim_boundary(4128, 32, 2048) == 4096
    assert trim_boundary(2079, 32, 2048) is None


@given(counts, policies)
def test_cold_save_split_respects_every_gate(n: int, policy: CachePolicy) -> None:
    split = cold_save_split(n, policy)
    if split is None:
        return
    assert split.save_at + split.tail == n
    assert split.save_at % policy.boundary_align_tokens == 0
    assert split.save_at <= n - policy.boundary_trim_tokens
    assert split.save_at <= policy.cold_max_tokens
    assert split.save_at >= max(policy.min_tokens, policy.cold_min_tokens)
    assert n >= policy.cold_min_tokens


@given(policies)
def test_cold_save_happens_once_the_prompt_covers_a_full_aligned_block(
    policy: CachePolicy,
) -> None:
    floor = max(policy.min_tokens, policy.cold_min_tokens)
    first = -(-max(floor, 1) // policy.boundary_align_tokens) * policy.boundary_align_tokens
    if first > policy.cold_max_tokens:
        return
    n = first + policy.boundary_trim_tokens
    assert cold_save_split(n, policy) == ColdSplit(first, policy.boundary_trim_tokens)
    if n - 1 >= 0:
        shorter = cold_save_split(n - 1, policy)
        assert shorter is None or shorter.save_at < first


def test_cold_save_split_caps_long_prompts_below_cold_max() -> None:
    assert cold_save_split(40_000, CachePolicy()) == ColdSplit(28_672, 40_000 - 28_672)
    assert cold_save_split(5000, CachePolicy()) == ColdSplit(4096, 904)
    assert cold_save_split(511, CachePolicy(boundary_align_tokens=256)) is None


@given(counts, counts, policies)
def test_continued_save_fires_after_each_interval(
    live: int, last: int, policy: CachePolicy
) -> None:
    fires = should_continued_save(live, last, policy)
    assert fires == (live >= policy.min_tokens and live - last >= policy.continued_interval)


@given(counts, policies)
def test_finish_save_requires_min_tokens(live: int, policy: CachePolicy) -> None:
    assert should_finish_save(live, policy) == (live >= policy.min_tokens)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"min_tokens": -1}, "min_tokens"),
        ({"continued_interval": 0}, "continued_interval"),
        ({"boundary_align_tokens": 0}, "boundary_align_tokens"),
        ({"cold_min_tokens": 40_000}, "cold_min_tokens"),
        ({"session_resume_wait_ms": 1.5}, "session_resume_wait_ms"),
        ({"evict_save_timeout_ms": True}, "evict_save_timeout_ms"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_invalid_policy_refuses_naming_the_field(values: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        CachePolicy.from_mapping(values)
    assert err.value.details["field"] == field


def test_per_model_overrides_keep_the_base_for_other_fields() -> None:
    base = CachePolicy.from_mapping({"min_tokens": 256})
    model = base.with_overrides({"boundary_align_tokens": 256, "cold_min_tokens": 256})
    assert model.min_tokens == 256
    assert model.boundary_align_tokens == 256
    assert model.cold_max_tokens == 30_000
    assert base.boundary_align_tokens == 2048
