"""P1-P8 and P12 for every system, one round at a time (P9: bench/peers/idle.py).

Each function runs one round of one scenario on every system the rig has,
in the order given (the caller alternates it between rounds), and adds the
round's values to :class:`bench.peers_report.Results`.

Requests go as a user's would: back to back, each sent the moment the
previous reply ended, and llamad runs its default cache configuration. No
scenario waits for a save to be published. Where a scenario needs a row in a
tier (P1), it gets there as traffic does: ``n_seq_max`` other short requests
take every sequence, the least recently used idle entry's last, so the
prompt's idle entry is gone and its repeat is looked up in the cache. If the
row's save were still in flight, that request waits for it or runs partly
cold; either way ``cache_delta.sources`` says where every prompt token came
from, and the report shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from bench.peers import workload
from bench.peers.copy_floor import copy_ms
from bench.peers.lcpp_sys import LlamaCppPython
from bench.peers.llamad_sys import LlamadDaemon
from bench.peers.server_sys import LlamaServer
from bench.peers_report import (
    CLIENT,
    COPY_FLOOR,
    COPY_PAST_CACHE,
    LBENCH,
    LCPP,
    LLAMAD,
    LOAD,
    LOOKUP,
    PRIMER,
    QUEUE,
    RESTORE,
    SERVER,
    SOURCES,
    TOTAL,
    WAIT,
    Results,
    intervals_ms,
    itl_p,
    prefix_share_ms,
    reuse_share,
)
from bench.worker_bench_report import steady_rate
from llamad.model.worker_spec import worker_env

if TYPE_CHECKING:
    from llamad.model.results import Completion

MAIN, SAVES, NO_SAVES = "main", "saves", "nosaves"
FILLER_TOKENS = 64  # a short request: far below min_tokens, never saved
T = TypeVar("T")


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
    # P14's systems at 1 thread (bench/peers/contention.py), started by its
    # first round, stopped with the rest.
    llamad_one: LlamadDaemon | None = None
    server_one: LlamaServer | None = None

    def tokenize(self, text: str) -> list[int]:
        assert self.llamad.client is not None
        return self.llamad.client.tokenize(MAIN, text)

    def tokenize_tail(self, text: str) -> list[int]:
        """Tokens of text that follows other tokens (no special tokens added)."""
        assert self.llamad.client is not None
        return self.llamad.client.tokenize(MAIN, text, add_special=False)


def add_llamad(res: Results, ms: float, c: Completion, variant: str, n: int) -> None:
    """One llamad request of a TTFT path: its client TTFT; where its prompt
    tokens came from (``cache_delta.sources``), one series per source; the
    tokens the cache supplied (``cache_delta.read``); and the worker's own
    clock (queue, restore, of it waiting, prefill to the first token) with
    what it did not see (TTFT less those: the way in and out, and any time
    the worker's loop was busy before it read the request)."""
    res.add(ms, "ttft", LLAMAD, variant, n)
    got = c.cache_delta.sources.as_dict()
    for source in SOURCES:
        res.add(float(got.get(source, 0)), "sources", LLAMAD, variant, n, source)
    res.add(float(c.cache_delta.read), "cached", LLAMAD, variant, n)
    s = c.stats
    for name, v in (
        ("queue_ms", s.queue_ms),
        ("restore_ms", s.restore_ms),
        ("wait_ms", s.wait_ms),
        ("prefill_ms", s.prefill_ms),
        ("unseen_ms", ms - s.queue_ms - s.restore_ms - s.prefill_ms),
    ):
        res.add(v, "worker", LLAMAD, variant, n, name)


# -- P1 / P2 / P5 (cold side) / P12: TTFT -------------------------------------------------


def ttft_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    """At every size, every system, back to back: a fresh prompt cold; the same
    prompt again the moment its reply ended (P12); ``n_seq_max`` short fillers
    for llamad (every sequence taken, the prompt's idle entry last), one for
    llama-server (its slot goes to the host-RAM cache); the prompt again (P1).
    Then every system restarts and each size's prompt is sent once more (P2:
    llamad's first repeat after a SIGTERM and a start, default configuration)."""
    prompts = {n: workload.exact_tokens(rig.tokenize, f"t{rnd}-{n}", n) for n in rig.sizes.ttft}
    fillers = {
        n: [
            workload.exact_tokens(rig.tokenize, f"filler{rnd}-{n}-{i}", FILLER_TOKENS)
            for i in range(rig.n_seq_max)
        ]
        for n in rig.sizes.ttft
    }
    for system in order:
        for n, ids in prompts.items():
            if system == LLAMAD:
                _llamad_ttft(rig, res, n, ids, fillers[n])
            elif system == SERVER and rig.server is not None:
                _server_ttft(rig.server, res, n, ids, fillers[n][0])
            elif system == LCPP and rig.lcpp_ram is not None:
                first = rig.lcpp_ram.complete(ids, 1, forget=True)
                res.add(first.ttft_ms, "ttft", LCPP, "cold", n)
                again = rig.lcpp_ram.complete(ids, 1, forget=True)
                res.add(again.ttft_ms, "ttft", LCPP, "ram-cache", n)
                res.add(float(again.reused), "cached", LCPP, "ram-cache", n)
    # Every system restarts; then each prompt again.
    for system in order:
        if system == LLAMAD:
            _llamad_restart(rig, res, prompts)
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


def _llamad_ttft(rig: Rig, res: Results, n: int, ids: list[int], fillers: list[list[int]]) -> None:
    d = rig.llamad
    ms, cold = d.first_token(MAIN, ids)
    res.add(ms, "ttft", LLAMAD, "cold", n)
    s = cold.stats
    if s.prefill_ms > 0:
        res.add(s.prefill_tokens / (s.prefill_ms / 1e3), "prefill", LLAMAD, n)
    # P12: the moment the reply ended. Its idle entry is still in place.
    ms, repeat = d.first_token(MAIN, ids)
    add_llamad(res, ms, repeat, "repeat", n)
    # P1: other users' short requests take every sequence; the last of them
    # the least recently used idle entry's, the prompt's. Back to back, none
    # waiting for the prompt's finish save.
    for filler in fillers:
        d.first_token(MAIN, filler)
    ms, warm = d.first_token(MAIN, ids)
    add_llamad(res, ms, warm, "ram", n)
    if n == max(rig.sizes.ttft):
        w = warm.stats
        worker = w.queue_ms + w.restore_ms + w.prefill_ms
        parts = {
            TOTAL: ms,
            CLIENT: ms - worker,
            QUEUE: w.queue_ms,
            RESTORE: w.restore_ms,
            WAIT: w.wait_ms,
            LOOKUP: w.lookup_ms,
            LOAD: w.load_ms,
            PRIMER: w.prefill_ms,
        }
        for part, v in parts.items():
            res.breakdown.setdefault(part, []).append(v)
        row = d.largest_ram_row()
        if row:
            res.breakdown.setdefault(COPY_FLOOR, []).append(copy_ms(row))
            res.breakdown.setdefault(COPY_PAST_CACHE, []).append(copy_ms_past_cache(row))


def _server_ttft(
    server: LlamaServer, res: Results, n: int, ids: list[int], filler: list[int]
) -> None:
    cold = server.complete(ids, 1)
    res.add(cold.ttft_ms, "ttft", SERVER, "cold", n)
    # P12's peer: the repeat the moment the reply ended. llama-server gives it
    # the slot whose prompt shares the most with it, the one that just served
    # it, and reuses that slot's KV: recorded (same slot, cache_n) so the bar
    # compares only with a live-slot hit.
    repeat = server.complete(ids, 1)
    res.add(repeat.ttft_ms, "ttft", SERVER, "repeat", n)
    res.add(float(repeat.timings.get("cache_n", 0)), "cached", SERVER, "repeat", n)
    same = cold.slot is not None and cold.slot == repeat.slot
    res.add(float(same), "same-slot", SERVER, "repeat", n)
    server.complete(filler, 1)  # another task takes a slot; idle slots go to host RAM
    warm = server.complete(ids, 1)
    res.add(warm.ttft_ms, "ttft", SERVER, "ram-cache", n)
    res.add(float(warm.timings.get("cache_n", 0)), "cached", SERVER, "ram-cache", n)
    # Served by another slot than the prefill's: the prompt came from the
    # host-RAM cache, not from KV still resident in its slot.
    moved = repeat.slot is not None and warm.slot is not None and repeat.slot != warm.slot
    res.add(float(moved), "moved", SERVER, "ram-cache", n)


def _llamad_restart(rig: Rig, res: Results, prompts: dict[int, list[int]]) -> None:
    """P2: SIGTERM (a clean stop, exit status recorded), a new daemon over the
    same directories, then each size's prompt: its first repeat since."""
    code = rig.llamad.stop()
    res.add(float(-1 if code is None else code), "exit", LLAMAD, "restart")
    rig.llamad.start()
    for n, ids in prompts.items():
        ms, c = rig.llamad.first_token(MAIN, ids)
        add_llamad(res, ms, c, "restart", n)


_REPO = Path(__file__).resolve().parents[2]
"""Where ``python -m bench.peers.copy_floor`` runs from, whatever the caller's cwd."""


def copy_ms_past_cache(nbytes: int) -> float:
    """:func:`~bench.peers.copy_floor.copy_ms` in a process started as a model
    worker is, with glibc's non-temporal threshold at the worker's (its stores
    bypass the cache; ``llamad.model.worker_spec.worker_env``). A fresh
    interpreter: glibc reads the setting once, at the process's start."""
    env = {**os.environ, **worker_env(os.environ)}
    run = subprocess.run(
        [sys.executable, "-m", "bench.peers.copy_floor", str(nbytes)],
        env=env,
        cwd=_REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return float(run.stdout.strip())


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
        return lambda p: d.arrivals(MAIN, p, n)
    if system == SERVER and rig.server is not None:
        server = rig.server
        return lambda p: server.complete(p, n).arrivals
    if system == LCPP and rig.lcpp_ram is not None:
        lcpp = rig.lcpp_ram
        return lambda p: lcpp.complete(p, n, forget=True).arrivals
    return None


def concurrently(
    run: Callable[[T], Any], items: Sequence[T], prepare: Callable[[], object] | None = None
) -> list[Any]:
    """``run(item)`` for every item, each on a thread of its own, released
    together by a barrier once every thread has run ``prepare`` (untimed: a
    client's connection, say); the results in the items' order."""
    out: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    go = threading.Barrier(len(items))

    def one(i: int) -> None:
        try:
            if prepare is not None:
                prepare()
            go.wait()
            out[i] = run(items[i])
        except BaseException as exc:  # re-raised below
            errors.append(exc)
            go.abort()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


# -- P6: agents over a shared prefix ------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """One agent's request: the client's TTFT and what the system said of it
    (llamad: the worker's stats and sources; llama-server: ``timings``)."""

    ttft_ms: float
    stats: dict[str, float]


def agents_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    """SPEC P6: agent 1 sends a fresh prefix and its tail alone (it warms the
    prefix, as an orchestrator's first agent would); the moment its reply
    ended, agents 2-8 send the prefix with their own tails together (threads
    released by one barrier), waiting for no save, on llamad and
    llama-server alike."""
    z = rig.sizes
    for system in order:
        send = _agent_sender(rig, system)
        if send is None:
            continue
        prefix = workload.exact_tokens(rig.tokenize, f"agents{rnd}-{system}", z.agents_prefix)
        tails = [
            workload.agent_tail(rig.tokenize_tail, f"agent{rnd}-{system}", i, z.agent_tail)
            for i in range(8)
        ]
        first = send(prefix + tails[0])
        others: list[Agent] = concurrently(
            send, [prefix + t for t in tails[1:]], _connect(rig, system)
        )
        add_agents(res, system, first, others)


def add_agents(res: Results, system: str, first: Agent, others: Sequence[Agent]) -> None:
    """One round of P6 for ``system``: agent 1's TTFT, agents 2-8 p50 (and, for
    information, its ratio to agent 1's), and the medians of what the system
    reported of agents 2-8; for llamad the prefix's share
    (:func:`bench.peers_report.prefix_share_ms`)."""
    p50 = float(np.median([a.ttft_ms for a in others]))
    res.add(first.ttft_ms, "p6", system, "agent1")
    res.add(p50, "p6", system, "others")
    res.add(p50 / first.ttft_ms, "p6", system, "share")
    for name in sorted({k for a in others for k in a.stats}):
        res.add(float(np.median([a.stats.get(name, 0.0) for a in others])), "p6", system, name)
    if system == LLAMAD:
        agents = [{"ttft_ms": a.ttft_ms, **a.stats} for a in others]
        res.add(prefix_share_ms(agents), "p6", system, "prefix_ms")


def _connect(rig: Rig, system: str) -> Callable[[], object] | None:
    """What an agent's thread does before the barrier: llamad's client opens
    each thread's sockets on its first call (an agent's process would have its
    connection already); llama-server gets a new HTTP connection per request."""
    client = rig.llamad.client
    if system == LLAMAD and client is not None:
        return lambda: client.tokenize(MAIN, "connect")
    return None


def _agent_sender(rig: Rig, system: str) -> Callable[[list[int]], Agent] | None:
    if system == LLAMAD:
        d = rig.llamad

        def llamad_agent(ids: list[int]) -> Agent:
            ms, c = d.first_token(MAIN, ids)
            s, src = c.stats, c.cache_delta.sources
            return Agent(
                ms,
                {
                    "queue_ms": s.queue_ms,
                    "restore_ms": s.restore_ms,
                    "wait_ms": s.wait_ms,
                    "prefill_ms": s.prefill_ms,
                    "prefill_tokens": float(s.prefill_tokens),
                    "unseen_ms": ms - s.queue_ms - s.restore_ms - s.prefill_ms,
                    "live": float(src.live),
                    "tier": float(src.reused - src.live),
                },
            )

        return llamad_agent
    if system == SERVER and rig.server is not None:
        server = rig.server

        def server_agent(ids: list[int]) -> Agent:
            r = server.complete(ids, 1)
            t = r.timings
            return Agent(
                r.ttft_ms,
                {
                    "cache_n": float(t.get("cache_n", 0)),
                    "prompt_n": float(t.get("prompt_n", 0)),
                    "prompt_ms": float(t.get("prompt_ms", 0.0)),
                },
            )

        return server_agent
    return None


# -- P7: stateless multi-turn chat --------------------------------------------------------


@dataclass(frozen=True)
class ChatTurn:
    """One turn as sent and answered: the messages sent (the whole chat so
    far), the reply, the prompt's tokens and those the system reports it
    reused, llamad's sources, and llamad's context (prompt + generated)."""

    messages: list[dict[str, str]]
    reply: str
    prompt_tokens: int
    reused: int
    sources: dict[str, int] | None = None
    context: list[int] | None = None


def chat_round(rig: Rig, res: Results, rnd: int, order: Sequence[str]) -> None:
    """SPEC P7: each turn resends the whole chat through the model's chat
    template, the moment the previous reply ended (~30-token user messages,
    replies of up to ``chat_reply`` tokens, greedy). Per turn from 2 on: the
    prompt's tokens, those the system reports it reused, and those it could
    have (the prompt's common prefix with the previous turn's prompt and
    reply, rendered by the model's template: a new user message can never
    come from a cache). All of that is worked out after the chat's last
    turn, so nothing runs between two turns."""
    z = rig.sizes
    client = rig.llamad.client
    assert client is not None
    for system in order:
        if system not in (LLAMAD, SERVER) or (system == SERVER and rig.server is None):
            continue
        turns = _chat(rig, system, f"{system}{rnd}", z.chat_turns, z.chat_reply)
        prompt_tokens: list[int] = []
        reused: list[int] = []
        reusable: list[int] = []
        sums = dict.fromkeys(SOURCES, 0)
        previous: list[int] = []
        for i, t in enumerate(turns, start=1):
            rendered = client.apply_chat_template(MAIN, t.messages, add_generation_prompt=True)
            context = t.context
            if context is None:
                context = rendered + client.tokenize(MAIN, t.reply, add_special=False)
            if i >= 2:
                prompt_tokens.append(t.prompt_tokens)
                reused.append(t.reused)
                reusable.append(common_prefix(previous, rendered))
                for source, v in (t.sources or {}).items():
                    sums[source] = sums.get(source, 0) + v
            previous = context
        if prompt_tokens:
            res.add(reuse_share(prompt_tokens, reused), "p7", system, "share of prompt")
            res.add(reuse_share(reusable, reused), "p7", system, "share")
            res.add(float(np.mean(prompt_tokens)), "p7", system, "prompt tokens")
        if system == LLAMAD:
            for source, v in sums.items():
                res.add(float(v), "p7", system, "sources", source)
        said = [
            len(client.tokenize(MAIN, m["content"], add_special=False))
            for m in turns[-1].messages
            if m["role"] == "user"
        ]
        res.add(float(np.mean(said)), "p7", system, "message tokens")


def _chat(rig: Rig, system: str, nonce: str, n_turns: int, max_tokens: int) -> list[ChatTurn]:
    """The chat itself: each turn sent the moment the previous reply ended."""
    from llamad.model.results import DoneEvent  # noqa: PLC0415

    messages: list[dict[str, str]] = []
    turns: list[ChatTurn] = []
    for turn in range(1, n_turns + 1):
        messages.append({"role": "user", "content": workload.chat_turn(nonce, turn)})
        sent = [dict(m) for m in messages]
        if system == LLAMAD:
            client = rig.llamad.client
            assert client is not None
            result = None
            for event in client.infer(MAIN, messages=sent, max_tokens=max_tokens, temperature=0.0):
                if isinstance(event, DoneEvent):
                    result = event.result
            assert result is not None
            t = ChatTurn(
                sent,
                result.reply,
                result.stats.prompt_tokens,
                result.cache_delta.read,
                result.cache_delta.sources.as_dict(),
                list(result.context_tokens),
            )
        else:
            assert rig.server is not None
            r = rig.server.chat(sent, max_tokens)
            read = int(r.timings.get("cache_n", 0))
            t = ChatTurn(sent, r.content, read + int(r.timings.get("prompt_n", 0)), read)
        turns.append(t)
        messages.append({"role": "assistant", "content": t.reply})
    return turns


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


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
