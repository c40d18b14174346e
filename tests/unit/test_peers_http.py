"""Issue 19's HTTP bars in the peers bench: P10, P11 and HTTP's cost over the Client.

The report rows are judged from per-round series like every bar
(bench/peers_report.py); the SSE reader is fed the bytes both servers send;
the client is run against a loopback HTTP/1.1 server to see it keeps one
connection; the round is run on fakes to see what it sends, in which order.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    FinishReason,
    Stats,
    TokenSources,
)

pytestmark = pytest.mark.timeout(60)

rep = importlib.import_module("bench.peers_report")
render = importlib.import_module("bench.peers.render")
http_sse = importlib.import_module("bench.peers.http_sse")
http_round = importlib.import_module("bench.peers.http_round")
workload = importlib.import_module("bench.peers.workload")
LLAMAD, SERVER = rep.LLAMAD, rep.SERVER


def results(sizes: tuple[int, ...] = (512, 1024, 2048), **series: list[float]) -> Any:
    r = rep.Results(rounds=3, sizes=sizes)
    for k, v in series.items():
        r.series[k.replace("__", "/")] = v
    return r


def bar(r: Any, id_: str, contains: str = "") -> Any:
    return next(b for b in rep.bars(r) if b.id == id_ and contains in b.what)


WARM = {"http-cached__llamad__http__ram__2048": [2048.0, 2048.0]}


# -- the report ---------------------------------------------------------------------------


def test_p10_pairs_llamads_gateway_with_llama_servers_ram_cache_hit_round_by_round() -> None:
    r = results(
        **{
            "http-ttft__llamad__http__ram__2048": [9.0, 12.0],
            "http-ttft__llama-server__http__ram-cache__2048": [20.0, 20.0],
        },
        **WARM,
    )
    assert bar(r, "P10").verdict == "within noise"  # 0.45 and 0.6 against 0.5
    r.series["http-ttft/llamad/http/ram/2048"] = [9.0, 10.0]
    assert bar(r, "P10").verdict == "met"
    r.series["http-ttft/llamad/http/ram/2048"] = [11.0, 12.0]
    assert bar(r, "P10").verdict == "ABOVE BAR"


def test_p10_is_not_measured_when_llamads_repeat_was_not_warm_or_was_served_live() -> None:
    r = results(
        **{
            "http-ttft__llamad__http__ram__2048": [9.0, 9.0],
            "http-ttft__llama-server__http__ram-cache__2048": [20.0, 20.0],
            "http-cached__llamad__http__ram__2048": [2048.0, 0.0],
        }
    )
    assert bar(r, "P10").verdict == "NOT MEASURED (llamad's repeat was not warm in round(s) 2)"
    r.series["http-cached/llamad/http/ram/2048"] = [2048.0, 2048.0]
    r.series["http-live/llamad/client/ram/2048"] = [0.0, 2048.0]
    assert bar(r, "P10").verdict.startswith(
        "NOT MEASURED (the Client's repeat after the same fillers was served live in round(s) 2"
    )
    r.series["http-live/llamad/client/ram/2048"] = [0.0, 0.0]
    assert bar(r, "P10").verdict == "met"


def test_p11_is_the_four_stream_rate_through_http_against_llama_servers() -> None:
    r = results(
        **{
            "http-decode__llamad__http__4": [300.0, 290.0],
            "http-decode__llama-server__http__4": [280.0, 300.0],
        }
    )
    assert bar(r, "P11").verdict == "within noise"  # 1.07 and 0.97 against 1.0
    r.series["http-decode/llamad/http/4"] = [300.0, 310.0]
    assert bar(r, "P11").verdict == "met"


def test_http_overhead_is_the_first_token_difference_and_the_decode_ratio_per_round() -> None:
    r = results(
        **{
            "http-run__llamad__http__2048": [5.5, 6.9],
            "http-run__llamad__client__2048": [5.0, 5.0],
            "http-ttft__llamad__http__repeat__2048": [5.2, 5.3],
            "http-ttft__llamad__client__repeat__2048": [5.0, 5.0],
            "http-decode__llamad__http__1": [95.0, 100.0],
            "http-decode__llamad__client__1": [100.0, 100.0],
            "http-decode__llamad__http__4": [280.0, 290.0],
            "http-decode__llamad__client__4": [300.0, 300.0],
        }
    )
    # Judged on the runs of back-to-back repeats (run medians), not on the
    # first repeat after the cold reply, which is information.
    first = bar(r, "HTTP", "first token, back-to-back repeats")
    assert (first.bar, first.verdict) == ("<= 1 ms", "within noise")  # +0.5 and +1.9 ms
    assert first.measured == "1.2 (0.5-1.9)"
    after_cold = bar(r, "HTTP", "first repeat after the cold reply")
    assert (after_cold.bar, after_cold.verdict) == ("-", "information")
    assert bar(r, "HTTP", "1 stream").verdict == "met"  # 0.95, 1.0
    assert bar(r, "HTTP", "4 stream").verdict == "within noise"  # 0.93, 0.97
    r.series["http-decode/llamad/http/4"] = [280.0, 282.0]
    assert bar(r, "HTTP", "4 stream").verdict == "BELOW BAR"  # 0.93, 0.94
    r.series["http-run/llamad/http/2048"] = [5.5, 5.9]
    assert bar(r, "HTTP", "first token, back-to-back repeats").verdict == "met"
    # The tier path's difference is information: its restore varies more than 1 ms.
    r.series["http-ttft/llamad/http/ram/2048"] = [9.0, 30.0]
    r.series["http-ttft/llamad/client/ram/2048"] = [8.0, 8.0]
    tier = bar(r, "HTTP", "from a tier")
    assert (tier.measured, tier.bar, tier.verdict) == ("11.5 (1-22)", "-", "information")


def test_a_run_without_llama_server_says_why_p10_and_p11_are_not_measured() -> None:
    r = results(**{"http-ttft__llamad__http__ram__2048": [9.0]})
    r.skipped[SERVER] = "--skip"
    assert bar(r, "P10").verdict == "not measured (llama-server: --skip)"
    assert bar(r, "P11").verdict == "not measured (llama-server: --skip)"


def test_a_record_without_http_series_renders_as_before() -> None:
    # Older result files have no http-* series: no new row, title or section.
    r = results(ttft__llamad__ram__2048=[10.0, 11.0])
    assert not {b.id for b in rep.bars(r)} & {"P10", "P11", "HTTP"}
    text = render.report(r)
    assert "### Bars (SPEC P1-P9, P12)" in text and "Through HTTP" not in text
    assert "gateway" not in text


def test_the_report_has_the_http_section_and_notes_from_the_runs_numbers() -> None:
    r = results(
        **{
            "http-ttft__llamad__http__ram__2048": [30.0, 32.0],
            "http-ttft__llamad__client__ram__2048": [28.0, 29.0],
            "http-ttft__llama-server__http__ram-cache__2048": [40.0, 40.0],
            "http-cached__llama-server__http__ram-cache__2048": [2047.0, 2047.0],
            "http-decode__llamad__http__4": [200.0, 210.0],
            "http-decode__llamad__client__4": [250.0, 250.0],
            "http-decode__llama-server__http__4": [240.0, 240.0],
            "p9__llamad__gateway": [61.0],
            "p9__llamad__mb": [300.0],
        },
        **WARM,
    )
    text = render.report(r)
    assert "### Bars (SPEC P1-P12, issue 19's HTTP)" in text
    assert "### Through HTTP (P10, P11, HTTP overhead)" in text
    table = render.http_table(r)
    assert "31.00 (30.00-32.00) [2048 (2048-2048)]" in table
    assert "40.00 (40.00-40.00) [2047 (2047-2047)]" in table
    notes = render.notes(r)
    p10 = next(n for n in notes if n.startswith("P10"))
    assert "31.00 ms" in p10 and "28.50 ms" in p10 and "40.00 ms" in p10
    assert any(n.startswith("P11 (BELOW BAR)") and "205.0 tok/s" in n for n in notes)
    assert any(n.startswith("P9") and "the HTTP gateway 61 MB RSS" in n for n in notes)
    gw = bar(r, "P9", "gateway")
    assert (gw.measured, gw.verdict) == ("61", "information")


# -- the SSE reader and the client --------------------------------------------------------


def sse(*events: Any) -> list[bytes]:
    lines = []
    for e in events:
        lines += [f"data: {json.dumps(e)}\n".encode(), b"\n"]
    return [*lines, b"data: [DONE]\n", b"\n"]


def test_the_reader_times_the_first_choice_and_every_token_with_text() -> None:
    stream = sse(
        {"choices": [{"index": 0, "text": "", "finish_reason": None}]},  # first: no text yet
        {"choices": [{"index": 0, "text": " 1", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": ",", "finish_reason": "length"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}},
            "timings": {"cache_n": 8},
        },
    )
    reply = http_sse.read_events(stream, 0.0)
    assert reply.text == " 1," and len(reply.arrivals) == 2
    assert reply.ttft_ms < reply.arrivals[0] * 1e3  # the empty first choice came first
    assert (reply.cached, reply.timings) == (8, {"cache_n": 8})
    with pytest.raises(RuntimeError, match="stream error"):
        http_sse.read_events(sse({"error": {"message": "boom"}}), 0.0)


class _Sse(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: list[int]
    bodies: list[dict[str, Any]]

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(body["max_tokens"]):
            self._chunk(sse({"choices": [{"index": 0, "text": f" {i}"}]})[0] + b"\n")
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sse_server() -> Iterator[tuple[str, Any]]:
    handler = type("H", (_Sse,), {"connections": [], "bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_client_streams_each_completion_on_a_connection_opened_before_it(
    sse_server: tuple[str, Any],
) -> None:
    url, handler = sse_server
    with http_sse.SseClient(url) as client:
        first = client.complete("m", [1, 2, 3], 3)
        second = client.complete("m", [4], 2)
    assert (first.text, len(first.arrivals), second.text) == (" 0 1 2", 3, " 0 1")
    # A new connection each (llama-server closes one after each streamed reply).
    assert len(handler.connections) == 2
    assert handler.bodies[0] == http_sse.completion_body("m", [1, 2, 3], 3)
    assert handler.bodies[0]["stream"] is True and handler.bodies[0]["temperature"] == 0.0


# -- the round ----------------------------------------------------------------------------


def _completion(n: int, reused: int, live: int) -> Completion:
    src = TokenSources(live=live, ram=reused - live, computed=n - reused)
    return Completion(
        reply="ok",
        generated=[7],
        context_tokens=[0] * n + [7],
        committed_tokens=n,
        cache_hit_kind=CacheHitKind.COLD,
        finish_reason=FinishReason.LENGTH,
        stats=Stats(prompt_tokens=n),
        cache_delta=CacheDelta(read=reused, sources=src),
    )


class _Log:
    """What every way in was sent, in order: (way, model, prompt length, max tokens)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, int, int]] = []
        self.seen: set[tuple[int, ...]] = set()
        self.lock = threading.Lock()

    def reused(self, ids: list[int]) -> int:
        with self.lock:
            hit = tuple(ids) in self.seen
            self.seen.add(tuple(ids))
        return len(ids) if hit else 0


class _FakeDaemon:
    def __init__(self, log: _Log) -> None:
        self.log = log
        self.client = SimpleNamespace(tokenize=lambda model, text: [1])

    def http_url(self) -> str:
        return "http://llamad:1"

    def first_token(self, model: str, ids: list[int]) -> tuple[float, Completion]:
        self.log.sent.append(("client", model, len(ids), 1))
        return 5.0, _completion(len(ids), self.log.reused(ids), 0)

    def arrivals(self, model: str, ids: list[int], n: int) -> list[float]:
        self.log.sent.append(("client", model, len(ids), n))
        return [i / 100 for i in range(n)]


def _fake_sse(log: _Log) -> type:
    class FakeSse:
        def __init__(self, url: str) -> None:
            self.way = "http-llamad" if "llamad" in url else "http-server"

        def open(self) -> FakeSse:
            return self

        def close(self) -> None:
            pass

        def __enter__(self) -> FakeSse:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def complete(self, model: str, ids: list[int], n: int) -> Any:
            log.sent.append((self.way, model, len(ids), n))
            arrivals = [i / 90 for i in range(n)]
            return http_sse.HttpReply(6.0, arrivals, "x", log.reused(ids))

    return FakeSse


@pytest.mark.parametrize(("rnd", "first"), [(0, "client"), (1, "http-llamad")])
def test_a_round_sends_each_way_in_the_same_requests_and_alternates_which_goes_first(
    monkeypatch: pytest.MonkeyPatch, rnd: int, first: str
) -> None:
    log = _Log()
    monkeypatch.setattr(http_round, "SseClient", _fake_sse(log))
    rig = SimpleNamespace(
        llamad=_FakeDaemon(log),
        server=SimpleNamespace(port=1),
        n_seq_max=4,
        sizes=workload.Sizes.quick(),
        tokenize=lambda text: [hash(w) % 50_000 for w in text.split()],
    )
    res = rep.Results(rounds=1, sizes=(512,))
    http_round.http_round(rig, res, rnd, [LLAMAD, SERVER, "llama-cpp-python"])
    ttft = [(way, n) for way, _, n, m in log.sent if m == 1]
    second = "http-llamad" if first == "client" else "client"
    # cold, repeat, n_seq_max fillers, the repeat: per way in; then a run of
    # back-to-back repeats of the last prompt through each way, in the same
    # order; llama-server: one filler
    per_way = [512, 512, 64, 64, 64, 64, 512]
    runs = http_round.RUN_REPEATS
    assert ttft == [
        *((first, n) for n in per_way),
        *((second, n) for n in per_way),
        *[(first, 512)] * runs,
        *[(second, 512)] * runs,
        *(("http-server", n) for n in (512, 512, 64, 512)),
    ]
    last_prompt = [ids for way, _, ids, m in log.sent if way == second and m == 1][-1]
    assert last_prompt == 512
    assert res.get("http-run", LLAMAD, "client", 512) == [5.0]
    assert res.get("http-run", LLAMAD, "http", 512) == [6.0]
    decode = [(way, m) for way, _, _, m in log.sent if m > 1]
    assert decode == [(first, 32)] * 5 + [(second, 32)] * 5 + [("http-server", 32)] * 5
    assert {model for way, model, _, _ in log.sent if way != "http-server"} == {"main"}
    for via in ("client", "http"):
        assert res.get("http-cached", LLAMAD, via, "ram", 512) == [512.0]
        assert res.get("http-cached", LLAMAD, via, "cold", 512) == [0.0]
        assert res.get("http-decode", LLAMAD, via, 4) == [
            pytest.approx(400.0 if via == "client" else 360.0)
        ]
    assert res.get("http-live", LLAMAD, "client", "ram", 512) == [0.0]
    assert res.get("http-ttft", SERVER, "http", "ram-cache", 512) == [6.0]
    assert res.get("http-decode", SERVER, "http", 1) == [pytest.approx(90.0)]
