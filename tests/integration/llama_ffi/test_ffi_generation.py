"""Decoding and sampling: determinism, batched isolation, per-row logits (SPEC L5, L6)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from llamad.llama_ffi import (
    Batch,
    Context,
    FlashAttn,
    KVType,
    Model,
    NoLogits,
    Sampler,
    SamplerParams,
)

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

MakeCtx = Callable[..., Context]
Greedy = Callable[[Context, Sequence[int], int], list[int]]


def test_greedy_generation_is_deterministic(
    make_ctx: MakeCtx, greedy: Greedy, prompt_tokens: list[int]
) -> None:
    first = greedy(make_ctx(), prompt_tokens, 32)
    second = greedy(make_ctx(), prompt_tokens, 32)
    assert len(first) == 32
    assert first == second


def test_seeded_sampling_is_reproducible(
    model: Model, make_ctx: MakeCtx, prompt_tokens: list[int]
) -> None:
    params = SamplerParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, seed=1234)

    def run() -> list[int]:
        ctx = make_ctx()
        ctx.prefill(prompt_tokens)
        with Sampler(model, params) as s:
            return ctx.generate(s, 24, stop_at_eog=False)

    assert run() == run()


def test_every_l6_sampler_is_in_the_chain(model: Model) -> None:
    params = SamplerParams(
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        min_p=0.1,
        typical_p=0.95,
        repeat_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=0.3,
        logit_bias={5: -1.0},
        seed=7,
        grammar='root ::= "yes" | "no"',
    )
    with Sampler(model, params) as s:
        assert s.names == [
            "logit-bias",
            "penalties",
            "grammar",
            "top-k",
            "typical",
            "top-p",
            "min-p",
            "temp",
            "dist",
        ]
        assert s.seed == 7
    with Sampler(model, SamplerParams(greedy=True)) as s:
        assert s.names == ["greedy"]


def test_logit_bias_bans_a_token(model: Model, make_ctx: MakeCtx, prompt_tokens: list[int]) -> None:
    ctx = make_ctx()
    ctx.prefill(prompt_tokens)
    with Sampler(model, SamplerParams(greedy=True)) as s:
        favourite = ctx.sample(s)
    with Sampler(model, SamplerParams(greedy=True, logit_bias={favourite: float("-inf")})) as s:
        assert ctx.sample(s) != favourite


def _run_four_sequences(ctx: Context, model: Model, prompts: list[list[int]]) -> list[list[int]]:
    """Prefill four sequences in one batch, then decode all four together."""
    batch = Batch(ctx.n_batch)
    rows = {}
    for seq, toks in enumerate(prompts):
        first = batch.add_tokens(toks, seq, 0)
        rows[seq] = first + len(toks) - 1
    ctx.decode(batch)
    samplers = [Sampler(model, SamplerParams(greedy=True)) for _ in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    pos = [len(p) for p in prompts]
    for _step in range(16):
        picked = [ctx.sample(samplers[seq], rows[seq]) for seq in range(len(prompts))]
        batch.clear()
        for seq, token in enumerate(picked):
            out[seq].append(token)
            rows[seq] = batch.add(token, pos[seq], seq, logits=True)
            pos[seq] += 1
        ctx.decode(batch)
    for s in samplers:
        s.close()
    return out


@pytest.mark.parametrize("kv_unified", [False, True], ids=["stream-per-sequence", "unified"])
def test_batched_sequences_are_isolated(model: Model, make_ctx: MakeCtx, kv_unified: bool) -> None:
    """Also with ``kv_unified`` (the model worker's mode), where the four
    sequences' cells are interleaved in one shared KV stream."""
    base = model.tokenize("The history of the printing press begins")
    others_a = [
        model.tokenize(t)
        for t in (
            "My favourite fruit is the ripe",
            "In 1969 the first people walked on",
            "A good recipe for bread needs flour",
        )
    ]
    # Same token counts, different tokens: only sequence 0's prompt is shared.
    others_b = [[(t * 7 + 11) % 20000 + 1000 for t in toks] for toks in others_a]
    layout = {"n_seq_max": 4, "n_ctx": 2048, "kv_unified": kv_unified}
    run_a = _run_four_sequences(make_ctx(**layout), model, [base, *others_a])
    run_b = _run_four_sequences(make_ctx(**layout), model, [base, *others_b])
    assert run_a[0] == run_b[0]
    assert run_a[1:] != run_b[1:]


def test_unified_cells_freed_and_refilled_by_other_sequences_do_not_leak(
    model: Model, make_ctx: MakeCtx
) -> None:
    """In one shared KV stream, the cells other sequences free (interleaved with
    sequence 0's) are reused for new text; sequence 0 continues the same."""
    base = model.tokenize("The history of the printing press begins")
    others = [
        model.tokenize(t)
        for t in ("My favourite fruit is the ripe", "In 1969 the first people walked on")
    ]
    others.append(model.tokenize("A good recipe for bread needs flour"))

    def continue_base_after_refill(salt: int) -> list[int]:
        ctx = make_ctx(n_seq_max=4, n_ctx=256, kv_unified=True)
        assert ctx.n_ctx == 256
        first = _run_four_sequences(ctx, model, [base, *others])
        last_pos = ctx.seq_pos_max(0)
        for seq in (1, 2, 3):
            assert ctx.seq_remove(seq)
        # 3 x 60 tokens cannot fit in the cells past the ~100 used ones: the
        # refill has to take the freed cells lying between sequence 0's.
        batch = Batch(ctx.n_batch)
        for seq in (1, 2, 3):
            batch.add_tokens([(t * 7 + seq * 131 + salt) % 20000 + 1000 for t in range(60)], seq, 0)
        ctx.decode(batch)
        # Re-decode sequence 0's last token for fresh logits, then continue it.
        ctx.seq_remove(0, last_pos)
        ctx.prefill([first[0][-1]], seq_id=0, start_pos=last_pos)
        with Sampler(model, SamplerParams(greedy=True)) as sampler:
            return ctx.generate(sampler, 16, seq_id=0, stop_at_eog=False)

    assert continue_base_after_refill(salt=0) == continue_base_after_refill(salt=5003)


def test_only_rows_that_asked_for_logits_can_be_sampled(model: Model, make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    batch = Batch(16)
    batch.add_tokens(model.tokenize("one two three four"), 0, 0)
    ctx.decode(batch)
    last = batch.output_rows[-1]
    assert ctx.output_rows == (last,)
    assert len(ctx.logits(last)) == model.n_vocab
    with Sampler(model, SamplerParams(greedy=True)) as s:
        with pytest.raises(NoLogits):
            ctx.sample(s, 0)
        assert ctx.sample(s, -1) == ctx.sample(s, last)


def test_contexts_decode_in_parallel_threads(
    make_ctx: MakeCtx, greedy: Greedy, prompt_tokens: list[int]
) -> None:
    expected = greedy(make_ctx(), prompt_tokens, 16)
    contexts = [make_ctx(n_threads=1, n_threads_batch=1) for _ in range(2)]
    results: list[list[int] | BaseException] = [[], []]

    def worker(i: int) -> None:
        try:
            results[i] = greedy(contexts[i], prompt_tokens, 16)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == [expected, expected]


@pytest.mark.parametrize(
    "opts",
    [
        {"flash_attn": FlashAttn.OFF},
        {"flash_attn": FlashAttn.ON},
        {"flash_attn": FlashAttn.ON, "type_k": KVType.Q8_0, "type_v": KVType.Q8_0},
        {"type_k": KVType.F32, "type_v": KVType.F32},
    ],
    ids=["fa-off", "fa-on", "fa-on-q8", "f32-kv"],
)
def test_attention_and_kv_type_options_generate(
    make_ctx: MakeCtx, greedy: Greedy, prompt_tokens: list[int], opts: dict[str, object]
) -> None:
    ctx = make_ctx(**opts)
    out = greedy(ctx, prompt_tokens, 8)
    assert len(out) == 8
    assert ctx.seq_pos_max(0) == len(prompt_tokens) + 7 - 1
