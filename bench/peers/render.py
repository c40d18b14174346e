"""The result file's tables and text, from :class:`bench.peers_report.Results`."""

from __future__ import annotations

from collections.abc import Sequence

from bench.common import median, table
from bench.peers_report import (
    CLIENT,
    LBENCH,
    LCPP,
    LLAMAD,
    PRIMER,
    RESTORE,
    SERVER,
    TTFT_PATHS,
    Results,
    bars,
    floor_parts,
    itl_p,
    spread,
)


def bars_table(results: Results) -> str:
    return table(
        ["id", "what", "measured: median (min-max)", "bar", "verdict"],
        [[b.id, b.what, b.measured, b.bar, b.verdict] for b in bars(results)],
    )


def ttft_table(results: Results) -> str:
    rows = []
    for system, paths in TTFT_PATHS.items():
        for variant, what in paths:
            cells = [spread(results.get("ttft", system, variant, n)) for n in results.sizes]
            if any(c != "-" for c in cells):
                rows.append([system, what, *cells])
    return table(["system", "path", *(f"{n} tokens, ms" for n in results.sizes)], rows)


def cached_table(results: Results) -> str:
    """Prompt tokens each warm path reused, as the system itself reports it."""
    rows = []
    for system, paths in TTFT_PATHS.items():
        for variant, what in paths:
            cells = [
                spread(results.get("cached", system, variant, n), ".0f") for n in results.sizes
            ]
            if any(c != "-" for c in cells):
                rows.append([system, what, *cells])
    moved = [v for n in results.sizes for v in results.get("moved", SERVER, "ram-cache", n)]
    text = table(["system", "path", *(f"of {n}" for n in results.sizes)], rows)
    if moved:
        text += (
            f"\n\nllama-server's warm hits served by another slot than the prefill's "
            f"(so from its host-RAM prompt cache, not KV left in the slot): "
            f"{sum(moved):.0f} of {len(moved)}."
        )
    return text


def decode_table(results: Results) -> str:
    rows = []
    for system in (LLAMAD, SERVER, LCPP):
        one, four = results.get("decode", system, 1), results.get("decode", system, 4)
        if one or four:
            rows.append([system, spread(one), spread(four)])
    return table(["system", "1 stream, tok/s", "4 streams (aggregate), tok/s"], rows)


def prefill_table(results: Results) -> str:
    rows = []
    for system in (LLAMAD, LBENCH, SERVER, LCPP):
        cells = [spread(results.get("prefill", system, n), ".0f") for n in results.sizes]
        if any(c != "-" for c in cells):
            rows.append([system, *cells])
    return table(["system", *(f"pp {n}, tok/s" for n in results.sizes)], rows)


def scenario_table(results: Results) -> str:
    rows = []
    for system in (LLAMAD, SERVER, LCPP):
        p6a = results.get("p6", system, "agent1")
        p6r = results.get("p6", system, "others")
        p6 = results.get("p6", system, "share")
        p7 = results.get("p7", system, "share")
        p7p = results.get("p7", system, "share of prompt")
        p8s, p8n = (
            results.get("p8", system, "saves", "p99"),
            results.get("p8", system, "no saves", "p99"),
        )
        p9 = results.get("p9", system, "mb")
        if any((p6, p7, p8s, p9)):
            rows.append(
                [
                    system,
                    f"{spread(p6a)} / {spread(p6r)} ({spread([x * 100 for x in p6])}%)"
                    if p6
                    else "-",
                    f"{spread([x * 100 for x in p7])}% ({spread([x * 100 for x in p7p])}%)"
                    if p7
                    else "-",
                    f"{spread(p8n)} / {spread(p8s)}" if p8s else "-",
                    spread(p9, ".0f") if p9 else "-",
                ]
            )
    return table(
        [
            "system",
            "P6 agent 1 / agents 2-8 p50, ms (share)",
            "P7 reused: of reusable (of prompt)",
            "P8 p99 ITL off / saves, ms",
            "P9 idle MB",
        ],
        rows,
    )


def itl_table(results: Results) -> str:
    rows = []
    for name, itl in results.itl_ms.items():
        if itl:
            fired = results.get("p8", LLAMAD, name, "saves_continued")
            rows.append(
                [
                    name,
                    len(itl),
                    f"{itl_p(itl, 50):.1f}",
                    f"{itl_p(itl, 99):.1f}",
                    f"{max(itl):.1f}",
                    " ".join(f"{x:.0f}" for x in fired) or "-",
                ]
            )
    return table(
        ["llamad", "intervals", "p50 ms", "p99 ms", "max ms", "continued saves, per round"], rows
    )


def breakdown_table(results: Results) -> str:
    rows = [[part, spread(ms, ".2f")] for part, ms in floor_parts(results).items()]
    return table(["part of the warm path", "ms: median (min-max)"], rows)


def _m(values: Sequence[float], fmt: str = ".1f") -> str:
    return f"{median(values):{fmt}}" if values else "-"


def notes(results: Results) -> list[str]:
    """For each bar measured and not met: where the time (or memory) goes, from
    this run's own numbers, and what would close it."""
    r = results
    size = max(r.sizes)
    parts = floor_parts(r)
    out: list[str] = []
    for b in bars(r):
        if b.verdict == "met" or b.verdict.startswith("not measured"):
            continue
        if b.id == "P1":
            server = _m(r.get("ttft", SERVER, "ram-cache", size))
            out.append(
                f"P1 ({b.what}: {b.verdict}): the warm ram path at {size} tokens is restore "
                f"{_m(parts.get(RESTORE, []))} ms + primer {_m(parts.get(PRIMER, []))} ms + "
                f"client/transport {_m(parts.get(CLIENT, []))} ms; llama-server's RAM-cache hit "
                f"{server} ms. Closing it means shrinking the largest of these parts."
            )
        elif b.id == "P2":
            out.append(
                f"P2 ({b.verdict}): after the restart, restore from disk "
                f"{_m(r.get('restore', LLAMAD, 'disk-restart', size))} ms + primer "
                f"{_m(r.get('primer', LLAMAD, 'disk-restart', size))} ms of "
                f"{_m(r.get('ttft', LLAMAD, 'disk-restart', size))} ms; the file's pages were "
                "left as the restart and cache-meta's startup prefetch found them (not "
                "dropped). With them dropped the read runs at the device's speed: "
                f"{_m(r.get('ttft', LLAMAD, 'disk-dropped', size))} ms."
            )
        elif b.id in ("P3", "P4"):
            n = 4 if b.id == "P3" else 1
            out.append(
                f"{b.id} ({b.verdict}): llamad {_m(r.get('decode', LLAMAD, n))} tok/s against "
                f"llama-server {_m(r.get('decode', SERVER, n))} at {n} stream(s); both run "
                "the same libllama, so the gap is per-step overhead outside the decode "
                "(scheduling, sampling, event sends) or the thread count llamad's governor chose."
            )
        elif b.id == "P5":
            out.append(
                f"P5 ({b.verdict}): llamad {_m(r.get('prefill', LLAMAD, size), '.0f')} tok/s "
                f"against llama-bench {_m(r.get('prefill', LBENCH, size), '.0f')}; llamad prefills "
                "prefill_chunk_size tokens per tick (512 by default) where llama-bench sends the "
                "whole prompt in n_batch (2048) batches."
            )
        elif b.id == "P6":
            out.append(
                f"P6 ({b.verdict}): agents 2-8 median TTFT {_m(r.get('p6', LLAMAD, 'others'))} ms "
                f"= restore {_m(r.get('p6', LLAMAD, 'restore_ms'))} ms + prefill of "
                f"{_m(r.get('p6', LLAMAD, 'prefill_tokens'), '.0f')} tail tokens "
                f"{_m(r.get('p6', LLAMAD, 'prefill_ms'))} ms + queue "
                f"{_m(r.get('p6', LLAMAD, 'queue_ms'))} ms; the bar is 5% of agent 1's "
                f"{_m(r.get('p6', LLAMAD, 'agent1'))} ms. The tail's prefill is the floor a "
                "restore cannot remove; llama-server: "
                f"{_m([x * 100 for x in r.get('p6', SERVER, 'share')])}%."
            )
        elif b.id == "P7":
            out.append(
                f"P7 ({b.verdict}): llamad reused "
                f"{_m([x * 100 for x in r.get('p7', LLAMAD, 'share')])}% of what it could; "
                "a turn that missed shows in the worker's cache_miss."
            )
        elif b.id == "P8":
            out.append(
                f"P8 ({b.verdict}): p99 ITL {_m(r.get('p8', LLAMAD, 'saves', 'p99'))} ms with "
                f"saves against {_m(r.get('p8', LLAMAD, 'no saves', 'p99'))} ms without: a "
                "continued save stalls the decode loop while it copies the sequence out."
            )
        elif b.id == "P9":
            out.append(
                f"P9 ({b.verdict}): the worker's own overhead (RSS less weights and KV) is "
                f"{_m(r.get('p9', LLAMAD, 'worker'), '.0f')} MB, llama-server's whole overhead "
                f"{_m(r.get('p9', SERVER, 'mb'), '.0f')} MB; the other llamad processes "
                f"(daemon, supervisors, front, cache-meta: one Python interpreter each) hold "
                f"{_m(r.get('p9', LLAMAD, 'others'), '.0f')} MB, each near its interpreter's "
                "import floor (python, pyzmq, msgspec, structlog: about 25 MB before any llamad "
                "module). Counted by PSS (shared pages split between their holders) the group "
                f"holds {_m(r.get('p9', LLAMAD, 'pss'), '.0f')} MB, llama-server "
                f"{_m(r.get('p9', SERVER, 'pss'), '.0f')} MB. Fewer interpreters would close "
                "it: cache_sup, model_sup and the front hosted in the root process (ARCHITECTURE "
                "requires only the root, cache-meta and each worker to be their own processes)."
            )
    return out


def report(results: Results, *, plots: Sequence[str] = ()) -> str:
    """The result file's body (the machine header is bench.common.record's)."""
    r = results
    parts = [
        f"{r.rounds} round(s), systems interleaved in every round; prompt sizes "
        f"{', '.join(map(str, r.sizes))} tokens. A bar is met only when every round "
        'clears it; "within noise" when it lies inside the rounds\' spread.',
        "",
        "### Setup",
        "",
        *(f"- {k}: {v}" for k, v in r.setup.items()),
        *(f"- **skipped** {k}: {v}" for k, v in r.skipped.items()),
        "",
        "### Bars (SPEC P1-P9)",
        "",
        bars_table(r),
        "",
        *(f"- {line}" for line in notes(r)),
        "",
        "### Time to first token",
        "",
        ttft_table(r),
        "",
        "Prompt tokens reused, as each system reports it (llamad `cache_delta.read`, "
        "llama-server `timings.cache_n`, llama-cpp-python: its own cache lookup):",
        "",
        cached_table(r),
        "",
        "### Decode",
        "",
        decode_table(r),
        "",
        "### Cold prefill",
        "",
        prefill_table(r),
        "",
        "### Agents, chat, saves, idle memory",
        "",
        scenario_table(r),
        "",
    ]
    if r.itl_ms:
        parts += [
            "### Inter-token latency (P8, every interval of every round)",
            "",
            itl_table(r),
            "",
        ]
    if r.breakdown:
        parts += [
            "### Where the time goes (llamad, warm ram hit at the largest size)",
            "",
            "From the worker's own timings (`Completion.stats`) and the client's clock; "
            "the floor is copying the row's KV bytes once plus one single-token decode step. "
            "The worker reports its restore as one time (lookup, validated read, unpack); "
            "bench/worker_bench_restore.py times those parts apart, in process.",
            "",
            breakdown_table(r),
            "",
        ]
    parts += [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"
