"""P14 in the peers bench (bench/peers/contention.py): decode beside a CPU hog per core.

The rates and the verdict are pure and judged from per-round series like
every bar; the hogs are real child processes, seen gone however the block
that started them ends (and when the bench itself is SIGKILLed); llama-server's
stream is cut at its budget against a loopback server that stalls; the round
runs on fakes to see what is measured with the hogs running and in which order.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bench.common import show

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
rep = importlib.import_module("bench.peers_report")
render = importlib.import_module("bench.peers.render")
contention = importlib.import_module("bench.peers.contention")
workload = importlib.import_module("bench.peers.workload")
plots = importlib.import_module("bench.peers_plots")
LLAMAD, SERVER = rep.LLAMAD, rep.SERVER


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# -- the pure parts -----------------------------------------------------------------------


def test_window_rates_count_tokens_per_window_up_to_the_streams_end() -> None:
    times = [0.1, 0.5, 0.9, 1.0, 1.5, 2.2, 9.0]
    # Windows [0,1) [1,2) [2,2.5]: 1.0 counts in the second; 9.0 is past the end.
    assert rep.window_rates(times, 2.5) == [3.0, 2.0, 2.0]  # 1 token over the last 0.5 s
    assert rep.window_rates(times, 2.5, width=2.0) == [2.5, 2.0]  # 5 tokens over 2 s
    assert rep.window_rates([], 3.0) == [0.0, 0.0, 0.0]  # a stall is zeros, not nothing
    assert rep.window_rates([0.1], 0.0) == []
    with pytest.raises(ValueError):
        rep.window_rates(times, 2.0, width=0.0)


def test_the_decode_window_starts_at_the_first_token_and_ends_at_the_budgets_end() -> None:
    s = contention.Stream(10.0, (10.5, 11.0, 11.5), 14.5)  # cut at 14.5, stalled after 11.5
    assert contention.decode_window(s) == (2, 4.0)  # not 2 tokens over 1.0 s
    assert s.timeline() == [0.5, 1.0, 1.5] and s.span_s == 4.5
    # No token in the budget: nothing decoded over the whole span.
    assert contention.decode_window(contention.Stream(10.0, (), 30.0)) == (0, 20.0)
    assert contention.decode_window(contention.Stream(10.0, (29.0,), 30.0)) == (0, 1.0)


def test_a_cut_stream_ends_at_its_deadline_one_that_finished_at_its_last_token() -> None:
    cut = contention.ended(0.0, [1.0, 2.0], 20.0, False)
    assert cut.end == 20.0
    done = contention.ended(0.0, [1.0, 2.0], 20.0, True)
    assert done.end == 2.0
    assert contention.ended(0.0, [1.0, 21.0], 20.0, False).arrivals == (1.0,)


# -- the verdict ----------------------------------------------------------------------------


def p14(rounds: int = 2, **rates: list[float]) -> Any:
    """Results with P14 series: ``llamad__default__hogs=[tok/s per round]``;
    each rate as tokens over 20 s."""
    r = rep.Results(rounds=rounds, sizes=(512,))
    for k, values in rates.items():
        system, config, phase = k.replace("server", SERVER).split("__")
        for v in values:
            r.add(v * 20.0, "p14", system, config, phase, "tokens")
            r.add(20.0, "p14", system, config, phase, "seconds")
    return r


def row(r: Any, config: str = "default") -> Any:
    return next(b for b in rep.bars(r) if b.id == "P14" and config in b.what)


def test_p14_pairs_llamad_with_llama_server_beside_the_hogs_round_by_round() -> None:
    r = p14(llamad__default__hogs=[40.0, 60.0], server__default__hogs=[0.5, 5.0])
    b = row(r)
    assert (b.measured, b.bar, b.verdict) == ("46 (12-80)", ">= 10x", "met")  # 80x and 12x
    r = p14(llamad__default__hogs=[40.0, 40.0], server__default__hogs=[2.0, 5.0])
    assert row(r).verdict == "within noise"  # 20x and 8x straddle the bar
    r = p14(llamad__default__hogs=[40.0, 40.0], server__default__hogs=[5.0, 8.0])
    assert row(r).verdict == "BELOW BAR"  # 8x and 5x


def test_a_llama_server_that_decoded_nothing_gives_a_lower_bound_not_a_division_by_zero() -> None:
    r = p14(llamad__default__hogs=[40.0, 40.0], server__default__hogs=[0.0, 0.5])
    ratios, bounded = rep.p14_ratios(r, "default")
    # Round 1: no token in 20 s, taken as 1 token / 20 s: 40 / 0.05 = 800x at least.
    assert ratios == pytest.approx([800.0, 80.0]) and bounded == [1]
    b = row(r)
    assert b.verdict == "met" and b.measured.startswith(">= 440 (80-800)")
    assert "decoded no token in round(s) 1" in b.measured


def test_the_one_thread_pair_is_information_and_each_system_keeps_a_share_of_quiet() -> None:
    r = p14(
        llamad__default__hogs=[40.0, 50.0],
        llamad__default__quiet=[100.0, 100.0],
        llamad__1__hogs=[20.0, 20.0],
        server__1__hogs=[10.0, 10.0],
    )
    one = row(r, "1 thread")
    assert (one.measured, one.bar, one.verdict) == ("2 (2-2)", "-", "information")
    assert rep.p14_fraction(r, LLAMAD, "default") == pytest.approx([0.4, 0.5])
    # llama-server at its default was not measured: the run says why.
    r.skipped[SERVER] = "--skip"
    assert row(r).verdict == "not measured (llama-server: --skip)"


def test_the_report_shows_p14_its_table_and_a_note_and_renders_from_json() -> None:
    r = p14(
        llamad__default__hogs=[6.0, 7.0],
        llamad__default__quiet=[100.0, 100.0],
        server__default__hogs=[1.0, 1.0],
        server__default__quiet=[110.0, 110.0],
    )
    r.timeline = {"llamad/default/hogs/0": [0.1, 0.2], "llama-server/default/hogs/0": [3.0]}
    params = {"rounds": r.rounds, "sizes": list(r.sizes), "plots": []}
    data = json.loads(json.dumps(rep.results_data(r)))
    assert rep.results_of(params, data) == r
    text = show("bench.peers.render:render", params, data)
    assert "### Bars (SPEC P1-P9, P12, P14)" in text
    assert "### Beside a CPU hog per core (P14)" in text
    line = next(x for x in text.splitlines() if x.startswith("| P14") and "default" in x)
    assert line.rstrip(" |").endswith("BELOW BAR")  # 6x and 7x
    assert "- P14 (BELOW BAR): beside a CPU hog per core llamad decoded 6.5 tok/s" in text
    assert "(6.5% of its quiet rate)" in text


def test_the_note_says_so_when_a_system_decoded_nothing_quiet() -> None:
    # A loaded machine can collapse a default llama-server with no hog at all.
    r = p14(
        llamad__default__hogs=[6.0],
        llamad__default__quiet=[10.0],
        server__default__hogs=[1.0],
        server__default__quiet=[0.0],
    )
    text = render.report(r)
    assert "(60% of its quiet rate) against llama-server's 1 (no quiet rate to compare" in text


def test_a_record_from_before_p14_renders_as_before() -> None:
    r = rep.Results(rounds=1, sizes=(512,))
    r.add(10.0, "ttft", LLAMAD, "ram", 512)
    data = rep.results_data(r)
    del data["timeline"]  # older records have none
    back = rep.results_of({"rounds": 1, "sizes": [512]}, data)
    assert back.timeline == {}
    assert "P14" not in render.report(back) and not rep.has_p14(back)


def test_the_plot_lines_are_each_streams_windows_beside_the_hogs_only() -> None:
    r = p14(llamad__default__hogs=[1.0])
    r.series["p14/llamad/default/hogs/span_s"] = [2.5]
    r.timeline = {
        "llamad/default/hogs/0": [0.2, 0.4, 1.1],
        "llamad/default/quiet/0": [0.1],
    }
    lines = plots.contention_lines(r)
    assert lines == {(LLAMAD, "default", 0): ([0.0, 1.0, 2.0, 2.5], [2.0, 1.0, 0.0, 0.0])}


# -- llama-server's stream, cut at its budget -----------------------------------------------


class _Stalling(BaseHTTPRequestHandler):
    """Streams two tokens, then nothing until the client goes."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in ("1", ","):
            data = f"data: {json.dumps({'content': piece, 'stop': False})}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        with contextlib.suppress(OSError):
            self.server.stall.wait(30)  # type: ignore[attr-defined]

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stalling() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stalling)
    server.stall = threading.Event()  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stall.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


def test_a_stalled_llama_server_stream_is_cut_at_its_budget(stalling: Any) -> None:
    fake = SimpleNamespace(port=stalling.server_address[1])
    started = time.perf_counter()
    s = contention.server_stream(fake, [1, 2, 3], 1.0)
    took = time.perf_counter() - started
    assert len(s.arrivals) == 2
    assert s.end == pytest.approx(s.sent + 1.0)  # cut at the budget, not at the last token
    assert took < 20  # bounded by the budget, not by a token count
    assert contention.decode_window(s)[0] == 1


def test_a_server_still_busy_after_a_cut_is_restarted() -> None:
    restarts: list[int] = []
    fake = SimpleNamespace(restart=lambda: restarts.append(1))
    assert contention.settle_server(fake, lambda _: False, timeout_s=1.0) is True
    assert restarts == []
    assert contention.settle_server(fake, lambda _: True, timeout_s=0.2) is False
    assert restarts == [1]


# -- the round ------------------------------------------------------------------------------


def test_a_round_measures_every_system_quiet_and_beside_running_hogs_in_rotation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, str, bool]] = []
    live: list[Any] = []

    class Hogs(contention.Hogs):
        def start(self) -> None:
            super().start()
            live.append(self)

    def stream(system: str) -> Any:
        def run(target: Any, *args: Any) -> Any:
            running = any(h.running() for h in live)
            config = "default" if target in ("main", "server") else "1"
            seen.append((system, config, running))
            now = time.perf_counter()
            return contention.Stream(now, (now + 0.1, now + 0.2, now + 0.3), now + 1.0)

        return run

    monkeypatch.setattr(contention, "Hogs", Hogs)
    monkeypatch.setattr(contention, "HOG_SETTLE_S", 0.0)
    monkeypatch.setattr(
        contention, "llamad_stream", lambda d, m, p, b: stream(LLAMAD)(d.name, p, b)
    )
    monkeypatch.setattr(contention, "server_stream", lambda s, p, b: stream(SERVER)(s.name, p, b))
    monkeypatch.setattr(contention, "settle_server", lambda s: True)
    rig = SimpleNamespace(
        sizes=workload.Sizes.quick(),
        threads=1,
        llamad=SimpleNamespace(name="main"),
        llamad_one=SimpleNamespace(name="one"),
        server=SimpleNamespace(name="server"),
        server_one=SimpleNamespace(name="server-one"),
        tokenize=lambda text: [len(w) for w in text.split()],
        log=lambda msg: None,
    )
    res = rep.Results(rounds=2, sizes=(512,))
    contention.contention_round(rig, res, 0)
    first = seen[:]
    seen.clear()
    contention.contention_round(rig, res, 1)
    everyone = {(LLAMAD, "default"), (LLAMAD, "1"), (SERVER, "default"), (SERVER, "1")}
    # Round 0: quiet first, then every system with the hogs running.
    assert [x[2] for x in first] == [False] * 4 + [True] * 4
    assert {x[:2] for x in first[:4]} == {x[:2] for x in first[4:]} == everyone
    # Round 1: the hogs first, the systems' order rotated by one.
    assert [x[2] for x in seen] == [True] * 4 + [False] * 4
    assert [x[:2] for x in seen[:4]] == [x[:2] for x in first[1:4]] + [first[0][:2]]
    assert all(not h.running() and h.procs == [] for h in live)  # every hog reaped
    assert rep.p14_rates(res, LLAMAD, "default", "hogs") == pytest.approx([2 / 0.9, 2 / 0.9])
    assert set(res.timeline) >= {"llama-server/1/hogs/0", "llama-server/1/quiet/1"}
