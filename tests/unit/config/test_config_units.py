"""Durations ("10m", "30s", "1h", numbers in the key's unit, "never") and sizes ("2GiB")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config_helpers import Workspace
from llamad.config.units import format_duration, format_size, parse_duration, parse_size

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10m", 600.0),
        ("30s", 30.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        ("500ms", 0.5),
        ("1h30m", 5400.0),
        ("1m 30s", 90.0),
        ("1.5h", 5400.0),
        (90, 90.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_durations_parse(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["10", "ten minutes", "-5s", -1, True, "5x", "", "m", [1], "1e3s"])
def test_bad_durations_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_a_number_is_in_the_keys_unit() -> None:
    assert parse_duration(250, unit_s=0.001) == 0.25
    assert parse_duration("2s", unit_s=0.001) == 2.0


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (1048576, 1 << 20),
        ("512MiB", 512 << 20),
        ("2GiB", 2 << 30),
        ("2gib", 2 << 30),
        ("500MB", 500_000_000),
        ("1.5KiB", 1536),
        ("64 KiB", 64 << 10),
        ("0B", 0),
        ("7B", 7),
        ("1.25GB", 1_250_000_000),
    ],
)
def test_sizes_parse(text: Any, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["lots", "2G", "-1MiB", -1, True, 1.5, "1.5", "MiB", [1]])
def test_bad_sizes_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=1 << 62))
def test_format_size_reads_back_exactly(n: int) -> None:
    assert parse_size(format_size(n)) == n


@given(st.integers(min_value=0, max_value=10**10))
def test_format_duration_reads_back_exactly(ms: int) -> None:
    assert parse_duration(format_duration(ms / 1000)) * 1000 == pytest.approx(ms)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("10m", 600.0), ("30s", 30.0), ("1h", 3600.0), (45, 45.0), (0, None), ("never", None)],
)
def test_keep_alive_takes_a_duration_or_never(ws: Workspace, value: Any, seconds: Any) -> None:
    config = ws.loaded(ws.data({("models", "smol", "keep_alive"): value}))
    assert config.models["smol"].keep_alive == seconds


def test_keep_alive_defaults_to_never(ws: Workspace) -> None:
    assert ws.loaded(ws.data()).models["smol"].keep_alive is None


def test_millisecond_keys_take_durations(ws: Workspace) -> None:
    config = ws.loaded(
        ws.data(
            {
                ("models", "smol", "decode_timeout_ms"): "1m",
                ("cache", "policy", "session_resume_wait_ms"): "1.5s",
            }
        )
    )
    assert config.models["smol"].decode_timeout_ms == 60_000
    spec = config.worker_spec("smol")
    assert spec.decode_timeout_ms == 60_000
    assert spec.worker.policy.session_resume_wait_ms == 1500


def test_quotas_take_sizes(ws: Workspace) -> None:
    config = ws.loaded(ws.data({("cache", "ram", "quota"): "256MiB"}))
    assert config.cache_settings().tiers[0].quota == 256 << 20
