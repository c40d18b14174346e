"""P14: single-stream decode beside a CPU hog per core, llamad against llama-server.

SPEC P14 (issue 21 item 4): on a shared machine a context that decodes on
every core collapses when other processes keep those cores busy (ggml's
threads wait for one another at every graph node, and one of them is always
descheduled); llamad's thread governor sees the collapse and decodes on
fewer threads (docs/internals/threads.md). This step measures it side by
side, once per round:

- four systems: llamad at its default (``n_threads`` = cores, the governor
  live; the bench's main daemon), llamad at 1 thread (a daemon of its own,
  started on the step's first round), llama-server at its default
  (``-t`` = cores; the bench's server) and llama-server at ``-t 1 -tb 1`` (a
  server of its own), in an order that rotates between rounds;
- each one stream, greedy, on a counting prompt, for a **time budget** (not a
  token count: beside the hogs a default llama-server decodes a token in
  seconds), its tokens' arrival times recorded; its rate is the tokens after
  the first over the time from the first token to the budget's end (or to
  the stream's own end, when it ends sooner): :func:`decode_window`;
- once with no hog (``quiet``, the reference) and once with one busy-loop
  child process per core running from before the stream starts
  (``hogs``), the two phases in alternating order between rounds.

A stream past its budget is cut: llamad's by leaving the Client's stream
(which cancels the request on the worker), llama-server's by a socket
timeout at the budget's end and the connection closed, after which the bench
waits for the server's slots to be idle (``/slots``), restarting it if they
do not come idle in time, so a cut generation never runs beside the next
system's. The hogs are this process's children, always killed (on an error
and on Ctrl-C too), and each exits by itself once its parent is gone
(:data:`HOG_CODE`), so even a SIGKILLed bench leaves none spinning.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.hogs import Hogs
from bench.peers import workload
from bench.peers.llamad_sys import LlamadDaemon, ModelTable
from bench.peers.server_sys import LlamaServer, _piece
from bench.peers_report import LLAMAD, SERVER, Results

if TYPE_CHECKING:
    from bench.peers.scenarios import Rig

HOG_SETTLE_S = 0.3  # the hogs' interpreters started and spinning before a stream
IDLE_WAIT_S = 30.0  # a cut llama-server generation must stop within this
DEFAULT, ONE = "default", "1"  # thread configurations
QUIET, HOGS = "quiet", "hogs"  # phases
CONFIGS: tuple[tuple[str, str], ...] = (
    (LLAMAD, DEFAULT),
    (SERVER, DEFAULT),
    (LLAMAD, ONE),
    (SERVER, ONE),
)
MAX_TOKENS = 2048  # half of n_ctx: a stream that decodes this fast ends on its own


# -- what one stream measured (pure) -----------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One stream as the client saw it (``time.perf_counter`` seconds): when
    the request was sent, each token's arrival, and where the measurement
    ended (the budget's end, or the stream's own end when it came sooner)."""

    sent: float
    arrivals: tuple[float, ...]
    end: float

    def timeline(self) -> list[float]:
        """Arrivals in seconds since the request was sent."""
        return [t - self.sent for t in self.arrivals]

    @property
    def span_s(self) -> float:
        return self.end - self.sent


def decode_window(s: Stream) -> tuple[int, float]:
    """(tokens decoded after the first, seconds from the first token to the
    end): the decode rate's numerator and denominator, the prefill left out.
    No token at all: (0, the whole span)."""
    if not s.arrivals:
        return 0, s.span_s
    inside = [t for t in s.arrivals[1:] if t <= s.end]
    return len(inside), max(s.end - s.arrivals[0], 0.0)


def ended(sent: float, arrivals: Sequence[float], deadline: float, finished: bool) -> Stream:
    """A stream's :class:`Stream`: one that ended by itself ends at its last
    token; one that was cut, at its deadline."""
    if finished:
        end = arrivals[-1] if arrivals else min(time.perf_counter(), deadline)
    else:
        end = deadline
    return Stream(sent, tuple(t for t in arrivals if t <= deadline), end)


# -- the systems' streams --------------------------------------------------------------------


def llamad_stream(
    daemon: LlamadDaemon, model_id: str, prompt: list[int], budget_s: float
) -> Stream:
    """One greedy stream through the Client until ``budget_s`` has passed
    (leaving the stream cancels the request on the worker) or it ends."""
    from llamad.errors import RequestTimeout  # noqa: PLC0415
    from llamad.model.results import DoneEvent, TokenEvent  # noqa: PLC0415

    client = daemon.client
    assert client is not None
    arrivals: list[float] = []
    finished = False
    sent = time.perf_counter()
    deadline = sent + budget_s
    try:
        with client.infer(
            model_id,
            prompt,
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            timeout=budget_s,
            idle_timeout=budget_s,
        ) as stream:
            for event in stream:
                now = time.perf_counter()
                if isinstance(event, TokenEvent) and event.token is not None and now <= deadline:
                    arrivals.append(now)
                elif isinstance(event, DoneEvent):
                    finished = now <= deadline
                    break
                if now >= deadline:
                    break
    except RequestTimeout:
        pass  # no event within the budget: cut at its end
    return ended(sent, arrivals, deadline, finished)


def server_stream(server: LlamaServer, prompt: list[int], budget_s: float) -> Stream:
    """One greedy streamed ``/completion`` until ``budget_s`` has passed (every
    read bounded by what is left of it, then the connection closed) or it ends."""
    body = json.dumps(
        {
            "prompt": prompt,
            "n_predict": MAX_TOKENS,
            "temperature": 0.0,
            "stream": True,
            "cache_prompt": True,
        }
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=budget_s)
    conn.connect()  # untimed, as in the other scenarios
    arrivals: list[float] = []
    finished = False
    sent = time.perf_counter()
    deadline = sent + budget_s
    try:
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"llama-server /completion: {resp.status} {resp.read()[:500]!r}")
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or conn.sock is None:
                break
            conn.sock.settimeout(left)
            raw = resp.readline()
            if not raw:
                finished = True
                break
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:].strip())
            now = time.perf_counter()
            if _piece(event) is not None and now <= deadline:
                arrivals.append(now)
            if event.get("stop") is True:
                finished = now <= deadline
                break
    except TimeoutError:
        pass  # the budget ran out while waiting for a token
    finally:
        conn.close()
    return ended(sent, arrivals, deadline, finished)


def slots_busy(server: LlamaServer) -> bool:
    """Whether any of the server's slots is still processing a task (``/slots``)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", "/slots")
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"llama-server /slots: {resp.status} {data[:200]!r}")
        return any(bool(s.get("is_processing")) for s in json.loads(data))
    finally:
        conn.close()


def settle_server(
    server: LlamaServer,
    busy: Callable[[LlamaServer], bool] = slots_busy,
    timeout_s: float = IDLE_WAIT_S,
) -> bool:
    """Wait for a cut generation to stop (the server notices the closed
    connection at its next token); restart the server if it has not within
    ``timeout_s``. True when it came idle by itself."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not busy(server):
            return True
        time.sleep(0.1)
    server.restart()
    return False


# -- the round -----------------------------------------------------------------------------


@dataclass
class Systems:
    """The step's four systems: the rig's own (defaults) and the two at 1 thread."""

    llamad: LlamadDaemon
    llamad_one: LlamadDaemon
    server: LlamaServer | None
    server_one: LlamaServer | None

    def stream(self, system: str, config: str, prompt: list[int], budget_s: float) -> Stream:
        from bench.peers.scenarios import MAIN  # noqa: PLC0415

        if system == LLAMAD:
            daemon = self.llamad if config == DEFAULT else self.llamad_one
            return llamad_stream(daemon, MAIN, prompt, budget_s)
        server = self.server if config == DEFAULT else self.server_one
        assert server is not None
        return server_stream(server, prompt, budget_s)

    def settle(self, system: str, config: str) -> bool:
        server = self.server if config == DEFAULT else self.server_one
        return True if system != SERVER or server is None else settle_server(server)


def one_thread_systems(rig: Rig) -> Systems:
    """The rig's systems and the two 1-thread ones, started the first time
    (kept on the rig, stopped with it by bench/peers_bench.py's ``stop``)."""
    from bench.peers.scenarios import MAIN  # noqa: PLC0415

    if rig.llamad_one is None:
        rig.llamad_one = LlamadDaemon(
            "one-thread", [ModelTable(MAIN, rig.n_ctx, rig.n_seq_max, 1)], rig.threads
        )
        rig.log("starting llamad at 1 thread (P14)")
        rig.llamad_one.start()
    if rig.server is not None and rig.server_one is None:
        rig.server_one = LlamaServer(
            rig.server.binary,
            rig.model,
            n_ctx=rig.n_ctx,
            n_seq_max=rig.n_seq_max,
            threads=1,
            log=rig.server.log_path.with_name("llama-server-t1.log"),
        )
        rig.log("starting llama-server -t 1 (P14)")
        rig.server_one.start()
    return Systems(rig.llamad, rig.llamad_one, rig.server, rig.server_one)


def round_order(rnd: int) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """The round's systems (rotated by one each round) and phases (quiet
    first in even rounds, the hogs first in odd ones)."""
    k = rnd % len(CONFIGS)
    phases = (QUIET, HOGS) if rnd % 2 == 0 else (HOGS, QUIET)
    return list(CONFIGS[k:] + CONFIGS[:k]), phases


def contention_round(rig: Rig, res: Results, rnd: int, *, warmup: bool = False) -> None:
    """P14, one round (the module's docstring); ``warmup``: every system once,
    quiet, a short budget, nothing kept (the 1-thread systems' first requests)."""
    z = rig.sizes
    systems = one_thread_systems(rig)
    configs, phases = round_order(rnd)
    configs = [(s, c) for s, c in configs if s == LLAMAD or rig.server is not None]
    if warmup:
        for i, (system, config) in enumerate(configs):
            systems.stream(system, config, workload.counting_tokens(rig.tokenize, 9000 + i), 2.0)
            systems.settle(system, config)
        return
    rig.log(f"P14 round {rnd}: {' then '.join(phases)}, systems {configs}")
    for phase in phases:
        budget = z.contention_s if phase == HOGS else z.contention_quiet_s
        hogs = Hogs(rig.threads if phase == HOGS else 0)
        with hogs:
            if phase == HOGS:
                time.sleep(HOG_SETTLE_S)
                if not hogs.running():
                    raise RuntimeError("a CPU hog exited before the streams")
            for i, (system, config) in enumerate(configs):
                start = 5000 * (rnd + 1) + 400 * i + (200 if phase == HOGS else 0)
                prompt = workload.counting_tokens(rig.tokenize, start)
                s = systems.stream(system, config, prompt, budget)
                add_stream(res, s, system=system, config=config, phase=phase, rnd=rnd)
                if not systems.settle(system, config):
                    res.add(1.0, "p14", system, config, phase, "restarted")


def add_stream(res: Results, s: Stream, *, system: str, config: str, phase: str, rnd: int) -> None:
    """One stream's figures: decoded tokens and seconds (:func:`decode_window`),
    its span, its first token's time, and its token times for the plot."""
    tokens, seconds = decode_window(s)
    res.add(float(tokens), "p14", system, config, phase, "tokens")
    res.add(seconds, "p14", system, config, phase, "seconds")
    res.add(s.span_s, "p14", system, config, phase, "span_s")
    if s.arrivals:
        res.add((s.arrivals[0] - s.sent) * 1e3, "p14", system, config, phase, "first_ms")
    res.timeline["/".join((system, config, phase, str(rnd)))] = [round(t, 4) for t in s.timeline()]
