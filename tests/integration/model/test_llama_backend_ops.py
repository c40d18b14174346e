"""The worker's M11 helpers on the real model: tokenize, detokenize, chat template,
embeddings on their own context, and LoRA adapters that split the cache namespace."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

import tolerances
from llama_backend_harness import fresh, open_context
from llamad.cache.key import Namespace
from llamad.llama_ffi import AdapterError, Context, InvalidToken, Model
from llamad.model.adapters import AdapterSet
from llamad.model.embedder import Embedder, EmbedderOptions
from llamad.model.identity import namespace
from llamad.model.results import CacheHitKind
from llamad.model.stub_cache import MemoryCache
from llamad.model.tokenizer import Tokenizer
from lora_gguf import write_lora

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def ctx(model: Model) -> Iterator[Context]:
    c = open_context(model)
    yield c
    c.close()


def _norm(vec: list[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in vec))


# -- tokenize / detokenize / chat template --------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "  leading spaces, tabs\tand\nnew lines  ",
        "Unicode: café, 数字, 🦙, Ω≈ç√",
        "special text <|im_start|>user stays text",
    ],
)
def test_tokenize_then_detokenize_gives_the_text_back(model: Model, text: str) -> None:
    tok = Tokenizer(model)
    tokens = tok.tokenize(text, add_special=False)
    assert tokens
    assert tok.detokenize(tokens) == text


def test_special_tokens_are_parsed_only_when_asked_and_render_back(model: Model) -> None:
    tok = Tokenizer(model)
    text = "<|im_start|>user\nhi<|im_end|>"
    parsed = tok.tokenize(text, add_special=False, parse_special=True)
    plain = tok.tokenize(text, add_special=False)
    assert model.bos in parsed and model.bos not in plain
    assert tok.detokenize(parsed) == text
    assert "<|im_start|>" not in tok.detokenize(parsed, unparse_special=False)


def test_detokenize_refuses_ids_outside_the_vocabulary(model: Model) -> None:
    with pytest.raises(InvalidToken):
        Tokenizer(model).detokenize([1, model.n_vocab])


def test_chat_template_renders_the_models_turns(model: Model) -> None:
    tok = Tokenizer(model)
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "What colour is the sky?"},
    ]
    text = tok.render_chat(messages)
    assert text.startswith("<|im_start|>system\nYou answer briefly.<|im_end|>")
    assert "<|im_start|>user\nWhat colour is the sky?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert not tok.render_chat(messages, add_generation_prompt=False).endswith("assistant\n")
    tokens = tok.apply_chat_template(messages)
    assert tokens == model.tokenize(text, add_special=False, parse_special=True)
    assert tokens[0] == model.bos  # <|im_start|> as one special token
    # enable_thinking reaches the template (this one ignores it).
    assert tok.render_chat(messages, enable_thinking=False) == text


# -- embeddings -------------------------------------------------------------------------------


def test_embeddings_batched_equal_one_at_a_time_and_are_unit_length(
    model: Model, ctx: Context
) -> None:
    texts = ["alpha beta", "a much longer sentence about the weather today", "🦙", "x y z"]
    inputs: list[str | list[int]] = [*texts, "gamma", model.tokenize("alpha beta")]
    embedder = Embedder(model, EmbedderOptions(n_ctx=256, n_seq_max=4), mirror=ctx)
    try:
        together = embedder.embed(inputs)
        alone = [embedder.embed([x])[0] for x in inputs]
        raw = embedder.embed(inputs[:1], normalize=False)[0]
        assert embedder.context is not None and embedder.context is not ctx
    finally:
        embedder.close()
    assert len(together) == len(inputs) == 6  # two groups of n_seq_max
    tolerance = tolerances.embedding_tolerance()
    for a, b in zip(together, alone, strict=True):
        assert len(a) == model.n_embd
        assert abs(_norm(a) - 1.0) <= 1e-5
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < tolerance
    assert together[0] == together[5]  # a text and its tokens embed alike
    assert together[0] != together[1]
    assert abs(_norm(raw) - 1.0) > 1e-3
    assert max(abs(x - y / _norm(raw)) for x, y in zip(together[0], raw, strict=True)) < 1e-5


def test_embedding_leaves_the_generation_context_alone(model: Model, ctx: Context) -> None:
    ctx.clear()
    prompt = model.tokenize("Generation keeps its sequence", add_special=False)
    ctx.prefill(prompt, 0)
    embedder = Embedder(model, EmbedderOptions(n_ctx=256, n_seq_max=4), mirror=ctx)
    try:
        embedder.embed(["one", "two", "three", "four", "five"])
    finally:
        embedder.close()
    assert ctx.seq_pos_max(0) == len(prompt) - 1
    assert all(ctx.seq_pos_max(s) == -1 for s in range(1, ctx.n_seq_max))
    ctx.clear()


def test_embedder_refuses_inputs_longer_than_its_context(model: Model) -> None:
    embedder = Embedder(model, EmbedderOptions(n_ctx=64, n_seq_max=4))
    try:
        with pytest.raises(Exception, match="inputs\\[1\\]") as err:
            embedder.embed(["short", "word " * 100])
        assert getattr(err.value, "code", None) == "bad_request"
        assert embedder.context is None  # refused before a context was made
    finally:
        embedder.close()


# -- LoRA adapters ------------------------------------------------------------------------------


class LiveNamespaceCache(MemoryCache):
    """MemoryCache keyed under the context's live namespace, as the real view is."""

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.ctx = ctx

    def namespace(self, salt: bytes | None) -> Namespace:
        self.rebase(namespace(self.ctx))
        return super().namespace(salt)


def test_adapters_split_the_namespace_and_scale_zero_joins_it_again(
    model: Model, ctx: Context, tmp_path: Path
) -> None:
    adapters = AdapterSet(ctx)
    plain = namespace(ctx)
    try:
        first = adapters.load("style", write_lora(tmp_path / "a.gguf", seed=1))
        assert first.scale == 1.0 and len(first.sha256) == 64
        with_a = namespace(ctx)
        adapters.set_scale("style", 0.5)
        half = namespace(ctx)
        adapters.load("tone", write_lora(tmp_path / "b.gguf", seed=2), scale=0.0)
        assert namespace(ctx) == half  # scale 0 is out of the graph
        assert len({plain, with_a, half}) == 3
        assert [(i.name, i.scale) for i in adapters.list_adapters()] == [
            ("style", 0.5),
            ("tone", 0.0),
        ]
        with pytest.raises(AdapterError):
            adapters.load("style", tmp_path / "a.gguf")
        with pytest.raises(AdapterError):
            adapters.set_scale("missing", 1.0)
        adapters.unload("style")
        assert namespace(ctx) == plain
        assert [i.name for i in adapters.list_adapters()] == ["tone"]
    finally:
        adapters.close()
    assert ctx.adapters == ()
    assert namespace(ctx) == plain


def test_an_adapter_change_sends_the_next_request_to_another_namespace(
    model: Model, ctx: Context, tmp_path: Path
) -> None:
    prompt = Tokenizer(model).apply_chat_template([{"role": "user", "content": "Say a word."}])
    adapters = AdapterSet(ctx)
    w = fresh(ctx, cache=LiveNamespaceCache(ctx))
    try:
        base = w.complete("base", prompt)
        adapters.load("strong", write_lora(tmp_path / "s.gguf", seed=7, rank=8), scale=4.0)
        adapted = w.complete("adapted", prompt)
        # The row saved without the adapter is not restored under it.
        assert adapted.cache_hit_kind is CacheHitKind.COLD
        assert adapted.finish_key != base.finish_key
        adapters.set_scale("strong", 0.0)
        back = w.complete("back", prompt)
        assert back.cache_hit_kind is CacheHitKind.EXACT
        assert back.generated == base.generated
    finally:
        w.close()
        adapters.close()


def test_embeddings_follow_the_generation_contexts_adapters(
    model: Model, ctx: Context, tmp_path: Path
) -> None:
    adapters = AdapterSet(ctx)
    embedder = Embedder(model, EmbedderOptions(n_ctx=256, n_seq_max=4), mirror=ctx)
    try:
        plain = embedder.embed(["the same words"])[0]
        adapters.load("strong", write_lora(tmp_path / "s.gguf", seed=7, rank=8), scale=4.0)
        adapted = embedder.embed(["the same words"])[0]
        assert embedder.context is not None
        assert [s for _, s in embedder.context.adapters] == [4.0]
        assert max(abs(x - y) for x, y in zip(plain, adapted, strict=True)) > 1e-3
        adapters.unload("strong")
        assert embedder.embed(["the same words"])[0] == plain
        assert embedder.context.adapters == ()
    finally:
        embedder.close()
        adapters.close()
