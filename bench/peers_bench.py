"""llamad against its peers: P1-P12 and P14 side by side in one invocation (issue 11,
issue 15 item 7, issue 19's P10, P11 and HTTP overhead, issue 21's P14; SPEC bars).

    python -m bench.peers_bench [--rounds 3] [--quick] [--no-record]
                                [--skip llama-server|llama-cpp-python ...]

The systems, every one on the default model (SmolLM2-135M-Instruct Q4_1),
``n_ctx`` 4096, ``n_threads`` = ``n_threads_batch`` = cores, flash attention
auto, greedy:

- **llamad**: a real ``python -m llamad.daemon`` (private directory, own
  cache instance) driven through the public :class:`llamad.Client`; one
  model, ``n_seq_max`` 4, with the cache's **default configuration**: no
  save or restore tier chosen, no quota, no policy set (the cache decides
  where a save lands; every tier may be read). A second daemon serves P8's
  ``saves`` (small ``continued_interval``) and ``nosaves`` (``min_tokens``
  beyond any prompt) models: P8 is about saves firing, so it sets the policy
  that makes them fire; a third, the default single model, is P9's idle
  daemon.
- **llama-server** and **llama-bench** from the same pinned tree and build
  folder as the libraries llamad loads (``bench/peers_setup.py``): ``-np 4
  --kv-unified``, prompt cache and host-RAM cache on (bench/peers/server_sys.py).
- **llama-cpp-python** at the pinned version, built from the pinned sdist with
  llamad's CMake flags in its own venv (``bench/peers_setup.py``), with
  ``LlamaRAMCache`` / ``LlamaDiskCache`` (bench/peers/lcpp_sys.py). Without
  that venv it is skipped, and the result file says why.

Requests go back to back, as a user's would: nothing waits for a save
(bench/peers/scenarios.py says how a scenario that needs a row in a tier
gets one). Every scenario runs every system in one round, the systems'
order rotating between rounds (TTFT: cold, back-to-back repeat, repeat from
a tier, after a restart; llama-bench pp; P3/P4 decode; P6 agents; P7 chat;
P8 ITL; through HTTP: P10's TTFT, P11's decode and what HTTP costs over the
``Client``, bench/peers/http_round.py; P14, single-stream decode quiet and
beside a CPU hog per core, llamad and llama-server at their defaults and at 1
thread, each stream for a time budget, bench/peers/contention.py), after an
unrecorded warm-up round (P14's: each system one short quiet stream). P9
is measured once at the end, over every process of each tree: llamad's root,
supervisors, front, cache-meta, worker and HTTP gateway.
Verdicts (bench/peers_report.py) are computed here; plots
(bench/peers_plots.py) lie beside the result file,
``bench/results/<date>-<machine>.md``, which only this script writes, rendered
(:func:`bench.peers.render.render`) from ``<date>-<machine>.json`` beside it:
every series of per-round values, every inter-token interval, the setup.
``--quick`` is one round at 512 tokens with short generations, for
developing on a busy machine; ``--no-record`` prints the report instead of
writing it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import peers_setup
from bench.common import machine, record, results_dir, show
from bench.peers import contention, http_round, idle, scenarios, workload
from bench.peers.lcpp_sys import LlamaCppPython
from bench.peers.llamad_sys import LlamadDaemon, ModelTable
from bench.peers.server_sys import LlamaServer
from bench.peers_plots import plot_all
from bench.peers_report import LCPP, LLAMAD, SERVER, Results, results_data

N_CTX, N_SEQ = 4096, 4
NEVER = 1_000_000_000
RENDER = "bench.peers.render:render"
TITLE = "llamad against its peers (P1-P12, P14)"
WARMUP_ROUND = 99  # the unrecorded warm-up round's number


def machine_name() -> str:
    """A host-name-free descriptor: the CPU model and the cores, as a file name."""
    info = machine()
    cpu = re.sub(r"\((R|TM)\)|CPU|Processor|@.*$", "", info["cpu"])
    slug = re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-") or "cpu"
    return f"{slug}-{info['cores']}c"


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build_rig(args: argparse.Namespace, res: Results, work: Path) -> scenarios.Rig:
    from llamad import paths  # noqa: PLC0415

    threads = os.cpu_count() or 2
    sizes = workload.Sizes.quick() if args.quick else workload.Sizes.full()
    model = str(paths.default_model_path())
    tools = peers_setup.llama_tools()
    main = LlamadDaemon("main", [ModelTable(scenarios.MAIN, N_CTX, N_SEQ, threads)], threads)
    itl = LlamadDaemon(
        "itl",
        [
            ModelTable(
                "saves", N_CTX, N_SEQ, threads, policy={"continued_interval": sizes.itl_interval}
            ),
            ModelTable("nosaves", N_CTX, N_SEQ, threads, policy={"min_tokens": NEVER}),
        ],
        threads,
    )
    server = None
    if SERVER in args.skip:
        res.skipped[SERVER] = "--skip"
    elif not Path(tools["llama-server"]).is_file():
        res.skipped[SERVER] = f"not built: {tools['llama-server']} (run bench/peers_setup.py)"
    else:
        server = LlamaServer(
            tools["llama-server"],
            model,
            n_ctx=N_CTX,
            n_seq_max=N_SEQ,
            threads=threads,
            log=work / "llama-server.log",
        )
    bench_bin = tools["llama-bench"] if Path(tools["llama-bench"]).is_file() else None
    if bench_bin is None:
        res.skipped["llama-bench"] = f"not built: {tools['llama-bench']}"
    lcpp_ram = lcpp_disk = None
    if LCPP in args.skip:
        res.skipped[LCPP] = "--skip"
    else:
        py, why = peers_setup.python_peer(build=False)
        if py is None:
            res.skipped[LCPP] = why
        else:
            lcpp_ram, lcpp_disk = (
                LlamaCppPython(
                    py,
                    model,
                    n_ctx=N_CTX,
                    threads=threads,
                    cache=kind,
                    cache_dir=work / "lcpp-disk-cache",
                    log=work / f"llama-cpp-python-{kind}.log",
                )
                for kind in ("ram", "disk")
            )
    res.setup.update(
        {
            "model": f"{Path(model).name} (n_ctx {N_CTX}, {N_SEQ} sequences, threads {threads})",
            "llamad": "python -m llamad.daemon through llamad.Client; one model, the cache's "
            "default configuration (no save or restore tier, quota or policy set: the cache "
            "chooses where a save lands). P8 only: a second daemon, continued_interval "
            f"{sizes.itl_interval} vs min_tokens beyond any prompt (saves on and off)",
            "llama-server": " ".join(
                Path(a).name if i == 0 else a for i, a in enumerate(server.args)
            )
            if server
            else "-",
            "llama-bench": f"-p N -n 0 -t {threads} -r 1 (default batch 2048, ubatch 512, fa auto)",
            "llama-cpp-python": "Llama + LlamaRAMCache / LlamaDiskCache, in its venv, timed "
            "inside its own process (a library: no IPC hop, unlike the two servers)"
            if lcpp_ram
            else "-",
            "threads": f"{threads} for every system; llamad's thread governor may decode on "
            "fewer when a step collapses (a busy machine), the peers keep theirs",
            "beside a CPU hog per core (P14)": f"{threads} busy-loop processes (one per core) "
            "running from before each stream; one greedy stream per system for "
            f"{sizes.contention_s:g} s beside them and {sizes.contention_quiet_s:g} s quiet "
            f"(at most {contention.MAX_TOKENS} tokens): llamad's main daemon (threads "
            f"{threads}, its governor live) and a daemon of its own at n_threads 1, "
            f"llama-server as above (-t {threads}) and one of its own at -t 1 -tb 1; "
            "a cut llama-server stream's generation stopped (its /slots idle) before the "
            "next system's",
            "waits": "none: every request is sent the moment the previous reply ended "
            "(P6's agents 2-8 together, the moment agent 1's ended); no scenario waits for a "
            "save to be published",
            "back-to-back repeat (P12)": "the prompt again the moment its cold reply ended: "
            "llamad keeps the finished request's KV as an idle entry; llama-server picks the "
            "slot whose prompt shares the most with it (same slot and timings.cache_n recorded)",
            "repeat from a tier (P1)": f"llamad: {N_SEQ} (n_seq_max) other "
            f"{scenarios.FILLER_TOKENS}-token requests first, back to back, so every sequence "
            "is taken, the prompt's idle entry's last (a new request takes an empty sequence "
            "first, then the least recently used idle entry's): the repeat is looked up in the "
            "cache, its finish save not waited for (where its tokens came from: "
            "cache_delta.sources); llama-server: one filler takes another slot and idle slots "
            "go to its host-RAM cache; llama-cpp-python: the context is reset first",
            "through HTTP (P10, P11, HTTP overhead)": "POST /v1/completions to both "
            "servers (llamad's gateway on its [http] port; llama-server), token ids, greedy, "
            "streamed, one plain http.client reader, each request on a new connection "
            "opened untimed (bench/peers/http_sse.py); TTFT: request written to the first chunk "
            "carrying a choice parsed; at the largest size: cold, back-to-back repeat, the "
            "P1 fillers, the repeat (llamad: from a tier; llama-server: its host-RAM "
            "cache); llamad through the Client the same way in the same round, the two "
            "ways in alternating which goes first; then HTTP's own cost to the first "
            "token: 8 back-to-back repeats of the live prompt through one way, 8 through "
            "the other, each run's median (the first repeat after a cold reply lands on "
            "that reply's finish save being written, and is shown apart); decode: 1 and 4 "
            "streams through each",
            "after a restart (P2)": "every system is stopped and started again; llamad: "
            "SIGTERM (its clean stop), a new daemon over the same runtime, state and "
            "ram_file directories, default configuration, then each size's prompt: its "
            "first repeat since; where its tokens came from is reported "
            "(cache_delta.sources). The former 'pages dropped' variant is gone: it timed a "
            "read from a disk-only model with the row's pages dropped; with the default "
            "configuration the cache decides which tier keeps a row across a clean stop "
            "(SPEC C12: ram rows demoted to ram_file, a copy on disk), so dropping the disk "
            "files' pages times no path P2 names; a reboot (disk only, pages cold) is "
            "another scenario",
        }
    )
    return scenarios.Rig(
        threads,
        N_CTX,
        N_SEQ,
        model,
        sizes,
        main,
        itl,
        server,
        lcpp_ram,
        lcpp_disk,
        bench_bin,
        log=log,
    )


def start(rig: scenarios.Rig) -> None:
    log("starting llamad (main, itl)")
    rig.llamad.start()
    assert rig.itl is not None
    rig.itl.start()
    if rig.server is not None:
        log("starting llama-server")
        rig.server.start()
    for lcpp in (rig.lcpp_ram, rig.lcpp_disk):
        if lcpp is not None:
            log("starting llama-cpp-python")
            lcpp.start()


def stop(rig: scenarios.Rig) -> None:
    for thing in (rig.lcpp_ram, rig.lcpp_disk, rig.server, rig.server_one):
        if thing is not None:
            with contextlib.suppress(Exception):
                thing.stop()
    for d in (rig.llamad, rig.itl, rig.llamad_one):
        if d is not None:
            d.remove()


STEPS = ("ttft", "pp", "decode", "agents", "chat", "itl", "http", "contention", "idle")


def one_round(rig: scenarios.Rig, res: Results, rnd: int, only: set[str]) -> None:
    systems = [LLAMAD, SERVER, LCPP]
    order = systems[rnd % 3 :] + systems[: rnd % 3]
    steps: tuple[tuple[str, Callable[[], None]], ...] = (
        ("ttft", lambda: scenarios.ttft_round(rig, res, rnd, order)),
        ("pp", lambda: scenarios.llama_bench_round(rig, res)),
        ("decode", lambda: scenarios.decode_round(rig, res, rnd, order)),
        ("agents", lambda: scenarios.agents_round(rig, res, rnd, order)),
        ("chat", lambda: scenarios.chat_round(rig, res, rnd, order)),
        ("itl", lambda: scenarios.itl_round(rig, res, rnd)),
        ("http", lambda: http_round.http_round(rig, res, rnd, order)),
        (
            "contention",
            lambda: contention.contention_round(rig, res, rnd, warmup=rnd == WARMUP_ROUND),
        ),
    )
    for name, step in steps:
        if name in only:
            log(f"round {rnd}: {name}, order {order}, load {load_avg()}")
            step()


def idle_round(rig: scenarios.Rig, res: Results, work: Path) -> None:
    """P9 on a fresh single-model llamad and a fresh llama-server (-lv 4 for its sizes)."""
    if rig.server is None:
        res.skipped["P9"] = "needs llama-server's log of the weights' and KV's sizes"
        return
    probe = LlamaServer(
        rig.server.binary,
        rig.model,
        n_ctx=N_CTX,
        n_seq_max=N_SEQ,
        threads=rig.threads,
        log=work / "llama-server-idle.log",
    )
    probe.args += ["-lv", "4"]
    daemon = LlamadDaemon("idle", [ModelTable("smollm2", N_CTX, N_SEQ, rig.threads)], rig.threads)
    try:
        probe.start()
        ids = workload.exact_tokens(rig.tokenize, "idle", 64)
        probe.complete(ids, 4)
        client = daemon.start()
        client.complete("smollm2", ids, max_tokens=4, temperature=0.0)
        daemon.http_url()  # the gateway serves: it is one of the tree's processes
        idle.settle()
        sizes = probe.buffers_mib()
        if not sizes["model"] or not sizes["kv"]:
            res.skipped["P9"] = f"llama-server's log lacks the buffer sizes: {sizes}"
            return
        res.setup["P9 weights / KV (llama.cpp's own sizes)"] = (
            f"{sizes['model']:.1f} MiB / {sizes['kv']:.1f} MiB per process holding the model"
        )
        ours = idle.rss_bytes(daemon.pids())
        res.add(idle.overhead_mb(ours, 1, sizes["model"], sizes["kv"]), "p9", LLAMAD, "mb")
        gateway = daemon.gateway_pid()
        if gateway is None or gateway not in daemon.pids():
            res.skipped["P9"] = f"the HTTP gateway ({gateway}) is not in the daemon's tree"
            return
        res.add(idle.rss_bytes([gateway]) / idle.MB, "p9", LLAMAD, "gateway")
        worker = client.model_info("smollm2").pid
        if worker is not None:
            mine = idle.rss_bytes([worker])
            res.add(idle.overhead_mb(mine, 1, sizes["model"], sizes["kv"]), "p9", LLAMAD, "worker")
            res.add((ours - mine) / idle.MB, "p9", LLAMAD, "others")
        res.add(
            idle.overhead_mb(idle.rss_bytes(probe.pids()), 1, sizes["model"], sizes["kv"]),
            "p9",
            SERVER,
            "mb",
        )
        # For the record beside SPEC's RSS sum: shared pages (libpython, the
        # GGUF both map) split between their holders.
        holders = [worker] if worker is not None else []
        res.add(
            idle.pss_overhead_mb(daemon.pids(), holders, rig.model, sizes["kv"]),
            "p9",
            LLAMAD,
            "pss",
        )
        res.add(
            idle.pss_overhead_mb(probe.pids(), probe.pids(), rig.model, sizes["kv"]),
            "p9",
            SERVER,
            "pss",
        )
        res.setup["P9 processes, RSS/PSS MB"] = (
            f"llamad: {idle.describe(daemon.pids(), pss=True)}; "
            f"llama-server: {idle.describe(probe.pids(), pss=True)}"
        )
    finally:
        probe.stop()
        daemon.remove()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round, 512 tokens, short outputs")
    ap.add_argument("--no-record", action="store_true", help="print the report, write nothing")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--skip", nargs="*", default=[], choices=[SERVER, LCPP])
    ap.add_argument(
        "--only",
        nargs="*",
        choices=STEPS,
        default=list(STEPS),
        help="scenarios to run (development; a recorded run runs them all)",
    )
    args = ap.parse_args()
    only = set(args.only)
    if not args.no_record and only != set(STEPS):
        ap.error("--only needs --no-record: a recorded run runs every scenario")
    rounds = 1 if args.quick else args.rounds
    work = Path(tempfile.mkdtemp(prefix="llamad-peers-"))
    sizes = workload.Sizes.quick() if args.quick else workload.Sizes.full()
    res = Results(rounds=rounds, sizes=sizes.ttft)
    rig = build_rig(args, res, work)
    load_start = load_avg()
    try:
        start(rig)
        if not args.no_warmup:
            log("warm-up round (not recorded)")
            one_round(rig, Results(rounds=1, sizes=sizes.ttft), WARMUP_ROUND, only)
        for rnd in range(rounds):
            one_round(rig, res, rnd, only)
        if "idle" in only:
            idle_round(rig, res, work)
    finally:
        stop(rig)
        # The disk caches' gigabytes go; the peers' logs stay for a look.
        shutil.rmtree(work / "lcpp-disk-cache", ignore_errors=True)
    res.setup["load average (1, 5, 15 min)"] = f"{load_start} at start, {load_avg()} at end"
    if args.quick:
        res.setup["mode"] = "--quick: one round at 512 tokens; indicative only"
    if args.no_record:
        plots = plot_all(res, work, "peers")
        params = {"rounds": rounds, "sizes": list(res.sizes), "plots": [str(p) for p in plots]}
        print(show(RENDER, params, results_data(res)))
        log(f"plots in {work}")
        return 0
    stem = f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-{machine_name()}"
    plots = plot_all(res, results_dir(), stem)
    path = record_run(stem, res, [p.name for p in plots])
    print(f"recorded {path}")
    return 0


def record_run(stem: str, res: Results, plots: list[str], results: Path | None = None) -> Path:
    """Record as ``<stem>.json`` and ``.md`` (``<date>-<machine>``, not
    bench.common.record's ``<name>-<date>``); the ``.md``'s path."""
    params = {"rounds": res.rounds, "sizes": list(res.sizes), "plots": plots}
    return record(stem, TITLE, RENDER, params, results_data(res), results=results, dated=False)


if __name__ == "__main__":
    sys.exit(main())
