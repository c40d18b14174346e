"""Token path probe (issue 21, P4/P3): the CPU each streamed token costs outside the decode.

    PYTHONPATH=src python -m bench.token_path_probe [--tokens 256] [--rounds 3]
        [--threads N] [--streams 1,4] [--http]

Starts a real daemon (:class:`bench.peers.llamad_sys.LlamadDaemon`: the
default GGUF, ``--threads`` threads, default all cores, as the peers bench
gives P4) and reads greedy streams through the public
:class:`llamad.Client` as the peers bench's ``arrivals`` does
(``Client.infer`` with token ids, ``max_tokens``, temperature 0). For each
stream count (1, then 4 at once, one thread each) it prints per streamed
token:

- ``client_us``: this process's CPU (``time.process_time``: every thread,
  ZeroMQ's I/O thread included), and of it ``client_main_us`` (the reading
  threads) and ``client_zmq_us`` (ZeroMQ's threads), read from
  ``/proc/self/task/*/schedstat`` (nanoseconds on the CPU);
- each process of the daemon's tree, by role (``worker``, ``front``,
  ``daemon``, ...), split into its ZeroMQ threads (``*_zmq_us``) and the
  rest (``*_other_us``: for the worker, its loop and ggml's threads, i.e.
  the decode itself);
- ``*_runs``: per token, how many times those threads were switched in
  (``schedstat``'s third field: each wakeup, or a return after preemption);
- ``tok_s``: tokens over the streams' steady window (from the last first
  token to the first last token, as the peers bench's ``steady_rate``).

With ``--http`` the streams are read through the daemon's HTTP gateway
instead (``POST /v1/completions``, streamed, one plain ``http.client``
reader per stream: the peers bench's :class:`bench.peers.http_sse.SseClient`),
and the ``gateway_*`` rows are the gateway's cost per token.

A front that still carried tokens would show its ZeroMQ threads' CPU
growing with the tokens streamed; ``front_*`` near zero says tokens go
straight from the worker to the client.

To compare two trees, run it alternately with ``PYTHONPATH`` pointing at
each tree's ``src`` (absolute: the daemon's processes inherit it). Not a
recorded bench: it writes no result file.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from bench.peers.http_sse import SseClient
from bench.peers.llamad_sys import LlamadDaemon, ModelTable

if TYPE_CHECKING:
    from llamad import Client

MODEL = "probe"
_ZMQ_PREFIX = "ZMQbg"


def _thread_ns(pid: int | str) -> dict[str, int]:
    """Nanoseconds on the CPU of ``pid``'s threads, summed by ``zmq`` / ``other``."""
    out: dict[str, int] = defaultdict(int)
    base = Path(f"/proc/{pid}/task")
    try:
        tids = list(base.iterdir())
    except OSError:
        return out
    for task in tids:
        try:
            comm = (task / "comm").read_text().strip()
            # on-CPU ns, wait ns, and timeslices run: one more each time the
            # thread is switched in (a wakeup, or a return after preemption).
            ns, _, slices = (int(v) for v in (task / "schedstat").read_text().split()[:3])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        part = "zmq" if comm.startswith(_ZMQ_PREFIX) else "other"
        out[part] += ns
        out[f"{part}_runs"] += slices
    return out


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "daemon"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    args = cmd.split()
    # Supervised children run ``llamad.supervisor.run_child --id ID``.
    ident = args[args.index("--id") + 1] if "--id" in args[:-1] else "other"
    if MODEL in ident:
        return "worker"
    return ident.replace(":", "_").replace("-", "_")


def _snapshot(daemon: LlamadDaemon) -> dict[str, int]:
    """CPU nanoseconds by ``role_zmq`` / ``role_other``, this process's included."""
    out: dict[str, int] = defaultdict(int)
    root = daemon.launcher.proc.pid if daemon.launcher.proc is not None else -1
    for pid in daemon.pids():
        role = _role(pid, root)
        for part, ns in _thread_ns(pid).items():
            out[f"{role}_{part}"] += ns
    for part, ns in _thread_ns("self").items():
        out[f"client_{part.replace('other', 'main')}"] += ns
    return out


def _stream(client: Client | str, prompt: list[int], n: int) -> tuple[list[float], float]:
    """Arrival times of one greedy stream, and the reading thread's CPU
    seconds; ``client`` a gateway's base URL: through HTTP."""
    from llamad.model.results import TokenEvent  # noqa: PLC0415

    cpu = time.thread_time()
    if isinstance(client, str):
        with SseClient(client) as sse:
            arrivals = sse.complete(MODEL, prompt, n).arrivals
        return arrivals, time.thread_time() - cpu
    times: list[float] = []
    for event in client.infer(MODEL, prompt, max_tokens=n, temperature=0.0):
        if isinstance(event, TokenEvent) and event.token is not None:
            times.append(time.perf_counter())
    return times, time.thread_time() - cpu


def _steady(streams: list[list[float]]) -> float:
    start = max(s[0] for s in streams)
    end = min(s[-1] for s in streams)
    count = sum(sum(1 for t in s if start < t <= end) for s in streams)
    return count / (end - start) if end > start else 0.0


class Readers:
    """``k`` reading threads that live across rounds (a thread's sockets and
    ZeroMQ context live as long as it does, as in a long-running client)."""

    def __init__(self, client: Client | str, prompts: list[list[int]], k: int, n: int) -> None:
        self.out: list[tuple[list[float], float]] = [([], 0.0)] * k
        self.go = threading.Barrier(k + 1)
        self.done = threading.Barrier(k + 1)
        self.stop = False
        self.failed: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._run, args=(client, prompts[i], i, n), daemon=True)
            for i in range(k)
        ]
        for t in self.threads:
            t.start()
        self.round()  # a first stream each: the route, the sockets

    def _run(self, client: Client | str, prompt: list[int], i: int, n: int) -> None:
        try:
            while True:
                self.go.wait()
                if self.stop:
                    return
                self.out[i] = _stream(client, prompt, n)
                self.done.wait()
        except threading.BrokenBarrierError:
            return  # another reader failed
        except BaseException as exc:
            # Said to the main thread, which would otherwise wait for this
            # reader forever.
            self.failed = exc
            self.go.abort()
            self.done.abort()

    def round(self) -> list[tuple[list[float], float]]:
        try:
            self.go.wait()
            self.done.wait()
        except threading.BrokenBarrierError:
            raise RuntimeError(f"a reader failed: {self.failed!r}") from self.failed
        return list(self.out)

    def close(self) -> None:
        self.stop = True
        self.go.wait()


def _round(daemon: LlamadDaemon, readers: Readers) -> dict[str, float]:
    before = _snapshot(daemon)
    before["client_process"] = time.process_time_ns()
    out = readers.round()
    after = {"client_process": time.process_time_ns()}
    after.update(_snapshot(daemon))
    tokens = sum(len(s) for s, _ in out)
    row = {
        key if key.endswith("_runs") else f"{key}_us": (after[key] - before.get(key, 0))
        / (1 if key.endswith("_runs") else 1e3)
        / max(1, tokens)
        for key in sorted(after)
    }
    row["client_us"] = row.pop("client_process_us")
    row["client_readers_us"] = sum(cpu for _, cpu in out) * 1e6 / max(1, tokens)
    # The other threads: the readers (just measured) and the probe's own
    # reads of /proc (not the client's cost).
    row.pop("client_main_us", None)
    row.pop("client_main_runs", None)
    row["tok_s"] = _steady([s for s, _ in out])
    row["tokens"] = tokens
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--http", action="store_true", help="read through the HTTP gateway")
    args = ap.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    table = ModelTable(MODEL, n_ctx=4096, n_seq_max=max(counts), threads=args.threads)
    daemon = LlamadDaemon("probe", [table], args.threads)
    try:
        client = daemon.start()
        # Counting prompts: the model goes on counting, so no stream ends early.
        texts = [", ".join(str(100 * i + 7 + j) for j in range(30)) + ", " for i in range(4)]
        prompts = [client.tokenize(MODEL, t) for t in texts]
        way: Client | str = daemon.http_url() if args.http else client
        readers = {k: Readers(way, prompts, k, args.tokens) for k in counts}
        for r in range(args.rounds):
            for k in counts:
                row = _round(daemon, readers[k])
                load = os.getloadavg()[0]
                shown = " ".join(f"{key}={v:.2f}" for key, v in row.items() if v)
                print(f"round {r} streams={k} load={load:.2f} {shown}", flush=True)
        for each in readers.values():
            each.close()
    except BaseException:
        print(daemon.log_tail(40))
        raise
    finally:
        daemon.remove()


if __name__ == "__main__":
    main()
