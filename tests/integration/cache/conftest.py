"""Fixtures for cache tests with real cache-meta processes and real tier files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamad.cache.settings import CacheSettings
from llamad.testing import discard_scratch, scratch_settings


@pytest.fixture
def cache_settings() -> Iterator[CacheSettings]:
    """A private cache (all three tiers, registry, counters), removed afterwards."""
    settings = scratch_settings(prefix="lc", stats_flush_s=0.5)
    try:
        yield settings
    finally:
        discard_scratch(settings)
