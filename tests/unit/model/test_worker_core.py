"""The tick (SPEC M4, M6, M7, M8): one decode per tick, endings, streams, results on the wire."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from llamad.errors import ContextOverflow
from llamad.llama_ffi.errors import DecodeError
from llamad.model.config import MarkerPair
from llamad.model.planner import BatchPlan
from llamad.model.results import (
    EVENT_DECODER,
    DoneEvent,
    ErrorEvent,
    FinishReason,
    ThinkingEvent,
    TokenEvent,
    ToolCallEvent,
)
from llamad.model.stub import StubBackend
from worker_harness import make, prompt

pytestmark = pytest.mark.timeout(60)


def scripted(reply: Sequence[int], prompt_len: int, *, then: int = 0) -> StubBackend:
    """A stub whose greedy reply is ``reply`` (then ``then`` forever)."""

    def rule(tokens: Sequence[int]) -> int:
        i = len(tokens) - prompt_len
        return reply[i] if 0 <= i < len(reply) else then

    return StubBackend(
        n_ctx=1024,
        n_batch=64,
        n_seq_max=2,
        rule=rule,
        piece=lambda t: PIECES.get(t, b"?"),
        eog=(0,),
    )


PIECES = {
    1: b"Hel",
    2: b"lo",
    3: b" wor",
    4: b"ld",
    5: b"\n\nU",
    6: b"ser:",
    7: b"<think>",
    8: b"hmm",
    9: b"</think>",
    10: b"<tool_call>",
    11: b'{"f":1}',
    12: b"</tool_call>",
}


def test_one_decode_per_tick_carries_every_generating_sequence() -> None:
    h = make(n_seq_max=3, n_batch=64)
    for i in range(3):
        h.submit(f"r{i}", prompt(10 + i, start=i), max_tokens=20)
    h.run()
    # Ticks 1-2 prefill all three prompts (up to their cold save at 8 tokens, then
    # the rest less the last token); from tick 3 every tick decodes all three until
    # they finish together after 20 tokens.
    decode_rows = [sum(s.want_logits for s in p.spans) for p in h.backend.decoded]
    assert decode_rows == [0, 0] + [3] * 20
    assert all(len({s.seq for s in p.spans}) == len(p.spans) for p in h.backend.decoded)


def test_long_prompts_are_chunked_and_n_batch_is_never_exceeded() -> None:
    h = make(n_seq_max=3, n_batch=40, chunk=16)
    h.submit("gen", prompt(5), max_tokens=60)
    h.step()
    h.step()
    h.submit("long1", prompt(200, start=3), max_tokens=2)
    h.submit("long2", prompt(150, start=4), max_tokens=2)
    h.run()
    assert max(p.n_rows for p in h.backend.decoded) <= 40
    assert max(len(s.tokens) for p in h.backend.decoded for s in p.spans) <= 16
    # While the long prompts were prefilled, the generating sequence never missed a tick.
    gen_seq = 0
    ticks_with_gen = [p for p in h.backend.decoded if p.span_of(gen_seq) is not None]
    assert len(ticks_with_gen) >= 60


def test_max_tokens_ends_with_length() -> None:
    result = make().complete("a", prompt(10), max_tokens=7)
    assert (len(result.generated), result.finish_reason) == (7, FinishReason.LENGTH)


def test_an_end_of_generation_token_ends_with_stop_and_adds_no_text() -> None:
    h = make(backend=scripted([1, 2, 0], prompt_len=10))
    result = h.complete("a", prompt(10), max_tokens=50)
    assert result.finish_reason is FinishReason.STOP
    assert result.generated == [1, 2, 0]
    assert result.reply == "Hello"
    assert result.stop_sequence is None


def test_a_stop_sequence_split_across_tokens_is_trimmed_and_reported() -> None:
    h = make(backend=scripted([1, 2, 3, 4, 5, 6, 1, 2], prompt_len=10))
    result = h.complete("a", prompt(10), max_tokens=50, stop=("\n\nUser:",))
    assert result.reply == "Hello world"
    assert result.stop_sequence == "\n\nUser:"
    assert result.finish_reason is FinishReason.STOP
    assert result.generated == [1, 2, 3, 4, 5, 6]
    streamed = "".join(e.text for e in h.events["a"] if isinstance(e, TokenEvent))
    assert streamed == result.reply


def test_thinking_and_tool_calls_stream_as_their_own_events() -> None:
    backend = scripted([7, 8, 9, 1, 2, 10, 11, 12, 0], prompt_len=10)
    h = make(
        backend=backend,
        thinking=MarkerPair("<think>", "</think>"),
        tool_call=MarkerPair("<tool_call>", "</tool_call>"),
    )
    result = h.complete("a", prompt(10), max_tokens=50)
    events = h.events["a"]
    assert [e.text for e in events if isinstance(e, ThinkingEvent)] == ["hmm"]
    assert [e.text for e in events if isinstance(e, ToolCallEvent)] == ['{"f":1}']
    assert (result.reply, result.thinking, result.tool_calls) == ("Hello", "hmm", ['{"f":1}'])
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "Hello"


def test_every_token_has_one_token_event_and_one_terminal_event_ends_the_stream() -> None:
    h = make()
    result = h.complete("a", prompt(10), max_tokens=9)
    events = h.events["a"]
    assert [e.token for e in events if isinstance(e, TokenEvent)] == result.generated
    assert isinstance(events[-1], DoneEvent)
    assert sum(isinstance(e, (DoneEvent, ErrorEvent)) for e in events) == 1


def test_text_held_at_a_cancel_is_released_before_done() -> None:
    h = make(backend=scripted([1, 2, 3, 5], prompt_len=10, then=3))
    h.submit("a", prompt(10), max_tokens=50, stop=("\n\nUser:",))
    while len(h.core.requests["a"].generated) < 4:
        h.step()
    h.core.cancel("a")
    h.run()
    result = h.result("a")
    assert result.cancelled and result.reply == "Hello wor\n\nU"
    assert "".join(e.text for e in h.events["a"] if isinstance(e, TokenEvent)) == result.reply


def test_logprobs_are_reported_per_token_when_asked() -> None:
    h = make()
    result = h.complete("a", prompt(10), max_tokens=6, logprobs=3)
    assert result.logprobs is not None and len(result.logprobs) == 6
    for lp, token in zip(result.logprobs, result.generated, strict=True):
        assert lp.token == token and lp.logprob <= 0.0
        assert 0 < len(lp.top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert lp.top[0].token == token
    assert make().complete("b", prompt(10), max_tokens=2).logprobs is None


def test_seeded_sampling_is_reproducible_across_workers() -> None:
    params = {"temperature": 0.9, "seed": 1234, "max_tokens": 16}
    a = make().complete("a", prompt(12), **params)
    b = make().complete("b", prompt(12), **params)
    c = make().complete("c", prompt(12), **{**params, "seed": 99})
    assert a.generated == b.generated
    assert a.generated != c.generated


def test_results_and_events_survive_the_wire() -> None:
    h = make()
    h.complete("a", prompt(40), max_tokens=3, logprobs=2, session_id="s")
    h.complete("b", [*prompt(40), 9], max_tokens=3)
    for events in h.events.values():
        for event in events:
            assert EVENT_DECODER.decode(msgspec.msgpack.encode(event)) == event
    assert msgspec.to_builtins(h.events["a"][-1])["kind"] == "done"


class FailingBackend(StubBackend):
    """Fails the decode call number ``fail_on`` (1-based)."""

    def __init__(self, fail_on: int) -> None:
        super().__init__(n_ctx=1024, n_batch=64, n_seq_max=2)
        self.fail_on = fail_on
        self.calls = 0

    def decode(self, plan: BatchPlan) -> None:
        self.calls += 1
        if self.calls == self.fail_on:
            raise DecodeError("llama_decode failed (rc=-3)")
        super().decode(plan)


def test_a_failed_decode_fails_its_requests_and_the_worker_goes_on() -> None:
    backend = FailingBackend(fail_on=3)
    h = make(backend=backend)
    h.submit("a", prompt(10), max_tokens=5)
    h.submit("b", prompt(10, start=2), max_tokens=5)
    h.run()
    assert h.error("a").code == h.error("b").code == "decode_failed"
    assert h.core.status().free_sequences == 2 and h.core.cells_used == 0
    assert backend.samplers_open == 0
    assert h.complete("c", prompt(10), max_tokens=2).finish_reason is FinishReason.LENGTH


def test_when_kv_cells_run_out_the_newest_request_yields() -> None:
    h = make(n_ctx=64, n_batch=32, n_seq_max=2)
    h.submit("old", prompt(20), max_tokens=200)
    h.submit("new", prompt(20, start=5), max_tokens=200)
    h.run()
    old, new = h.result("old"), h.result("new")
    assert old.finish_reason is new.finish_reason is FinishReason.LENGTH
    # The newer request gave its cells up first; the older one ran until the context was full.
    assert len(old.generated) > len(new.generated)
    assert old.committed_tokens == 64
    # The yielded request's idle entry was dropped for the older one's cells;
    # the older one's KV stays, idle, holding the whole context.
    assert [(e.seq, e.tokens) for e in h.core.status().idle_entries] == [(0, 64)]
    assert h.core.cells_used == h.backend.cells_used == 64


def test_a_prefilling_request_without_cells_fails_with_context_overflow() -> None:
    h = make(n_ctx=64, n_batch=32, n_seq_max=2, chunk=8)
    h.submit("old", prompt(40), max_tokens=200)
    while not h.core.requests["old"].generating:
        h.step()
    h.submit("new", prompt(40, start=5), max_tokens=2)
    h.run()
    assert h.error("new").code == ContextOverflow.code
    assert h.result("old").finish_reason is FinishReason.LENGTH


def test_samplers_and_pins_are_always_given_back() -> None:
    h = make(n_seq_max=2, max_queue=20)
    base = prompt(30)
    h.complete("seed", base, max_tokens=4)
    for i in range(10):
        h.submit(f"r{i}", base[: 10 + i * 2] + prompt(4, start=i), max_tokens=3)
    h.core.cancel("r3")
    h.core.cancel("r7")
    h.run()
    assert h.backend.samplers_open == 0
    assert not h.cache.pins
    # Every sequence is free again; what they hold is idle KV, counted as the
    # backend counts it, and all of it goes once the idle entries are dropped.
    assert h.core.status().free_sequences == 2
    assert h.core.cells_used == h.backend.cells_used
    while h.core.seqs.drop_idle():
        pass
    assert h.core.cells_used == h.backend.cells_used == 0
