"""Sandboxed Jinja chat templates: HF-compatible rendering, validation, escapes refused."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from llamad import paths
from llamad.errors import BadRequest, TemplateError, TemplateSecurityError, from_wire
from llamad.llama_ffi.chat_template import (
    ChatFormatter,
    ChatTemplate,
    apply_chat_template,
    validate_messages,
)

pytestmark = pytest.mark.timeout(30)

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
]


@functools.cache
def _read_smollm2_template() -> str | None:
    import gguf  # noqa: PLC0415 - test-only dependency, imported where used

    try:
        path = paths.default_model_path()
    except paths.AssetMissing:
        return None
    # The gguf package parses every field (49k tokenizer strings): seconds, once.
    source = gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()
    assert isinstance(source, str)
    return source


def smollm2_source() -> str:
    source = _read_smollm2_template()
    if source is None:
        pytest.skip("default model not extracted (make setup)")
    return source


def render(source: str, messages: Any = None, **kwargs: Any) -> str:
    return ChatTemplate(source).render(CHAT if messages is None else messages, **kwargs)


# ----------------------------------------------------------- SmolLM2's template


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_smollm2_template_renders_turns_and_generation_prompt() -> None:
    assert render(smollm2_source()) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_smollm2_template_supplies_its_system_prompt_when_none_is_given() -> None:
    text = render(smollm2_source(), [{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_generation_prompt_the_text_ends_after_the_last_turn() -> None:
    text = render(smollm2_source(), add_generation_prompt=False)
    assert text.endswith("<|im_start|>user\nBye<|im_end|>\n")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_continue_final_message_stops_inside_the_last_turn() -> None:
    chat = [*CHAT[:2], {"role": "assistant", "content": "The answer is"}]
    text = render(smollm2_source(), chat, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nThe answer is")
    with pytest.raises(BadRequest):
        render(smollm2_source(), chat, continue_final_message=True)


def test_continue_final_message_needs_the_template_to_echo_the_text() -> None:
    with pytest.raises(TemplateError):
        render(
            "{% for m in messages %}[{{ m.role }}]{% endfor %}",
            add_generation_prompt=False,
            continue_final_message=True,
        )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_system_argument_becomes_the_first_message() -> None:
    chat = [{"role": "user", "content": "Hi"}]
    text = render(smollm2_source(), chat, system="Be terse.")
    assert text.startswith("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi")
    with pytest.raises(BadRequest) as info:
        render(smollm2_source(), CHAT, system="Twice")
    assert info.value.details == {"field": "system"}


# ------------------------------------------------------- HF environment


def test_blocks_are_trimmed_like_hf() -> None:
    source = (
        "{% for m in messages %}\n"
        "    {% if m.role == 'user' %}\n"
        "{{ m.content }}\n"
        "    {% endif %}\n"
        "{% endfor %}"
    )
    assert render(source) == "Hi\nBye\n"


def test_loop_controls_are_available() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{{ m.content }};{% if loop.index == 3 %}{% break %}{% endif %}{% endfor %}"
    )
    assert render(source) == "Hi;Hello.;"


def test_tojson_does_not_html_escape_and_takes_hf_arguments() -> None:
    tools = [{"name": "f<&>'", "description": "é", "b": 1, "a": [1, 2]}]
    assert render("{{ tools | tojson }}", tools=tools) == (
        '[{"name": "f<&>\'", "description": "é", "b": 1, "a": [1, 2]}]'
    )
    assert render("{{ tools[0] | tojson(sort_keys=true, ensure_ascii=true) }}", tools=tools) == (
        '{"a": [1, 2], "b": 1, "description": "\\u00e9", "name": "f<&>\'"}'
    )
    assert render("{{ tools[0].a | tojson(indent=2) }}", tools=tools) == "[\n  1,\n  2\n]"
    assert render("{{ tools[0].a | tojson(separators=(',', ':')) }}", tools=tools) == "[1,2]"


def test_raise_exception_becomes_a_template_error() -> None:
    source = (
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('Roles must start with user') }}{% endif %}"
    )
    with pytest.raises(TemplateError) as info:
        render(source)
    assert type(info.value) is TemplateError
    assert info.value.message == "Roles must start with user"
    assert info.value.details == {"raised_by": "template"}


def test_strftime_now_formats_the_current_date() -> None:
    before = datetime.date.today().year
    year = int(render("{{ strftime_now('%Y') }}"))
    assert before <= year <= datetime.date.today().year


def test_generation_block_renders_its_body() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}"
        "{% generation %}<{{ m.content }}>{% endgeneration %}{% endif %}{% endfor %}"
    )
    assert render(source) == "<Hello.>"


def test_enable_thinking_is_defined_only_when_given() -> None:
    source = (
        "{% if enable_thinking is defined %}{{ enable_thinking }}{% else %}undefined{% endif %}"
    )
    assert render(source) == "undefined"
    assert render(source, enable_thinking=False) == "False"
    assert render(source, enable_thinking=True) == "True"
    with pytest.raises(BadRequest):
        render(source, enable_thinking="yes")  # type: ignore[arg-type]


def test_special_tokens_and_extra_variables_reach_the_template() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{{ date_string }}|{{ tools is none }}{{ eos_token }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert (
        template.render(CHAT, variables={"date_string": "1 Jan 2026"}) == "<s>1 Jan 2026|True</s>"
    )
    for bad in ({"messages": []}, {"bos_token": "x"}, {"_private": 1}, {"not an identifier": 1}):
        with pytest.raises(BadRequest):
            template.render(CHAT, variables=bad)
    with pytest.raises(BadRequest):
        template.render(CHAT, variables={"x": object()})


def test_tool_aware_template_sees_tools_tool_calls_and_content_parts() -> None:
    source = (
        "{% set ns = namespace(n=0) %}"
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}"
        "{% if not loop.last %},{% endif %}"
        "{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% if m.content is string %}{{ m.role }}:{{ m.content }}"
        "{% elif m.content is none %}{{ m.role }}:"
        "{% for c in m.tool_calls %}call {{ c.function.name }}"
        "({{ c.function.arguments | tojson }}){% endfor %}"
        "{% else %}{{ m.role }}:{% for p in m.content %}"
        "{{ p.text if p.type == 'text' else '[' ~ p.type ~ ']' }}{% endfor %}"
        "{% endif %}{{ '\\n' }}{% endfor %}{{ ns.n }}"
    )
    chat = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "look "}, {"type": "image", "url": "u"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "see", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "content": "seen", "tool_call_id": "1"},
    ]
    tools = [
        {"type": "function", "function": {"name": "see"}},
        {"type": "function", "function": {"name": "say"}},
    ]
    assert render(source, chat, tools=tools) == (
        '<tools>see,say</tools>user:look [image]\nassistant:call see({"x": 1})\ntool:seen\n3'
    )


def test_compiled_templates_are_shared_by_source() -> None:
    source = "{{ messages | length }}"
    assert ChatTemplate(source)._template is ChatTemplate(source, bos_token="<s>")._template


def test_template_that_does_not_compile_raises_template_error() -> None:
    with pytest.raises(TemplateError) as info:
        ChatTemplate("{% for m in messages %}{{ m.content }")
    assert info.value.code == "template_error"
    with pytest.raises(TemplateError):
        ChatTemplate("   ")


def test_template_runtime_failures_are_template_errors() -> None:
    for source in (
        "{{ messages[0].content + 1 }}",
        "{{ missing.attr }}",
        "{% for i in range(10**9) %}{% endfor %}",
    ):
        with pytest.raises(TemplateError):
            render(source)


# ------------------------------------------------------------- the sandbox


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__ }}",
        "{{ messages.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__ }}",
        "{{ raise_exception.__globals__ }}",
        "{{ strftime_now.__globals__['datetime'] }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ lipsum.__globals__ }}",
        "{{ namespace.mro() }}",
        "{{ dict.mro() }}",
        "{{ dict.__subclasses__() }}",
        "{{ messages['__class__'] }}",
        "{{ messages | attr('__class__') }}",
        "{{ '{0.__class__}'.format(messages) }}",
        "{% set x = messages.append(1) %}",
        "{{ messages[0].update({'role': 'x'}) }}",
        "{{ messages[0].content.__len__() }}",
    ],
)
def test_template_reaching_for_internals_raises_security_error(source: str) -> None:
    with pytest.raises(TemplateSecurityError) as info:
        render(source)
    assert info.value.code == "template_security"


def test_security_error_survives_the_wire() -> None:
    with pytest.raises(TemplateSecurityError) as info:
        render("{{ messages.__class__ }}")
    rebuilt = from_wire(info.value.to_wire())
    assert type(rebuilt) is TemplateSecurityError
    assert isinstance(rebuilt, TemplateError)
    assert rebuilt.details["attribute"] == "__class__"


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 10**9 }}",
        "{{ [0] * 10**9 }}",
        "{{ 10 ** (10 ** 6) }}",
        "{{ [1] | tojson(indent=10**6) }}",
        "{% for i in range(100000) %}{{ 'xxxxxxxxxx' * 100 }}{% endfor %}",
    ],
)
def test_oversized_output_is_refused(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source, max_output_chars=1_000_000).render(CHAT)


# ------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ("hello", "messages"),
        ({"role": "user", "content": "x"}, "messages"),
        ([], "messages"),
        (["x"], "messages[0]"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "", "content": "x"}], "messages[0].role"),
        ([{"role": 5, "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "assistant", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": [{"text": "x"}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0]"),
        ([{"role": "assistant", "content": None, "tool_calls": "f()"}], "messages[0].tool_calls"),
        ([{"role": "user", "content": "x", "meta": object()}], "messages[0].meta"),
        ([{"role": "user", "content": "x", "score": float("nan")}], "messages[0].score"),
        ([{"role": "user", "content": "x", "meta": {1: "a"}}], "messages[0].meta"),
    ],
)
def test_invalid_messages_raise_bad_request_naming_the_field(messages: Any, field: str) -> None:
    with pytest.raises(BadRequest) as info:
        validate_messages(messages)
    assert info.value.code == "bad_request"
    assert info.value.details["field"] == field


def test_validated_messages_are_plain_copies() -> None:
    original = [{"role": "user", "content": "x", "extra": ({"k": (1, 2)},)}]
    checked = validate_messages(original)
    assert checked == [{"role": "user", "content": "x", "extra": [{"k": [1, 2]}]}]
    assert checked[0] is not original[0]


def test_deeply_nested_message_data_is_refused() -> None:
    deep: Any = "x"
    for _ in range(100):
        deep = [deep]
    with pytest.raises(BadRequest):
        validate_messages([{"role": "user", "content": "x", "deep": deep}])


def test_invalid_tools_raise_bad_request() -> None:
    for tools in ("f", [1], {"name": "f"}):
        with pytest.raises(BadRequest):
            render("{{ tools }}", tools=tools)


# ------------------------------------------------------------- fallback


class FakeBuiltin:
    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], str | None, bool]] = []

    def __call__(
        self,
        messages: Sequence[Mapping[str, str]],
        template: str | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        self.calls.append(([dict(m) for m in messages], template, add_generation_prompt))
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + (
            "<gen>" if add_generation_prompt else ""
        )


def test_formatter_uses_the_jinja_template_when_it_compiles() -> None:
    builtin = FakeBuiltin()
    formatter = ChatFormatter("{{ messages | length }}", builtin=builtin)
    assert not formatter.uses_fallback
    assert formatter.render(CHAT) == "4"
    assert builtin.calls == []


def test_formatter_without_template_falls_back_to_the_named_builtin() -> None:
    builtin = FakeBuiltin()
    formatter = ChatFormatter(None, builtin=builtin, fallback="llama3")
    assert formatter.uses_fallback
    assert formatter.fallback_reason == "no chat template"
    assert formatter.render(CHAT[1:2], add_generation_prompt=False) == "<user>Hi"
    assert builtin.calls == [([{"role": "user", "content": "Hi"}], "llama3", False)]


def test_formatter_with_broken_template_hands_its_source_to_the_builtin() -> None:
    builtin = FakeBuiltin()
    source = "<|im_start|>{% for m in messages %}{{ m.content }"
    formatter = ChatFormatter(source, builtin=builtin)
    assert formatter.uses_fallback
    assert formatter.fallback_reason is not None and "does not compile" in formatter.fallback_reason
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert formatter.render([{"role": "user", "content": parts}]) == "<user>a\nb<gen>"
    assert builtin.calls[0][1] == source


def test_fallback_renders_tools_and_calls_as_text() -> None:
    # The built-ins know text only: tools and calls reach them as Hermes-format text.
    builtin = FakeBuiltin()
    formatter = ChatFormatter(None, builtin=builtin)
    formatter.render(CHAT[1:2], tools=[{"name": "f"}])
    system = builtin.calls[-1][0][0]
    assert system["role"] == "system" and '"name": "f"' in system["content"]
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]
    assert formatter.render(calls, add_generation_prompt=False) == (
        '<assistant><tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    )


def test_fallback_refuses_what_it_cannot_render() -> None:
    formatter = ChatFormatter(None, builtin=FakeBuiltin())
    with pytest.raises(BadRequest):
        formatter.render([{"role": "user", "content": [{"type": "image", "url": "u"}]}])
    with pytest.raises(BadRequest):
        formatter.render([{"role": "user"}])


def test_fallback_continues_the_final_message() -> None:
    formatter = ChatFormatter(None, builtin=FakeBuiltin())
    chat = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A is"}]
    assert (
        formatter.render(chat, add_generation_prompt=False, continue_final_message=True)
        == "<user>Q<assistant>A is"
    )


def test_fallback_renders_with_llama_cpp_builtins() -> None:
    formatter = ChatFormatter(None)
    assert formatter.render(CHAT[1:2]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


class FakeModel:
    def __init__(self, template: str | None, *, add_bos: bool) -> None:
        self.template = template
        self.bos: int | None = 1
        self.eos: int | None = 2
        self.add_bos = add_bos
        self.tokenized: list[tuple[str, bool, bool]] = []

    def chat_template(self, name: str | None = None) -> str | None:
        return self.template if name is None else None

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        assert special
        return {1: b"<s>", 2: b"</s>"}[token]

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        self.tokenized.append((text, add_special, parse_special))
        return [len(text)]


def test_formatter_for_model_uses_its_template_and_special_tokens() -> None:
    model = FakeModel("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", add_bos=True)
    assert ChatFormatter.for_model(model).render(CHAT[1:2]) == "<s>Hi</s>"
    assert ChatFormatter.for_model(model, name="tool_use", builtin=FakeBuiltin()).uses_fallback


@pytest.mark.parametrize(
    ("template", "add_bos", "expect_add_special"),
    [
        ("{{ bos_token }}{{ messages[0].content }}", True, False),
        ("{{ messages[0].content }}", True, True),
        ("{{ bos_token }}{{ messages[0].content }}", False, False),
    ],
)
def test_apply_chat_template_adds_bos_only_when_the_template_did_not(
    template: str, add_bos: bool, expect_add_special: bool
) -> None:
    model = FakeModel(template, add_bos=add_bos)
    apply_chat_template(model, CHAT[1:2], add_generation_prompt=False)
    assert model.tokenized == [(model.tokenized[0][0], expect_add_special, True)]
