"""The result file's tables and text, from :class:`bench.peers_report.Results`.

A recorded run is ``<date>-<machine>.json`` beside its ``.md``:
:func:`render` reads its ``data`` back into :class:`~bench.peers_report.Results`
(every series, one value per round; every inter-token interval; the warm
path's parts per round; the setup and what was skipped) and renders the
``.md`` with :func:`report`, the verdicts judged again by
:func:`bench.peers_report.bars`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.common import median, table
from bench.peers_report import (
    CLIENT,
    CLIENT_VIA,
    COPY_FLOOR,
    COPY_PAST_CACHE,
    HTTP_VIA,
    INFO,
    LBENCH,
    LCPP,
    LLAMAD,
    LOAD,
    LOOKUP,
    P1_FLOOR_RATIO,
    P6_PREFIX_MS,
    P14_CONFIGS,
    P14_ID,
    PRIMER,
    RESTORE,
    SERVER,
    SOURCES,
    TTFT_PATHS,
    WAIT,
    Results,
    against_floor,
    bars,
    floor_parts,
    has_p14,
    itl_p,
    p14_fraction,
    p14_rates,
    results_of,
    spread,
)


def exit_line(results: Results) -> list[str]:
    """llamad's exit status on the SIGTERM before P2, every round (-1: killed
    after the stop's timeout)."""
    codes = results.get("exit", LLAMAD, "restart")
    if not codes:
        return []
    said = ", ".join(f"{c:.0f}" for c in codes)
    return [f"llamad's exit status on the SIGTERM before P2, per round: {said}.", ""]


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
    text = table(["system", "path", *(f"of {n}" for n in results.sizes)], rows)
    same = [v for n in results.sizes for v in results.get("same-slot", SERVER, "repeat", n)]
    if same:
        text += (
            f"\n\nllama-server's back-to-back repeats served by the slot that ran the prompt "
            f"first (a live-slot hit, P12's peer): {sum(same):.0f} of {len(same)}."
        )
    moved = [v for n in results.sizes for v in results.get("moved", SERVER, "ram-cache", n)]
    if moved:
        text += (
            f"\n\nllama-server's repeats after a filler served by another slot than the "
            f"prefill's (so from its host-RAM prompt cache, not KV left in the slot): "
            f"{sum(moved):.0f} of {len(moved)}."
        )
    return text


def _sources_cell(results: Results, variant: str, n: int) -> str:
    """``live 2047 / ram 0 / ... / computed 1`` (medians over rounds; a source
    no round used is left out; a source that varied shows its range)."""
    parts = []
    for source in SOURCES:
        v = results.get("sources", LLAMAD, variant, n, source)
        if v and max(v) > 0:
            parts.append(f"{source} {spread(v, '.0f')}")
    return " / ".join(parts) or "-"


def sources_table(results: Results) -> str:
    """llamad's own account of every prompt token of its warm paths:
    ``cache_delta.sources`` (live KV, a tier, or computed)."""
    rows = []
    for variant, what in TTFT_PATHS[LLAMAD]:
        cells = [_sources_cell(results, variant, n) for n in results.sizes]
        if any(c != "-" for c in cells):
            rows.append([what, *cells])
    return table(["llamad path", *(f"{n} tokens" for n in results.sizes)], rows)


def worker_table(results: Results) -> str:
    """llamad's warm paths at every size by the worker's own clock, and what it
    did not see (medians over rounds)."""
    rows = []
    for variant, what in TTFT_PATHS[LLAMAD][1:]:
        for n in results.sizes:
            ttft = results.get("ttft", LLAMAD, variant, n)
            if not ttft:
                continue
            parts = [
                _m(results.get("worker", LLAMAD, variant, n, name), ".2f")
                for name in ("queue_ms", "restore_ms", "wait_ms", "prefill_ms", "unseen_ms")
            ]
            rows.append([what, n, _m(ttft, ".2f"), *parts])
    return table(
        [
            "llamad path",
            "tokens",
            "TTFT ms",
            "queue_ms",
            "restore_ms",
            "of it wait_ms",
            "prefill_ms",
            "not seen by the worker, ms",
        ],
        rows,
    )


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


def agents_table(results: Results) -> str:
    """P6, per system: agent 1, agents 2-8 p50, their ratio to agent 1's
    (information), and what each system reported of agents 2-8 (medians)."""
    rows = []
    for system in (LLAMAD, SERVER):
        first = results.get("p6", system, "agent1")
        if not first:
            continue
        if system == LLAMAD:
            said = (
                f"queue {spread(results.get('p6', system, 'queue_ms'))} + restore "
                f"{spread(results.get('p6', system, 'restore_ms'))} (of it waiting "
                f"{spread(results.get('p6', system, 'wait_ms'))}) + not seen by the worker "
                f"{spread(results.get('p6', system, 'unseen_ms'))} + tail prefill "
                f"{spread(results.get('p6', system, 'prefill_ms'))} ms of "
                f"{spread(results.get('p6', system, 'prefill_tokens'), '.0f')} tokens; "
                f"prefix from live KV {spread(results.get('p6', system, 'live'), '.0f')}, "
                f"from a tier {spread(results.get('p6', system, 'tier'), '.0f')} tokens"
            )
            prefix = spread(results.get("p6", system, "prefix_ms"))
        else:
            said = (
                f"cache_n {spread(results.get('p6', system, 'cache_n'), '.0f')}, prompt_n "
                f"{spread(results.get('p6', system, 'prompt_n'), '.0f')}, prompt_ms "
                f"{spread(results.get('p6', system, 'prompt_ms'))}"
            )
            prefix = "-"
        rows.append(
            [
                system,
                spread(first),
                spread(results.get("p6", system, "others")),
                spread([x * 100 for x in results.get("p6", system, "share")]),
                prefix,
                said,
            ]
        )
    return table(
        [
            "system",
            "agent 1 TTFT, ms",
            "agents 2-8 p50 TTFT, ms",
            "p50 / agent 1, %",
            "prefix's share, ms",
            "agents 2-8, as the system reports them (medians)",
        ],
        rows,
    )


def chat_table(results: Results) -> str:
    """P7, per system: reuse of the reusable tokens and of all prompt tokens,
    turns 2 on; for llamad where the reused tokens came from."""
    rows = []
    for system in (LLAMAD, SERVER):
        share = results.get("p7", system, "share")
        if not share:
            continue
        where = "-"
        if system == LLAMAD:
            where = " / ".join(
                f"{source} {spread(v, '.0f')}"
                for source in SOURCES
                if (v := results.get("p7", system, "sources", source)) and max(v) > 0
            )
        rows.append(
            [
                system,
                f"{spread([x * 100 for x in share])}%",
                f"{spread([x * 100 for x in results.get('p7', system, 'share of prompt')])}%",
                spread(results.get("p7", system, "prompt tokens"), ".0f"),
                spread(results.get("p7", system, "message tokens"), ".0f"),
                where or "-",
            ]
        )
    return table(
        [
            "system",
            "reused / reusable",
            "reused / all prompt tokens",
            "prompt tokens per turn (mean)",
            "user message tokens (mean)",
            "prompt tokens of turns 2 on by source (sum per round)",
        ],
        rows,
    )


def scenario_table(results: Results) -> str:
    rows = []
    for system in (LLAMAD, SERVER, LCPP):
        p8s, p8n = (
            results.get("p8", system, "saves", "p99"),
            results.get("p8", system, "no saves", "p99"),
        )
        p9 = results.get("p9", system, "mb")
        if any((p8s, p9)):
            rows.append(
                [
                    system,
                    f"{spread(p8n)} / {spread(p8s)}" if p8s else "-",
                    spread(p9, ".0f") if p9 else "-",
                ]
            )
    return table(["system", "P8 p99 ITL off / saves, ms", "P9 idle MB"], rows)


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


def has_http(results: Results) -> bool:
    """The run measured the HTTP bars (older records did not: their files
    render as they were)."""
    return any(k.startswith("http-") for k in results.series)


# (system, way in, TTFT paths) of the HTTP section's rows
HTTP_ROWS = (
    (LLAMAD, CLIENT_VIA, ("cold", "repeat", "ram")),
    (LLAMAD, HTTP_VIA, ("cold", "repeat", "ram")),
    (SERVER, HTTP_VIA, ("cold", "repeat", "ram-cache")),
)


def http_table(results: Results) -> str:
    """P10/P11's measurements: per system and way in, TTFT of each path at
    the largest size (reused prompt tokens beside it) and decode rates."""
    r = results
    n = max(r.sizes)
    rows = []
    for system, via, paths in HTTP_ROWS:
        cells = [
            f"{spread(r.get('http-ttft', system, via, path, n), '.2f')} "
            f"[{spread(r.get('http-cached', system, via, path, n), '.0f')}]"
            for path in paths
        ]
        decode = [spread(r.get("http-decode", system, via, k)) for k in (1, 4)]
        if any(v for path in paths for v in r.get("http-ttft", system, via, path, n)):
            rows.append([system, via, *cells, *decode])
    return table(
        [
            "system",
            "way in",
            f"cold {n}, ms [reused]",
            "back-to-back repeat, ms [reused]",
            "repeat after the fillers (llamad: a tier; llama-server: host-RAM cache), ms [reused]",
            "1 stream, tok/s",
            "4 streams, tok/s",
        ],
        rows,
    )


def contention_table(results: Results) -> str:
    """P14's measurements per system and thread configuration: quiet and
    beside the hogs (decode tok/s), the share of its quiet rate it kept
    (paired by round), its first token and the tokens it decoded beside them."""
    r = results
    rows = []
    for system in (LLAMAD, SERVER):
        for config, what in P14_CONFIGS:
            quiet = p14_rates(r, system, config, "quiet")
            hogs = p14_rates(r, system, config, "hogs")
            if not (quiet or hogs):
                continue
            restarts = len(r.get("p14", system, config, "hogs", "restarted")) + len(
                r.get("p14", system, config, "quiet", "restarted")
            )
            rows.append(
                [
                    system,
                    what,
                    spread(quiet),
                    spread(hogs, ".3g"),
                    spread([x * 100 for x in p14_fraction(r, system, config)], ".3g"),
                    spread(r.get("p14", system, config, "hogs", "first_ms"), ".0f"),
                    spread(r.get("p14", system, config, "hogs", "tokens"), ".0f"),
                    spread(r.get("p14", system, config, "hogs", "seconds")),
                    str(restarts) if system == SERVER else "-",
                ]
            )
    return table(
        [
            "system",
            "threads",
            "quiet, tok/s",
            "beside the hogs, tok/s",
            "of its quiet rate, %",
            "first token beside the hogs, ms",
            "tokens decoded beside the hogs",
            "over s",
            "restarted after a cut",
        ],
        rows,
    )


def breakdown_table(results: Results) -> str:
    rows = [[part, spread(ms, ".2f")] for part, ms in floor_parts(results).items()]
    return table(["part of the warm path", "ms: median (min-max)"], rows)


def against_floor_table(results: Results) -> str:
    rows = [
        [part, floor, spread(ratios, ".2f")]
        for part, (floor, ratios) in against_floor(results).items()
    ]
    return table(["part of the warm path", "against", "x: median (min-max)"], rows)


def _m(values: Sequence[float], fmt: str = ".1f") -> str:
    return f"{median(values):{fmt}}" if values else "-"


def _quiet_share(results: Results, system: str) -> str:
    """P14's note: the share of its quiet rate a system kept at its default
    threads beside the hogs (median over rounds)."""
    share = p14_fraction(results, system, "default")
    if not share:
        return "no quiet rate to compare: it decoded nothing quiet"
    return f"{median(share) * 100:.3g}% of its quiet rate"


def _past_cache(parts: Mapping[str, Sequence[float]]) -> str:
    past = parts.get(COPY_PAST_CACHE, [])
    return f"; its stores past the cache, as a worker copies: {_m(past)} ms" if past else ""


def _restore_parts(parts: Mapping[str, Sequence[float]]) -> str:
    """The restore's own parts, where the worker reported them (issue 21)."""
    if not parts.get(LOAD):
        return ""
    return (
        f"; of the restore, lookup {_m(parts.get(LOOKUP, []))} ms and the row's validated "
        f"read + unpack {_m(parts.get(LOAD, []))} ms"
    )


def _sources_of(results: Results, variant: str, n: int) -> str:
    cell = _sources_cell(results, variant, n)
    return "no sources reported" if cell == "-" else cell


def notes(results: Results) -> list[str]:
    """For each bar measured and not met: where the time (or memory) goes, from
    this run's own numbers, and what would close it."""
    r = results
    size = max(r.sizes)
    parts = floor_parts(r)
    out: list[str] = []
    noted: set[str] = set()
    for b in bars(r):
        if b.verdict in ("met", INFO) or b.verdict.startswith("not measured") or b.id in noted:
            continue
        # One note per bar id: the first row it misses names itself.
        noted.add(b.id)
        if b.id == "P1":
            server = _m(r.get("ttft", SERVER, "ram-cache", size))
            out.append(
                f"P1 ({b.what}: {b.verdict}): the repeat from a tier at {size} tokens is restore "
                f"{_m(parts.get(RESTORE, []))} ms (of it waiting for the row's save "
                f"{_m(parts.get(WAIT, []))} ms) + first token {_m(parts.get(PRIMER, []))} ms + "
                f"client/transport {_m(parts.get(CLIENT, []))} ms (the row copied once: "
                f"{_m(parts.get(COPY_FLOOR, []))} ms{_past_cache(parts)}){_restore_parts(parts)}; "
                "its tokens came from "
                f"{_sources_of(r, 'ram', size)}; llama-server's host-RAM cache hit {server} ms."
            )
        elif b.id == "P2":
            out.append(
                f"P2 ({b.verdict}): the first repeat after the restart took "
                f"{_m(r.get('ttft', LLAMAD, 'restart', size))} ms (restore "
                f"{_m(r.get('worker', LLAMAD, 'restart', size, 'restore_ms'))} ms, first token "
                f"{_m(r.get('worker', LLAMAD, 'restart', size, 'prefill_ms'))} ms); its tokens "
                "came from "
                f"{_sources_of(r, 'restart', size)}. With the default configuration a row "
                "survives a restart only where the cache keeps it across a clean stop "
                "(SPEC C12: ram rows demoted to ram_file, disk copies): 'computed' means "
                "nothing survived."
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
                f"P6 ({b.what}: {b.verdict}): llamad's agents 2-8 p50 TTFT "
                f"{_m(r.get('p6', LLAMAD, 'others'))} ms = queue "
                f"{_m(r.get('p6', LLAMAD, 'queue_ms'))} + restore "
                f"{_m(r.get('p6', LLAMAD, 'restore_ms'))} (waiting "
                f"{_m(r.get('p6', LLAMAD, 'wait_ms'))}) + tail prefill "
                f"{_m(r.get('p6', LLAMAD, 'prefill_ms'))} ms + not seen by the worker "
                f"{_m(r.get('p6', LLAMAD, 'unseen_ms'))} ms (medians, each over agents); the "
                "prefix's share (TTFT - queue - tail prefill) "
                f"{_m(r.get('p6', LLAMAD, 'prefix_ms'))} ms against {P6_PREFIX_MS:g}. The "
                "prefix itself, by the worker's clock, is the restore (live cells shared); "
                "the time it does not see is the way in and out and, for an agent that "
                "arrived while another agent's tail was being prefilled, that whole tick "
                "(no worker stat counts it: docs/internals/model-worker.md, 'What is left'). "
                f"llama-server's p50 {_m(r.get('p6', SERVER, 'others'))} ms "
                f"(cache_n {_m(r.get('p6', SERVER, 'cache_n'), '.0f')})."
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
        elif b.id == "P10":
            n = max(r.sizes)
            out.append(
                f"P10 ({b.verdict}): llamad's repeat from a tier through HTTP "
                f"{_m(r.get('http-ttft', LLAMAD, HTTP_VIA, 'ram', n), '.2f')} ms against "
                f"{_m(r.get('http-ttft', LLAMAD, CLIENT_VIA, 'ram', n), '.2f')} ms through the "
                "Client in the same rounds; llama-server's host-RAM cache hit "
                f"{_m(r.get('http-ttft', SERVER, HTTP_VIA, 'ram-cache', n), '.2f')} ms "
                f"(reused {_m(r.get('http-cached', SERVER, HTTP_VIA, 'ram-cache', n), '.0f')} "
                "tokens). The way in through HTTP is the Client's plus the gateway's hop: "
                "the HTTP rows below say how much of the TTFT that is."
            )
        elif b.id == "P11":
            out.append(
                f"P11 ({b.verdict}): llamad through HTTP "
                f"{_m(r.get('http-decode', LLAMAD, HTTP_VIA, 4))} tok/s (through the Client "
                f"{_m(r.get('http-decode', LLAMAD, CLIENT_VIA, 4))}) against llama-server "
                f"{_m(r.get('http-decode', SERVER, HTTP_VIA, 4))} at 4 streams; with the "
                "Client's rate at P3's, the gap is the gateway's per-token work "
                "(an event in, a JSON chunk out)."
            )
        elif b.id == "HTTP":
            n = max(r.sizes)
            out.append(
                f"HTTP ({b.what}: {b.verdict}): back-to-back repeats through HTTP "
                f"{_m(r.get('http-run', LLAMAD, HTTP_VIA, n), '.2f')} ms against "
                f"{_m(r.get('http-run', LLAMAD, CLIENT_VIA, n), '.2f')} ms through "
                "the Client (the first repeat after the cold reply: "
                f"{_m(r.get('http-ttft', LLAMAD, HTTP_VIA, 'repeat', n), '.2f')} against "
                f"{_m(r.get('http-ttft', LLAMAD, CLIENT_VIA, 'repeat', n), '.2f')} ms); "
                "decode at 1 stream "
                f"{_m(r.get('http-decode', LLAMAD, HTTP_VIA, 1))} against "
                f"{_m(r.get('http-decode', LLAMAD, CLIENT_VIA, 1))} tok/s. The gateway is one "
                "more process on the token's way (worker, gateway's AsyncClient, JSON, SSE, "
                "the HTTP client), so each token pays one more hop and a Python event loop's turn."
            )
        elif b.id == P14_ID:
            out.append(
                f"P14 ({b.verdict}): beside a CPU hog per core llamad decoded "
                f"{_m(p14_rates(r, LLAMAD, 'default', 'hogs'), '.3g')} tok/s "
                f"({_quiet_share(r, LLAMAD)}) against llama-server's "
                f"{_m(p14_rates(r, SERVER, 'default', 'hogs'), '.3g')} "
                f"({_quiet_share(r, SERVER)}). "
                "A context decoding on every core waits at each graph node for its slowest "
                "thread, and beside the hogs one of them is always descheduled; llamad's "
                "governor sees the collapse and decodes on fewer threads "
                "(docs/internals/threads.md)."
            )
        elif b.id == "P9":
            gateway = (
                f", the HTTP gateway {_m(r.get('p9', LLAMAD, 'gateway'), '.0f')} MB RSS"
                if r.get("p9", LLAMAD, "gateway")
                else ""
            )
            out.append(
                f"P9 ({b.verdict}): the worker's own overhead (RSS less weights and KV) is "
                f"{_m(r.get('p9', LLAMAD, 'worker'), '.0f')} MB, llama-server's whole overhead "
                f"{_m(r.get('p9', SERVER, 'mb'), '.0f')} MB; the other llamad processes "
                f"(daemon, supervisors, front, cache-meta{gateway}: one Python interpreter "
                "each) hold "
                f"{_m(r.get('p9', LLAMAD, 'others'), '.0f')} MB, each near its interpreter's "
                "import floor (python, pyzmq, msgspec, structlog: about 25 MB before any llamad "
                "module). Counted by PSS (shared pages split between their holders) the group "
                f"holds {_m(r.get('p9', LLAMAD, 'pss'), '.0f')} MB, llama-server "
                f"{_m(r.get('p9', SERVER, 'pss'), '.0f')} MB. Fewer interpreters would close "
                "it: cache_sup, model_sup and the front hosted in the root process (ARCHITECTURE "
                "requires only the root, cache-meta and each worker to be their own processes)."
            )
        elif b.id == "P12":
            n = b.size or size
            worker = r.get("worker", LLAMAD, "repeat", n, "unseen_ms")
            out.append(
                f"P12 ({b.verdict}): llamad's back-to-back repeat "
                f"{_m(r.get('ttft', LLAMAD, 'repeat', n))} ms, of it "
                f"{_m(worker)} ms not seen by the worker's clock (the way in and out, and "
                "the worker's loop busy before it read the request), its tokens from "
                f"{_sources_of(r, 'repeat', n)}; against llama-server's live-slot hit "
                f"{_m(r.get('ttft', SERVER, 'repeat', n))} ms (cache_n "
                f"{_m(r.get('cached', SERVER, 'repeat', n), '.0f')})."
            )
    return out


def report(results: Results, *, plots: Sequence[str] = ()) -> str:
    """The result file's body (the machine header is bench.common.record's)."""
    r = results
    bars_title = "SPEC P1-P12, issue 19's HTTP" if has_http(r) else "SPEC P1-P9, P12"
    if has_p14(r):
        bars_title += ", P14"
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
        f"### Bars ({bars_title})",
        "",
        bars_table(r),
        "",
        *(f"- {line}" for line in notes(r)),
        "",
        "### Time to first token",
        "",
        ttft_table(r),
        "",
        *exit_line(r),
        "Where llamad's prompt tokens came from, by its own account "
        "(`cache_delta.sources`: live KV, a tier, or computed here; median (min-max) "
        "over rounds):",
        "",
        sources_table(r),
        "",
        "llamad's warm paths by the worker's own clock (`Completion.stats`, medians): "
        "`restore_ms` includes `wait_ms` (for a save of this prompt still in flight); "
        "`prefill_ms` runs to the first token (sampled from kept logits where there are "
        "some); the last column is the client's TTFT less queue, restore and prefill: the "
        "request's way in and the token's way out, and any time the worker's loop was busy "
        "before it read the request:",
        "",
        worker_table(r),
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
        "### Agents (P6)",
        "",
        "Agent 1 alone, then agents 2-8 together the moment its reply ended. The prefix's "
        "share of an agent's TTFT is its client TTFT less the worker's `queue_ms` (waiting "
        "for a sequence while other agents' tails prefill) and `prefill_ms` (its own tail "
        "prefilled, to its first token's logits): what is left is `restore_ms` (keeping or "
        "sharing the prefix's live cells, or a lookup and restore, and `wait_ms`, any wait "
        "for another agent's prefill of it) and the request's way in and out (transport, "
        "front, admission, sampling, a tick in progress when it arrived). The bar takes "
        "the median over agents 2-8 of each round.",
        "",
        agents_table(r),
        "",
        "### Chat (P7)",
        "",
        "Six turns, the whole chat resent through the template each turn, the moment the "
        "previous reply ended; reusable = the prompt's common prefix with the previous "
        "turn's prompt and reply.",
        "",
        chat_table(r),
        "",
        "### Saves and idle memory",
        "",
        scenario_table(r),
        "",
    ]
    if has_http(r):
        parts += [
            "### Through HTTP (P10, P11, HTTP overhead)",
            "",
            "llamad through its Client and through its HTTP gateway, llama-server through "
            "its HTTP, the same HTTP client for both servers (bench/peers/http_sse.py: "
            "`POST /v1/completions`, token ids, streamed, each on a new connection opened "
            "untimed; TTFT from the request written to the first chunk carrying a choice); median "
            f"(min-max) over rounds at {max(r.sizes)} tokens, prompt tokens the system "
            "reports it reused in brackets:",
            "",
            http_table(r),
            "",
        ]
    if has_p14(r):
        parts += [
            "### Beside a CPU hog per core (P14)",
            "",
            "One greedy stream per system on a counting prompt, for a time budget "
            "(bench/peers/contention.py): quiet, then with one busy-loop process per core "
            "running from before the stream (the two phases' order alternating between "
            "rounds, the systems' rotating). A rate is the tokens after the first over the "
            "time from the first token to the budget's end (or the stream's own end); "
            "median (min-max) over rounds. llamad through its Client, llama-server through "
            "its `/completion`, a cut stream's generation stopped before the next system's.",
            "",
            contention_table(r),
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
            "### Where the time goes (llamad, repeat from a tier at the largest size)",
            "",
            "From the worker's own timings (`Completion.stats`) and the client's clock; "
            "the floor (SPEC P1) is copying the row's KV bytes once plus one sample (the "
            "worker's own time to the first token, from the row's kept logits). The worker "
            "reports its restore as one time (lookup, validated read, unpack); "
            "bench/worker_bench_restore.py times those parts apart, in process.",
            "",
            breakdown_table(r),
            "",
        ]
        if against_floor(r):
            parts += [
                "Each part against the floor, round by round (the part over that "
                "round's floor; P1's bar is the first row at <= "
                f"{P1_FLOOR_RATIO:g}x): the restore and its load (the row's validated "
                "read, checksums included, and `llama_state_seq_set_data`) against one "
                "copy of the row, the rest against the floor total.",
                "",
                against_floor_table(r),
                "",
            ]
    parts += [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"


def render(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    """The recorded body from bench/peers_bench.py's ``params`` (rounds, sizes,
    plots) and ``data`` (:func:`bench.peers_report.results_data`)."""
    return report(results_of(params, data), plots=params["plots"])
