"""What the same-answer guarantees cost (issue 16, SPEC M19): two builds and two
settings of the pinned llama.cpp, in alternating rounds.

    python -m bench.numerics_bench --before LIB_DIR [--only bursts|decode|prompt]
        [--rounds 8] [--reps 5] [--pairs 8] [--burst 8] [--threads N] [--no-record]

* **Decode, grouped flash attention, paired bursts** (``--only bursts``, patch
  0003; what settles the bar on a noisy machine): two long-lived probe
  processes at once, ``bench/numerics_probe.c`` compiled against each build's
  headers and linked to its libllama (``before`` = ``--before``, ``after`` =
  this checkout's build). Each loads the default model, makes a context as
  llamad's worker does (flash attention on, f16 KV, 2 threads by default), and
  prefills 4,096 pseudo-random tokens once (the same on both). Per KV depth
  (4,096, then 2,048, 1,024, 512: the prefill is cut down with
  ``llama_memory_seq_rm``), the coordinator asks for short greedy bursts
  (``--burst`` one-token decodes, each burst's cells removed afterwards so every
  burst runs at the same depth) in the order A,B,B,A,A,B,... : a pair's two
  bursts are ~0.1-0.5 s apart on a quiet machine, so a host slowdown lasting
  seconds lands on both halves of a pair alike. A pair's ratio is
  ``before ms / after ms`` (after's speed over before's); a round's ratio is
  the median of its ``--pairs`` pairs; ``--rounds`` rounds per depth.
  Bar: >= 0.97 at every depth. Each probe's burst must decode the same tokens
  every time at a depth (the cells really were removed); the two builds may
  differ (that is the patch). The load average at start and end is recorded:
  other work on the machine is not stopped for this bench, the pairing is what
  is meant to cancel it.

* **P5 with the ``deterministic`` option, through the daemon** (``--only
  p5``, issue 16 item 2): two real daemons alive at once (``python -m
  llamad.daemon``, the default configuration but ``deterministic = true`` on
  one, and on both a ``decode_timeout_ms`` of 600 s: a 2,048-token prompt is
  one decode step, which ran past the default 30 s on the loaded machine),
  each sent fresh 2,048-token prompts (greedy, one token: a cold prefill)
  through :class:`llamad.Client`, ``--p5-pairs`` pairs a round in the order
  A,B,B,A (with one pair the rounds take turns at going first). Tok/s: the
  worker's prefill tokens over its prefill time; a round's ratio: the median
  of its pairs' deterministic over default. Bar (SPEC M19): >= 0.95 would make
  the option the default. Threads are the governor's (live); each cold
  prompt's save runs in the background as by default, on both sides alike.
* **P3 and P4 with the ``deterministic`` option, through the daemon**
  (``--only p34``, issue 16 item 2's cost on decode): the same two daemons
  as ``p5``; each side in turn decodes ``--p34-tokens`` greedy tokens from
  counting prompts, as one stream (P4) and as 4 concurrent streams from 4
  client threads (P3), in pairs A,B,B,A. Tok/s: the tokens after each
  stream's first over the time from the first stream's first token to the
  last stream's last (the first prefill left out; the other streams' short
  prefills fall inside the window, on both sides alike, which is why 4
  streams read lower than 1 here); a round's ratio: the median of
  its pairs' deterministic over default. Decode steps of under 64 rows never
  take the tiled path and the default model's weights are not repacked, so
  the option should cost decode nothing; the bar says whether that held
  (>= 0.95, SPEC M19's 5 %).
* **Decode, grouped flash attention, llama-bench** (``--only decode``, the
  first record's method; a noisy host swings it past the bar): decode tok/s at KV depths
  512, 1,024, 2,048 and 4,096 (``llama-bench -p 0 -n 64 -d D``, 2 threads,
  flash attention on), ``--before`` (a build folder of the previous patch set,
  whose ``llama-bench`` and libraries are used) against this checkout's build.
  Bar: after / before >= 0.97 at every depth.
* **Prompt processing without the tiled path** (``GGML_CPU_FA_TILED=0``, what
  the ``deterministic`` model option sets): prefill tok/s at 512 and 2,048
  tokens on this checkout's build, tiled against untiled (the same binary).
  The cost decides whether the setting is the default: untiled / tiled >=
  0.95 would make it so (SPEC M19: what costs more than 5 % goes behind the
  option). Decode steps of fewer than 64 rows (P3's 4 streams and P4's one)
  never take the tiled path, so they cost nothing either way.

Both run on the default thread count (2 on the reference machine) on a machine
that does other things: within each round every test runs on both sides back
to back (which one goes first alternates), each side keeps the best of
``--reps`` repetitions, each round gives one ratio per test, and the
verdict is "met" only when every round clears the bar, "within noise" when the
bar lies inside the rounds' spread, "below bar" when no round does. Recorded
(``numerics-best-<date>.json`` beside the ``.md``) with every round's samples;
:func:`render` computes ratios and verdicts from them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import median, record, show, table
from bench.ffi_bench import verdict
from llamad import Client, paths
from llamad.llama_ffi import default_threads
from llamad.llama_ffi.build_info import build_record
from llamad.model.worker_spec import TILED_ENV
from llamad.testing import Launcher

DEPTHS = (512, 1024, 2048, 4096)
DECODE_TOKENS = 64
PROMPTS = (512, 2048)
THREADS = default_threads()
MIN_ROUNDS = 5
REPS = 5  # llama-bench repetitions per side per round; the best one counts
DECODE_BAR = 0.97  # after / before, at least
UNTILED_BAR = 0.95  # untiled / tiled, at least, to be the default
RENDER = "bench.numerics_bench:render"
PARTS = ("decode", "prompt", "bursts", "p5", "p34")
DEFAULT_PARTS = ("bursts",)  # what a run without --only measures
PAIRS = 8  # paired bursts per round per depth
BURST = 8  # one-token decodes per burst
PROBE_SRC = Path(__file__).resolve().parent / "numerics_probe.c"
SEED = 16  # the probes' prompt (the same pseudo-random tokens on both builds)
P5_TOKENS = 2048  # P5's cold prompt through the daemon
P5_PAIRS = 2  # paired cold prompts per round (A,B,B,A)
P5_SIDES = ("default", "deterministic")
P34_TOKENS = 64  # greedy tokens per stream (P3, P4 with the option)
P34_PAIRS = 2
P34_STREAMS = (1, 4)  # P4, P3
# A 2,048-token prompt is one decode step (n_batch 2,048); on a loaded 2-core
# machine it ran past the default decode_timeout_ms (30 s) and was stopped.
# The only setting P5's daemons change besides ``deterministic``.
P5_DECODE_TIMEOUT_MS = 600_000


Samples = dict[str, list[float]]


def llama_bench(
    lib_dir: Path, args: Sequence[str], env: Mapping[str, str], threads: int = THREADS
) -> Samples:
    """One llama-bench run of ``lib_dir``'s binary on its own libraries: every
    repetition's tok/s per test."""
    exe = lib_dir / "llama-bench"
    if not exe.is_file():
        sys.exit(f"{exe} missing: run `python scripts/native.py llama --tools` (make bench does)")
    cmd = [str(exe), "-m", str(paths.default_model_path()), *args]
    cmd += ["-t", str(threads), "-fa", "1", "-o", "json"]
    run_env = {**os.environ, **env, "LD_LIBRARY_PATH": str(lib_dir)}
    out = subprocess.run(cmd, env=run_env, capture_output=True, text=True, check=True).stdout
    found: Samples = {}
    for row in json.loads(out):
        decode = int(row["n_gen"]) > 0
        test = f"tg{row['n_gen']}@{row['n_depth']}" if decode else f"pp{row['n_prompt']}"
        found[test] = [float(x) for x in row["samples_ts"]]
    return found


def best(value: float | Sequence[float]) -> float:
    """A side's figure in one round: the best of its repetitions (what the
    code can do when nothing else got in the way), or the single figure an
    older record kept."""
    return max(value) if isinstance(value, Sequence) else float(value)


def measure(
    before: Path,
    after: Path,
    rounds: int,
    reps: int,
    parts: Sequence[str] = PARTS,
    *,
    threads: int = THREADS,
) -> dict[str, Any]:
    """Per round, per test, the two sides back to back (which goes first
    alternates): a burst of other work on the machine then lands on one
    round's pair rather than on one side of every comparison."""
    sides: dict[str, tuple[Path, dict[str, str]]] = {
        "before": (before, {}),
        "after": (after, {}),
        "tiled": (after, {TILED_ENV: "1"}),
        "untiled": (after, {TILED_ENV: "0"}),
    }
    tests: list[tuple[tuple[str, str], list[str]]] = []
    if "decode" in parts:
        tests += [
            (("before", "after"), ["-p", "0", "-n", str(DECODE_TOKENS), "-d", str(d)])
            for d in DEPTHS
        ]
    if "prompt" in parts:
        tests += [(("tiled", "untiled"), ["-p", str(n), "-n", "0"]) for n in PROMPTS]
    data: dict[str, Any] = {name: [] for name in sides}
    for r in range(rounds):
        got: dict[str, Samples] = {name: {} for name in sides}
        for pair, args in tests:
            for name in pair if r % 2 == 0 else pair[::-1]:
                lib, env = sides[name]
                got[name].update(llama_bench(lib, [*args, "-r", str(reps)], env, threads))
        for name in sides:
            data[name].append(got[name])
        print(f"round {r + 1}/{rounds}: {got}", flush=True)
    return data


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine state a result keeps)."""
    return [round(x, 2) for x in os.getloadavg()]


def burst_order(pairs: int, first: int = 0) -> list[tuple[str, str]]:
    """The sides of each pair in turn: A,B then B,A then A,B ... (which goes
    first alternates, so a trend within a round favours neither); ``first``
    (the round's number) shifts it, so with an odd number of pairs the rounds
    take turns at going first."""
    return [
        ("before", "after") if (first + i) % 2 == 0 else ("after", "before") for i in range(pairs)
    ]


def pair_ratios(before_ms: Sequence[float], after_ms: Sequence[float]) -> list[float]:
    """Each pair's after-speed over before-speed: ``before ms / after ms``."""
    return [b / a for b, a in zip(before_ms, after_ms, strict=True)]


def round_ratio(before_ms: Sequence[float], after_ms: Sequence[float]) -> float:
    """A round's ratio: the median of its pairs' ratios (one pair hit by a
    burst of other work moves it little)."""
    return median(pair_ratios(before_ms, after_ms))


def compile_probe(lib_dir: Path, out_dir: Path, name: str) -> Path:
    """``numerics_probe.c`` built against the build folder's own headers (its
    ``src/``) and linked, with an rpath, to its libraries."""
    root = lib_dir.parent.parent  # <cache>/<version>-<pin>-p<digest>-<backend>/build/bin
    exe = out_dir / f"numerics_probe-{name}"
    cmd = ["cc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"]
    cmd += [f"-I{root / 'src' / 'include'}", f"-I{root / 'src' / 'ggml' / 'include'}"]
    cmd += [str(PROBE_SRC), f"-L{lib_dir}", "-lllama", "-lggml", "-lggml-base"]
    cmd += [f"-Wl,-rpath,{lib_dir}", "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


class Probe:
    """One running ``numerics_probe``: prefilled once, then bursts on demand."""

    def __init__(self, exe: Path, n_ctx: int, threads: int, prefill: int) -> None:
        cmd = [str(exe), str(paths.default_model_path()), str(n_ctx), str(threads)]
        cmd += [str(prefill), str(SEED)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        word, ms = self._read().split()
        if word != "ready":
            raise RuntimeError(f"{exe}: expected ready, got {word!r}")
        self.prefill_ms = float(ms)

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"probe exited (rc={self.proc.wait()})")
        return line.strip()

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def depth(self, d: int) -> None:
        if self.ask(f"depth {d}") != "ok":
            raise RuntimeError(f"depth {d} refused")

    def burst(self, n: int) -> tuple[float, list[int]]:
        ms, *tokens = self.ask(f"burst {n}").split()
        return float(ms), [int(t) for t in tokens]

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, OSError):
                self.ask("quit")
            self.proc.wait(timeout=30)


def measure_bursts(
    before: Path,
    after: Path,
    *,
    rounds: int,
    pairs: int,
    burst: int,
    threads: int,
    depths: Sequence[int] = DEPTHS,
) -> dict[str, Any]:
    """The paired-burst decode comparison (see the module doc): per depth,
    ``rounds`` rounds of ``pairs`` pairs; every burst's wall ms, and each
    probe's burst tokens checked against its first burst at that depth."""
    load_start = load_average()
    depths = sorted(depths, reverse=True)
    with tempfile.TemporaryDirectory(prefix="numerics-probe-") as tmp:
        exes = {
            "before": compile_probe(before, Path(tmp), "before"),
            "after": compile_probe(after, Path(tmp), "after"),
        }
        probes: dict[str, Probe] = {}
        try:
            # One after the other: two prefills at once would only fight for the cores.
            for side, exe in exes.items():
                probes[side] = Probe(exe, depths[0] + burst + 16, threads, depths[0])
                print(
                    f"{side} prefilled {depths[0]} in {probes[side].prefill_ms:.0f} ms", flush=True
                )
            by_depth: dict[str, Any] = {}
            tokens: dict[str, dict[str, list[int]]] = {side: {} for side in probes}
            mismatches = dict.fromkeys(probes, 0)
            for d in depths:
                for side, probe in probes.items():
                    probe.depth(d)
                    _, tokens[side][str(d)] = probe.burst(burst)  # warm-up, not timed
                rows = []
                for r in range(rounds):
                    ms: dict[str, list[float]] = {side: [] for side in probes}
                    for pair in burst_order(pairs, r):
                        for side in pair:
                            t, toks = probes[side].burst(burst)
                            ms[side].append(t)
                            mismatches[side] += toks != tokens[side][str(d)]
                    rows.append({"before_ms": ms["before"], "after_ms": ms["after"]})
                    ratio = round_ratio(ms["before"], ms["after"])
                    print(f"depth {d} round {r + 1}/{rounds}: ratio {ratio:.3f}", flush=True)
                by_depth[str(d)] = rows
        finally:
            for probe in probes.values():
                probe.close()
    return {
        "depths": by_depth,
        "tokens": tokens,
        "mismatches": mismatches,
        "prefill_ms": {side: probe.prefill_ms for side, probe in probes.items()},
        "load_start": load_start,
        "load_end": load_average(),
    }


def p5_daemon(deterministic: bool) -> Launcher:
    """A daemon serving the default model as ``m`` with the default
    configuration but the ``deterministic`` option and a long
    ``decode_timeout_ms`` (:data:`P5_DECODE_TIMEOUT_MS`), with its own
    directories and cache instance, quiet logs."""
    launcher = Launcher(prefix="lnb-", instance=f"nb{uuid.uuid4().hex[:10]}")
    launcher.write_config(
        f"""
[daemon]
runtime_dir = "{launcher.runtime}"
state_dir = "{launcher.state}"
log_format = "json"
log_level = "warning"
[cache]
instance = "{launcher.instance}"
[models.m]
path = "default"
deterministic = {"true" if deterministic else "false"}
decode_timeout_ms = {P5_DECODE_TIMEOUT_MS}
"""
    )
    return launcher


def measure_p5(*, rounds: int, pairs: int, tokens: int = P5_TOKENS) -> dict[str, Any]:
    """P5 with and without ``deterministic``: two daemons alive at once, each
    sent a fresh ``tokens``-token prompt (greedy, one token: a cold prefill)
    in the order A,B,B,A,... through :class:`llamad.Client`; per request the
    worker's prefill time and tokens and the client's TTFT."""
    from bench.daemon_bench import tokens_of  # noqa: PLC0415 - the daemon bench's prompts
    from bench.daemon_bench_report import measure  # noqa: PLC0415

    load_start = load_average()
    daemons = {side: p5_daemon(side == "deterministic") for side in P5_SIDES}
    clients: dict[str, Client] = {}
    try:
        for side, launcher in daemons.items():
            launcher.start()
            launcher.wait_routed(["m"], timeout=180.0)
            clients[side] = Client(launcher.endpoint, timeout=600.0, connect_timeout=5.0)
            clients[side].complete("m", "Hello", max_tokens=1, temperature=0.0)  # untimed
        # One untimed cold prompt each: the first long prefill's allocations.
        for side, client in clients.items():
            client.complete("m", tokens_of(client, tokens, f"w{side}"), max_tokens=1)
        out: list[dict[str, list[dict[str, float]]]] = []
        for r in range(rounds):
            got: dict[str, list[dict[str, float]]] = {side: [] for side in P5_SIDES}
            for i, pair in enumerate(burst_order(pairs, r)):
                for name in pair:
                    side = "default" if name == "before" else "deterministic"
                    client = clients[side]
                    prompt = tokens_of(client, tokens, f"p5-{uuid.uuid4().hex}-{r}-{i}")
                    t0 = time.perf_counter()
                    result = client.complete("m", prompt, max_tokens=1, temperature=0.0)
                    m = measure((time.perf_counter() - t0) * 1e3, result)
                    got[side].append(
                        {
                            "prefill_ms": m.prefill_ms,
                            "prefill_tokens": m.prefill_tokens,
                            "reply_ms": m.ttft_ms,
                        }
                    )
            ratio = round_ratio(
                [x["prefill_ms"] / x["prefill_tokens"] for x in got["default"]],
                [x["prefill_ms"] / x["prefill_tokens"] for x in got["deterministic"]],
            )
            print(f"p5 round {r + 1}/{rounds}: deterministic/default {ratio:.3f}", flush=True)
            out.append(got)
    finally:
        for client in clients.values():
            client.close()
        for launcher in daemons.values():
            launcher.close(120.0)
    return {"rounds": out, "load_start": load_start, "load_end": load_average()}


def _decode_streams(client_of: Any, prompts: Sequence[list[int]], tokens: int) -> dict[str, float]:
    """``len(prompts)`` greedy streams at once, one client thread each: tokens
    after each stream's first, and the time from the first stream's first
    token to the last stream's last."""
    import threading  # noqa: PLC0415

    from llamad.model.results import TokenEvent  # noqa: PLC0415

    times: list[list[float]] = [[] for _ in prompts]
    errors: list[BaseException] = []
    start = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        try:
            with client_of() as client:
                start.wait(60)
                for event in client.infer("m", prompts[i], max_tokens=tokens, temperature=0.0):
                    if isinstance(event, TokenEvent) and event.token is not None:
                        times[i].append(time.perf_counter())
        except BaseException as exc:  # reported below, in the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    if errors:
        raise errors[0]
    first = min(t[0] for t in times)
    last = max(t[-1] for t in times)
    return {"tokens": float(sum(len(t) - 1 for t in times)), "seconds": last - first}


def measure_p34(*, rounds: int, pairs: int, tokens: int = P34_TOKENS) -> dict[str, Any]:
    """Decode with and without ``deterministic``: the two daemons of
    :func:`measure_p5`, 1 and 4 concurrent greedy streams, pairs A,B,B,A."""
    from bench.peers.workload import counting_tokens  # noqa: PLC0415

    load_start = load_average()
    daemons = {side: p5_daemon(side == "deterministic") for side in P5_SIDES}
    try:
        for launcher in daemons.values():
            launcher.start()
        for launcher in daemons.values():
            launcher.wait_routed(["m"], timeout=180.0)

        def client_of(side: str) -> Any:
            return lambda: Client(daemons[side].endpoint, timeout=600.0, connect_timeout=5.0)

        with client_of("default")() as c:
            prompts = [
                counting_tokens(lambda t: c.tokenize("m", t), 100 * (i + 1)) for i in range(4)
            ]
        for side in P5_SIDES:  # untimed: each daemon's first decodes
            _decode_streams(client_of(side), prompts[:1], 8)
        out: list[dict[str, dict[str, list[dict[str, float]]]]] = []
        for r in range(rounds):
            got: dict[str, dict[str, list[dict[str, float]]]] = {
                str(n): {side: [] for side in P5_SIDES} for n in P34_STREAMS
            }
            for n in P34_STREAMS:
                for pair in burst_order(pairs, r):
                    for name in pair:
                        side = "default" if name == "before" else "deterministic"
                        got[str(n)][side].append(
                            _decode_streams(client_of(side), prompts[:n], tokens)
                        )
                ratio = _p34_ratio(got[str(n)])
                print(f"p34 round {r + 1}/{rounds}, {n} stream(s): {ratio:.3f}", flush=True)
            out.append(got)
    finally:
        for launcher in daemons.values():
            launcher.close(120.0)
    return {"rounds": out, "load_start": load_start, "load_end": load_average()}


def _p34_ratio(sides: Mapping[str, Sequence[Mapping[str, float]]]) -> float:
    """A round's deterministic over default decode speed: the median of its pairs."""
    return round_ratio(
        [x["seconds"] / x["tokens"] for x in sides["default"]],
        [x["seconds"] / x["tokens"] for x in sides["deterministic"]],
    )


def _render_p34(params: Mapping[str, Any], p34: Mapping[str, Any]) -> list[str]:
    rows = []
    for n in P34_STREAMS:
        per = [r[str(n)] for r in p34["rounds"]]
        ratios = [_p34_ratio(sides) for sides in per]

        def speed(side: str, per: list[Any] = per) -> float:
            return median([x["tokens"] / x["seconds"] for sides in per for x in sides[side]])

        rows.append(
            [
                f"{'P4' if n == 1 else 'P3'}: {n} stream{'s' if n > 1 else ''}",
                f"{speed('default'):.1f}",
                f"{speed('deterministic'):.1f}",
                f"{median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                f">= {UNTILED_BAR:g}",
                verdict(ratios, UNTILED_BAR, at_least=True),
            ]
        )
    start, end = p34["load_start"], p34["load_end"]
    return [
        "## P3 and P4 through the daemon: decode with `deterministic` against the default",
        "",
        "The two daemons of the P5 part (the default configuration, one with `deterministic = "
        f"true`), the default model; each side in turn decodes {params['p34_tokens']} greedy "
        "tokens from counting prompts as one stream (P4) and as 4 concurrent streams from 4 "
        f"client threads (P3), {params['p34_pairs']} pair(s) a round in the order A,B,B,A, "
        f"{len(p34['rounds'])} rounds. Tok/s: aggregate, the tokens after each stream's first "
        "over the time from the first stream's first token to the last stream's last; a "
        "round's ratio: the median of its pairs' deterministic over default; bar: a cost within "
        "SPEC M19's 5 %.",
        "",
        table(
            [
                "test",
                "default tok/s",
                "deterministic tok/s",
                "ratio (median)",
                "spread",
                "bar",
                "verdict",
            ],
            rows,
        ),
        "",
        f"Load average (1, 5, 15 min) at the start: {start[0]:g}, {start[1]:g}, {start[2]:g}; "
        f"at the end: {end[0]:g}, {end[1]:g}, {end[2]:g}.",
        "",
    ]


def _render_p5(params: Mapping[str, Any], p5: Mapping[str, Any]) -> list[str]:
    def tok_s(rows: Sequence[Mapping[str, float]]) -> list[float]:
        return [x["prefill_tokens"] * 1e3 / x["prefill_ms"] for x in rows]

    ratios = [
        round_ratio(
            [1 / t for t in tok_s(r["default"])], [1 / t for t in tok_s(r["deterministic"])]
        )
        for r in p5["rounds"]
    ]
    default = median([t for r in p5["rounds"] for t in tok_s(r["default"])])
    det = median([t for r in p5["rounds"] for t in tok_s(r["deterministic"])])
    start, end = p5["load_start"], p5["load_end"]
    return [
        "## P5 through the daemon: cold prefill with `deterministic` against the default",
        "",
        f"Two daemons alive at once (the default configuration, one with `deterministic = "
        f"true`), the default model, each sent a fresh {params['p5_tokens']:,}-token prompt "
        f"(greedy, `max_tokens` 1) through `llamad.Client`, {params['p5_pairs']} pair(s) a "
        "round in the order A,B,B,A (rounds take turns at going first), "
        "`decode_timeout_ms` 600 s on both (a 2,048-token prompt is one step), "
        f"{len(p5['rounds'])} rounds. Tok/s: the worker's prefill tokens over its prefill time, "
        "median of every request; a round's ratio: the median of its pairs' deterministic "
        "over default tok/s; bar: the option could be the default at >= 0.95 (SPEC M19).",
        "",
        table(
            [
                "test",
                "default tok/s",
                "deterministic tok/s",
                "ratio (median)",
                "spread",
                "bar",
                "verdict",
            ],
            [
                [
                    f"P5 cold {params['p5_tokens']}",
                    f"{default:.1f}",
                    f"{det:.1f}",
                    f"{median(ratios):.3f}",
                    f"{min(ratios):.3f}-{max(ratios):.3f}",
                    f">= {UNTILED_BAR:g}",
                    verdict(ratios, UNTILED_BAR, at_least=True),
                ]
            ],
        ),
        "",
        f"Load average (1, 5, 15 min) at the start: {start[0]:g}, {start[1]:g}, {start[2]:g}; "
        f"at the end: {end[0]:g}, {end[1]:g}, {end[2]:g}.",
        "",
    ]


def _burst_rows(bursts: Mapping[str, Any], per_burst: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for d, rounds in sorted(bursts["depths"].items(), key=lambda kv: int(kv[0])):
        ratios = [round_ratio(r["before_ms"], r["after_ms"]) for r in rounds]
        before = median([x for r in rounds for x in r["before_ms"]])
        after = median([x for r in rounds for x in r["after_ms"]])
        rows.append(
            [
                d,
                f"{per_burst * 1e3 / before:.1f}",
                f"{per_burst * 1e3 / after:.1f}",
                f"{median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                f">= {DECODE_BAR:g}",
                verdict(ratios, DECODE_BAR, at_least=True),
            ]
        )
    return rows


def _render_bursts(params: Mapping[str, Any], bursts: Mapping[str, Any]) -> list[str]:
    same = all(n == 0 for n in bursts["mismatches"].values())
    start, end = bursts["load_start"], bursts["load_end"]
    return [
        "## Decode at KV depth, paired bursts: grouped flash attention (patch 0003) against "
        "the split it replaces",
        "",
        f"Two probes (`bench/numerics_probe.c`, one per build) alive at once; per depth, "
        f"{params['rounds']} rounds of {params['pairs']} pairs of {params['burst']}-token "
        "greedy bursts in the order A,B,B,A,... (each burst's cells removed afterwards, so "
        "every burst runs at the same depth). Tok/s: from the median burst of all rounds; "
        "a round's ratio: the median of its pairs' `before ms / after ms`; ratio: the "
        "median of the rounds; spread: their range.",
        "",
        table(
            [
                "KV depth",
                "before tok/s",
                "after tok/s",
                "ratio (median)",
                "spread",
                "bar",
                "verdict",
            ],
            _burst_rows(bursts, params["burst"]),
        ),
        "",
        f"Load average (1, 5, 15 min) at the start: {start[0]:g}, {start[1]:g}, {start[2]:g}; "
        f"at the end: {end[0]:g}, {end[1]:g}, {end[2]:g} ({params.get('cores', '?')} cores; "
        "the machine's other work was left running, the pairing is what cancels it).",
        "",
        "Same tokens in every burst of a probe at a depth: "
        + ("yes, on both builds." if same else f"NO: mismatching bursts {bursts['mismatches']}."),
        "",
    ]


def _rows(data: Mapping[str, Any], a: str, b: str, bar: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for test in data[a][0]:
        xs = [best(rnd[test]) for rnd in data[a]]
        ys = [best(rnd[test]) for rnd in data[b]]
        ratios = [y / x for x, y in zip(xs, ys, strict=True)]
        rows.append(
            [
                test,
                f"{median(xs):.1f}",
                f"{median(ys):.1f}",
                f"{median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                f">= {bar:g}",
                verdict(ratios, bar, at_least=True),
            ]
        )
    return rows


def render(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    columns = ["ratio (median)", "spread", "bar", "verdict"]
    bench_runs = bool(data.get("before") and data["before"][0]) or bool(
        data.get("tiled") and data["tiled"][0]
    )
    builds = (
        f"Before: `{params['before']}` (patches {params['before_patches']}); after: "
        f"`{params['after']}` (patches {params['after_patches']}). "
    )
    verdicts = (
        "Verdict: met only if every round clears the bar, within noise if the bar lies "
        "inside the spread."
    )
    if bench_runs:
        head = (
            f"{params['rounds']} alternating rounds, {params['threads']} threads, flash "
            f"attention on, the default model. {builds}{_method(params)}Tok/s: median of the "
            "rounds; ratio: median of the per-round ratios; spread: their range. "
        )
    elif "bursts" in data:
        head = f"{params['threads']} threads, flash attention on, the default model. {builds}"
    else:
        head = (
            f"This checkout's build `{params['after']}` (patches {params['after_patches']}); "
            "the daemon's own thread choice (the governor live). "
        )
    lines = [head + verdicts, ""]
    if data.get("before") and data["before"][0]:
        decode = table(
            ["test", "before tok/s", "after tok/s", *columns],
            _rows(data, "before", "after", DECODE_BAR),
        )
        lines += [
            "## Decode at KV depth: grouped flash attention (patch 0003) against the split "
            "it replaces",
            "",
            "`tgN@D`: N tokens decoded after a D-token prompt.",
            "",
            decode,
            "",
        ]
    if data.get("tiled") and data["tiled"][0]:
        prompt = table(
            ["test", "tiled tok/s", "untiled tok/s", *columns],
            _rows(data, "tiled", "untiled", UNTILED_BAR),
        )
        lines += [
            "## Prompt processing: the tiled path off (`GGML_CPU_FA_TILED=0`, the "
            "`deterministic` option) against on",
            "",
            prompt,
            "",
        ]
    if "bursts" in data:
        lines += _render_bursts(params, data["bursts"])
    if "p5" in data:
        lines += _render_p5(params, data["p5"])
    if "p34" in data:
        lines += _render_p34(params, data["p34"])
    return "\n".join(lines)


def _method(params: Mapping[str, Any]) -> str:
    """How a round's figure was taken (a record from before ``reps`` took one run)."""
    if "reps" not in params:
        return ""
    return (
        f"Each round runs every test on both sides back to back and keeps each side's best of "
        f"{params['reps']} repetitions. "
    )


def _patches(lib_dir: Path) -> str:
    """The patch digest a build folder was made with (its folder name says it)."""
    name = lib_dir.parent.parent.name  # <cache>/<version>-<pin>-p<digest>-<backend>/build/bin
    parts = [p for p in name.split("-") if p.startswith("p") and len(p) == 9]
    return parts[0][1:] if parts else "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--before", type=Path, help="lib dir of the build to compare (all but --only p5)"
    )
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=REPS, help="llama-bench repetitions per side")
    ap.add_argument("--pairs", type=int, default=PAIRS, help="paired bursts per round")
    ap.add_argument("--burst", type=int, default=BURST, help="one-token decodes per burst")
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--p5-pairs", type=int, default=P5_PAIRS, help="P5 pairs per round")
    ap.add_argument("--p5-tokens", type=int, default=P5_TOKENS, help="P5's prompt length")
    ap.add_argument("--p34-pairs", type=int, default=P34_PAIRS, help="P3/P4 pairs per round")
    ap.add_argument(
        "--p34-tokens", type=int, default=P34_TOKENS, help="greedy tokens per stream (P3/P4)"
    )
    ap.add_argument(
        "--depths", type=int, nargs="+", default=list(DEPTHS), help="KV depths for bursts"
    )
    ap.add_argument(
        "--only",
        choices=PARTS,
        help="measure this part (default: bursts, the paired decode comparison)",
    )
    ap.add_argument(
        "--label", default="", help="added to the result's name (a second run the same day)"
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.rounds < MIN_ROUNDS and not args.no_record:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    if min(args.rounds, args.reps, args.pairs, args.burst, args.threads) < 1:
        ap.error("--rounds, --reps, --pairs, --burst and --threads must be at least 1")
    parts = [args.only] if args.only else list(DEFAULT_PARTS)
    if args.before is None and parts not in (["p5"], ["p34"]):
        ap.error("--before is needed to compare two builds")
    after = Path(build_record()["lib_dir"])
    before = (args.before or after).expanduser().resolve()
    params: dict[str, Any] = {
        "rounds": args.rounds,
        "parts": parts,
        "threads": args.threads,
        "cores": os.cpu_count(),
        "before": str(before),
        "after": str(after),
        "before_patches": _patches(before),
        "after_patches": _patches(after),
        "depths": sorted(args.depths),
    }
    data: dict[str, Any] = {}
    if "decode" in parts or "prompt" in parts:
        params |= {"reps": args.reps, "prompts": list(PROMPTS)}
        data = measure(before, after, args.rounds, args.reps, parts, threads=args.threads)
    if "bursts" in parts:
        params |= {"pairs": args.pairs, "burst": args.burst, "seed": SEED}
        data["bursts"] = measure_bursts(
            before,
            after,
            rounds=args.rounds,
            pairs=args.pairs,
            burst=args.burst,
            threads=args.threads,
            depths=args.depths,
        )
    if "p5" in parts:
        params |= {"p5_pairs": args.p5_pairs, "p5_tokens": args.p5_tokens}
        data["p5"] = measure_p5(rounds=args.rounds, pairs=args.p5_pairs, tokens=args.p5_tokens)
    if "p34" in parts:
        params |= {"p34_pairs": args.p34_pairs, "p34_tokens": args.p34_tokens}
        data["p34"] = measure_p34(rounds=args.rounds, pairs=args.p34_pairs, tokens=args.p34_tokens)
    if args.no_record:
        print(show(RENDER, params, data))
    elif parts == ["p34"]:
        title = "Same answer under any load: P3 and P4 with the deterministic option"
        print(f"recorded {record('numerics-p34' + args.label, title, RENDER, params, data)}")
    elif parts == ["p5"]:
        title = "Same answer under any load: P5 with the deterministic option, through the daemon"
        print(f"recorded {record('numerics-p5' + args.label, title, RENDER, params, data)}")
    elif parts == ["bursts"]:
        title = "Same answer under any load: decode after grouped flash attention, paired bursts"
        print(f"recorded {record('numerics-decode' + args.label, title, RENDER, params, data)}")
    else:
        title = "Same answer under any load: what grouped flash attention and the untiled path cost"
        print(f"recorded {record('numerics-best', title, RENDER, params, data)}")


if __name__ == "__main__":
    main()
