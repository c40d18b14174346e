"""bench/worker_bench.py judges its own bars and measures decode while every stream decodes."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.common import show

from bench_samples import GOVERNOR

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


def synthetic_round(from_logits: bool, ram_ms: float = 14.0, four_streams: float = 2.0) -> Any:
    def stats(prefill: int) -> dict[str, Any]:
        return {"prefill_tokens": prefill, "queue_ms": 0.0, "restore_ms": 12.0, "prefill_ms": 0.5}

    r = report.Round()
    for path in report.TTFT_PATHS:
        for n in report.SIZES:
            if path.startswith("cold"):
                r.ttft[path, n] = report.Ttft(7000.0, stats(n), 33.0, 2)
            elif from_logits and path.startswith("ram"):
                r.ttft[path, n] = report.Ttft(ram_ms, stats(0), 0.0, None, from_logits=True)
            else:
                r.ttft[path, n] = report.Ttft(48.0, stats(1), 33.0, 2)
    one = [[100.0 + i / 64 for i in range(11)]]  # 64 tok/s
    for s in report.SCENARIOS:
        # 4 streams: each at 64 * four_streams / 4 tok/s, together four_streams x one.
        step = 4 / (64 * four_streams)
        arrivals = [[100.0 + i * step for i in range(11)]] * 4 if s == "4 streams" else one
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


def test_the_recorded_rounds_render_the_same_report_and_verdicts() -> None:
    rounds = [synthetic_round(True, ram_ms=14.0), synthetic_round(False)]
    data = {"rounds": [report.round_data(r) for r in rounds]}
    params = {
        "cores": 2,
        "flash_attn": "auto",
        "n_ctx": 4096,
        "n_seq_max": 4,
        "n_batch": 512,
        "rounds": 2,
        "max_tokens": 32,
        "load_start": [1.0, 1.0, 1.0],
        "load_end": [1.2, 1.0, 1.0],
        "loads": [0.9, 1.0, 1.1],
        "wall_s": 600.0,
        "governor": {"ram": GOVERNOR, "disk": {"spin": "bounded", "threads": None}},
    }
    text = show("bench.worker_bench_report:render", params, data)
    assert text.endswith(report.report(rounds, text.split("\n\n### TTFT")[0]))
    assert "prefill chunk 128 (default)" in text and "Wall time 600 s." in text
    assert "`ram` governed (spin bounded), 2 threads at the end" in text
    assert "`disk` not governed (fixed n_threads; spin bounded)" in text
    # The verdicts, from the recorded rounds: the ram TTFT 14 ms in one round
    # (first token from stored logits), 48 ms in the other: above 25 ms once.
    assert bar_row(text, "warm 2048-token TTFT from ram")[-1] == "within noise"
    assert bar_row(text, "4 streams / one stream")[1:] == ["2.000", "2.000-2.000", "met"]
    slow = {"rounds": [report.round_data(synthetic_round(False, four_streams=1.5))]}
    text = show("bench.worker_bench_report:render", params | {"rounds": 1}, slow)
    assert bar_row(text, "4 streams / one stream")[1:] == ["1.500", "1.500-1.500", "BELOW BAR"]
    assert bar_row(text, "warm 2048-token TTFT from ram")[-1] == "ABOVE BAR"


def bar_row(text: str, start: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {start}"))
    return [c.strip() for c in line.strip("|").split("|")]
