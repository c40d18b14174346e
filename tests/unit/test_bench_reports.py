"""The smaller benches' reports, rendered from hand-made per-round data as
their result JSON holds it: the figures are computed from every round, and the
verdicts from those figures (bench/common.py: the format)."""

from __future__ import annotations

import pytest
from bench.common import show

import bench_samples as samples

pytestmark = pytest.mark.timeout(60)


def cells(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in text.splitlines():
        got = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and got[0] == first:
            return got
    raise AssertionError(f"no row {first!r} in\n{text}")


@pytest.mark.parametrize(("call_us", "said"), [(90, "met (90 µs"), (101, "MISSED (101 µs")])
def test_actors_judges_the_call_p50_from_every_rounds_latencies(call_us: int, said: str) -> None:
    text = show(*samples.actors(call_us=call_us))
    assert f"call p50 ≤ 100 µs: {said}; the bare floor is 85 µs)" in text
    # Throughput: calls over the rounds' busy time (6 calls in 2 ms).
    assert cells(text, "call round trip")[4] == "3,000 calls/s"
    assert cells(text, "bare pyzmq echo (floor)")[4] == "10,000 calls/s"


def test_actors_judges_the_slower_stream_rate() -> None:
    assert "≥ 50,000 stream events/s: met" in show(*samples.actors(events=60_000))
    assert "≥ 50,000 stream events/s: MISSED" in show(*samples.actors(events=40_000))


def test_cache_io_judges_ram_against_memcpy_and_disk_against_a_plain_read() -> None:
    text = show(*samples.cache_io(ram_load_s=0.010, disk_load_s=0.012))
    assert "- ram load <= 2x memcpy: 2.00x, met" in text
    assert "- disk load <= 3x plain read: 3.00x, met" in text
    text = show(*samples.cache_io(ram_load_s=0.0101, disk_load_s=0.0121))
    assert "- ram load <= 2x memcpy: 2.02x, NOT met" in text
    assert "- disk load <= 3x plain read: 3.02x, NOT met" in text
    assert cells(text, "ram")[6:8] == ["3.00", "2.80"]  # mapped, and the writer's map
    assert cells(text, "disk")[6:8] == ["-", "-"]


def test_cache_lookup_pools_the_rounds_and_judges_the_p50_bars() -> None:
    text = show(*samples.cache_lookup(lp2k_us=150, lp30k_us=1001))
    assert cells(text, "longest_prefix 2,000 tok (hit)")[1:3] == ["6", "150"]
    # Hits, server time and probes summed over the rounds, per lookup.
    assert cells(text, "longest_prefix 2,000 tok (hit)")[5] == "hits 6/6; server 10 µs; 4 probes"
    assert cells(text, "longest prefix, 2,000 tokens")[3] == "True"
    assert cells(text, "longest prefix, 30,000 tokens")[1:4] == ["1001 µs", "1000 µs", "False"]


@pytest.mark.parametrize(("restore_s", "said"), [(0.02, "met"), (0.0201, "NOT met")])
def test_cache_view_judges_the_ram_restore_against_a_memcpy(restore_s: float, said: str) -> None:
    text = show(*samples.cache_view(ram_restore_s=restore_s))
    assert f"(SPEC: within ~2x of a memcpy): {said}\n" in text
    assert "(restore part only): yes" in text
    assert "(restore part only): no" in show(*samples.cache_view(ram_restore_s=0.026))
    assert cells(text, "memcpy")[1:4] == ["10.00", "9.00", "11.00"]


def test_client_takes_each_rounds_figures_then_their_median() -> None:
    text = show(*samples.client())
    assert cells(text, "blocking")[1:] == ["110", "100 k"]
    loop = cells(text, "AsyncClient, one loop")
    # 64 tokens in 2 s; 64 ms of CPU per 64 tokens; ticker late 0.1/0.2/5 ms.
    assert loop[1:] == ["32", "1000", "100", "300", "0.20", "5.00", "5.0"]
    assert cells(text, "Client, 16 threads")[5:] == ["-", "-", "-"]


def test_front_relay_computes_the_hops_cost_from_both_paths_rounds() -> None:
    text = show(*samples.front_relay())
    assert "adds 150 µs to the first event (p50) and 80 µs to every paced event" in text
    assert "relayed throughput is 0.40x direct" in text
    assert "spends 25.0 µs of CPU per event" in text


@pytest.mark.parametrize(
    ("hogs", "said"),
    [((30.0, 35.0), "met"), ((20.0, 35.0), "within noise"), ((20.0, 24.0), "BELOW BAR")],
)
def test_threads_judges_every_rounds_ratio_to_its_quiet_loop(
    hogs: tuple[float, ...], said: str
) -> None:
    text = show(*samples.threads(hogs_tok_s=hogs))
    rows = [line for line in text.splitlines() if "hogs_first / quiet" in line]
    assert len(rows) == 2 and all(r.rstrip(" |").endswith(said) for r in rows)
    # The pair's total (50 + 48) over the quiet loop's 100.
    assert "| 0.980  | 0.980-0.980 | met" in text


def test_the_threads_matrix_compares_each_configuration_beside_hogs_with_the_best_quiet() -> None:
    text = show(*samples.threads_matrix())
    # 100 tok/s quiet is 10 ms/token (the best); 20 tok/s beside hogs is 50 ms.
    assert cells(text, "2 threads, GOMP_SPINCOUNT=1000")[1:] == [
        "10.0 (10.0-10.0)",
        "50.0 (50.0-50.0)",
        "50",
        "0.200",
    ]
    assert "at each round's start: 1.00, 1.20." in text


def test_worker_attention_takes_the_median_of_each_rounds_decodes() -> None:
    text = show(*samples.worker_attention(off_ms=7.0))
    # One-row figures: the median of (7, 8, 6); off / on per round.
    assert cells(text, "1 row over 2048 cells, ms")[1:] == [
        "5.0 (5.0-5.0)",
        "7.0 (7.0-7.0)",
        "5.0 (5.0-5.0)",
        "1.40 (1.40-1.40)",
    ]


def test_worker_restore_leaves_the_warm_up_hit_out_of_the_cores_figures() -> None:
    text = show(*samples.worker_restore())
    assert "`restore_ms` 11.00 (10.00-12.00), `prefill_ms` 5.50 (5.00-6.00)" in text
    assert cells(text, "view.resolve")[1] == "0.25 (0.20-0.30)"
    assert cells(text, "unpack")[1] == "4.50 (4.00-5.00)"
