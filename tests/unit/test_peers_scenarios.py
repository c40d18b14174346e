"""bench/peers/scenarios.py sends what a user would, in the order a user would.

A fake llamad keeps idle entries as the worker does (docs/internals/model-worker.md,
"Live reuse": a new request takes an empty sequence first, then the least
recently used idle entry's; an exact repeat of an idle entry is served live),
so the tests see which path each measured request took.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    DoneEvent,
    FinishReason,
    Stats,
    TokenSources,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
scenarios = importlib.import_module("bench.peers.scenarios")
workload = importlib.import_module("bench.peers.workload")
rep = importlib.import_module("bench.peers_report")
server_sys = importlib.import_module("bench.peers.server_sys")
render = importlib.import_module("bench.peers.render")

N_SEQ = 4


def tokenize(text: str, add_special: bool = True) -> list[int]:
    return [hash(w) % 50_000 for w in text.split()]


def completion(
    prompt: int, sources: TokenSources, context: list[int] | None = None, **stats: Any
) -> Completion:
    return Completion(
        reply="ok",
        generated=[7],
        context_tokens=(context if context is not None else [0] * prompt) + [7],
        committed_tokens=prompt,
        cache_hit_kind=CacheHitKind.EXACT if sources.computed == 0 else CacheHitKind.COLD,
        finish_reason=FinishReason.LENGTH,
        stats=Stats(prompt_tokens=prompt, **stats),
        cache_delta=CacheDelta(read=sources.reused, sources=sources),
    )


class FakeClient:
    def __init__(self, owner: FakeLlamad) -> None:
        self.owner = owner

    def tokenize(self, model: str, text: str, add_special: bool = True) -> list[int]:
        self.owner.calls.append("tokenize")
        return tokenize(text)

    def apply_chat_template(
        self, model: str, messages: list[dict[str, str]], add_generation_prompt: bool
    ) -> list[int]:
        self.owner.calls.append("template")
        return [t for m in messages for t in tokenize(f"<{m['role']}> {m['content']} <end>")]

    def infer(self, model: str, messages: list[dict[str, str]], **kw: Any) -> Any:
        self.owner.calls.append("chat")
        rendered = self.apply_chat_template(model, messages, True)
        self.owner.calls.pop()
        reused = min(len(rendered), self.owner.last_chat)
        self.owner.last_chat = len(rendered) + 2
        src = TokenSources(live=reused, computed=len(rendered) - reused)
        yield DoneEvent(completion(len(rendered), src, rendered))


class FakeLlamad:
    """Idle entries by sequence, as the worker keeps them; saves are instant
    (a row exists for every prompt once it ran)."""

    def __init__(self, n_seq: int = N_SEQ) -> None:
        self.calls: list[Any] = []
        self.seqs: list[tuple[int, ...] | None] = [None] * n_seq
        self.used = [0] * n_seq
        self.clock = 0
        self.rows: set[tuple[int, ...]] = set()
        self.client: Any = FakeClient(self)
        self.last_chat = 0
        self.lock = threading.Lock()

    def first_token(self, model: str, ids: list[int]) -> tuple[float, Completion]:
        key = tuple(ids)
        with self.lock:
            self.calls.append(("first_token", len(ids)))
            live = key in self.seqs
            free = [i for i, s in enumerate(self.seqs) if s is None]
            seq = free[0] if free else min(range(len(self.seqs)), key=self.used.__getitem__)
            self.clock += 1
            self.seqs[seq], self.used[seq] = key, self.clock
            if live:
                src = TokenSources(live=len(ids))
            elif key in self.rows:
                src = TokenSources(ram=len(ids))
            else:
                src = TokenSources(computed=len(ids))
            self.rows.add(key)
        stats = {"queue_ms": 1.0, "restore_ms": 2.0, "prefill_ms": 30.0, "prefill_tokens": 16}
        return 40.0, completion(len(ids), src, **stats)

    def stop(self) -> int:
        self.calls.append("stop")
        self.seqs = [None] * len(self.seqs)
        return 0

    def start(self) -> Any:
        self.calls.append("start")
        return self.client

    def largest_ram_row(self) -> int:
        return 0


def rig(fake: FakeLlamad, *, sizes: tuple[int, ...] = (512, 1024), server: Any = None) -> Any:
    return SimpleNamespace(
        llamad=fake,
        n_seq_max=N_SEQ,
        sizes=workload.Sizes.full().__class__(sizes, 32, 256, 8, 3, 8, 560, 96, 32),
        server=server,
        lcpp_ram=None,
        lcpp_disk=None,
        tokenize=tokenize,
        tokenize_tail=lambda text: tokenize(text, add_special=False),
    )


def test_p1s_repeat_comes_from_a_tier_after_n_seq_max_other_requests_and_p12s_from_live() -> None:
    fake = FakeLlamad()
    res = rep.Results(rounds=1, sizes=(512, 1024))
    scenarios.ttft_round(rig(fake), res, 0, [scenarios.LLAMAD])
    for n in (512, 1024):
        assert res.get("sources", "llamad", "repeat", n, "live") == [float(n)]
        assert res.get("sources", "llamad", "ram", n, "live") == [0.0]
        assert res.get("sources", "llamad", "ram", n, "ram") == [float(n)]
    sent = [c for c in fake.calls if isinstance(c, tuple)]
    # Per size: cold, the repeat at once, n_seq_max short fillers, the repeat.
    filler = scenarios.FILLER_TOKENS
    per_size = [
        ("first_token", n) for n in (512, 512, *[filler] * N_SEQ, 512)
    ]  # then the same at 1024
    assert sent[: len(per_size)] == per_size
    verdict = next(b for b in rep.bars(res) if b.id == "P1" and "ms" in b.what).verdict
    assert not verdict.startswith("NOT MEASURED")
    # The worker's clock: queue 1 + restore 2 + prefill 30 of the client's 40 ms.
    assert res.get("worker", "llamad", "repeat", 512, "unseen_ms") == [pytest.approx(7.0)]
    line = next(x for x in render.worker_table(res).splitlines() if "P12" in x and "| 512" in x)
    assert line.rstrip(" |").endswith("7.00")


def test_one_filler_too_few_leaves_the_idle_entry_and_p1_says_so() -> None:
    fake = FakeLlamad(n_seq=N_SEQ + 1)  # the bench believes there are N_SEQ sequences
    res = rep.Results(rounds=1, sizes=(512,))
    scenarios.ttft_round(rig(fake, sizes=(512,)), res, 0, [scenarios.LLAMAD])
    assert res.get("sources", "llamad", "ram", 512, "live") == [512.0]
    p1 = next(b for b in rep.bars(res) if b.id == "P1" and "ms" in b.what)
    assert p1.verdict.startswith("NOT MEASURED (served live in 1 of 1 rounds")


def test_p2_is_the_first_repeat_of_each_prompt_after_a_sigterm_and_a_start() -> None:
    fake = FakeLlamad()
    res = rep.Results(rounds=1, sizes=(512, 1024))
    scenarios.ttft_round(rig(fake), res, 0, [scenarios.LLAMAD])
    after = fake.calls[fake.calls.index("stop") :]
    assert after[:2] == ["stop", "start"]
    assert [c for c in after if isinstance(c, tuple)] == [
        ("first_token", 512),
        ("first_token", 1024),
    ]
    assert res.get("exit", "llamad", "restart") == [0.0]
    assert "SIGTERM before P2, per round: 0." in render.report(res)
    # The fake keeps its rows across the restart: exact, from a tier.
    assert res.get("sources", "llamad", "restart", 1024, "ram") == [1024.0]


class FakeServer:
    def __init__(self, slots: int = N_SEQ, repeat_moves: bool = False) -> None:
        self.slots: list[tuple[int, ...]] = [()] * slots
        self.repeat_moves = repeat_moves
        self.calls: list[int] = []

    def complete(self, ids: list[int], n: int) -> Any:
        self.calls.append(len(ids))
        key = tuple(ids)
        if key in self.slots and not self.repeat_moves:
            slot, cached = self.slots.index(key), len(ids) - 1
        else:
            slot = next((i for i, s in enumerate(self.slots) if s != key), 0)
            cached = 0
        self.slots[slot] = key
        return server_sys.Reply(20.0, [0.0, 0.1], {"cache_n": cached, "prompt_n": 1}, "x", slot)

    def restart(self) -> None:
        self.slots = [()] * len(self.slots)


def test_p12_pairs_llamads_repeat_with_llama_servers_live_slot_hit() -> None:
    server = FakeServer()
    res = rep.Results(rounds=1, sizes=(512,))
    scenarios.ttft_round(
        rig(FakeLlamad(), sizes=(512,), server=server), res, 0, [scenarios.LLAMAD, scenarios.SERVER]
    )
    assert res.get("same-slot", "llama-server", "repeat", 512) == [1.0]
    assert res.get("cached", "llama-server", "repeat", 512) == [511.0]
    p12 = next(b for b in rep.bars(res) if b.id == "P12")
    assert p12.verdict == "ABOVE BAR"  # 40 ms against 20 ms: 2x, bar 0.5x
    # One filler for the server between the repeat and its host-RAM cache hit.
    assert server.calls == [512, 512, scenarios.FILLER_TOKENS, 512, 512]


def test_p12_is_not_measured_when_llama_servers_repeat_was_no_live_slot_hit() -> None:
    res = rep.Results(rounds=1, sizes=(512,))
    scenarios.ttft_round(
        rig(FakeLlamad(), sizes=(512,), server=FakeServer(repeat_moves=True)),
        res,
        0,
        [scenarios.SERVER, scenarios.LLAMAD],
    )
    assert res.get("same-slot", "llama-server", "repeat", 512) == [0.0]
    p12 = next(b for b in rep.bars(res) if b.id == "P12")
    assert p12.verdict == "NOT MEASURED (llama-server's repeat was no live-slot hit in round(s) 1)"


class BarrierLlamad(FakeLlamad):
    """Agents 2-8 must all be in flight before any is answered: a request that
    waited for another's reply would deadlock here (and time out)."""

    def __init__(self) -> None:
        super().__init__(n_seq=8)
        self.inside = threading.Barrier(7, timeout=10)
        self.first_done = False

    def first_token(self, model: str, ids: list[int]) -> tuple[float, Completion]:
        if self.first_done:
            self.inside.wait()
        ms, c = super().first_token(model, ids)
        self.first_done = True
        return ms, c


def test_p6_sends_agent_1_alone_then_agents_2_to_8_together() -> None:
    fake = BarrierLlamad()
    res = rep.Results(rounds=1, sizes=(512,))
    scenarios.agents_round(rig(fake), res, 0, [scenarios.LLAMAD])
    sent = [c for c in fake.calls if isinstance(c, tuple)]
    assert sent == [("first_token", 256 + 8)] * 8
    # The fake's every agent: TTFT 40, queue 1, tail prefill 30: the prefix's share 9 ms.
    assert res.get("p6", "llamad", "prefix_ms") == [pytest.approx(9.0)]
    # Of it, restore 2 by the worker's clock and 7 it did not see.
    assert res.get("p6", "llamad", "unseen_ms") == [pytest.approx(7.0)]
    assert res.get("p6", "llamad", "others") == [40.0]
    # Each agent thread opened its connection before the barrier (untimed).
    assert fake.calls.count("tokenize") >= 7


def test_p7_sends_the_turns_back_to_back_and_counts_after_the_chat() -> None:
    fake = FakeLlamad()
    res = rep.Results(rounds=1, sizes=(512,))
    scenarios.chat_round(rig(fake), res, 0, [scenarios.LLAMAD])
    chats = [i for i, c in enumerate(fake.calls) if c == "chat"]
    assert len(chats) == 3
    # Nothing between two turns: no template rendered, nothing tokenized, no wait.
    assert chats == list(range(chats[0], chats[0] + 3))
    assert res.get("p7", "llamad", "share")
    assert res.get("p7", "llamad", "sources", "live")[0] > 0
