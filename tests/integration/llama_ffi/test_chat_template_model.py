"""The real model's chat template: rendered, tokenized, and answered."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llamad.llama_ffi import Context, Model, Sampler, SamplerParams
from llamad.llama_ffi.chat_template import ChatFormatter, apply_chat_template

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

MakeCtx = Callable[..., Context]

CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_model_template_is_rendered_by_jinja(model: Model) -> None:
    formatter = ChatFormatter.for_model(model)
    assert not formatter.uses_fallback
    assert formatter.render(CHAT) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_rendered_prompt_tokenizes_special_markers_once(model: Model) -> None:
    tokens = apply_chat_template(model, CHAT)
    start = model.tokenize("<|im_start|>", add_special=False, parse_special=True)
    end = model.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(start) == 1 and len(end) == 1
    assert tokens[0] == start[0] and tokens[1] != start[0]  # no doubled BOS
    assert tokens.count(start[0]) == 3
    assert tokens.count(end[0]) == 2
    assert model.detokenize(tokens, unparse_special=True) == ChatFormatter.for_model(model).render(
        CHAT
    )


@pytest.mark.slow
def test_rendered_chat_prompt_generates_a_reply(model: Model, make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    ctx.prefill(apply_chat_template(model, CHAT))
    with Sampler(model, SamplerParams(greedy=True)) as sampler:
        tokens = ctx.generate(sampler, 32)
    reply = model.detokenize([t for t in tokens if t not in model.eog_tokens])
    assert reply.strip()
    assert "<|im_start|>" not in reply
    assert "Paris" in reply


def test_builtin_chatml_fallback_renders_like_the_model_template(model: Model) -> None:
    fallback = ChatFormatter(None, fallback="chatml")
    assert fallback.uses_fallback
    assert fallback.render(CHAT) == ChatFormatter.for_model(model).render(CHAT)
