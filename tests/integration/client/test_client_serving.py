"""The serving path end to end through the public client (SPEC D3, M2-M13).

One served model per module (n_seq_max 4, one thread, small save
thresholds); every request goes through ``llamad.Client``: route at the
front, then the worker actor directly.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import pytest

from llamad import (
    CacheHitKind,
    Cancelled,
    Client,
    DoneEvent,
    FinishReason,
    NoSession,
    StickyBusy,
    TokenEvent,
    TranscriptMismatch,
)
from served import ENDLESS, MANY, Served, prompt_text, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[Client]:
    with Client(served.endpoint, timeout=120) as c:
        yield c


def test_cold_then_exact_hit_gives_the_same_reply(served: Served, client: Client) -> None:
    prompt = prompt_text(101)
    cold = client.complete(served.model_id, prompt, max_tokens=6, **GREEDY)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    served.wait_saved(cold.finish_key)
    warm = client.complete(served.model_id, prompt, max_tokens=6, **GREEDY)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.reply == cold.reply
    assert warm.generated == cold.generated
    assert warm.cache_delta.read == warm.stats.prompt_tokens
    assert warm.stats.prefill_tokens <= 1


def test_a_turn_with_parent_key_resumes_from_the_previous_turn(
    served: Served, client: Client
) -> None:
    first = client.complete(served.model_id, prompt_text(102), max_tokens=4, **GREEDY)
    follow = client.tokenize(served.model_id, " And then the river turned to", add_special=False)
    second = client.complete(
        served.model_id,
        [*first.context_tokens, *follow],
        parent_key=first.finish_key,
        max_tokens=4,
        **GREEDY,
    )
    assert second.cache_hit_kind is CacheHitKind.PARTIAL
    # Everything the first turn committed came from its finish row.
    assert second.cache_delta.read >= first.committed_tokens
    assert second.stats.prefill_tokens <= len(first.context_tokens) - first.committed_tokens + len(
        follow
    )


def test_stateless_chat_resending_the_history_reuses_its_tokens(
    served: Served, client: Client
) -> None:
    messages = [{"role": "user", "content": "Name three colours of the sea at night."}]
    first = client.complete(served.model_id, messages=messages, max_tokens=12, **GREEDY)
    served.wait_saved(first.finish_key)
    messages += [
        {"role": "assistant", "content": first.reply},
        {"role": "user", "content": "And three animals that live there?"},
    ]
    second = client.complete(served.model_id, messages=messages, max_tokens=4, **GREEDY)
    assert second.cache_hit_kind is CacheHitKind.PARTIAL
    # The whole first turn (prompt and reply) is reused: only the new user
    # turn and the template's glue are prefilled.
    assert second.cache_delta.read >= first.committed_tokens
    assert second.cache_delta.read / second.stats.prompt_tokens > 0.5
    assert second.stats.prefill_tokens == second.stats.prompt_tokens - second.cache_delta.read


def test_a_longer_prompt_restores_its_longest_saved_prefix(served: Served, client: Client) -> None:
    base = prompt_text(103)
    first = client.prefill_only(served.model_id, base)
    served.wait_saved(first.finish_key)
    longer = client.complete(
        served.model_id, base + " The lamp went out and the garden", max_tokens=2, **GREEDY
    )
    assert longer.cache_hit_kind is CacheHitKind.PARTIAL
    assert longer.cache_delta.read >= len(first.context_tokens) - 1
    assert longer.cache_miss is not None
    assert longer.cache_miss.diverged_at >= len(first.context_tokens) - 1


def test_prefill_only_generates_nothing_and_the_next_request_hits(
    served: Served, client: Client
) -> None:
    prompt = prompt_text(104)
    warmed = client.prefill_only(served.model_id, prompt)
    assert warmed.generated == []
    assert warmed.finish_reason is FinishReason.LENGTH
    served.wait_saved(warmed.finish_key)
    hit = client.complete(served.model_id, prompt, max_tokens=2, **GREEDY)
    assert hit.cache_hit_kind is CacheHitKind.EXACT


def test_a_stream_yields_tokens_then_exactly_one_done(served: Served, client: Client) -> None:
    stream = client.infer(served.model_id, prompt_text(105), max_tokens=8, **GREEDY)
    events = list(stream)
    assert isinstance(events[-1], DoneEvent)
    assert sum(isinstance(e, DoneEvent) for e in events) == 1
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(tokens) == 8
    done = events[-1]
    assert done.result == stream.result
    assert "".join(t.text for t in tokens) == done.result.reply
    assert [t.token for t in tokens if t.token is not None] == done.result.generated
    assert stream.finished
    assert list(stream) == []  # a finished stream yields nothing more


def test_eight_concurrent_streams_on_four_sequences_all_complete(
    served: Served, client: Client
) -> None:
    """Eight threads share one client; four requests wait in the worker's queue."""
    results: dict[int, list[object]] = {}

    def run(i: int) -> None:
        results[i] = list(client.infer(served.model_id, prompt_text(200 + i), max_tokens=12))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert sorted(results) == list(range(8))
    for events in results.values():
        assert sum(isinstance(e, DoneEvent) for e in events) == 1
        done = events[-1]
        assert isinstance(done, DoneEvent)
        assert done.result.stats.completion_tokens == 12 or (
            done.result.finish_reason is FinishReason.STOP
        )
    queued = [e[-1].result.stats.queue_ms for e in results.values()]  # type: ignore[union-attr]
    assert sum(q > 0 for q in queued) >= 1, "with 8 requests on 4 sequences some must queue"


def test_sessions_stick_continue_fork_reset_and_end(served: Served, client: Client) -> None:
    model = served.model_id
    first = client.complete(model, prompt_text(106), session_id="s1", max_tokens=4, **GREEDY)
    tail = client.tokenize(model, " Then the copper lamp", add_special=False)
    cont = client.complete(
        model,
        tail,
        session_id="s1",
        continue_=True,
        expect_committed=first.committed_tokens,
        max_tokens=4,
        **GREEDY,
    )
    assert cont.cache_hit_kind is CacheHitKind.CONTINUATION
    assert cont.context_tokens[: len(first.context_tokens)] == first.context_tokens
    with pytest.raises(TranscriptMismatch):
        client.complete(
            model, tail, session_id="s1", continue_=True, expect_committed=1, max_tokens=1
        )
    with client.infer(model, tail, session_id="s1", continue_=True, max_tokens=200) as busy:
        next(busy)
        with pytest.raises(StickyBusy):
            client.complete(model, tail, session_id="s1", continue_=True, max_tokens=1)
    wait_until(lambda: served.wait_idle() is not None, "the busy request to end")
    assert isinstance(client.fork_session(model, "s1", "s1-fork"), bool)
    forked = client.complete(model, tail, session_id="s1-fork", continue_=True, max_tokens=2)
    assert (
        forked.context_tokens[: len(cont.context_tokens)]
        == cont.context_tokens[: len(cont.context_tokens)]
    )
    client.reset_session(model, "s1-fork")
    reset = client.complete(model, tail, session_id="s1-fork", continue_=True, max_tokens=1)
    assert reset.context_tokens[: len(tail)] == tail
    client.end_session(model, "s1")
    client.end_session(model, "s1-fork")
    with pytest.raises(NoSession):
        client.complete(model, tail, session_id="s1", continue_=True, max_tokens=1)


def test_a_grammar_constrains_the_reply(served: Served, client: Client) -> None:
    result = client.complete(
        served.model_id,
        "Is the sea salty? Answer:",
        grammar='root ::= " yes" | " no"',
        max_tokens=8,
        **GREEDY,
    )
    assert result.reply in {" yes", " no"}


def test_a_stop_sequence_ends_the_reply_and_is_reported(served: Served, client: Client) -> None:
    free = client.complete(served.model_id, "Count: 1, 2, 3, 4,", max_tokens=12, **GREEDY)
    assert " 7" in free.reply, "the test relies on the model counting on"
    stopped = client.complete(
        served.model_id, "Count: 1, 2, 3, 4,", stop=[" 7"], max_tokens=12, **GREEDY
    )
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.stop_sequence == " 7"
    assert stopped.reply == free.reply[: free.reply.index(" 7")]
    streamed = list(
        client.infer(served.model_id, "Count: 1, 2, 3, 4,", stop=" 7", max_tokens=12, **GREEDY)
    )
    text = "".join(e.text for e in streamed if isinstance(e, TokenEvent))
    assert text == stopped.reply


def test_cancel_mid_stream_ends_with_a_cancelled_done(served: Served, client: Client) -> None:
    stream = client.infer(served.model_id, prompt_text(107), max_tokens=400)
    seen = [next(stream) for _ in range(3)]
    assert all(isinstance(e, TokenEvent) for e in seen)
    assert stream.cancel() is True
    rest = list(stream)
    assert isinstance(rest[-1], DoneEvent)
    result = rest[-1].result
    assert result.finish_reason is FinishReason.CANCELLED
    assert 3 <= result.stats.completion_tokens < 400
    assert stream.cancel() is False  # already ended


def test_cancel_by_request_id_from_another_thread(served: Served, client: Client) -> None:
    stream = client.infer(served.model_id, prompt_text(108), max_tokens=400, request_id="by-id")
    next(stream)
    outcome: list[bool] = []
    canceller = threading.Thread(target=lambda: outcome.append(client.cancel("by-id")))
    canceller.start()
    canceller.join(60)
    assert outcome == [True]
    assert stream.completion().finish_reason is FinishReason.CANCELLED


def test_a_stream_is_consumed_on_the_thread_that_opened_it(served: Served, client: Client) -> None:
    stream = client.infer(served.model_id, prompt_text(111), max_tokens=200)
    failures: list[BaseException] = []

    def consume() -> None:
        try:
            next(stream)
        except BaseException as exc:
            failures.append(exc)

    other = threading.Thread(target=consume)
    other.start()
    other.join(60)
    assert len(failures) == 1
    assert isinstance(failures[0], RuntimeError)
    # The opening thread still can, and leaving cancels it.
    with stream:
        assert isinstance(next(stream), TokenEvent)
    served.wait_idle(timeout=5)


def test_breaking_out_of_a_stream_cancels_the_request(served: Served, client: Client) -> None:
    """Generation that cannot stop by itself (:data:`ENDLESS`) stops as soon
    as the consumer leaves the loop."""
    before = served.ticks()
    stream = client.infer(served.model_id, prompt_text(109), max_tokens=MANY, grammar=ENDLESS)
    for _ in stream:
        break
    assert stream.finished
    served.assert_dropped(before)
    # Left early, it has no Completion: a typed error says so.
    with pytest.raises(Cancelled) as exc:
        stream.completion()
    assert exc.value.details == {"reason": "closed", "request_id": stream.request_id}
    before = served.ticks()
    for _ in client.infer(served.model_id, prompt_text(110), max_tokens=MANY, grammar=ENDLESS):
        break
    served.assert_dropped(before)


def test_a_stream_dropped_unread_is_cancelled(served: Served, client: Client) -> None:
    before = served.ticks()
    stream = client.infer(served.model_id, prompt_text(112), max_tokens=MANY, grammar=ENDLESS)
    served.wait_until_busy()
    del stream  # collected: the request is abandoned
    served.assert_dropped(before)


def test_embeddings_are_unit_vectors_that_tell_texts_apart(served: Served, client: Client) -> None:
    a = client.embed(served.model_id, "The sea is salty.")
    b = client.embed(served.model_id, "The sea is salty.")
    c = client.embed(served.model_id, "Copper wire conducts electricity.")
    assert len(a) > 100
    assert math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-3)
    assert a == b
    assert a != c
    tokens = client.tokenize(served.model_id, "The sea is salty.")
    assert client.embed(served.model_id, tokens) == pytest.approx(a, abs=1e-5)


def test_text_operations_round_trip(served: Served, client: Client) -> None:
    text = "Hello <|im_start|> world"
    tokens = client.tokenize(served.model_id, text, add_special=False)
    assert client.detokenize(served.model_id, tokens) == text
    chat = [{"role": "user", "content": "hi"}]
    rendered = client.apply_chat_template(served.model_id, chat)
    assert client.detokenize(served.model_id, rendered).endswith("assistant\n")
