"""Restart intensity: any sequence of restart times → restart or escalate exactly per OTP.

OTP's rule: a supervisor escalates at the first restart after which more than
``intensity`` restarts (that one included) lie within the last ``period``
seconds (a restart exactly ``period`` ago still counts).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.supervisor.intensity import RestartIntensity

pytestmark = pytest.mark.timeout(120)


def otp_oracle(times: list[float], intensity: int, period: float) -> list[bool]:
    """Per restart: allowed? Computed from the definition, by brute force."""
    verdicts = []
    for i, now in enumerate(times):
        in_window = sum(1 for t in times[: i + 1] if now - t <= period)
        verdicts.append(in_window <= intensity)
    return verdicts


@settings(deadline=None)
@given(
    gaps=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=40),
    intensity=st.integers(0, 6),
    period=st.floats(0.001, 20, allow_nan=False),
    start=st.floats(0, 1e6, allow_nan=False),
)
def test_restart_window_matches_otp_rule(
    gaps: list[float], intensity: int, period: float, start: float
) -> None:
    times = []
    now = start
    for gap in gaps:
        now += gap
        times.append(now)
    expected = otp_oracle(times, intensity, period)
    window = RestartIntensity(intensity, period)
    for now, allowed in zip(times, expected, strict=True):
        verdict = window.record(now)
        assert verdict.allowed is allowed
        if not allowed:
            break  # the supervisor is gone after its first escalation


def test_default_flags_allow_one_restart_in_five_seconds() -> None:
    window = RestartIntensity(1, 5.0)
    assert window.record(100.0).allowed
    assert not window.record(104.0).allowed


def test_restart_after_period_is_allowed_again() -> None:
    window = RestartIntensity(1, 5.0)
    assert window.record(100.0).allowed
    assert window.record(105.001).allowed


def test_restart_exactly_period_ago_still_counts() -> None:
    window = RestartIntensity(1, 5.0)
    window.record(100.0)
    verdict = window.record(105.0)
    assert not verdict.allowed and verdict.restarts_in_window == 2


def test_intensity_zero_escalates_on_first_restart() -> None:
    assert not RestartIntensity(0, 5.0).record(1.0).allowed


def test_in_window_forgets_old_restarts() -> None:
    window = RestartIntensity(5, 1.0)
    window.record(0.0)
    window.record(0.5)
    assert window.in_window(0.9) == 2
    assert window.in_window(1.2) == 1
