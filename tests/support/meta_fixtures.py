"""Fixtures for cache-meta fault tests (import them into the test module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamad.cache.settings import CacheSettings
from llamad.testing import discard_scratch, scratch_settings


@pytest.fixture(name="cache_settings")
def cache_settings_fixture() -> Iterator[CacheSettings]:
    """A private cache (all three tiers, registry, counters), removed afterwards."""
    settings = scratch_settings(prefix="lcf", stats_flush_s=0.5)
    try:
        yield settings
    finally:
        discard_scratch(settings)
