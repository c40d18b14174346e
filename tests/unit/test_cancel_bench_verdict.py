"""bench/cancel_bench.py's verdict on issue 21's bar: every cancel mid-prefill within 50 ms."""

from __future__ import annotations

from typing import Any

from bench.cancel_bench import BAR_MS, cancel_verdict


def trial(ms: float, finish: str = "cancelled") -> dict[str, Any]:
    return {"latency_ms": ms, "finish": finish}


def test_every_trial_within_the_bar_is_met() -> None:
    assert cancel_verdict([trial(3.0), trial(BAR_MS)]) == "met"


def test_one_slow_trial_fails_the_run() -> None:
    assert cancel_verdict([trial(3.0), trial(BAR_MS + 0.1)]) == "ABOVE BAR"


def test_a_trial_that_was_not_cancelled_measured_nothing() -> None:
    assert cancel_verdict([trial(3.0), trial(1.0, finish="length")]).startswith("NOT A CANCEL")


def test_no_trials_is_no_verdict() -> None:
    assert cancel_verdict([]) == "no trials"
