"""P10, P11 and the HTTP overhead: llamad's gateway against llama-server and its own Client.

One round, back to back like every scenario (bench/peers/scenarios.py), at
the run's largest prompt size (2,048 tokens in a full run), the systems in
the round's order; llamad's two ways in, the public :class:`llamad.Client`
and the HTTP gateway, alternate which goes first from round to round. Every
HTTP request, to either server, goes through the same client
(:class:`bench.peers.http_sse.SseClient`: ``/v1/completions``, token ids,
streamed; its docstring says what is timed).

- **TTFT paths** (series ``http-ttft/<system>/<via>/<path>/<n>``): a fresh
  prompt cold; the same again the moment its reply ended (``repeat``); then
  the fillers P1 uses (llamad: ``n_seq_max`` short requests, so the
  prompt's idle entry is displaced and its repeat is looked up in the cache;
  llama-server: one, so its slot goes to the host-RAM cache); the prompt
  again (``ram``; llama-server's ``ram-cache``: P10's peer). Each request's
  reused prompt tokens as the system reports them (``http-cached``); for
  llamad's Client path also the live ones (``http-live``: a repeat from a
  tier that was served live displaced nothing).
- **Back-to-back runs** (``http-run/llamad/<via>/<n>``): HTTP's own cost to
  the first token. After both ways' TTFT paths, the last prompt (live again:
  its repeat from a tier left an idle entry) is sent :data:`RUN_REPEATS`
  times back to back through one way, then as many through the other (the
  round's order), each the moment the previous reply ended; the median of
  each run is recorded. The single ``repeat`` above lands while the cold
  reply's finish save (47 MB at 2,048 tokens) is still being written beside
  it, at a different moment for each way in, which swung HTTP - Client from
  -1.4 to +6.8 ms between rounds; a run of repeats of a live prompt, each
  way after its own kind, measures the hop itself.
- **Decode** (``http-decode/<system>/<via>/<streams>``): one stream, and 4
  streams released together, greedy on counting prompts, the aggregate rate
  while all decode (:func:`bench.worker_bench_report.steady_rate`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from bench.peers import workload
from bench.peers.http_sse import SseClient
from bench.peers.scenarios import FILLER_TOKENS, MAIN, Rig, concurrently
from bench.peers_report import CLIENT_VIA, HTTP_VIA, LLAMAD, SERVER, Results
from bench.worker_bench_report import steady_rate

SERVER_MODEL = "default"  # llama-server serves its one model under any name
RUN_REPEATS = 8
"""Back-to-back repeats per way in and round for HTTP's cost to the first token."""


def http_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    n = max(rig.sizes.ttft)
    fillers = [
        workload.exact_tokens(rig.tokenize, f"hfill{rnd}-{i}", FILLER_TOKENS)
        for i in range(rig.n_seq_max)
    ]
    vias = (CLIENT_VIA, HTTP_VIA) if rnd % 2 == 0 else (HTTP_VIA, CLIENT_VIA)
    for system in order:
        if system == LLAMAD:
            for via in vias:
                prompt = workload.exact_tokens(rig.tokenize, f"http{rnd}-{via}", n)
                _llamad_ttft(rig, res, via, prompt, fillers)
            _llamad_runs(rig, res, vias, prompt)
        elif system == SERVER and rig.server is not None:
            prompt = workload.exact_tokens(rig.tokenize, f"http{rnd}-server", n)
            _server_ttft(rig, res, n, prompt, fillers[0])
    m = rig.sizes.decode_tokens
    prompts = [workload.counting_tokens(rig.tokenize, 300 * (rnd + 1) + 7 * i) for i in range(4)]
    for system in order:
        if system == LLAMAD:
            for via in vias:
                _decode(res, LLAMAD, via, _llamad_stream(rig, via, m), prompts)
        elif system == SERVER and rig.server is not None:
            url = f"http://127.0.0.1:{rig.server.port}"
            _decode(res, SERVER, HTTP_VIA, _http_stream(url, SERVER_MODEL, m), prompts)


Sent = tuple[float, int, int]
"""A first-token request's TTFT ms, reused prompt tokens and live ones (-1: not said)."""


def _sender(rig: Rig, via: str, http: SseClient) -> Callable[[list[int]], Sent]:
    """One first-token request of a prompt to llamad through ``via``."""
    d = rig.llamad
    if via == CLIENT_VIA:

        def send(ids: list[int]) -> Sent:
            ms, c = d.first_token(MAIN, ids)
            src = c.cache_delta.sources
            return ms, src.reused, src.live

        return send

    def over_http(ids: list[int]) -> Sent:
        r = http.complete(MAIN, ids, 1)
        return r.ttft_ms, r.cached or 0, -1

    return over_http


def _llamad_ttft(
    rig: Rig, res: Results, via: str, prompt: list[int], fillers: list[list[int]]
) -> None:
    n = len(prompt)
    with SseClient(rig.llamad.http_url()) as http:
        timed = _sender(rig, via, http)
        for path in ("cold", "repeat"):
            ms, reused, _ = timed(prompt)
            res.add(ms, "http-ttft", LLAMAD, via, path, n)
            res.add(float(reused), "http-cached", LLAMAD, via, path, n)
        for filler in fillers:
            timed(filler)
        ms, reused, live = timed(prompt)
        res.add(ms, "http-ttft", LLAMAD, via, "ram", n)
        res.add(float(reused), "http-cached", LLAMAD, via, "ram", n)
        if live >= 0:
            res.add(float(live), "http-live", LLAMAD, via, "ram", n)


def _llamad_runs(rig: Rig, res: Results, vias: Sequence[str], prompt: list[int]) -> None:
    """:data:`RUN_REPEATS` back-to-back repeats of ``prompt`` through each way
    in, one way's run after the other's; each run's median TTFT."""
    with SseClient(rig.llamad.http_url()) as http:
        for via in vias:
            timed = _sender(rig, via, http)
            times = [timed(prompt)[0] for _ in range(RUN_REPEATS)]
            res.add(statistics.median(times), "http-run", LLAMAD, via, len(prompt))


def _server_ttft(rig: Rig, res: Results, n: int, prompt: list[int], filler: list[int]) -> None:
    assert rig.server is not None
    with SseClient(f"http://127.0.0.1:{rig.server.port}") as http:
        for path in ("cold", "repeat"):
            r = http.complete(SERVER_MODEL, prompt, 1)
            res.add(r.ttft_ms, "http-ttft", SERVER, HTTP_VIA, path, n)
            res.add(_server_cached(r.cached, r.timings), "http-cached", SERVER, HTTP_VIA, path, n)
        http.complete(SERVER_MODEL, filler, 1)  # another task takes a slot: idle ones go to RAM
        r = http.complete(SERVER_MODEL, prompt, 1)
        res.add(r.ttft_ms, "http-ttft", SERVER, HTTP_VIA, "ram-cache", n)
        res.add(
            _server_cached(r.cached, r.timings), "http-cached", SERVER, HTTP_VIA, "ram-cache", n
        )


def _server_cached(cached: int | None, timings: dict[str, object]) -> float:
    if cached is not None:
        return float(cached)
    value = timings.get("cache_n", 0)
    return float(value) if isinstance(value, int | float) else 0.0


Stream = tuple[Callable[[list[int]], list[float]], Callable[[], object] | None]


def _llamad_stream(rig: Rig, via: str, m: int) -> Stream:
    d = rig.llamad
    if via == CLIENT_VIA:
        client = d.client
        assert client is not None
        # Each stream's thread opens its sockets untimed (scenarios._connect).
        return (lambda p: d.arrivals(MAIN, p, m)), (lambda: client.tokenize(MAIN, "connect"))
    return _http_stream(d.http_url(), MAIN, m)


def _http_stream(url: str, model: str, m: int) -> Stream:
    def run(prompt: list[int]) -> list[float]:
        with SseClient(url) as http:
            return http.complete(model, prompt, m).arrivals

    return run, None


def _decode(res: Results, system: str, via: str, stream: Stream, prompts: list[list[int]]) -> None:
    run, prepare = stream
    res.add(steady_rate([run(prompts[0])]), "http-decode", system, via, 1)
    res.add(steady_rate(concurrently(run, prompts, prepare)), "http-decode", system, via, 4)
