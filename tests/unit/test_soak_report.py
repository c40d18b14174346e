"""bench/soak.py judges its own bars: lost and duplicated replies, typed errors,
own-RSS growth like for like, fds, threads, and the kills' restart window."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from bench.common import show

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
sr = importlib.import_module("bench.soak_report")
lg = importlib.import_module("bench.soak_ledger")
procs = importlib.import_module("bench.soak_procs")

MB = 1024  # kB


def bar(bars: list[Any], start: str) -> Any:
    return next(b for b in bars if b.name.startswith(start))


def judge(ledger: Any, grown: Sequence[Any] = (), kills: list[Any] | None = None) -> list[Any]:
    """The bars of a run that compared ``grown`` and killed as ``kills`` (one kill
    of a worker that came back, by default: the kill bar needs at least one)."""
    kills = [sr.Kill(60, "a", 1, 2.0)] if kills is None else kills
    result: list[Any] = sr.judge(ledger, list(grown), [], kills, [])
    return result


# -- the ledger ----------------------------------------------------------------------


def test_a_request_without_a_terminal_is_lost_and_one_with_two_is_duplicated() -> None:
    ledger = lg.Ledger()
    ok = ledger.start("complete", "a")
    ledger.end(ok, lg.OK)
    never = ledger.start("stream", "a")
    twice = ledger.start("stream", "b")
    ledger.end(twice, lg.OK)
    ledger.end(twice, lg.error_outcome("worker_crashed"))
    s = ledger.summary()
    assert s.lost == [never]
    assert s.duplicated == [twice]
    assert (s.total.started, s.total.served, s.total.lost, s.total.duplicated) == (3, 2, 1, 1)
    assert bar(judge(s), "no reply lost").verdict == "FAILED"


def test_a_timeout_is_a_reply_that_never_came() -> None:
    ledger = lg.Ledger()
    rid = ledger.start("complete", "a")
    ledger.end(rid, lg.error_outcome("timeout"))
    s = ledger.summary()
    assert s.lost == [rid]
    assert s.total.errors == 0
    assert bar(judge(s), "no reply lost").verdict == "FAILED"


def test_every_request_answered_once_with_expected_codes_meets_both_bars() -> None:
    ledger = lg.Ledger()
    for outcome in (lg.OK, lg.CANCELLED, lg.error_outcome("worker_crashed")):
        ledger.end(ledger.start("stream", "a"), outcome)
    ledger.end(ledger.start("end_session", "b"), lg.error_outcome("no_session"))
    s = ledger.summary()
    assert s.errors == {"worker_crashed": Counter(stream=1), "no_session": Counter(end_session=1)}
    bars = judge(s)
    assert bar(bars, "no reply lost").verdict == "met"
    assert bar(bars, "every error typed").verdict == "met"


@pytest.mark.parametrize(
    "outcome",
    [lg.error_outcome("sticky_busy"), lg.untyped_outcome(RuntimeError("boom"))],
    ids=["unexpected code", "untyped"],
)
def test_an_untyped_failure_or_an_unexpected_code_fails_the_error_bar(outcome: str) -> None:
    ledger = lg.Ledger()
    ledger.end(ledger.start("complete", "a"), outcome)
    ledger.end(ledger.start("complete", "a"), lg.OK)
    assert bar(judge(ledger.summary()), "every error typed").verdict == "FAILED"


def test_a_reply_to_another_prompt_fails_the_lost_bar() -> None:
    ledger = lg.Ledger()
    ledger.end(ledger.start("complete", "a"), lg.MISMATCH)
    s = ledger.summary()
    assert s.total.mismatched == 1
    assert bar(judge(s), "no reply lost").verdict == "FAILED"


# -- growth --------------------------------------------------------------------------

W = sr.Windows(warmup=120, span=30, end=600, age=60)


def series(
    role: str, pid: int, times: range, own_mb: float, step_mb: float = 0.0, **kw: int
) -> list[Any]:
    """Samples of one process at ``times``, its own RSS growing ``step_mb`` a sample."""
    return [
        sr.Sample(
            t=float(t),
            pid=pid,
            role=role,
            rss_kb=int((own_mb + 100) * MB),
            own_kb=int((own_mb + step_mb * i) * MB),
            fds=kw.get("fds", 20),
            threads=kw.get("threads", 4),
        )
        for i, t in enumerate(times)
    ]


def test_a_long_lived_process_is_compared_after_warm_up_not_from_its_start() -> None:
    # 30 MB gained during warm-up, then flat: no growth after warm-up.
    samples = series("front", 7, range(0, 120, 5), 10, step_mb=30 / 24) + series(
        "front", 7, range(120, 605, 5), 40
    )
    g = sr.long_lived_growth(samples, "front", W)
    assert g is not None
    assert g.growth_mb == pytest.approx(0.0)
    assert bar(judge(lg.Ledger().summary(), [g]), "own RSS").verdict == "met"


def test_a_leak_after_warm_up_is_above_the_bar() -> None:
    samples = series("cache-meta", 7, range(0, 605, 5), 40, step_mb=0.3)  # +36 MB after warm-up
    g = sr.long_lived_growth(samples, "cache-meta", W)
    assert g is not None
    assert g.growth_mb == pytest.approx(0.3 * (600 - 15 - 120 - 15) / 5, abs=1)
    assert bar(judge(lg.Ledger().summary(), [g]), "own RSS").verdict == "ABOVE BAR"


@pytest.mark.parametrize(
    ("value", "noise", "expected"),
    [(12.0, 5.0, "met"), (18.0, 5.0, "within noise"), (26.0, 5.0, "ABOVE BAR"), (20.0, 0.0, "met")],
)
def test_the_rss_bar_is_met_only_clear_of_its_noise(
    value: float, noise: float, expected: str
) -> None:
    assert sr.upper_verdict(value, noise, sr.RSS_BAR_MB) == expected


def test_workers_are_compared_fresh_and_at_the_same_age() -> None:
    # Each worker grows 1 MB per sample over its life; every one is killed at
    # 120 s of age. The first (born before the warm-up ended) is left out, and
    # growth within a life is not growth across lives.
    samples = []
    for n, born in enumerate(range(0, 600, 120)):
        samples += series(
            "model.a", 100 + n, range(born + 2, min(born + 120, 600), 5), 200, step_mb=1
        )
    g = sr.worker_growth(samples, "model.a", W)
    assert g is not None
    assert g.pids == [101, 102, 103, 104]
    assert g.growth_mb == pytest.approx(0.0)
    # The samples 60 to 90 s into its life, the 13th to the 18th: median 214.5.
    assert g.ref_mb == pytest.approx(200 + 14.5)


def test_workers_that_grow_from_life_to_life_are_caught() -> None:
    samples = []
    for n, born in enumerate(range(0, 600, 120)):
        samples += series("model.b", 100 + n, range(born, min(born + 120, 600), 5), 200 + 10 * n)
    g = sr.worker_growth(samples, "model.b", W)
    assert g is not None
    assert g.growth_mb == pytest.approx(30.0)  # lives 1 (210) to 4 (240)


def test_fewer_than_two_fresh_workers_cannot_be_compared_and_the_bar_says_so() -> None:
    samples = series("model.a", 1, range(0, 200, 5), 200) + series(
        "model.a", 2, range(200, 600, 5), 200
    )
    samples += series("front", 7, range(0, 605, 5), 40)
    assert sr.worker_growth(samples, "model.a", W) is None
    grown, missing = sr.growths(samples, W)
    assert [g.role for g in grown] == ["front"]
    bars = sr.judge(lg.Ledger().summary(), grown, missing, [sr.Kill(60, "a", 1, 2.0)], [])
    assert bar(bars, "own RSS").verdict == "incomplete"


# -- fds, threads, kills -------------------------------------------------------------


def test_a_transient_fd_peak_is_not_growth_but_a_higher_count_at_the_end_is() -> None:
    steady = series("front", 7, range(0, 605, 5), 40, fds=30)
    peak = [
        s if s.t != 130 else sr.Sample(130, 7, "front", s.rss_kb, s.own_kb, 45, 4) for s in steady
    ]
    g = sr.long_lived_growth(peak, "front", W)
    assert g is not None and (g.fds_ref, g.fds_end) == (45, 30)
    assert bar(judge(lg.Ledger().summary(), [g]), "no fd growth").verdict == "met"
    grows = series("root", 1, range(0, 400, 5), 40, fds=30) + series(
        "root", 1, range(400, 605, 5), 40, fds=33
    )
    g = sr.long_lived_growth(grows, "root", W)
    assert g is not None
    assert bar(judge(lg.Ledger().summary(), [g]), "no fd growth").verdict == "FAILED"


def test_threads_past_the_most_seen_by_the_end_of_warm_up_fail_the_bound() -> None:
    ok = series("front", 7, range(0, 150, 5), 40, threads=11) + series(
        "front", 7, range(150, 605, 5), 40, threads=9
    )
    g = sr.long_lived_growth(ok, "front", W)
    assert g is not None and bar(judge(lg.Ledger().summary(), [g]), "threads").verdict == "met"
    more = ok + series("front", 7, range(605, 610, 5), 40, threads=12)
    g = sr.long_lived_growth(more, "front", W)
    assert g is not None and bar(judge(lg.Ledger().summary(), [g]), "threads").verdict == "FAILED"


def test_one_kill_a_minute_alternating_stays_inside_the_restart_window() -> None:
    kills = [sr.Kill(60.0 * i, "ab"[i % 2], i, 2.0) for i in range(1, 10)]
    assert sr.most_kills_in_period(kills) == 1
    assert bar(judge(lg.Ledger().summary(), kills=kills), "restarts").verdict == "met"
    fast = [sr.Kill(15.0 * i, "a", i, 2.0) for i in range(1, 5)]  # 4 within 60 s
    assert sr.most_kills_in_period(fast) == 4
    assert bar(judge(lg.Ledger().summary(), kills=fast), "restarts").verdict == "FAILED"


def test_a_worker_that_never_came_back_or_a_model_given_up_fails_the_restart_bar() -> None:
    s = lg.Ledger().summary()
    assert bar(judge(s, kills=[sr.Kill(60, "a", 1, None)]), "restarts").verdict == "FAILED"
    bars = sr.judge(s, [], [], [sr.Kill(60, "a", 1, 2.0)], ["a (crashed)"])
    assert bar(bars, "restarts").verdict == "FAILED"


# -- /proc parsing -------------------------------------------------------------------

SMAPS = """\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
Rss:                 132 kB
Pss:                 132 kB
7fd4be5b3000-7fd4c41cf000 r--s 001b3000 fe:00 16056504                   /m/SmolLM2.Q4_1.gguf
Size:              94320 kB
Rss:               94320 kB
7fd4c41cf000-7fd4c41d0000 r--p 00000000 fe:00 1                          /usr/lib/libc.so.6
Rss:                   4 kB
7fd4c5000000-7fd4c5100000 r--p 00000000 fe:00 16056504                   /m/other.gguf
Rss:                 100 kB
"""


def test_only_the_gguf_mappings_count_as_weights() -> None:
    assert procs.gguf_rss_kb(SMAPS) == 94320 + 100


def test_status_gives_rss_shared_memory_and_threads() -> None:
    text = "Name:\tpython\nVmRSS:\t  217956 kB\nRssShmem:\t    2048 kB\nThreads:\t4\n"
    assert procs.status_fields(text) == {"VmRSS": 217956, "RssShmem": 2048, "Threads": 4}


def test_fd_kinds_that_changed_are_named_with_their_change() -> None:
    before = Counter({"socket": 10, "pipe": 4, "/run/actors/model.a.status": 1})
    after = Counter({"socket": 12, "pipe": 3, "/run/actors/model.a.status": 1})
    assert sr.fd_diff(before, after) == "-1 pipe, +2 socket"


def test_a_workers_other_exits_count_in_its_restart_window() -> None:
    # One kill a minute per model is inside the window; a liveness kill of the
    # same model's workers twice in the same minute takes it past 3.
    kills = [sr.Kill(60, "a", 11, 2.0), sr.Kill(120, "b", 12, 2.0)]
    hung = [sr.Exit(70 + i, "model.a", 20 + i, "abnormal, SIGKILL, hung") for i in range(3)]
    by_killer = sr.Exit(60, "model.a", 11, "abnormal, signal SIGKILL")
    assert sr.unexplained([by_killer, *hung], kills) == hung
    s = lg.Ledger().summary()
    one = sr.judge(s, [], [], kills, [], exits=[by_killer, hung[0]])
    assert bar(one, "restarts").verdict == "met"
    assert "model.a pid 20 at 70 s" in bar(one, "restarts").value
    assert bar(sr.judge(s, [], [], kills, [], exits=[by_killer, *hung]), "restarts").verdict == (
        "FAILED"
    )


def test_a_workers_threads_are_bounded_by_the_first_fresh_workers_life() -> None:
    # The worker alive at the start ran 9 threads before it first saved; every
    # fresh one runs 13 once it has: that is no growth. A later one at 14 is.
    def run(last: int) -> Any:
        samples = series("model.a", 100, range(0, 120, 5), 200, threads=9)
        for n, born in enumerate(range(120, 600, 120)):
            samples += series("model.a", 101 + n, range(born, born + 120, 5), 200, threads=13)
        samples += series("model.a", 200, range(600, 700, 5), 200, threads=last)
        return sr.worker_growth(samples, "model.a", W)

    assert bar(judge(lg.Ledger().summary(), [run(13)]), "threads").verdict == "met"
    assert bar(judge(lg.Ledger().summary(), [run(14)]), "threads").verdict == "FAILED"


def test_the_report_shows_every_bar_and_marks_an_unexpected_code() -> None:
    ledger = lg.Ledger()
    ledger.end(ledger.start("stream", "a"), lg.error_outcome("worker_crashed"))
    ledger.end(ledger.start("complete", "b"), lg.error_outcome("sticky_busy"))
    s = ledger.summary()
    bars = judge(s)
    text = sr.report(
        settings={"load": "1.0"}, ledger=s, grown=[], kills=[], bars=bars, plots=["x.png"]
    )
    for b in bars:
        assert f"| {b.name}" in text
    assert "| sticky_busy " in text and "UNEXPECTED" in text
    assert lg.EXPECTED_CODES["worker_crashed"] in text
    assert "![x.png](x.png)" in text


def test_an_exited_unreaped_process_is_not_sampled_as_some_other_role() -> None:
    # A killed worker stays a zombie until its supervisor reaps it; sampled
    # then, it had no cmdline and showed up as a role of its own.
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while "State:\tZ" not in Path(f"/proc/{child.pid}/status").read_text():
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        assert procs.sample(child.pid, root=os.getpid(), t=0.0) is None
        assert procs.sample(os.getpid(), root=os.getpid(), t=0.0).role == "root"
    finally:
        child.wait()


# -- the recorded run ----------------------------------------------------------------


def recorded(requests: list[list[Any]], samples: list[Any], kills: list[Any]) -> tuple[Any, Any]:
    """``params`` and ``data`` as bench/soak.py records them."""
    fds = {(s.t, s.pid): Counter(socket=s.fds - 2, pipe=2) for s in samples}
    params = {
        "minutes": 10.0,
        "kill_every_s": 60.0,
        "warmup_s": W.warmup,
        "span_s": W.span,
        "age_s": W.age,
        "ram_quota": "32MiB",
        "ram_file_quota": "32MiB",
        "disk_quota": "64MiB",
        "models": {"a": 4096, "b": 2048},
        "threads": 12,
        "async_tasks": 4,
        "load_start": 1.5,
        "plots": ["soak-x-rss.png"],
    }
    data = {
        "end_s": W.end,
        "samples": [sr.sample_data(s) for s in samples],
        "fd_kinds": sr.picked_fds(samples, fds, W),
        "load": [1.0, 2.0, 3.0],
        "kills": [[k.t, k.model, k.pid, k.back_s] for k in kills],
        "exits": [],
        "requests": requests,
        "models": {
            "a": {"state": "ready", "restarts": 1, "error": None},
            "b": {"state": "ready", "restarts": 0, "error": None},
        },
        "counters": {"hits_exact": 3, "misses": 4},
        "log_problems": 0,
        "exit_code": 0,
        "stuck": [],
    }
    return json.loads(json.dumps(params)), json.loads(json.dumps(data))


def test_a_recorded_run_is_judged_from_its_requests_samples_and_kills() -> None:
    ledger = lg.Ledger()
    ledger.end(ledger.start("stream", "a"), lg.OK)
    ledger.end(ledger.start("complete", "b"), lg.error_outcome("worker_crashed"))
    flat = series("front", 7, range(0, 605, 5), 40)
    kills = [sr.Kill(60.0, "a", 11, 0.5)]
    params, data = recorded(ledger.requests(), flat, kills)
    text = show("bench.soak_report:render", params, data)
    assert all(b.verdict == "met" for b in sr.run_bars(params, data))
    assert "| no reply lost or duplicated " in text and "of 2 " in text
    assert "- load average (1 min): 1.50 at start; during the run median 2.00, max 3.00" in text
    assert "- cache: hits_exact 3, misses 4" in text
    assert "- front's view at the end: a ready, 1 restarts; b ready, 0 restarts" in text
    assert "| 60    | a     | 11  | 0.5" in text and "![soak-x-rss.png](soak-x-rss.png)" in text
    # A request that never ended, and fds that grew: judged from the data.
    never = ledger.start("stream", "a")
    grew = series("front", 7, range(0, 570, 5), 40) + series(
        "front", 7, range(570, 605, 5), 40, fds=23
    )
    params, data = recorded(ledger.requests(), grew, kills)
    bars = sr.run_bars(params, data)
    assert bar(bars, "no reply lost").verdict == "FAILED"
    assert bar(bars, "no fd growth").verdict == "FAILED"
    text = show("bench.soak_report:render", params, data)
    assert "- front: +3 socket" in text  # the fd kinds of the two samples compared
    assert sr.run_of(params, data).ledger.lost == [never]


def test_the_ledgers_requests_count_the_same_as_its_summary() -> None:
    ledger = lg.Ledger()
    for outcome in (lg.OK, lg.CANCELLED, lg.MISMATCH, lg.untyped_outcome(ValueError("x"))):
        ledger.end(ledger.start("stream", "a"), outcome)
    twice = ledger.start("complete", "b")
    ledger.end(twice, lg.OK)
    ledger.end(twice, lg.error_outcome("timeout"))
    ledger.start("embed", "a")
    assert lg.summarize(json.loads(json.dumps(ledger.requests()))) == ledger.summary()
