"""llama.cpp's built-in chat templates (the Jinja renderer's fallback)."""

from __future__ import annotations

import pytest

from llamad.errors import BadRequest
from llamad.llama_ffi import ChatTemplateError, builtin_chat_template, builtin_template_names

pytestmark = pytest.mark.timeout(30)

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi 🦙"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
]


def test_names_include_chatml() -> None:
    names = builtin_template_names()
    assert "chatml" in names
    assert len(names) == len(set(names)) > 10


def test_chatml_renders_every_turn_and_the_generation_prompt() -> None:
    text = builtin_chat_template(MESSAGES, "chatml")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi 🦙<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_without_generation_prompt_the_text_ends_after_the_last_turn() -> None:
    text = builtin_chat_template(MESSAGES, "chatml", add_generation_prompt=False)
    assert text.endswith("<|im_start|>user\nBye<|im_end|>\n")


def test_a_jinja_source_is_recognised_by_its_markers() -> None:
    source = "{% for m in messages %}<|im_start|>{{ m.role }}...{% endfor %}"
    assert builtin_chat_template(MESSAGES[:1], source) == builtin_chat_template(
        MESSAGES[:1], "chatml"
    )


def test_long_messages_grow_the_buffer() -> None:
    long = [{"role": "user", "content": "x" * 100_000}]
    assert builtin_chat_template(long, "chatml").count("x") == 100_000


def test_unknown_template_raises_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError):
        builtin_chat_template(MESSAGES, "no-such-template-anywhere")


def test_message_without_string_content_is_bad_request() -> None:
    with pytest.raises(BadRequest):
        builtin_chat_template([{"role": "user"}], "chatml")
