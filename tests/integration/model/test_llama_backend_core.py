"""WorkerCore on the real model through LlamaBackend, with the in-memory cache (SPEC M3-M6, M13).

One context (4 sequences, one KV pool) serves the module; every test builds a
fresh core, backend and cache over it. On the CPU a token's computation does
not depend on its batch or KV neighbours, so warm, batched and cold runs must
give the very same greedy tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import jsonschema
import pytest

import tolerances
from llama_backend_harness import GREEDY, Worker, fresh, open_context
from llamad.errors import SchemaError
from llamad.llama_ffi import Context, GrammarError, InvalidToken, Model
from llamad.model.results import CacheHitKind, FinishReason
from llamad.model.tokenizer import Tokenizer

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def ctx(model: Model) -> Iterator[Context]:
    c = open_context(model)
    yield c
    c.close()


@pytest.fixture
def worker(ctx: Context) -> Iterator[Worker]:
    w = fresh(ctx)
    yield w
    w.close()


def chat(model: Model, text: str) -> list[int]:
    return Tokenizer(model).apply_chat_template([{"role": "user", "content": text}])


def test_exact_hit_replays_the_cold_reply_without_prefilling(model: Model, worker: Worker) -> None:
    prompt = chat(model, "Name three colours of the rainbow.")
    cold = worker.complete("cold", prompt)
    cold_rows = worker.backend.rows_for(0)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert cold.stats.prefill_tokens == len(prompt)
    assert cold.finish_key is not None
    worker.backend.plans.clear()

    warm = worker.complete("warm", prompt)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.generated == cold.generated
    assert warm.reply == cold.reply
    # The finish row keeps the prompt's last logits: no prompt token is decoded
    # again (the first token is sampled from them), then one row per generated
    # token but the last (sampled, never decoded).
    assert warm.stats.prefill_tokens == 0
    assert worker.backend.rows_for(0) == len(warm.generated) - 1
    assert cold_rows == len(prompt) + len(cold.generated) - 1
    assert warm.cache_delta.read == len(prompt)


def test_longest_prefix_hit_prefills_only_the_tail(model: Model, ctx: Context) -> None:
    head = chat(model, "Tell me about the sea.")
    tail = model.tokenize(" Keep it short, please, and mention fish.", add_special=False)
    with_tail = head + tail
    reference = fresh(ctx)
    try:
        want = reference.complete("ref", with_tail)
    finally:
        reference.close()

    w = fresh(ctx)
    try:
        warmed = w.complete("warm-up", head, prefill_only=True)
        assert warmed.finish_key is not None
        got = w.complete("tail", with_tail)
        assert got.cache_hit_kind is CacheHitKind.PARTIAL
        assert got.cache_delta.read == len(head)
        assert got.stats.prefill_tokens == len(tail)
        if tolerances.exact():
            assert got.generated == want.generated
    finally:
        w.close()


def test_common_prefix_hit_truncates_a_diverging_row(model: Model, ctx: Context) -> None:
    shared = model.tokenize("A short story about a lighthouse keeper named ", add_special=False)
    first = shared + model.tokenize("Oskar who loved storms.", add_special=False)
    second = shared + model.tokenize("Mira who feared the dark.", add_special=False)
    reference = fresh(ctx)
    try:
        want = reference.complete("ref", second)
    finally:
        reference.close()

    w = fresh(ctx)
    try:
        w.complete("first", first)
        got = w.complete("second", second)
        # The row of `first` (prompt and reply) is restored and cut back to
        # the tokens both prompts share; the rest of `second` is prefilled.
        assert got.cache_hit_kind is CacheHitKind.PARTIAL
        assert got.cache_delta.read == len(shared)
        assert got.stats.prefill_tokens == len(second) - len(shared)
        assert got.cache_miss is not None and got.cache_miss.diverged_at == len(shared)
        if tolerances.exact():
            assert got.generated == want.generated
    finally:
        w.close()


def test_four_concurrent_requests_each_get_their_solo_reply(model: Model, ctx: Context) -> None:
    prompts = [
        chat(model, "What is the capital of France?"),
        chat(model, "Write one word that rhymes with cat."),
        model.tokenize("Once upon a time, in a small village by the river,", add_special=False),
        chat(model, "Count from one to five, in words, separated by commas, and then stop."),
    ]
    solo = []
    for i, p in enumerate(prompts):
        w = fresh(ctx)
        try:
            solo.append(w.complete(f"solo{i}", p, max_tokens=10).generated)
        finally:
            w.close()

    w = fresh(ctx)
    try:
        for i, p in enumerate(prompts):
            assert w.submit(f"r{i}", p, max_tokens=10) is None  # each holds a sequence
        w.run()
        together = [w.result(f"r{i}").generated for i in range(len(prompts))]
        # Prompts of different lengths: some ticks mixed prefill chunks and
        # decode rows of other sequences in one batch.
        assert any(
            len(p.spans) > 1 and len({len(s.tokens) for s in p.spans}) > 1 for p in w.backend.plans
        )
    finally:
        w.close()
    if tolerances.exact():
        assert together == solo
    assert len({tuple(g) for g in together}) == len(prompts)


def test_grammar_limits_the_reply_to_its_language(model: Model, worker: Worker) -> None:
    prompt = chat(model, "Is the sky green? Answer yes or no.")
    got = worker.complete("g", prompt, grammar='root ::= "yes" | "no"', max_tokens=16)
    assert got.reply in ("yes", "no")
    assert got.finish_reason is FinishReason.STOP
    assert worker.backend.samplers_open == 0


def test_json_schema_output_parses_and_validates(model: Model, worker: Worker) -> None:
    schema = {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "sure": {"type": "boolean"},
        },
        "required": ["colour", "sure"],
    }
    prompt = chat(model, "Pick a colour and say whether you are sure, as JSON.")
    got = worker.complete("j", prompt, json_schema=schema, max_tokens=48)
    assert got.finish_reason is FinishReason.STOP, got.reply
    jsonschema.validate(json.loads(got.reply), schema)


def test_stop_sequence_is_trimmed_from_the_reply_and_reported(model: Model, worker: Worker) -> None:
    prompt = chat(model, "Count from one to ten in words, separated by commas.")
    free = worker.complete("free", prompt, max_tokens=24)
    # A stop string taken from the middle of the free reply; the reply is cut
    # where it first occurs.
    reply = free.reply
    assert len(reply) >= 6, reply
    stop = reply[len(reply) // 2 : len(reply) // 2 + 2]
    cut = reply.index(stop)
    assert cut > 0, reply
    got = worker.complete("stopped", prompt, max_tokens=24, stop=(stop,))
    assert got.finish_reason is FinishReason.STOP
    assert got.stop_sequence == stop
    assert got.reply == free.reply[:cut]
    assert worker.streamed_text("stopped") == got.reply


def test_seeded_sampling_is_reproducible_across_two_backends(model: Model, worker: Worker) -> None:
    prompt = chat(model, "Invent a name for a small red boat.")
    params = {"temperature": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": 12}
    first = worker.complete("a", prompt, seed=1234, **params).generated
    other_ctx = open_context(model, n_seq_max=1, n_ctx=512)
    try:
        other = fresh(other_ctx)
        try:
            second = other.complete("b", prompt, seed=1234, **params).generated
            others = [
                other.complete(f"s{seed}", prompt, seed=seed, **params).generated
                for seed in (1, 2, 3)
            ]
        finally:
            other.close()
    finally:
        other_ctx.close()
    assert second == first
    # The seed matters: some other seed draws another reply.
    assert any(o != first for o in others)


def test_logprobs_are_log_probabilities_led_by_the_greedy_token(
    model: Model, worker: Worker
) -> None:
    prompt = chat(model, "Say hello.")
    got = worker.complete("lp", prompt, logprobs=5, max_tokens=8)
    assert got.logprobs is not None and len(got.logprobs) == len(got.generated)
    for token, lp in zip(got.generated, got.logprobs, strict=True):
        assert lp.token == token
        assert lp.logprob <= 0.0
        assert len(lp.top) == 5
        assert lp.top[0].token == token  # greedy: the most likely token
        assert lp.top[0].logprob == lp.logprob
        values = [t.logprob for t in lp.top]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0.0 for v in values)
        assert math.fsum(math.exp(v) for v in values) <= 1.0 + 1e-6
    # logprobs=0: the token's own log-probability, no alternatives.
    bare = worker.complete("lp0", prompt, logprobs=0, max_tokens=2)
    assert bare.logprobs is not None and all(lp.top == () for lp in bare.logprobs)


def test_token_ids_outside_the_vocabulary_are_refused(model: Model, worker: Worker) -> None:
    prompt = chat(model, "Hi.")
    for bad in (model.n_vocab, model.n_vocab + 1000, -1):
        with pytest.raises(InvalidToken):
            worker.submit(f"bad{bad}", [*prompt[:3], bad, *prompt[3:]])
    assert not worker.core.requests
    assert worker.complete("ok", prompt, max_tokens=2).finish_reason is not None


def test_bad_grammar_and_schema_are_refused_at_submit_while_others_run(
    model: Model, ctx: Context
) -> None:
    prompt = chat(model, "Name a fruit.")
    solo = fresh(ctx)
    try:
        want = solo.complete("solo", prompt, max_tokens=10).generated
    finally:
        solo.close()

    w = fresh(ctx)
    try:
        w.submit("running", prompt, max_tokens=10)
        for _ in range(3):
            w.step()
        with pytest.raises(GrammarError) as grammar:
            w.submit("bad-grammar", prompt, grammar="root ::= [unclosed")
        assert grammar.value.code == "invalid_grammar"
        with pytest.raises(SchemaError) as schema:
            w.submit("bad-schema", prompt, json_schema={"type": "string", "pattern": "a+"})
        assert schema.value.code == "bad_schema"
        assert set(w.core.requests) == {"running"}
        w.run()
        assert w.result("running").generated == want
        assert w.backend.samplers_open == 0
    finally:
        w.close()


def test_greedy_defaults_match_the_binding_generate_loop(model: Model, ctx: Context) -> None:
    """The core's greedy reply is the binding's own greedy continuation."""
    from llamad.llama_ffi import Sampler, SamplerParams  # noqa: PLC0415

    prompt = chat(model, "What is two plus two?")
    w = fresh(ctx)
    try:
        got = w.complete("g", prompt, **{**GREEDY, "max_tokens": 8})
    finally:
        w.close()
    ctx.clear()
    # The binding's loop, with the last prompt token decoded alone as the core does.
    ctx.prefill(prompt[:-1])
    ctx.prefill(prompt[-1:])
    with Sampler(model, SamplerParams(greedy=True)) as sampler:
        direct = ctx.generate(sampler, len(got.generated))
    ctx.clear()
    assert direct == got.generated
