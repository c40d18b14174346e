"""Ollama's API onto llamad, without a server: request bodies to the llamad call,
hand-made completions and model infos to Ollama's JSON lines."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from llamad.errors import BadRequest, ContextOverflow, LlamadError, ModelNotFound
from llamad.front.wire import ModelInfo, ModelState
from llamad.gateway import ollama
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    FinishReason,
    Stats,
)


def completion(
    reply: str = "Hi",
    *,
    prompt: int = 20,
    generated: int = 2,
    read: int = 0,
    finish: FinishReason = FinishReason.STOP,
    thinking: str = "",
    tool_calls: list[str] | None = None,
) -> Completion:
    return Completion(
        reply=reply,
        generated=list(range(100, 100 + generated)),
        context_tokens=list(range(prompt + generated)),
        committed_tokens=prompt + generated - 1,
        cache_hit_kind=CacheHitKind.PARTIAL if read else CacheHitKind.COLD,
        finish_reason=finish,
        stats=Stats(
            prompt_tokens=prompt,
            completion_tokens=generated,
            prefill_tokens=prompt - read,
            restore_ms=1.5,
            prefill_ms=10.0,
            generation_ms=20.25,
        ),
        cache_delta=CacheDelta(read=read),
        thinking=thinking,
        tool_calls=tool_calls or [],
    )


def chat(**fields: Any) -> ollama.ChatRequest:
    base: dict[str, Any] = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
    base.update(fields)
    return ollama.parse(json.dumps(base).encode(), ollama.ChatRequest)


def generate(**fields: Any) -> ollama.GenerateRequest:
    base: dict[str, Any] = {"model": "smol", "prompt": "Why is the sky blue?"}
    base.update(fields)
    return ollama.parse(json.dumps(base).encode(), ollama.GenerateRequest)


# -- requests -------------------------------------------------------------------------


def test_chat_streams_by_default_and_maps_options() -> None:
    request = chat(
        options={
            "num_predict": 8,
            "temperature": 0,
            "top_p": 0.9,
            "top_k": 20,
            "seed": 42,
            "stop": ["\n"],
            "repeat_penalty": 1.1,
            "repeat_last_n": 32,
            "min_p": 0.1,
            "num_ctx": 4096,
            "num_gpu": 99,
        }
    )
    assert request.stream is True
    messages, options = request.call()
    assert messages == [{"role": "user", "content": "hi"}]
    assert options == {
        "max_tokens": 8,
        "temperature": 0.0,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.1,
        "seed": 42,
        "stop": ("\n",),
        "repetition_penalty": 1.1,
        "penalty_last_n": 32,
    }


@pytest.mark.parametrize(("num_predict", "max_tokens"), [(-1, None), (-2, None), (0, 1), (5, 5)])
def test_num_predict(num_predict: int, max_tokens: int | None) -> None:
    _, options = chat(options={"num_predict": num_predict}).call()
    assert options.get("max_tokens") == max_tokens


def test_a_negative_seed_is_random() -> None:
    assert "seed" not in chat(options={"seed": -1}).call()[1]


def test_format_json_and_schema_go_through_the_json_schema_grammar() -> None:
    assert chat(format="json").call()[1]["json_schema"] == {"type": "object"}
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    assert chat(format=schema).call()[1]["json_schema"] == schema
    assert "json_schema" not in chat(format="").call()[1]
    with pytest.raises(BadRequest, match="format"):
        chat(format="yaml").call()


def test_think_switches_the_templates_thinking() -> None:
    assert chat(think=True).call()[1]["enable_thinking"] is True
    assert chat(think="low").call()[1]["enable_thinking"] is True
    assert chat(think=False).call()[1]["enable_thinking"] is False
    assert "enable_thinking" not in chat().call()[1]


def test_options_tool_choice_is_llamads_tool_choice() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    _, options = chat(tools=tools, options={"tool_choice": "required"}).call()
    assert options["tools"] == tools and options["tool_choice"] == "required"
    _, options = chat(tools=tools, options={"tool_choice": "f"}).call()
    assert options["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    _, options = chat(tools=tools).call()
    assert options["tools"] == tools and "tool_choice" not in options
    with pytest.raises(BadRequest, match=r"options\.tool_choice") as exc:
        chat(tools=tools, options={"tool_choice": "g"}).call()
    assert exc.value.details == {"field": "options.tool_choice"}
    with pytest.raises(BadRequest, match=r"options\.tool_choice"):
        chat(options={"tool_choice": "required"}).call()  # no tools to call


def test_chat_messages_with_tools_calls_and_results() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    turns = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "call f"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "content": "42", "tool_name": "f"},
    ]
    messages, options = chat(messages=turns, tools=tools).call()
    assert options["tools"] == tools
    assert messages[2]["tool_calls"] == [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    ]
    assert messages[3] == {"role": "tool", "content": "42", "name": "f"}
    assert "add_generation_prompt" not in options


def test_a_final_assistant_message_is_continued() -> None:
    turns = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    _, options = chat(messages=turns).call()
    assert options["continue_final_message"] is True
    assert options["add_generation_prompt"] is False


def test_images_are_refused() -> None:
    with pytest.raises(BadRequest, match="images") as caught:
        chat(messages=[{"role": "user", "content": "x", "images": ["aGk="]}]).call()
    assert caught.value.details["field"] == "messages[0].images"


def test_generate_renders_the_prompt_as_a_user_turn_with_the_system() -> None:
    messages, options = generate(system="Be brief.", options={"num_predict": 4}).call()
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]
    assert options == {"max_tokens": 4}


def test_generate_raw_and_with_context_sends_no_messages() -> None:
    assert generate(raw=True).call()[0] is None
    assert generate(context=[1, 2, 3]).call()[0] is None
    with pytest.raises(BadRequest, match="system"):
        generate(context=[1, 2], system="S").call()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"suffix": "x"}, "suffix"),
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"images": ["a"]}, "images"),
    ],
)
def test_generate_refuses_what_does_not_map(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest) as caught:
        generate(**fields).call()
    assert caught.value.details["field"] == field


def test_an_empty_prompt_only_loads() -> None:
    assert generate(prompt="").loads_only
    assert not generate(prompt="", context=[1]).loads_only
    assert not generate().loads_only


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"messages": []}', "model"),
        (b'{"model": "m", "messages": [{"role": "robot"}]}', "messages[0].role"),
        (b'{"model": "m", "options": {"temperature": "hot"}}', "options.temperature"),
        (b"[1, 2", ""),
    ],
)
def test_bad_bodies_name_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(BadRequest) as caught:
        ollama.parse(raw, ollama.ChatRequest)
    assert caught.value.details["field"] == field


def test_embed_inputs() -> None:
    one = ollama.parse(b'{"model": "m", "input": "a"}', ollama.EmbedRequest)
    two = ollama.parse(b'{"model": "m", "input": ["a", "b"]}', ollama.EmbedRequest)
    assert one.inputs() == ["a"]
    assert two.inputs() == ["a", "b"]
    with pytest.raises(BadRequest):
        ollama.parse(b'{"model": "m", "input": []}', ollama.EmbedRequest).inputs()


def test_truncated_embeddings_are_unit_length_again() -> None:
    cut = ollama.truncate_embedding([0.6, 0.0, 0.8, 0.0], 2)
    assert cut == [1.0, 0.0]
    assert ollama.truncate_embedding([0.6, 0.8], 4) == [0.6, 0.8]
    assert ollama.truncate_embedding([0.6, 0.8], None) == [0.6, 0.8]


def test_show_takes_model_or_name() -> None:
    assert ollama.parse(b'{"model": "a"}', ollama.ShowRequest).target == "a"
    assert ollama.parse(b'{"name": "b"}', ollama.ShowRequest).target == "b"
    with pytest.raises(BadRequest):
        _ = ollama.parse(b"{}", ollama.ShowRequest).target


# -- names and keep_alive ---------------------------------------------------------------


def test_model_names_carry_a_tag_and_latest_is_the_id() -> None:
    assert ollama.model_id("smol:latest") == "smol"
    assert ollama.model_id("smol") == "smol"
    assert ollama.model_id("smol:q4") == "smol:q4"
    assert ollama.model_name("smol") == "smol:latest"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (0, 0.0),
        ("0", 0.0),
        (300, 300.0),
        ("300", 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("2m30s", 150.0),
        (-1, math.inf),
        ("-1s", math.inf),
        ("-1m", math.inf),
    ],
)
def test_keep_alive_durations(value: str | int | None, seconds: float | None) -> None:
    got = ollama.keep_alive_seconds(value)
    assert got == (pytest.approx(seconds) if seconds not in (None, math.inf) else seconds)


@pytest.mark.parametrize("value", ["soon", "5 minutes", "5x", "m", "", True])
def test_keep_alive_that_is_no_duration_is_refused(value: str | bool) -> None:
    with pytest.raises(BadRequest, match="keep_alive"):
        ollama.keep_alive_seconds(value)


# -- answers ------------------------------------------------------------------------------


def test_a_chat_answer_not_streamed() -> None:
    out = ollama.chat_done(completion("Hi!", read=16), "smol:latest", 5_000_000, streamed=False)
    assert out["message"] == {"role": "assistant", "content": "Hi!"}
    assert out["done"] is True
    assert out["done_reason"] == "stop"
    assert out["model"] == "smol:latest"
    assert out["created_at"].endswith("Z")
    assert out["total_duration"] == 5_000_000
    assert out["prompt_eval_count"] == 20
    assert out["prompt_cached_count"] == 16
    assert out["prompt_eval_duration"] == 11_500_000
    assert out["eval_count"] == 2
    assert out["eval_duration"] == 20_250_000


def test_a_streamed_chat_is_chunks_then_an_empty_done_line() -> None:
    chunk = ollama.chat_chunk("smol", content="Hel")
    assert chunk["message"] == {"role": "assistant", "content": "Hel"}
    assert chunk["done"] is False
    thinking = ollama.chat_chunk("smol", thinking="hmm")
    assert thinking["message"] == {"role": "assistant", "content": "", "thinking": "hmm"}
    last = ollama.chat_done(completion("Hello"), "smol", 1, streamed=True)
    assert last["message"] == {"role": "assistant", "content": ""}
    assert last["done"] is True
    json.dumps(last)  # one NDJSON line


def test_length_is_done_reason_length() -> None:
    out = ollama.chat_done(completion(finish=FinishReason.LENGTH), "m", 1, streamed=False)
    assert out["done_reason"] == "length"


def test_tool_calls_and_thinking_in_a_chat_answer() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    done = completion(
        'junk<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', thinking="t"
    )
    message = ollama.chat_done(done, "m", 1, streamed=False, tools=tools)["message"]
    assert message == {
        "role": "assistant",
        "content": "junk",
        "thinking": "t",
        "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
    }
    untooled = ollama.chat_done(done, "m", 1, streamed=False)["message"]
    assert untooled["content"] == done.reply
    assert "tool_calls" not in untooled
    chunk = ollama.chat_chunk("m", calls=[ollama.Call("g", {})])
    assert chunk["message"]["tool_calls"] == [{"function": {"name": "g", "arguments": {}}}]


def test_a_generate_answer_carries_the_context() -> None:
    done = completion("Because.", prompt=5, generated=2)
    out = ollama.generate_done(done, "smol", 1, streamed=False)
    assert out["response"] == "Because."
    assert out["context"] == list(range(7))
    streamed = ollama.generate_done(done, "smol", 1, streamed=True)
    assert streamed["response"] == ""
    assert ollama.generate_chunk("smol", response="Be")["response"] == "Be"


def test_load_and_unload_answers() -> None:
    assert ollama.load_done("m", "load", chat=False)["done_reason"] == "load"
    unload = ollama.load_done("m", "unload", chat=True)
    assert unload["done_reason"] == "unload"
    assert unload["message"] == {"role": "assistant", "content": ""}


def info(model_id: str, state: ModelState, keep_alive: float | None = None) -> ModelInfo:
    return ModelInfo(
        model_id=model_id,
        path=f"/m/{model_id}.gguf",
        state=state,
        n_ctx=2048,
        n_seq_max=4,
        keep_alive_s=keep_alive,
        loaded_at=1_700_000_000.0,
    )


def test_tags_list_every_model_not_failed() -> None:
    models = [
        info("a", ModelState.READY),
        info("b", ModelState.UNLOADED),
        info("c", ModelState.FAILED),
    ]
    out = ollama.tags_body(models, {"a": (123, "d" * 64, 1_600_000_000.0)})
    assert [m["name"] for m in out["models"]] == ["a:latest", "b:latest"]
    first = out["models"][0]
    assert (first["size"], first["digest"]) == (123, "d" * 64)
    assert first["modified_at"].startswith("2020-09-13T")
    assert first["details"]["format"] == "gguf"


def test_ps_lists_running_models_with_their_expiry() -> None:
    models = [
        info("a", ModelState.READY, keep_alive=60.0),
        info("b", ModelState.UNLOADED),
        info("c", ModelState.READY),
    ]
    out = ollama.ps_body(models, {}, now=1_700_000_000.0)
    assert [m["name"] for m in out["models"]] == ["a:latest", "c:latest"]
    assert out["models"][0]["expires_at"] == "2023-11-14T22:14:20Z"
    assert out["models"][0]["context_length"] == 2048
    assert out["models"][1]["expires_at"].startswith("2318")


def test_show_says_what_llamad_knows() -> None:
    out = ollama.show_body(info("a", ModelState.READY), 123, None)
    assert out["model_info"]["llamad.context_length"] == 2048
    assert out["parameters"] == "num_ctx 2048"
    assert out["modelfile"].startswith("FROM /m/a.gguf")
    assert out["capabilities"] == ["completion"]


def test_version() -> None:
    assert ollama.version_body("1.2.3") == {"version": "1.2.3"}


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (BadRequest("bad"), 400),
        (ContextOverflow("long"), 400),
        (ModelNotFound("no model 'x'"), 404),
        (LlamadError("boom"), 500),
    ],
)
def test_errors_take_ollamas_shape(error: LlamadError, status: int) -> None:
    assert ollama.error_for(error) == (status, {"error": error.message})


def test_routes_that_do_not_map_are_named_with_what_to_do_instead() -> None:
    assert set(ollama.UNSUPPORTED) == {
        "/api/pull",
        "/api/push",
        "/api/create",
        "/api/copy",
        "/api/delete",
    }
    assert "GGUF" in ollama.UNSUPPORTED["/api/pull"]
