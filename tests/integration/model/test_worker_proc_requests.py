"""Request parameters and prefix hits through the real worker process (SPEC M3, M6, M13, M16).

A real supervisor starts cache-meta and the worker (default model, one
thread); the tests drive it through actors clients. What the core and the
backend already do in-process is checked here across the wire: a grammar or a
JSON Schema constrains the reply, stop strings are trimmed and reported,
``max_tokens`` ends with ``length``, logprobs are the model's distribution,
a common-prefix hit restores a longer row and cuts it back, the miss
explanation points at the changed word, and four requests batched together
reply as each alone.

Every tick stays under 64 rows (``prefill_chunk_size=15``, at most 4 sequences:
4 x 15 = 60), where the CPU computes each token bit-identically whatever shares
its batch (tests/integration/llama_ffi/tolerances.py), so batched, partial and
cold runs are compared token for token and log-probability for log-probability
(the batched requests keep their KV cells to the end: see that test).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from typing import Any

import jsonschema
import pytest

import tolerances
from llamad.errors import NoSession
from llamad.model.results import CacheHitKind, Completion, FinishReason, TokenEvent
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY: dict[str, Any] = {"temperature": 0.0}
N_SEQ = 4


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    n_ctx=1024, n_batch=64, n_seq_max=N_SEQ, prefill_chunk_size=15, prefix="lmr"
)


def user(text: str, system: str | None = None) -> list[dict[str, Any]]:
    head = [] if system is None else [{"role": "system", "content": system}]
    return [*head, {"role": "user", "content": text}]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# -- constraints and endings (M6) ---------------------------------------------------


def test_grammar_limits_the_reply_to_its_language(worker: WorkerClient) -> None:
    chat = user("Is the sky green? Answer yes or no.")
    free = worker.complete(messages=chat, max_tokens=16, **GREEDY)
    # Unconstrained, the model answers in a sentence: the grammar is what
    # makes the reply one bare word.
    assert free.reply not in ("yes", "no"), free.reply
    got = worker.complete(messages=chat, grammar='root ::= "yes" | "no"', max_tokens=16, **GREEDY)
    assert got.reply in ("yes", "no"), got.reply
    assert got.finish_reason is FinishReason.STOP


def test_json_schema_reply_parses_and_validates(worker: WorkerClient) -> None:
    schema = {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "sure": {"type": "boolean"},
        },
        "required": ["colour", "sure"],
        "additionalProperties": False,
    }
    chat = user("Pick a colour and say whether you are sure, as JSON.")
    got = worker.complete(messages=chat, json_schema=schema, max_tokens=48, **GREEDY)
    assert got.finish_reason is FinishReason.STOP, got.reply
    jsonschema.validate(json.loads(got.reply), schema)


def test_stop_sequence_is_trimmed_from_the_reply_and_reported(worker: WorkerClient) -> None:
    chat = user("Count from one to ten in words, separated by commas.")
    free = worker.complete(messages=chat, max_tokens=24, **GREEDY)
    reply = free.reply
    assert len(reply) >= 8, reply
    # A stop string from the middle of the free reply: the stopped reply is the
    # free one cut where the string first occurs.
    stop = reply[len(reply) // 2 : len(reply) // 2 + 3]
    cut = reply.index(stop)
    assert cut > 0, reply
    stream = worker.infer(messages=chat, max_tokens=24, stop=(stop, "never-said-xyzzy"), **GREEDY)
    streamed = "".join(e.text for e in stream if isinstance(e, TokenEvent))
    got = stream.result
    assert got is not None
    assert got.finish_reason is FinishReason.STOP
    assert got.stop_sequence == stop
    assert got.reply == reply[:cut]
    assert stop not in got.reply
    # The stream never released the stop string either.
    assert streamed == got.reply


def test_max_tokens_ends_the_reply_with_length(worker: WorkerClient) -> None:
    got = worker.complete(prompt_text(70, words=12), max_tokens=3, **GREEDY)
    assert got.finish_reason is FinishReason.LENGTH
    assert len(got.generated) == got.stats.completion_tokens == 3
    assert got.stop_sequence is None


# -- logprobs (M13) -----------------------------------------------------------------


def test_logprobs_are_log_probabilities_led_by_the_greedy_token(worker: WorkerClient) -> None:
    k = 5
    stream = worker.infer(messages=user("Say hello."), logprobs=k, max_tokens=8, **GREEDY)
    events = [e for e in stream if isinstance(e, TokenEvent) and e.token is not None]
    got = stream.result
    assert got is not None and got.logprobs is not None
    assert len(got.logprobs) == len(got.generated) >= 2
    for token, lp in zip(got.generated, got.logprobs, strict=True):
        assert lp.token == token
        assert lp.logprob <= 0.0
        assert len(lp.top) == k
        assert lp.top[0].token == token  # greedy: the sampled token is the most likely
        assert lp.top[0].logprob == lp.logprob
        values = [t.logprob for t in lp.top]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0.0 for v in values)
        assert len({t.token for t in lp.top}) == k
        assert math.fsum(math.exp(v) for v in values) <= 1.0 + 1e-6
    # Each token event carried its own entry.
    assert [e.logprob for e in events] == got.logprobs


# -- prefix hits (M3, M16) ----------------------------------------------------------


def test_common_prefix_hit_truncates_a_longer_row_and_replies_as_cold(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    head = "In a quiet harbour town of grey stone houses, this is a short story about the "
    first = worker.tokenize(head + "old lighthouse keeper who loved the winter storms.")
    second = worker.tokenize(head + "young baker who feared the long dark nights.")
    shared = common_prefix(first, second)
    assert 16 <= shared < min(len(first), len(second))
    # A cold run of the second prompt on a cache with nothing of it: a salt
    # nobody else uses is a namespace of its own.
    params: dict[str, Any] = {"max_tokens": 8, "logprobs": 1, **GREEDY}
    cold = worker.complete(second, cache_salt="fresh-cache-reference", **params)
    assert cold.cache_hit_kind is CacheHitKind.COLD

    saved = worker.complete(first, **params)
    tree.wait_saved(saved.finish_key)
    got = worker.complete(second, **params)
    # The first prompt's row is restored and cut back to the tokens both
    # prompts share; the rest is prefilled.
    assert got.cache_hit_kind is CacheHitKind.PARTIAL
    assert got.cache_delta.read == shared
    assert got.stats.prefill_tokens == len(second) - shared
    assert got.cache_miss is not None and got.cache_miss.diverged_at == shared
    if tolerances.exact():
        assert got.generated == cold.generated
        assert got.reply == cold.reply
        # Bit for bit: the restored and cut prefix is the cold run's KV.
        assert got.logprobs == cold.logprobs


def test_cache_miss_points_at_the_changed_word(tree: WorkerTree, worker: WorkerClient) -> None:
    system = "You are a helpful assistant for a garden shop by the sea."
    before = user("Which plants grow well in red clay soil near the coast?", system)
    after = user("Which plants grow well in sandy clay soil near the coast?", system)
    first = worker.complete(messages=before, max_tokens=4, **GREEDY)
    tree.wait_saved(first.finish_key)

    got = worker.complete(messages=after, max_tokens=4, **GREEDY)
    tokens = worker.apply_chat_template(after)
    diverged = common_prefix(worker.apply_chat_template(before), tokens)
    # The divergence really is the changed word, well past the system prompt.
    assert worker.detokenize(tokens[diverged:]).startswith(" sandy clay")
    assert got.cache_hit_kind is CacheHitKind.PARTIAL
    miss = got.cache_miss
    assert miss is not None
    assert miss.nearest_key == first.finish_key
    assert miss.diverged_at == diverged == got.cache_delta.read == miss.restored_tokens
    assert miss.prompt_tokens == len(tokens)
    assert miss.before.endswith("grow well in"), miss.before
    assert miss.after.startswith(" sandy clay"), miss.after
    # The window is miss_window tokens each side, not the whole prompt.
    assert system not in miss.before


# -- batching (M2, M4) --------------------------------------------------------------


def test_concurrent_greedy_requests_reply_as_each_alone(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    """Four requests decoded in shared ticks get the very tokens, and the very
    log-probabilities, each gets alone.

    Each request opens a session, so its sequence keeps its KV cells until the
    test ends them all. A plain request frees its cells when it ends, and
    llama.cpp then places the later tokens of the requests still running in
    those cells, below their earlier ones: the attention sums run in another
    order (measured on the binding: logits 0.5-0.8 apart from the first reused
    cell on), and a near-tie may flip. That is numerics, not one sequence
    seeing another's KV, so the test keeps every cell in place to compare bit
    for bit.
    """
    prompts = [
        worker.apply_chat_template(user("What is the capital of France?")),
        worker.apply_chat_template(user("Write one word that rhymes with cat.")),
        worker.tokenize("Once upon a time, in a small village by the river,"),
        worker.apply_chat_template(user("Count from one to five, in words, then stop.")),
    ]
    assert len({len(p) for p in prompts}) == N_SEQ  # prefills of different lengths interleave
    params: dict[str, Any] = {"max_tokens": 10, "logprobs": 2, **GREEDY}
    # Salts give every run a namespace of its own, so every run is cold.
    solo: list[Completion] = []
    solo_ticks = 0
    for i, p in enumerate(prompts):
        before = tree.wait_idle().status.ticks
        solo.append(worker.complete(p, cache_salt=f"solo-{i}", session_id=f"solo-{i}", **params))
        solo_ticks += tree.wait_idle().status.ticks - before
        worker.end_session(f"solo-{i}")

    results: dict[int, Completion] = {}
    errors: list[BaseException] = []
    started = threading.Barrier(N_SEQ)

    def run(i: int) -> None:
        try:
            with tree.client() as c:
                started.wait(30)
                results[i] = c.complete(
                    prompts[i], cache_salt=f"together-{i}", session_id=f"together-{i}", **params
                )
        except BaseException as exc:
            errors.append(exc)

    before = tree.wait_idle().status.ticks
    threads = [threading.Thread(target=run, args=(i,)) for i in range(N_SEQ)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        together_ticks = tree.wait_idle().status.ticks - before
    finally:
        for i in range(N_SEQ):
            with contextlib.suppress(NoSession):  # a request that failed opened none
                worker.end_session(f"together-{i}")
    assert not errors, errors
    assert sorted(results) == list(range(N_SEQ))
    assert all(r.cache_hit_kind is CacheHitKind.COLD for r in [*solo, *results.values()])
    # They shared ticks: one decode served several sequences.
    assert together_ticks < solo_ticks
    together = [results[i] for i in range(N_SEQ)]
    if tolerances.exact():
        assert [r.generated for r in together] == [s.generated for s in solo]
        assert [r.logprobs for r in together] == [s.logprobs for s in solo]
    assert len({tuple(s.generated) for s in solo}) == N_SEQ


def test_streams_of_one_client_get_each_tick_in_one_message_with_their_own_tokens(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    """Three streams on one connection, as the HTTP gateway holds them: the
    worker sends each tick's events to that client as one ``EVENTS`` message
    (its actor's ``event_batches`` counter moves), and each stream still gets
    every token of its own request, in order: the tokens of its solo run, and
    its completion's ``generated``. Sessions keep every cell in place, as in
    the test above, so the batched runs compare bit for bit."""
    prompts = [
        worker.apply_chat_template(user("Name three colours of the rainbow.")),
        worker.apply_chat_template(user("Describe a quiet morning at the sea.")),
        worker.tokenize("The old lighthouse keeper climbed the stairs and"),
    ]
    params: dict[str, Any] = {"max_tokens": 12, **GREEDY}
    solo = []
    for i, p in enumerate(prompts):
        solo.append(
            worker.complete(p, cache_salt=f"ev-solo-{i}", session_id=f"ev-solo-{i}", **params)
        )
        worker.end_session(f"ev-solo-{i}")
    info = worker.actor.call("$info")["stats"]
    try:
        with tree.client() as c:
            streams = [
                c.infer(p, cache_salt=f"ev-together-{i}", session_id=f"ev-together-{i}", **params)
                for i, p in enumerate(prompts)
            ]
            tokens: list[list[int]] = [[] for _ in prompts]
            iters = [iter(s) for s in streams]
            running = set(range(len(prompts)))
            while running:  # read them in turn: one thread, one socket
                for i in sorted(running):
                    event = next(iters[i], None)
                    if event is None:
                        running.discard(i)
                    elif isinstance(event, TokenEvent) and event.token is not None:
                        tokens[i].append(event.token)
            results = [s.result for s in streams]
    finally:
        for i in range(len(prompts)):
            with contextlib.suppress(NoSession):
                worker.end_session(f"ev-together-{i}")
    after = worker.actor.call("$info")["stats"]
    assert after["event_batches"] > info["event_batches"]
    assert all(r is not None for r in results)
    assert tokens == [r.generated for r in results if r is not None]
    if tolerances.exact():
        assert tokens == [s.generated for s in solo]
    assert all(
        len(t) == 12 or s.finish_reason is FinishReason.STOP
        for t, s in zip(tokens, solo, strict=True)
    )
