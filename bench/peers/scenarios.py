"""P1-P8 for every system, one round at a time (P9: bench/peers/idle.py).

Each function runs one round of one scenario on every system the rig has,
in the order given (the caller alternates it between rounds), and adds the
round's values to :class:`bench.peers_report.Results`. Waiting for llamad's
finish saves to be published is untimed (the time a user takes to read).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.peers import workload
from bench.peers.lcpp_sys import LlamaCppPython
from bench.peers.llamad_sys import LlamadDaemon
from bench.peers.server_sys import LlamaServer
from bench.peers_report import (
    CLIENT,
    COPY_FLOOR,
    LBENCH,
    LCPP,
    LLAMAD,
    PRIMER,
    QUEUE,
    RESTORE,
    SERVER,
    TOTAL,
    Results,
    intervals_ms,
    itl_p,
    reuse_share,
)
from bench.worker_bench_report import steady_rate

RAM, DISK, SAVES, NO_SAVES = "ram", "disk", "saves", "nosaves"


@dataclass
class Rig:
    """The systems of one run (None: not available, reason in Results.skipped)."""

    threads: int
    n_ctx: int
    n_seq_max: int
    model: str
    sizes: workload.Sizes
    llamad: LlamadDaemon
    itl: LlamadDaemon | None
    server: LlamaServer | None
    lcpp_ram: LlamaCppPython | None
    lcpp_disk: LlamaCppPython | None
    llama_bench: str | None
    log: Callable[[str], None] = print
    meta: dict[str, Any] = field(default_factory=dict)

    def tokenize(self, text: str) -> list[int]:
        assert self.llamad.client is not None
        return self.llamad.client.tokenize(RAM, text)


# -- P1 / P2 / P5 (cold side): TTFT -------------------------------------------------------


def ttft_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    """Cold, warm, and after-a-restart TTFT at every size on every system."""
    prompts = {n: workload.exact_tokens(rig.tokenize, f"t{rnd}-{n}", n) for n in rig.sizes.ttft}
    # llamad's disk model gets prompts of its own: rows are keyed by the model
    # file and context, not the model id, so the same prompt's finish save
    # would find the ram model's row already written and add no disk row.
    on_disk = {n: workload.exact_tokens(rig.tokenize, f"d{rnd}-{n}", n) for n in rig.sizes.ttft}
    filler = workload.exact_tokens(rig.tokenize, f"filler{rnd}", 64)
    for system in order:
        for n, ids in prompts.items():
            if system == LLAMAD:
                _llamad_warm(rig, res, n, ids, on_disk[n])
            elif system == SERVER and rig.server is not None:
                cold = rig.server.complete(ids, 1)
                res.add(cold.ttft_ms, "ttft", SERVER, "cold", n)
                rig.server.complete(filler, 1)  # another task takes the context
                warm = rig.server.complete(ids, 1)
                res.add(warm.ttft_ms, "ttft", SERVER, "ram-cache", n)
                res.add(float(warm.timings.get("cache_n", 0)), "cached", SERVER, "ram-cache", n)
                # Served by another slot than the prefill's: the prompt came from
                # the host-RAM cache, not from KV still resident in its slot.
                moved = cold.slot is not None and warm.slot is not None and cold.slot != warm.slot
                res.add(float(moved), "moved", SERVER, "ram-cache", n)
            elif system == LCPP and rig.lcpp_ram is not None:
                first = rig.lcpp_ram.complete(ids, 1, forget=True)
                res.add(first.ttft_ms, "ttft", LCPP, "cold", n)
                again = rig.lcpp_ram.complete(ids, 1, forget=True)
                res.add(again.ttft_ms, "ttft", LCPP, "ram-cache", n)
                res.add(float(again.reused), "cached", LCPP, "ram-cache", n)
    # Every system restarts; then each prompt again.
    for system in order:
        if system == LLAMAD:
            rig.llamad.restart()
            for n, ids in on_disk.items():
                ms, c = rig.llamad.first_token(DISK, ids)
                res.add(ms, "ttft", LLAMAD, "disk-restart", n)
                res.add(c.stats.restore_ms, "restore", LLAMAD, "disk-restart", n)
                res.add(c.stats.prefill_ms, "primer", LLAMAD, "disk-restart", n)
                res.add(float(c.cache_delta.read), "cached", LLAMAD, "disk-restart", n)
            # The same rows again with their files' pages out of the page cache
            # (as after a reboot, or a row not read for long): one untimed drop
            # after every size's restart read (a drop between sizes made the
            # next sizes' "restart" reads cold ones too).
            rig.llamad.drop_disk_pages()
            for n, ids in on_disk.items():
                ms, c = rig.llamad.first_token(DISK, ids)
                res.add(ms, "ttft", LLAMAD, "disk-dropped", n)
                res.add(float(c.cache_delta.read), "cached", LLAMAD, "disk-dropped", n)
        elif system == SERVER and rig.server is not None:
            rig.server.restart()
            for n, ids in prompts.items():
                r = rig.server.complete(ids, 1)
                res.add(r.ttft_ms, "ttft", SERVER, "restart", n)
        elif system == LCPP and rig.lcpp_disk is not None:
            # LlamaDiskCache (0.3.36) pops the entry a lookup finds, and a lookup
            # takes any shared prefix (these prompts share their first tokens):
            # filling the next size would consume this one. So each size is
            # filled, then read back across a restart of its own.
            for n, ids in prompts.items():
                rig.lcpp_disk.complete(ids, 1, forget=True)
                rig.lcpp_disk.restart()
                d = rig.lcpp_disk.complete(ids, 1, forget=True)
                res.add(d.ttft_ms, "ttft", LCPP, "disk-restart", n)
                res.add(float(d.reused), "cached", LCPP, "disk-restart", n)


def _llamad_warm(rig: Rig, res: Results, n: int, ids: list[int], disk_ids: list[int]) -> None:
    d = rig.llamad
    before = d.saves()
    ms, cold = d.first_token(RAM, ids)
    res.add(ms, "ttft", LLAMAD, "cold", n)
    s = cold.stats
    if s.prefill_ms > 0:
        res.add(s.prefill_tokens / (s.prefill_ms / 1e3), "prefill", LLAMAD, n)
    d.wait_saved(before)
    ms, warm = d.first_token(RAM, ids)
    res.add(ms, "ttft", LLAMAD, "ram", n)
    res.add(float(warm.cache_delta.read), "cached", LLAMAD, "ram", n)
    if n == max(rig.sizes.ttft):
        w = warm.stats
        worker = w.queue_ms + w.restore_ms + w.prefill_ms
        parts = {
            TOTAL: ms,
            CLIENT: ms - worker,
            QUEUE: w.queue_ms,
            RESTORE: w.restore_ms,
            PRIMER: w.prefill_ms,
        }
        for part, v in parts.items():
            res.breakdown.setdefault(part, []).append(v)
        row = d.largest_ram_row()
        if row:
            res.breakdown.setdefault(COPY_FLOOR, []).append(copy_ms(row))
    # The disk model's row for the after-restart measurement (untimed).
    before = d.saves()
    d.first_token(DISK, disk_ids)
    d.wait_saved(before)


def copy_ms(nbytes: int) -> float:
    """Best of five copies of ``nbytes`` between two resident buffers."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


# -- P5: llama-bench ----------------------------------------------------------------------


def llama_bench_round(rig: Rig, res: Results) -> None:
    if rig.llama_bench is None:
        return
    for n in rig.sizes.ttft:
        cmd = [
            rig.llama_bench,
            "-m",
            rig.model,
            "-p",
            str(n),
            "-n",
            "0",
            "-t",
            str(rig.threads),
            "-r",
            "1",
            "-o",
            "json",
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
        rows = json.loads(out)
        res.add(float(rows[0]["avg_ts"]), "prefill", LBENCH, n)


# -- P3 / P4: decode ----------------------------------------------------------------------


def decode_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    n = rig.sizes.decode_tokens
    prompts = [workload.counting_tokens(rig.tokenize, 100 * (rnd + 1) + 7 * i) for i in range(4)]
    for system in order:
        run = _decoder(rig, system, n)
        if run is None:
            continue
        res.add(steady_rate([run(prompts[0])]), "decode", system, 1)
        if system != LCPP:  # one Llama decodes one sequence at a time
            res.add(steady_rate(concurrently(run, prompts)), "decode", system, 4)


def _decoder(rig: Rig, system: str, n: int) -> Callable[[list[int]], list[float]] | None:
    """One greedy stream of ``n`` tokens on ``system``: its token arrival times."""
    if system == LLAMAD:
        d = rig.llamad
        return lambda p: d.arrivals(RAM, p, n)
    if system == SERVER and rig.server is not None:
        server = rig.server
        return lambda p: server.complete(p, n).arrivals
    if system == LCPP and rig.lcpp_ram is not None:
        lcpp = rig.lcpp_ram
        return lambda p: lcpp.complete(p, n, forget=True).arrivals
    return None


def concurrently(
    run: Callable[[list[int]], list[float]], prompts: Sequence[list[int]]
) -> list[list[float]]:
    out: list[list[float]] = [[] for _ in prompts]
    errors: list[BaseException] = []
    go = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        try:
            go.wait()
            out[i] = run(prompts[i])
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


# -- P6: agents over a shared prefix ------------------------------------------------------


def agents_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    z = rig.sizes
    for system in order:
        prefix = workload.exact_tokens(rig.tokenize, f"agents{rnd}-{system}", z.agents_prefix)
        tails = [
            workload.exact_tokens(rig.tokenize, f"agent{rnd}-{system}-{i}", z.agent_tail)
            for i in range(8)
        ]
        ttfts: list[float] = []
        parts: dict[str, list[float]] = {}
        for i, tail in enumerate(tails):
            ids = prefix + tail
            if system == LLAMAD:
                before = rig.llamad.saves()
                ms, c = rig.llamad.first_token(RAM, ids)
                if i == 0:
                    rig.llamad.wait_saved(before)
                else:  # where agents 2-8's time goes, by the worker's own clock
                    s = c.stats
                    for name, v in (
                        ("restore_ms", s.restore_ms),
                        ("prefill_ms", s.prefill_ms),
                        ("prefill_tokens", float(s.prefill_tokens)),
                        ("queue_ms", s.queue_ms),
                    ):
                        parts.setdefault(name, []).append(v)
            elif system == SERVER and rig.server is not None:
                ms = rig.server.complete(ids, 1).ttft_ms
            else:
                break
            ttfts.append(ms)
        if len(ttfts) == 8:
            others = float(np.median(ttfts[1:]))
            res.add(ttfts[0], "p6", system, "agent1")
            res.add(others, "p6", system, "others")
            res.add(others / ttfts[0], "p6", system, "share")
            for name, values in parts.items():
                res.add(float(np.median(values)), "p6", system, name)


# -- P7: stateless multi-turn chat --------------------------------------------------------


def chat_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    """Each turn resends the whole chat. Per turn from 2 on: the prompt's tokens,
    those the server reports it reused, and those it could have (the prompt's
    common prefix with the previous turn's prompt and reply, rendered by the
    model's template: a new user message can never come from a cache)."""
    z = rig.sizes
    assert rig.llamad.client is not None
    client = rig.llamad.client
    for system in order:
        if system not in (LLAMAD, SERVER) or (system == SERVER and rig.server is None):
            continue
        messages: list[dict[str, str]] = []
        prompt_tokens: list[int] = []
        reused: list[int] = []
        reusable: list[int] = []
        previous: list[int] = []
        for turn in range(1, z.chat_turns + 1):
            messages.append({"role": "user", "content": workload.chat_turn(f"{system}{rnd}", turn)})
            rendered = client.apply_chat_template(RAM, messages, add_generation_prompt=True)
            if system == LLAMAD:
                c = _llamad_chat(rig, messages, z.chat_reply)
                reply, prompt_n, read = c.reply, c.stats.prompt_tokens, c.cache_delta.read
                context = list(c.context_tokens)
            else:
                assert rig.server is not None
                r = rig.server.chat(messages, z.chat_reply)
                reply = r.content
                read = int(r.timings.get("cache_n", 0))
                prompt_n = read + int(r.timings.get("prompt_n", 0))
                context = rendered + client.tokenize(RAM, reply, add_special=False)
            messages.append({"role": "assistant", "content": reply})
            if turn >= 2:
                prompt_tokens.append(prompt_n)
                reused.append(read)
                reusable.append(common_prefix(previous, rendered))
            previous = context
        if prompt_tokens:
            res.add(reuse_share(prompt_tokens, reused), "p7", system, "share of prompt")
            res.add(reuse_share(reusable, reused), "p7", system, "share")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _llamad_chat(rig: Rig, messages: list[dict[str, str]], n: int) -> Any:
    from llamad.model.results import DoneEvent  # noqa: PLC0415

    d = rig.llamad
    assert d.client is not None
    before = d.saves()
    result = None
    for event in d.client.infer(RAM, messages=messages, max_tokens=n, temperature=0.0):
        if isinstance(event, DoneEvent):
            result = event.result
    assert result is not None
    if result.stats.prompt_tokens >= 512:  # the default min_tokens: shorter is never saved
        d.wait_saved(before)
    return result


# -- P8: inter-token latency with saves firing ----------------------------------------------


def itl_round(rig: Rig, res: Results, rnd: int) -> None:
    if rig.itl is None:
        return
    z = rig.sizes
    order = (SAVES, NO_SAVES) if rnd % 2 == 0 else (NO_SAVES, SAVES)
    for model in order:
        ids = workload.long_counting_tokens(rig.tokenize, 1000 * (rnd + 1), z.itl_prompt)
        assert rig.itl.client is not None
        before = rig.itl.client.counters()
        arrivals = rig.itl.arrivals(model, ids, z.itl_tokens)
        after = rig.itl.client.counters()
        for counter in ("saves_continued", "saves_cold"):
            fired = after.get(counter, 0) - before.get(counter, 0)
            res.add(float(fired), "p8", LLAMAD, "saves" if model == SAVES else "no saves", counter)
        itl = intervals_ms(arrivals[1:])  # the first interval follows the primer decode
        name = "saves" if model == SAVES else "no saves"
        res.itl_ms.setdefault(name, []).extend(itl)
        if itl:
            res.add(itl_p(itl, 50), "p8", LLAMAD, name, "p50")
            res.add(itl_p(itl, 99), "p8", LLAMAD, name, "p99")
