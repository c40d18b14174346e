"""bench/worker_bench.py judges its own bars and measures decode while every stream decodes."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
worker_bench = importlib.import_module("bench.worker_bench")
report = importlib.import_module("bench.worker_bench_report")


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ([1.7, 1.9, 2.0], "met"),
        ([1.6, 1.6], "met"),
        ([1.5, 1.8, 1.9], "within noise"),  # the median clears the bar, one round does not
        ([1.2, 1.5, 1.59], "BELOW BAR"),
    ],
)
def test_a_lower_bar_is_met_only_when_every_round_clears_it(
    ratios: list[float], expected: str
) -> None:
    assert report.verdict(ratios, 1.6, at_least=True) == expected


@pytest.mark.parametrize(
    ("ms", "expected"),
    [([18.0, 24.9, 25.0], "met"), ([20.0, 30.0], "within noise"), ([25.1, 40.0], "ABOVE BAR")],
)
def test_an_upper_bar_is_met_only_when_every_round_stays_under_it(
    ms: list[float], expected: str
) -> None:
    assert report.verdict(ms, 25.0, at_least=False) == expected


def test_one_streams_rate_is_its_tokens_after_the_first_over_their_span() -> None:
    # 11 tokens 1/64 s apart (exact in binary): 10 intervals in 10/64 s.
    arrivals = [[i / 64 for i in range(11)]]
    assert report.steady_rate(arrivals) == pytest.approx(64.0)


def test_concurrent_streams_count_only_the_window_in_which_all_of_them_decode() -> None:
    # Stream b starts 5 ticks late and a ends 5 ticks early: only (5/64, 10/64]
    # counts, where each stream gets a token every 1/64 s (5 each, 10 in 5/64 s).
    # Counting a's lone tokens before b started would give 20 / (15/64) = 85.3.
    a = [i / 64 for i in range(11)]
    b = [(i + 5) / 64 for i in range(11)]
    assert report.steady_rate([a, b]) == pytest.approx(128.0)


@pytest.mark.parametrize("arrivals", [[], [[1.0]], [[1.0, 1.1], [1.2, 1.3]]])
def test_streams_that_never_decode_together_have_no_rate(arrivals: list[list[float]]) -> None:
    with pytest.raises(ValueError, match="stream"):
        report.steady_rate(arrivals)


def test_prompts_with_another_nonce_share_no_leading_text() -> None:
    a = worker_bench.prompt_text("a1", 50)
    b = worker_bench.prompt_text("b2", 50)
    assert a != b
    assert a[: len("Record ")] == b[: len("Record ")]
    assert a[len("Record ")] != b[len("Record ")]
    assert worker_bench.prompt_text("a1", 50) == a  # deterministic per nonce


def test_a_recorded_run_needs_at_least_five_rounds() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.worker_bench", "--rounds", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 2
    assert "--rounds >= 5" in proc.stderr


def synthetic_round(from_logits: bool) -> Any:
    from llamad.model.results import (  # noqa: PLC0415
        CacheHitKind,
        Completion,
        FinishReason,
        Stats,
    )

    def done(prefill: int) -> Completion:
        return Completion(
            reply="x",
            generated=[1],
            context_tokens=[1],
            committed_tokens=1,
            cache_hit_kind=CacheHitKind.EXACT,
            finish_reason=FinishReason.LENGTH,
            stats=Stats(prefill_tokens=prefill, restore_ms=12.0, prefill_ms=0.5),
        )

    r = report.Round()
    for path in report.TTFT_PATHS:
        for n in report.SIZES:
            if path.startswith("cold"):
                r.ttft[path, n] = report.Ttft(7000.0, done(n), 33.0, 2)
            elif from_logits and path.startswith("ram"):
                r.ttft[path, n] = report.Ttft(14.0, done(0), 0.0, None, from_logits=True)
            else:
                r.ttft[path, n] = report.Ttft(48.0, done(1), 33.0, 2)
    arrivals = [[i / 64 for i in range(11)]]
    for s in report.SCENARIOS:
        r.decode[s] = report.Decode(arrivals, ["length"], {"ram": 2})
    return r


def where_row(text: str, path: str, n: int) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 2 and cells[0] == path and cells[1] == str(n):
            return cells
    raise AssertionError(f"no row for {path} {n}")


def test_a_first_token_from_stored_logits_shows_no_decode_of_its_own() -> None:
    # A warm hit sampled from its row's logits decodes nothing: the board's
    # last decode is another request's, and the report must not show it.
    text = report.report([synthetic_round(True), synthetic_round(True)], "settings")
    ram = where_row(text, "ram", 2048)
    cold = where_row(text, "cold", 2048)
    disk = where_row(text, "disk", 2048)
    # decode ms, its threads, tokens prefilled, first token from stored logits
    assert ram[6:10] == ["-", "-", "0", "yes"]
    assert cold[6:10] == ["33.00", "2", "2048", "no"]
    assert disk[6:10] == ["33.00", "2", "1", "no"]
    mixed = report.report([synthetic_round(True), synthetic_round(False)], "settings")
    assert where_row(mixed, "ram", 2048)[9] == "1/2 rounds"
