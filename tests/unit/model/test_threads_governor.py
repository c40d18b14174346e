"""The thread governor (SPEC M14): budget, collapse fallback, probing back, status."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.errors import ConfigError
from llamad.model.threads import (
    SoloBoard,
    ThreadGovernor,
    ThreadPolicy,
    ThreadStatus,
    kv_bucket,
    rows_bucket,
    step_shape,
)

pytestmark = pytest.mark.timeout(60)

MS = 1e-3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SharedBoard:
    """Several workers' marks in one process: what ThreadBoard does across processes."""

    def __init__(self) -> None:
        self.marks: dict[int, float] = {}

    def seat(self) -> Seat:
        return Seat(self, len(self.marks))


class Seat:
    def __init__(self, board: SharedBoard, slot: int) -> None:
        self.board, self.slot = board, slot
        board.marks[slot] = -math.inf

    def mark_busy(self, until: float) -> None:
        self.board.marks[self.slot] = until

    def busy_workers(self, now: float) -> int:
        return sum(1 for until in self.board.marks.values() if until >= now)


def policy(**kwargs: object) -> ThreadPolicy:
    """A 2-core policy; exploring fewer threads only where a test asks for it."""
    opts: dict[str, object] = {
        "max_threads": 2,
        "cores": 2,
        "explore_first_s": 1e9,
        "settle_steps": 0,
        **kwargs,
    }
    return ThreadPolicy(**opts)  # type: ignore[arg-type]


def governor(clock: Clock, **kwargs: object) -> ThreadGovernor:
    return ThreadGovernor(policy(**kwargs), clock=clock)


def step(
    gov: ThreadGovernor, clock: Clock, seconds: float, rows: int = 1, kv_cells: int = 0
) -> int:
    """One decode: ask, 'run' for ``seconds``, record. Returns the threads used."""
    threads = gov.threads_for(rows, kv_cells)
    clock.advance(seconds)
    gov.record(rows, seconds, kv_cells)
    return threads


def warm(
    gov: ThreadGovernor,
    clock: Clock,
    seconds: float,
    n: int = 8,
    *,
    rows: int = 1,
    kv_cells: int = 0,
) -> None:
    for _ in range(n):
        step(gov, clock, seconds, rows, kv_cells)


def collapse(gov: ThreadGovernor, clock: Clock) -> None:
    """Quiet 2-thread steps at 10 ms, then two at 2.4 s (the measured collapse:
    a short step's collapse is confirmed by the next step's)."""
    warm(gov, clock, 10 * MS)
    assert step(gov, clock, 2.4) == 2
    assert step(gov, clock, 2.4) == 2


# -- the budget -------------------------------------------------------------------


def test_a_lone_worker_decodes_on_its_configured_threads() -> None:
    clock = Clock()
    gov = governor(clock, max_threads=2, cores=2)
    assert gov.threads_for(1) == 2
    status = gov.status()
    assert (status.threads, status.busy_workers, status.budget) == (2, 1, 2)
    assert not status.fallback


def test_configured_threads_beyond_the_cores_are_capped_by_the_budget() -> None:
    clock = Clock()
    assert governor(clock, max_threads=8, cores=2).threads_for(1) == 2


def test_two_busy_workers_share_the_cores() -> None:
    clock = Clock()
    board = SharedBoard()
    a = ThreadGovernor(policy(), board=board.seat(), clock=clock)
    b = ThreadGovernor(policy(), board=board.seat(), clock=clock)
    assert step(a, clock, 10 * MS) == 2  # alone so far
    assert step(b, clock, 10 * MS) == 1  # a is still busy (within its linger)
    assert step(a, clock, 10 * MS) == 1
    assert a.status().busy_workers == 2


def test_an_idle_worker_gives_its_share_back_at_once() -> None:
    clock = Clock()
    board = SharedBoard()
    a = ThreadGovernor(policy(), board=board.seat(), clock=clock)
    b = ThreadGovernor(policy(), board=board.seat(), clock=clock)
    step(a, clock, 10 * MS)
    a.idle()
    clock.advance(1 * MS)  # well within the linger
    assert b.threads_for(512) == 2


def test_a_worker_that_stops_decoding_gives_its_share_back_after_the_linger() -> None:
    clock = Clock()
    board = SharedBoard()
    pol = policy(busy_linger_s=0.5)
    a = ThreadGovernor(pol, board=board.seat(), clock=clock)
    b = ThreadGovernor(pol, board=board.seat(), clock=clock)
    step(a, clock, 10 * MS)
    clock.advance(0.3)
    assert step(b, clock, 10 * MS) == 1
    clock.advance(0.6)  # a's last step ended more than 0.5 s ago
    assert step(b, clock, 10 * MS) == 2


def test_a_long_step_keeps_its_worker_busy_while_it_runs() -> None:
    clock = Clock()
    board = SharedBoard()
    pol = policy(busy_linger_s=0.5)
    a = ThreadGovernor(pol, board=board.seat(), clock=clock)
    b = ThreadGovernor(pol, board=board.seat(), clock=clock)
    warm(a, clock, 2.0, n=4, rows=64)  # a's 64-row steps take 2 s
    a.threads_for(64)  # a starts another
    clock.advance(1.5)  # beyond the linger, within the expected step
    assert b.threads_for(1) == 1


def test_a_step_of_a_new_shape_keeps_its_worker_busy_however_long_it_runs() -> None:
    # The mark once guessed the step's end from the shape's median (0 for a
    # shape never seen): a 30 s first prefill chunk under load lapsed after
    # the linger, and the other worker took every core.
    clock = Clock()
    board = SharedBoard()
    pol = policy(busy_linger_s=0.5)
    a = ThreadGovernor(pol, board=board.seat(), clock=clock)
    b = ThreadGovernor(pol, board=board.seat(), clock=clock)
    a.threads_for(512, 512)  # a shape a has no median for
    clock.advance(30.0)
    assert b.threads_for(1) == 1
    a.record(512, 30.0, 512)
    clock.advance(0.6)  # the step ended more than the linger ago
    assert b.threads_for(1) == 2


def test_a_step_far_slower_than_its_median_keeps_its_worker_busy() -> None:
    clock = Clock()
    board = SharedBoard()
    pol = policy(busy_linger_s=0.5)
    a = ThreadGovernor(pol, board=board.seat(), clock=clock)
    b = ThreadGovernor(pol, board=board.seat(), clock=clock)
    warm(a, clock, 10 * MS)
    a.threads_for(1)
    clock.advance(5.0)  # 500x its median: a collapse still under way
    assert b.threads_for(1) == 1


def test_a_step_that_raised_ends_its_mark_after_the_linger() -> None:
    clock = Clock()
    board = SharedBoard()
    pol = policy(busy_linger_s=0.5)
    a = ThreadGovernor(pol, board=board.seat(), clock=clock)
    b = ThreadGovernor(pol, board=board.seat(), clock=clock)
    warm(a, clock, 10 * MS)
    a.threads_for(1)
    a.abandon()  # its decode raised: nothing recorded
    clock.advance(0.3)
    assert b.threads_for(1) == 1  # within the linger
    b.idle()
    clock.advance(0.3)
    assert b.threads_for(1) == 2
    assert a.status().threads == 2  # nothing was learnt from the abandoned step


@settings(max_examples=200, deadline=None)
@given(
    cores=st.integers(1, 64),
    configured=st.lists(st.integers(1, 64), min_size=1, max_size=16),
)
def test_busy_workers_never_ask_for_more_threads_than_cores(
    cores: int, configured: list[int]
) -> None:
    clock = Clock()
    board = SharedBoard()
    govs = [
        ThreadGovernor(policy(max_threads=n, cores=cores), board=board.seat(), clock=clock)
        for n in configured
    ]
    for gov in govs:  # everyone marks itself busy first
        gov.threads_for(1)
    threads = [gov.threads_for(1) for gov in govs]
    assert all(1 <= t <= n for t, n in zip(threads, configured, strict=True))
    if len(govs) <= cores:
        assert sum(threads) <= cores
    else:
        assert threads == [1] * len(govs)  # never fewer than one


# -- collapse detection ---------------------------------------------------------------


def test_a_step_far_above_its_median_falls_back_to_fewer_threads() -> None:
    clock = Clock()
    gov = governor(clock)
    collapse(gov, clock)
    assert gov.threads_for(1) == 1
    status = gov.status()
    assert status.fallback and status.ceiling == 1
    assert (status.fallbacks, status.collapses) == (1, 1)
    last = status.last_collapse
    assert last is not None
    assert (last.threads, last.rows) == (2, 1)
    assert last.step_ms == pytest.approx(2400.0)
    assert last.median_ms == pytest.approx(10.0)


def test_jitter_below_the_collapse_factor_is_not_a_collapse() -> None:
    clock = Clock()
    gov = governor(clock, collapse_factor=3.0)
    warm(gov, clock, 10 * MS)
    step(gov, clock, 29 * MS)
    assert gov.threads_for(1) == 2
    assert gov.status().collapses == 0


def test_a_tiny_step_must_also_be_slower_by_an_absolute_margin() -> None:
    clock = Clock()
    gov = governor(clock, collapse_min_s=5 * MS)
    warm(gov, clock, 1 * MS)
    step(gov, clock, 4.5 * MS)  # 4.5x, but only 3.5 ms slower
    step(gov, clock, 4.5 * MS)
    assert gov.status().collapses == 0
    step(gov, clock, 7 * MS)
    step(gov, clock, 7 * MS)
    assert gov.status().collapses == 1


def test_no_verdict_before_the_median_has_enough_samples() -> None:
    clock = Clock()
    gov = governor(clock, min_samples=4)
    for seconds in (10 * MS, 10 * MS, 10 * MS, 2.0):  # the fourth has only 3 before it
        step(gov, clock, seconds)
    assert gov.status().collapses == 0


def test_each_batch_shape_is_judged_against_its_own_median() -> None:
    clock = Clock()
    gov = governor(clock)
    warm(gov, clock, 10 * MS, rows=1)
    warm(gov, clock, 120 * MS, rows=64)
    step(gov, clock, 130 * MS, rows=64)
    step(gov, clock, 10 * MS, rows=1)
    assert gov.status().collapses == 0
    step(gov, clock, 500 * MS, rows=48)  # same bucket as 64 rows
    assert gov.status().collapses == 1


def test_rows_bucket_groups_powers_of_two() -> None:
    assert [rows_bucket(r) for r in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [0, 1, 2, 2, 3, 3, 4, 4, 5]


def test_kv_bucket_groups_powers_of_two_above_llamas_256_cell_padding() -> None:
    cells = (0, 16, 255, 256, 511, 512, 1023, 1024, 2047, 2048, 4095, 4096)
    assert [kv_bucket(c) for c in cells] == [0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert step_shape(1, 2048) == (0, 4)


# The bench's false collapses (issue 8): a one-row decode over 2,048 cells
# takes 17-35 ms at 2 threads where one over a few cells takes 10 ms.


def test_a_one_row_step_over_a_long_kv_after_short_ones_is_not_a_collapse() -> None:
    clock = Clock()
    gov = governor(clock)
    warm(gov, clock, 10 * MS, kv_cells=16)
    for _ in range(6):  # a warm hit's held-back token, then its reply
        assert step(gov, clock, 35 * MS, kv_cells=2048) == 2
    assert step(gov, clock, 10 * MS, kv_cells=20) == 2
    status = gov.status()
    assert (status.collapses, status.fallbacks, status.ceiling) == (0, 0, 2)


def test_a_ten_times_slower_step_over_a_long_kv_is_still_a_collapse() -> None:
    clock = Clock()
    gov = governor(clock)
    warm(gov, clock, 10 * MS, kv_cells=16)
    warm(gov, clock, 35 * MS, kv_cells=2048)
    assert step(gov, clock, 350 * MS, kv_cells=2100) == 2
    assert step(gov, clock, 350 * MS, kv_cells=2101) == 2
    assert gov.threads_for(1, 2102) == 1
    last = gov.status().last_collapse
    assert last is not None
    assert (last.rows, last.kv_cells, last.step_ms, last.median_ms) == (1, 2101, 350.0, 35.0)


def test_a_short_kv_step_is_judged_against_short_kv_steps() -> None:
    clock = Clock()
    gov = governor(clock)
    warm(gov, clock, 35 * MS, n=16, kv_cells=2048)
    warm(gov, clock, 10 * MS, n=4, kv_cells=16)
    for _ in range(2):  # under 3x a median of both, 10x of 16 cells
        step(gov, clock, 100 * MS, kv_cells=16)
    assert gov.status().collapses == 1


def test_a_short_step_that_collapses_alone_is_a_burst_not_a_fallback() -> None:
    """Another process taking a core for tens of ms (cache-meta copying a row
    to disk) makes the one short step under way collapse, and nothing after."""
    clock = Clock()
    gov = governor(clock)
    warm(gov, clock, 10 * MS)
    assert step(gov, clock, 60 * MS) == 2
    assert step(gov, clock, 10 * MS) == 2
    assert step(gov, clock, 60 * MS, kv_cells=300) == 2  # nothing to judge it against
    status = gov.status()
    assert (status.collapses, status.fallbacks, status.bursts, status.ceiling) == (0, 0, 1, 2)
    assert status.last_collapse is None
    assert gov.threads_for(1) == 2


def test_a_long_step_that_collapses_falls_back_at_once() -> None:
    # A burst cannot make a 1 s prefill chunk 3x slower; another such chunk costs seconds.
    clock = Clock()
    gov = governor(clock)
    warm(gov, clock, 1.0, rows=512)
    assert step(gov, clock, 3.5, rows=512) == 2
    assert gov.threads_for(512) == 1
    assert (gov.status().collapses, gov.status().bursts) == (1, 0)


def test_a_collapse_at_one_thread_is_counted_but_there_is_nothing_to_give_back() -> None:
    clock = Clock()
    gov = governor(clock, max_threads=1)
    warm(gov, clock, 18 * MS)
    step(gov, clock, 1.0)
    status = gov.status()
    assert (status.collapses, status.fallbacks, status.ceiling) == (1, 0, 1)
    assert not status.fallback
    assert gov.threads_for(1) == 1


def test_collapsed_steps_do_not_drag_the_median_up() -> None:
    clock = Clock()
    gov = governor(clock, max_threads=1, window=8)
    warm(gov, clock, 10 * MS, n=8)
    for _ in range(8):
        step(gov, clock, 1.0)
    assert gov.status().collapses == 8  # still judged against 10 ms


def test_the_fallback_ladder_halves_down_to_one() -> None:
    clock = Clock()
    gov = governor(clock, max_threads=8, cores=8)
    warm(gov, clock, 10 * MS)
    step(gov, clock, 1.0)
    step(gov, clock, 1.0)
    assert gov.threads_for(1) == 4
    clock.advance(1 * MS)
    gov.record(1, 1 * MS)  # nothing to judge 4 threads against yet
    warm(gov, clock, 12 * MS)
    step(gov, clock, 1.0)
    step(gov, clock, 1.0)
    assert gov.threads_for(1) == 2
    gov.record(1, 12 * MS)
    assert gov.status().fallbacks == 2


# -- probing back ------------------------------------------------------------------


def test_after_the_cooldown_a_faster_count_is_probed_and_kept() -> None:
    clock = Clock()
    gov = governor(clock, cooldown_s=2.0, probe_steps=4)
    collapse(gov, clock)
    warm(gov, clock, 18 * MS, n=8)  # the 1-thread baseline, under 2 s
    assert gov.threads_for(1) == 1
    gov.record(1, 18 * MS)
    clock.advance(2.0)
    assert [step(gov, clock, 11 * MS) for _ in range(4)] == [2, 2, 2, 2]
    status = gov.status()
    assert (status.probes, status.probes_kept, status.ceiling) == (1, 1, 2)
    assert not status.fallback and status.next_probe_s is None
    assert step(gov, clock, 11 * MS) == 2


def test_a_probe_up_no_faster_on_short_steps_is_kept() -> None:
    """One-row steps of a small model run as fast on 2 threads as on 1: a
    probe that had to be faster there never went back up, and the prefill
    chunks that 2 threads make twice as fast ran on 1 for minutes."""
    clock = Clock()
    gov = governor(clock, cooldown_s=2.0, probe_steps=4)
    collapse(gov, clock)
    warm(gov, clock, 10 * MS)  # 1 thread: as fast as 2 were
    clock.advance(2.0)
    assert [step(gov, clock, 10.8 * MS) for _ in range(4)] == [2] * 4
    status = gov.status()
    assert (status.probes, status.probes_kept, status.ceiling) == (1, 1, 2)
    assert step(gov, clock, 1.0, rows=512) == 2


def test_a_probe_slower_than_the_fallback_is_dropped_and_the_cooldown_doubles() -> None:
    clock = Clock()
    gov = governor(clock, cooldown_s=2.0, cooldown_max_s=5.0, probe_steps=2)
    collapse(gov, clock)
    warm(gov, clock, 25 * MS)
    clock.advance(2.0)
    assert [step(gov, clock, 60 * MS) for _ in range(2)] == [2, 2]
    status = gov.status()
    assert (status.probes, status.probes_kept, status.cooldown_s) == (1, 0, 4.0)
    assert status.next_probe_s == pytest.approx(4.0)
    assert step(gov, clock, 25 * MS) == 1
    clock.advance(4.0)
    assert [step(gov, clock, 60 * MS) for _ in range(2)] == [2, 2]
    assert gov.status().cooldown_s == 5.0  # capped
    clock.advance(4.9)
    assert gov.threads_for(1) == 1


def test_a_probe_step_that_collapses_against_the_fallback_ends_the_probe() -> None:
    clock = Clock()
    gov = governor(clock, cooldown_s=2.0, probe_steps=4)
    collapse(gov, clock)
    warm(gov, clock, 25 * MS)
    clock.advance(2.0)
    assert step(gov, clock, 90 * MS) == 2  # 3.6x the 1-thread median: hopeless
    assert step(gov, clock, 25 * MS) == 1
    status = gov.status()
    assert (status.probes, status.probes_kept, status.cooldown_s) == (1, 0, 4.0)


def test_a_kept_probe_rebaselines_so_a_busier_machine_does_not_fall_back_at_once() -> None:
    clock = Clock()
    gov = governor(clock, cooldown_s=1.0, probe_steps=4)
    collapse(gov, clock)  # 2 threads learnt at 10 ms on a quiet machine
    warm(gov, clock, 50 * MS)  # now busier: 1 thread at 50 ms
    clock.advance(1.0)
    assert [step(gov, clock, 35 * MS) for _ in range(4)] == [2] * 4  # kept: 0.7x
    for _ in range(8):  # 3.5x the quiet baseline, but the baseline moved
        assert step(gov, clock, 35 * MS) == 2
    assert gov.status().fallbacks == 1


def test_a_budget_that_shrinks_mid_probe_cancels_the_probe() -> None:
    clock = Clock()
    board = SharedBoard()
    a = ThreadGovernor(policy(cooldown_s=1.0, probe_steps=4), board=board.seat(), clock=clock)
    other = board.seat()
    collapse(a, clock)
    warm(a, clock, 18 * MS)
    clock.advance(1.0)
    assert step(a, clock, 11 * MS) == 2  # probing
    other.mark_busy(clock() + 10.0)  # another worker starts decoding
    assert step(a, clock, 11 * MS) == 1
    status = a.status()
    assert (status.probes, status.probes_kept, status.ceiling) == (1, 0, 1)
    other.mark_busy(-math.inf)
    clock.advance(1.0)
    assert a.threads_for(1) == 2  # a fresh probe once the cores are free again


def test_no_probe_while_the_budget_already_allows_no_more() -> None:
    clock = Clock()
    board = SharedBoard()
    a = ThreadGovernor(policy(cooldown_s=1.0), board=board.seat(), clock=clock)
    other = board.seat()
    collapse(a, clock)
    other.mark_busy(clock() + 100.0)
    clock.advance(5.0)
    for _ in range(4):
        assert step(a, clock, 18 * MS) == 1
    assert a.status().probes == 0


# -- exploring fewer threads ----------------------------------------------------------


def test_a_worker_started_on_a_busy_machine_finds_fewer_threads_faster() -> None:
    clock = Clock()
    gov = governor(clock, explore_first_s=0.0, probe_steps=4, cooldown_s=2.0)
    # Already busy: 2 threads learn a slow baseline, so nothing ever "collapses".
    assert [step(gov, clock, 60 * MS) for _ in range(4)] == [2] * 4
    assert [step(gov, clock, 25 * MS) for _ in range(4)] == [1] * 4  # exploring
    status = gov.status()
    assert (status.explorations, status.explorations_kept) == (1, 1)
    assert status.fallback and status.fallbacks == 1 and status.collapses == 0
    assert step(gov, clock, 25 * MS) == 1
    clock.advance(2.0)  # a probe back up finds 2 threads still slower
    assert [step(gov, clock, 60 * MS) for _ in range(4)] == [2] * 4
    assert gov.status().probes_kept == 0
    assert step(gov, clock, 25 * MS) == 1


def test_exploration_that_finds_nothing_backs_off() -> None:
    clock = Clock()
    gov = governor(clock, explore_first_s=0.0, explore_s=30.0, explore_max_s=50.0, probe_steps=2)
    warm(gov, clock, 10 * MS, n=4)
    # 1 thread no faster, yet not slower by probe_gain either: worth trying again.
    assert [step(gov, clock, 10.5 * MS) for _ in range(2)] == [1, 1]
    status = gov.status()
    assert (status.explorations, status.explorations_kept, status.ceiling) == (1, 0, 2)
    clock.advance(29.0)
    assert step(gov, clock, 10 * MS) == 2
    clock.advance(1.0)
    assert [step(gov, clock, 10.5 * MS) for _ in range(2)] == [1, 1]  # after 30 s
    clock.advance(49.0)
    assert step(gov, clock, 10 * MS) == 2  # next after 60 s, capped at 50 s
    clock.advance(1.0)
    assert gov.threads_for(1) == 1
    assert gov.status().explorations == 3


def test_an_exploration_never_runs_a_prefill_chunk_on_fewer_threads() -> None:
    # Half the threads cost ~1.9x on a quiet machine: a few ms on a decode
    # step, over a second on a 512-row prefill chunk (a cold prompt's TTFT).
    clock = Clock()
    gov = governor(clock, explore_first_s=0.0, probe_steps=4)
    chunk = {"rows": 512, "kv_cells": 1024}
    warm(gov, clock, 1.3, n=4, **chunk)
    assert step(gov, clock, 1.3, **chunk) == 2  # a baseline, yet no exploration here
    assert gov.status().explorations == 0
    warm(gov, clock, 10 * MS, n=4)
    assert step(gov, clock, 18 * MS) == 1  # explores on a decode step
    assert step(gov, clock, 1.3, **chunk) == 2  # a chunk amid the exploration
    assert [step(gov, clock, 18 * MS) for _ in range(3)] == [1] * 3
    status = gov.status()
    assert (status.explorations, status.explorations_kept, status.ceiling) == (1, 0, 2)
    assert step(gov, clock, 10 * MS) == 2


def test_no_exploration_while_fewer_threads_are_known_to_be_slower() -> None:
    # Each exploration costs probe_steps slow steps (~3% of a 128-token
    # stream on a quiet machine): repeating a known answer only costs.
    clock = Clock()
    gov = governor(clock, explore_first_s=0.0, explore_s=30.0, probe_steps=4)
    warm(gov, clock, 10 * MS, n=4)
    assert [step(gov, clock, 18 * MS) for _ in range(4)] == [1] * 4  # quiet: slower
    clock.advance(600.0)
    assert [step(gov, clock, 10 * MS) for _ in range(8)] == [2] * 8
    assert gov.status().explorations == 1
    # The machine gets busier (no collapse): once 2 threads' recent median is
    # as slow as 1 thread was (by probe_gain), exploring is worth it again.
    used = [step(gov, clock, 17 * MS) for _ in range(32)]
    assert used[:4] == [2] * 4 and 1 in used
    assert gov.status().explorations == 2


def test_no_exploration_before_the_first_delay_or_without_a_baseline() -> None:
    clock = Clock()
    gov = governor(clock, explore_first_s=5.0)
    warm(gov, clock, 10 * MS, n=8)
    assert gov.status().explorations == 0
    clock.advance(5.0)
    assert step(gov, clock, 10 * MS, rows=64) == 2  # no 64-row baseline yet
    assert step(gov, clock, 10 * MS) == 1
    assert gov.status().explorations == 1


def test_the_first_steps_at_a_new_count_are_not_learnt_from() -> None:
    # A new context's first steps are slow (page faults, threads starting):
    # in the baseline they would make fewer threads look faster than they are.
    clock = Clock()
    gov = governor(clock, explore_first_s=0.0, settle_steps=2, probe_steps=4)
    assert [step(gov, clock, s) for s in (0.2, 0.2, 10 * MS, 10 * MS, 10 * MS, 10 * MS)] == [2] * 6
    assert [step(gov, clock, 18 * MS) for _ in range(4)] == [1] * 4  # explored, judged on 10 ms
    status = gov.status()
    assert (status.explorations, status.explorations_kept, status.ceiling) == (1, 0, 2)
    assert step(gov, clock, 10 * MS) == 2


def test_the_first_steps_after_a_switch_are_not_learnt_from() -> None:
    clock = Clock()
    board = SharedBoard()
    pol = policy(settle_steps=2, window=4, min_samples=2)
    gov = ThreadGovernor(pol, board=board.seat(), clock=clock)
    other = board.seat()
    warm(gov, clock, 10 * MS, n=4)
    other.mark_busy(clock() + 100.0)  # the budget drops to 1 thread
    assert [step(gov, clock, s) for s in (0.5, 0.5, 18 * MS, 18 * MS)] == [1] * 4
    step(gov, clock, 100 * MS)  # against 18 ms (not against the switch's slow steps)
    assert gov.status().collapses == 1


def test_a_dropped_exploration_still_teaches_the_fewer_threads_baseline() -> None:
    clock = Clock()
    gov = governor(clock, explore_first_s=0.0, probe_steps=4, cooldown_s=1.0)
    warm(gov, clock, 10 * MS, n=4)
    assert [step(gov, clock, 18 * MS) for _ in range(4)] == [1] * 4  # dropped
    assert [step(gov, clock, 2.4) for _ in range(2)] == [2, 2]  # collapse
    clock.advance(1.0)
    # The probe back up is judged against the 18 ms the exploration measured
    # (with no 1-thread baseline it would be kept: 25 ms is no collapse of 10).
    assert [step(gov, clock, 25 * MS) for _ in range(4)] == [2] * 4
    assert gov.status().probes_kept == 0
    assert step(gov, clock, 18 * MS) == 1


# -- status and validation --------------------------------------------------------------


class Saves:
    """The writer pool's quiet_epoch: None while a save runs, else a count
    moved as each starts and ends."""

    def __init__(self) -> None:
        self.running = False
        self.epoch = 0

    def __call__(self) -> int | None:
        return None if self.running else self.epoch


def test_a_step_beside_the_workers_own_saves_is_neither_judged_nor_learnt() -> None:
    """A save's CRC and copy take the cores the step's threads wait for: the
    step reads slow while nothing outside the worker is busy."""
    clock, saves = Clock(), Saves()
    gov = ThreadGovernor(policy(), clock=clock, own_work=saves)
    warm(gov, clock, 10 * MS)
    warm(gov, clock, 1.0, rows=512)
    saves.running = True  # a save under way for a while
    assert step(gov, clock, 3.5, rows=512) == 2
    saves.running = False
    saves.epoch += 2
    # One that started and ended within the step.
    assert gov.threads_for(1) == 2
    saves.epoch += 2
    clock.advance(60 * MS)
    gov.record(1, 60 * MS)
    # One that started during the step and still runs.
    assert gov.threads_for(1) == 2
    saves.running = True
    clock.advance(60 * MS)
    gov.record(1, 60 * MS)
    saves.running = False
    status = gov.status()
    assert (status.collapses, status.bursts, status.fallbacks) == (0, 0, 0)
    assert status.beside_own_work == 3
    # Nothing was learnt from them: the medians are still 10 ms and 1 s.
    assert [step(gov, clock, 40 * MS) for _ in range(2)] == [2, 2]
    assert gov.threads_for(1) == 1


def test_a_short_step_started_beside_the_workers_own_save_takes_half_the_threads() -> None:
    """On every thread it waited at its barriers for the cores the save held
    (P8: p99 ITL 61.7 ms with continued saves, 12.0 without); a prefill
    chunk outlasts the save and keeps its threads."""
    clock, saves = Clock(), Saves()
    gov = ThreadGovernor(policy(max_threads=4, cores=4), clock=clock, own_work=saves)
    warm(gov, clock, 10 * MS)
    saves.running = True
    assert [step(gov, clock, 12 * MS) for _ in range(3)] == [2, 2, 2]
    assert step(gov, clock, 1.0, rows=512) == 4
    assert step(gov, clock, 12 * MS, rows=16) == 2
    saves.running = False
    saves.epoch += 1
    assert step(gov, clock, 10 * MS) == 4
    status = gov.status()
    assert (status.halved_beside_own_work, status.beside_own_work) == (4, 5)
    assert (status.fallbacks, status.ceiling) == (0, 4)


def test_with_cores_to_spare_a_short_step_beside_a_save_keeps_its_threads() -> None:
    # 4 threads of 16 cores: the save's two threads find cores of their own.
    clock, saves = Clock(), Saves()
    gov = ThreadGovernor(policy(max_threads=4, cores=16), clock=clock, own_work=saves)
    warm(gov, clock, 10 * MS)
    saves.running = True
    assert [step(gov, clock, 12 * MS) for _ in range(3)] == [4, 4, 4]
    assert gov.status().halved_beside_own_work == 0


def test_the_own_work_probe_can_be_set_after_construction() -> None:
    clock, saves = Clock(), Saves()
    gov = governor(clock)
    gov.own_work = saves
    warm(gov, clock, 10 * MS)
    saves.running = True
    for _ in range(2):
        assert step(gov, clock, 60 * MS) == 1
    assert gov.status().beside_own_work == 2
    saves.running = False
    assert gov.threads_for(1) == 2


def test_status_is_a_wire_struct_with_the_collapse_age() -> None:
    clock = Clock()
    gov = governor(clock)
    collapse(gov, clock)
    clock.advance(3.0)
    status = gov.status()
    assert status.last_collapse is not None
    assert status.last_collapse.age_s == pytest.approx(3.0)
    assert status.next_probe_s == pytest.approx(0.0)  # the 2 s cooldown is over
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(status), type=ThreadStatus)
    assert decoded == status


def test_status_before_any_step() -> None:
    status = governor(Clock()).status()
    assert status.last_collapse is None and status.next_probe_s is None
    assert (status.fallbacks, status.collapses, status.probes) == (0, 0, 0)


def test_solo_board_counts_only_a_busy_self() -> None:
    board = SoloBoard()
    assert board.busy_workers(0.0) == 0
    board.mark_busy(5.0)
    assert board.busy_workers(4.0) == 1
    assert board.busy_workers(6.0) == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_threads": 0}, "max_threads"),
        ({"max_threads": True}, "max_threads"),
        ({"max_threads": 2.0}, "max_threads"),
        ({"cores": 0}, "cores"),
        ({"collapse_factor": 1.0}, "collapse_factor"),
        ({"collapse_factor": math.nan}, "collapse_factor"),
        ({"collapse_min_s": -1}, "collapse_min_s"),
        ({"window": 0}, "window"),
        ({"settle_steps": -1}, "settle_steps"),
        ({"settle_steps": 1.0}, "settle_steps"),
        ({"min_samples": 33}, "min_samples"),
        ({"cooldown_s": 0}, "cooldown_s"),
        ({"cooldown_s": 10.0, "cooldown_max_s": 5.0}, "cooldown_max_s"),
        ({"probe_steps": 0}, "probe_steps"),
        ({"probe_gain": 1.5}, "probe_gain"),
        ({"probe_gain": 0}, "probe_gain"),
        ({"busy_linger_s": math.inf}, "busy_linger_s"),
        ({"explore_s": 0}, "explore_s"),
        ({"explore_s": 60.0, "explore_max_s": 30.0}, "explore_max_s"),
        ({"explore_first_s": -1.0}, "explore_first_s"),
        ({"explore_first_s": math.inf}, "explore_first_s"),
    ],
)
def test_policy_refuses_bad_values_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    opts: dict[str, object] = {"max_threads": 2, "cores": 2, **kwargs}
    with pytest.raises(ConfigError) as err:
        ThreadPolicy(**opts)  # type: ignore[arg-type]
    assert err.value.details["field"] == f"threads.{field}"


@pytest.mark.parametrize(
    ("rows", "seconds", "kv_cells"),
    [(0, 0.01, 0), (True, 0.01, 0), (1, -0.5, 0), (1, "x", 0), (1, 0.01, -1), (1, 0.01, 2.0)],
)
def test_record_refuses_nonsense(rows: object, seconds: object, kv_cells: object) -> None:
    gov = governor(Clock())
    gov.threads_for(1)
    with pytest.raises(ValueError):
        gov.record(rows, seconds, kv_cells)  # type: ignore[arg-type]


@pytest.mark.parametrize(("rows", "kv_cells"), [(0, 0), (1, -1), (1, True)])
def test_threads_for_refuses_an_empty_step_or_negative_cells(rows: int, kv_cells: int) -> None:
    with pytest.raises(ValueError):
        governor(Clock()).threads_for(rows, kv_cells)


def test_a_step_builds_no_status_and_status_shows_the_last_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two calls around every decode leave the status to be built when
    asked (the worker asks once per step, at its publish), from the state the
    step left."""
    clock = Clock()
    gov = governor(clock, max_threads=2, cores=2)
    built: list[int] = []
    real = ThreadGovernor._build_snapshot

    def counting(self: ThreadGovernor) -> Any:
        built.append(1)
        return real(self)

    monkeypatch.setattr(ThreadGovernor, "_build_snapshot", counting)
    for _ in range(3):
        step(gov, clock, 10 * MS)
    assert built == []
    status = gov.status()
    assert (status.threads, status.busy_workers, status.budget) == (2, 1, 2)
    assert gov.status() == status
    assert built == [1]


def test_status_shows_every_change_since_it_was_last_asked() -> None:
    """status() reuses its last snapshot while nothing it shows has changed
    (the worker asks before every decode step); a count that moves alone,
    as a collapse at one thread does (nothing to fall back to), still shows."""
    clock = Clock()
    gov = governor(clock, max_threads=1, cores=1)
    warm(gov, clock, 10 * MS)
    first = gov.status()
    step(gov, clock, 10 * MS)
    assert gov.status() is first  # nothing it shows changed
    step(gov, clock, 2.0)
    after = gov.status()
    assert after.collapses == 1 and after.fallbacks == 0
    assert after.last_collapse is not None and after.last_collapse.threads == 1


# -- the quiet probe: a fallback ends once the other work has gone ----------------------


class Gauge:
    """Other processes' busy cores, as the test sets them (cpu_load.OthersGauge)."""

    def __init__(self, others: float | None) -> None:
        self.others = others
        self.asked = 0

    def sample(self, now: float) -> float | None:
        self.asked += 1
        return self.others


def long_cooldown(clock: Clock, gauge: Gauge) -> ThreadGovernor:
    """A governor fallen back to 1 thread whose cool-down has doubled to 32 s
    (probes failed while the hogs ran), 2 s after its last probe."""
    gov = ThreadGovernor(
        policy(cooldown_s=2.0, cooldown_max_s=60.0, probe_steps=2), clock=clock, gauge=gauge
    )
    collapse(gov, clock)
    warm(gov, clock, 25 * MS)
    for wait in (2.0, 4.0, 8.0, 16.0):  # each probe collapses against 1 thread
        clock.advance(wait)
        assert step(gov, clock, 90 * MS) == 2
    status = gov.status()
    assert (status.fallback, status.probes, status.probes_kept) == (True, 4, 0)
    assert status.cooldown_s == 32.0
    clock.advance(2.0)
    return gov


def test_a_fallback_probes_at_once_when_the_other_work_has_gone() -> None:
    clock, gauge = Clock(), Gauge(others=0.2)
    gov = long_cooldown(clock, gauge)
    assert [step(gov, clock, 11 * MS) for _ in range(2)] == [2, 2]  # 30 s early
    status = gov.status()
    assert (status.quiet_probes, status.probes, status.probes_kept) == (1, 5, 1)
    assert not status.fallback and status.ceiling == 2


def test_no_quiet_probe_while_other_processes_hold_the_cores() -> None:
    clock, gauge = Clock(), Gauge(others=1.9)  # a CPU hog per core, less a little
    gov = long_cooldown(clock, gauge)
    for _ in range(20):
        assert step(gov, clock, 25 * MS) == 1
    assert gauge.asked > 0
    assert gov.status().quiet_probes == 0
    gauge.others = 0.4
    assert step(gov, clock, 11 * MS) == 2
    assert gov.status().quiet_probes == 1


def test_an_unknown_load_waits_out_the_cooldown() -> None:
    clock, gauge = Clock(), Gauge(others=None)
    gov = long_cooldown(clock, gauge)
    assert step(gov, clock, 25 * MS) == 1
    clock.advance(30.0)  # 32 s after the last probe
    assert step(gov, clock, 11 * MS) == 2
    assert gov.status().quiet_probes == 0


def test_a_quiet_probe_waits_the_base_cooldown_after_the_last_probe() -> None:
    # Quiet other processes do not turn the fallback into a probe every
    # step: the base cool-down still separates a probe from the last one.
    clock, gauge = Clock(), Gauge(others=0.1)
    gov = long_cooldown(clock, gauge)
    assert step(gov, clock, 90 * MS) == 2  # the quiet probe, collapsing again
    assert gov.status().quiet_probes == 1
    clock.advance(1.9)
    assert step(gov, clock, 25 * MS) == 1
    clock.advance(0.2)
    assert step(gov, clock, 11 * MS) == 2
    assert gov.status().quiet_probes == 2


def test_no_exploration_while_other_processes_leave_the_cores_free() -> None:
    """Nothing competes: fewer threads cannot win, and a 'win' on the noise of
    four one-row steps lowered the ceiling for the prefill chunks after it."""
    clock, gauge = Clock(), Gauge(others=0.2)
    gov = ThreadGovernor(policy(explore_first_s=0.0, probe_steps=4), clock=clock, gauge=gauge)
    warm(gov, clock, 10 * MS, n=4)
    assert [step(gov, clock, 10 * MS) for _ in range(8)] == [2] * 8
    assert gov.status().explorations == 0 and gauge.asked > 0
    gauge.others = 1.0  # a hog on one of the two cores: worth a try
    assert [step(gov, clock, 5 * MS) for _ in range(4)] == [1] * 4
    status = gov.status()
    assert (status.explorations, status.explorations_kept, status.ceiling) == (1, 1, 1)


def test_an_unknown_load_waits_for_a_reading_before_exploring() -> None:
    # The worker's gauge answers None on its first reading after a pause.
    clock, gauge = Clock(), Gauge(others=None)
    gov = ThreadGovernor(policy(explore_first_s=0.0, probe_steps=4), clock=clock, gauge=gauge)
    warm(gov, clock, 10 * MS, n=4)
    assert step(gov, clock, 10 * MS) == 2
    assert gov.status().explorations == 0
    gauge.others = 1.2
    assert step(gov, clock, 5 * MS) == 1
    assert gov.status().explorations == 1


def test_without_a_gauge_a_worker_explores_as_before() -> None:
    clock = Clock()
    gov = governor(clock, explore_first_s=0.0, probe_steps=4)
    warm(gov, clock, 10 * MS, n=4)
    assert step(gov, clock, 5 * MS) == 1
    assert gov.status().explorations == 1


def test_a_worker_falling_back_reads_the_gauge_as_it_goes_idle() -> None:
    """The load over the idle gap tells the next request's first step whether
    the other work went meanwhile (a one-chunk cold prompt is one step)."""
    clock, gauge = Clock(), Gauge(others=1.9)
    gov = long_cooldown(clock, gauge)
    asked = gauge.asked
    gov.idle()
    assert gauge.asked == asked + 1
    clock.advance(1.0)
    gauge.others = 0.1  # the hogs went while the worker waited
    assert step(gov, clock, 1.0, rows=512) == 2  # the quiet probe, at once
    assert gov.status().quiet_probes == 1


def test_an_idle_worker_on_every_thread_reads_no_gauge() -> None:
    clock, gauge = Clock(), Gauge(others=0.0)
    gov = ThreadGovernor(policy(), clock=clock, gauge=gauge)
    warm(gov, clock, 10 * MS)
    gov.idle()
    assert gauge.asked == 0


def test_no_gauge_is_read_while_decoding_on_every_thread() -> None:
    clock, gauge = Clock(), Gauge(others=0.0)
    gov = ThreadGovernor(policy(), clock=clock, gauge=gauge)
    warm(gov, clock, 10 * MS, n=20)
    assert gauge.asked == 0
