"""The HTTP gateway's Anthropic and Ollama routes through the official ``anthropic``
and ``ollama`` packages, against a real daemon.

One daemon per module (``python -m llamad.daemon``, the default model, one
thread) with its gateway on a free loopback port and one API key, sent as
Anthropic's ``x-api-key`` and as Ollama's ``Authorization: Bearer``.
Generations are short (at most 24 tokens); the ``keep_alive`` tests, which
unload the model, run last.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import anthropic
import httpx
import ollama
import pytest

import llamad
from daemon_proc import DaemonProc
from llamad import Client, ModelState
from served import EVENTUALLY, MANY, prompt_text, wait_until

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

KEY = f"sk-ant-{secrets.token_hex(16)}"
MODEL = "smol"
#: The anthropic SDK has no sampling parameters of its own any more: llamad's
#: Messages route still reads them, sent as extra body fields.
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProc]:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    d = DaemonProc(MODEL, extra=f'[http.keys.tester]\nsha256 = "{digest}"\n')
    try:
        d.start()
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def url(daemon: DaemonProc) -> str:
    return daemon.http_url()


@pytest.fixture(scope="module")
def claude(url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=EVENTUALLY) as c:
        yield c


@pytest.fixture(scope="module")
def olla(url: str) -> ollama.Client:
    return ollama.Client(host=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=EVENTUALLY)


@pytest.fixture(scope="module")
def llamad_client(daemon: DaemonProc) -> Iterator[Client]:
    with Client(daemon.endpoint, timeout=EVENTUALLY, connect_timeout=30) as c:
        yield c


def _user(i: int, words: int = 40) -> list[anthropic.types.MessageParam]:
    return [{"role": "user", "content": prompt_text(i, words)}]


# -- Anthropic ----------------------------------------------------------------------------


def test_messages_with_a_system_prompt(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(
        model=MODEL,
        max_tokens=8,
        extra_body=GREEDY,
        system="You are terse.",
        messages=_user(1),
    )
    assert msg.type == "message"
    assert msg.role == "assistant"
    assert msg.model == MODEL
    assert msg.id.startswith("msg_")
    assert msg.content
    assert msg.content[0].type == "text"
    assert msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= msg.usage.output_tokens <= 8
    total = (
        msg.usage.input_tokens
        + (msg.usage.cache_read_input_tokens or 0)
        + (msg.usage.cache_creation_input_tokens or 0)
    )
    counted = claude.messages.count_tokens(model=MODEL, system="You are terse.", messages=_user(1))
    assert counted.input_tokens == total  # the rendered prompt, counted the same way


def test_the_system_prompt_reaches_the_model(claude: anthropic.Anthropic) -> None:
    # The template's default system prompt stands in when none is given.
    default = claude.messages.count_tokens(model=MODEL, messages=_user(2))
    one = claude.messages.count_tokens(model=MODEL, system="You are terse.", messages=_user(2))
    blocks: list[anthropic.types.TextBlockParam] = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "You answer in French."},
    ]
    two = claude.messages.count_tokens(model=MODEL, system=blocks, messages=_user(2))
    assert one.input_tokens != default.input_tokens
    assert two.input_tokens > one.input_tokens  # both blocks are rendered


def test_a_stop_sequence_ends_the_reply_and_is_reported(claude: anthropic.Anthropic) -> None:
    ask = {"model": MODEL, "max_tokens": 16, "extra_body": GREEDY, "messages": _user(3)}
    free = claude.messages.create(**ask)  # type: ignore[call-overload]
    text = free.content[0].text
    words = text.split()
    assert len(words) >= 3, f"a greedy reply long enough to cut: {text!r}"
    stop = words[2]
    stopped = claude.messages.create(**ask, stop_sequences=[stop])  # type: ignore[call-overload]
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.index(stop)]


def test_streamed_messages_match_the_reply_and_carry_usage(claude: anthropic.Anthropic) -> None:
    ask = {"model": MODEL, "max_tokens": 12, "extra_body": GREEDY, "messages": _user(4)}
    whole = claude.messages.create(**ask)  # type: ignore[call-overload]
    kinds: list[str] = []
    with claude.messages.stream(**ask) as stream:  # type: ignore[call-overload]
        pieces = []
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                pieces.append(event.delta.text)
        final = stream.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert "content_block_start" in kinds
    assert "content_block_stop" in kinds
    assert "message_delta" in kinds
    assert "".join(pieces) == whole.content[0].text
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The stream's totals come in message_delta and replace message_start's zeros.
    assert (
        final.usage.input_tokens
        + (final.usage.cache_read_input_tokens or 0)
        + (final.usage.cache_creation_input_tokens or 0)
        == claude.messages.count_tokens(model=MODEL, messages=_user(4)).input_tokens
    )


def test_a_warm_repeat_reads_its_prompt_from_the_cache(claude: anthropic.Anthropic) -> None:
    ask = {
        "model": MODEL,
        "max_tokens": 4,
        "extra_body": GREEDY,
        # No earlier prompt shares a prefix with it (the template's default
        # system prompt would otherwise be read from the cache the first time).
        "system": f"{secrets.token_hex(8)}: you tell stories.",
        "messages": _user(5, 120),
    }
    cold = claude.messages.create(**ask)  # type: ignore[call-overload]
    # Cold: at most the template's first tokens are shared with live KV.
    cold_read = cold.usage.cache_read_input_tokens or 0
    created = cold.usage.cache_creation_input_tokens or 0
    assert created > 0, "the prompt was saved"
    assert cold_read < created
    warm = claude.messages.create(**ask)  # type: ignore[call-overload]
    read = warm.usage.cache_read_input_tokens or 0
    # Warm: what the first request computed and saved is read back.
    assert read >= cold_read + created
    total = cold.usage.input_tokens + cold_read + created
    assert read + warm.usage.input_tokens + (warm.usage.cache_creation_input_tokens or 0) == total
    assert warm.content[0].text == cold.content[0].text


WEATHER: list[anthropic.types.ToolParam] = [
    {
        "name": "weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
        },
    }
]


def test_a_forced_tool_call_is_a_tool_use_block(claude: anthropic.Anthropic) -> None:
    ask = {
        "model": MODEL,
        "max_tokens": 40,
        "extra_body": GREEDY,
        "tools": WEATHER,
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    }
    msg = claude.messages.create(**ask)  # type: ignore[call-overload]
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1, msg.content
    assert uses[0].name == "weather"
    assert uses[0].input in ({"city": "Paris"}, {"city": "Oslo"})
    assert uses[0].id.startswith("toolu_")
    assert msg.stop_reason == "tool_use"
    with claude.messages.stream(**ask) as stream:  # type: ignore[call-overload]
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(uses[0].name, uses[0].input)]
    assert final.stop_reason == "tool_use"
    # The call and its result go back as the next turn's blocks.
    follow = claude.messages.create(
        model=MODEL,
        max_tokens=4,
        tools=WEATHER,
        messages=[
            ask["messages"][0],
            {"role": "assistant", "content": [uses[0].model_dump()]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny"}],
            },
        ],
    )
    assert follow.usage.output_tokens >= 1


def test_errors_take_anthropics_shape(claude: anthropic.Anthropic, url: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=_user(6))
    assert missing.value.status_code == 404
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": missing.value.body["error"]["message"]},
    }
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL, max_tokens=0, messages=_user(6))
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in bad.value.body["error"]["message"]
    # A prompt past the context: refused before the stream starts, with its status.
    long = [{"role": "user", "content": prompt_text(7, 3000)}]
    with (
        pytest.raises(anthropic.BadRequestError) as overflow,
        claude.messages.stream(model=MODEL, max_tokens=4, messages=long) as stream,  # type: ignore[arg-type]
    ):
        stream.get_final_message()
    assert overflow.value.body["error"]["type"] == "invalid_request_error"
    with (
        anthropic.Anthropic(base_url=url, api_key="sk-wrong", max_retries=0) as stranger,
        pytest.raises(anthropic.AuthenticationError) as denied,
    ):
        stranger.messages.create(model=MODEL, max_tokens=4, messages=_user(6))
    assert denied.value.body["error"]["type"] == "authentication_error"
    # An unknown path under /v1/messages answers in Anthropic's shape, not OpenAI's.
    nowhere = httpx.post(url + "/v1/messages/nowhere", headers={"x-api-key": KEY}, json={})
    assert nowhere.status_code == 404
    assert nowhere.json()["error"]["type"] == "not_found_error"
    # The daemon still serves.
    ok = claude.messages.create(model=MODEL, max_tokens=2, messages=_user(8))
    assert ok.usage.output_tokens >= 1


# -- Ollama -------------------------------------------------------------------------------


def olla_url(client: ollama.Client) -> str:
    return str(client._client.base_url).rstrip("/")


def _chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt_text(20 + i)}]


def test_ollama_chat_streamed_and_not(olla: ollama.Client) -> None:
    options = {"num_predict": 8, "temperature": 0}
    whole = olla.chat(model=MODEL, messages=_chat(1), stream=False, options=options)
    assert whole.done is True
    assert whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant"
    assert whole.message.content
    assert whole.eval_count is not None and 1 <= whole.eval_count <= 8
    assert whole.prompt_eval_count is not None and whole.prompt_eval_count > 0
    assert whole.total_duration is not None and whole.total_duration > 0
    parts = list(olla.chat(model=MODEL, messages=_chat(1), stream=True, options=options))
    assert parts[-1].done is True
    assert all(p.done is False for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


OLLAMA_WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"],
            },
        },
    }
]


def test_ollama_tools_with_a_required_call_streamed_and_not(olla: ollama.Client) -> None:
    # Ollama's API has no tool_choice: llamad reads it from options (the
    # ollama client passes options through), constraining the reply to a call.
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": OLLAMA_WEATHER,
        "options": {"num_predict": 40, "temperature": 0, "tool_choice": "required"},
    }
    whole = olla.chat(**ask, stream=False)  # type: ignore[arg-type]
    calls = whole.message.tool_calls or []
    assert [c.function.name for c in calls] == ["weather"], whole.message
    assert calls[0].function.arguments in ({"city": "Paris"}, {"city": "Oslo"})
    parts = list(olla.chat(**ask, stream=True))  # type: ignore[arg-type]
    streamed = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (calls[0].function.name, calls[0].function.arguments)
    ]
    assert parts[-1].done is True
    # The call and its result go back as the next turn's messages.
    follow = olla.chat(
        model=MODEL,
        messages=[
            *ask["messages"],  # type: ignore[list-item]
            {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
            {"role": "tool", "content": "Sunny", "tool_name": "weather"},
        ],
        tools=OLLAMA_WEATHER,
        options={"num_predict": 4, "temperature": 0},
        stream=False,
    )
    assert follow.eval_count is not None and follow.eval_count >= 1


def test_ollama_chat_with_a_json_schema_format(olla: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    out = olla.chat(
        model=MODEL,
        messages=_chat(2),
        format=schema,
        stream=False,
        options={"num_predict": 24, "temperature": 0},
    )
    assert isinstance(json.loads(out.message.content or "")["ok"], bool)


def test_ollama_generate_and_its_context(olla: ollama.Client) -> None:
    first = olla.generate(
        model=MODEL, prompt=prompt_text(30), options={"num_predict": 6, "temperature": 0}
    )
    assert first.done is True
    assert first.response
    assert first.context and len(first.context) >= (first.prompt_eval_count or 0)
    more = olla.generate(
        model=MODEL,
        prompt=" And then?",
        context=first.context,
        options={"num_predict": 4, "temperature": 0},
    )
    assert more.response
    # The earlier tokens went on as they were: the cache held them.
    assert more.prompt_eval_count is not None and more.prompt_eval_count > len(first.context)
    streamed = list(
        olla.generate(
            model=MODEL,
            prompt=prompt_text(30),
            stream=True,
            options={"num_predict": 6, "temperature": 0},
        )
    )
    assert "".join(p.response for p in streamed) == first.response


def test_ollama_embed(olla: ollama.Client) -> None:
    out = olla.embed(model=MODEL, input=["a red apple", "a green pear"])
    assert len(out.embeddings) == 2
    for vector in out.embeddings:
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-3)
    assert out.embeddings[0] != out.embeddings[1]
    cut = olla.embed(model=MODEL, input="a red apple", dimensions=8)
    assert len(cut.embeddings[0]) == 8


def test_ollama_tags_show_ps_and_version(olla: ollama.Client, url: str) -> None:
    names = [m.model for m in olla.list().models]
    assert f"{MODEL}:latest" in names
    shown = olla.show(f"{MODEL}:latest")
    assert shown.modelinfo is not None
    assert shown.modelinfo["llamad.context_length"] == 2048
    # From the GGUF header (the default model, SmolLM2-135M at Q4_1).
    assert shown.details is not None
    assert (shown.details.family, shown.details.families) == ("llama", ["llama"])
    assert shown.details.parameter_size == "134.52M"
    assert shown.details.quantization_level == "Q4_1"
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["general.parameter_count"] == 134_515_008
    running = [m.model for m in olla.ps().models]
    assert f"{MODEL}:latest" in running
    version = httpx.get(url + "/api/version", headers={"Authorization": f"Bearer {KEY}"})
    assert version.json() == {"version": llamad.__version__}


def test_ollama_errors(olla: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        olla.chat(model="no-such-model", messages=_chat(3), stream=False)
    assert missing.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as pull:
        olla.pull(MODEL)
    assert pull.value.status_code == 501
    assert "GGUF" in pull.value.error
    nowhere = httpx.get(olla_url(olla) + "/api/nowhere", headers={"Authorization": f"Bearer {KEY}"})
    assert nowhere.status_code == 404
    assert set(nowhere.json()) == {"error"}
    with pytest.raises(ollama.ResponseError) as bad:
        olla.chat(model=MODEL, messages=_chat(3), keep_alive="soon", stream=False)
    assert bad.value.status_code == 400
    assert "keep_alive" in bad.value.error


def _raw_post(url: str, path: str, headers: str, body: dict[str, object]) -> socket.socket:
    """A request on a raw socket (a client that can go away at any moment),
    read up to the end of the response's head (a 200)."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    data = json.dumps(body).encode()
    sock = socket.create_connection((where.hostname, where.port), timeout=EVENTUALLY)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
        + f"{headers}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(65536)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def test_an_anthropic_client_leaving_a_stream_cancels_it(url: str, daemon: DaemonProc) -> None:
    daemon.wait_idle()
    ticks = daemon.ticks()
    body = {
        "model": MODEL,
        "max_tokens": MANY,
        "stream": True,
        "messages": _user(9),
        # A JSON string of at least 10,000 characters: it cannot end before MANY tokens.
        "output_config": {
            "format": {"type": "json_schema", "schema": {"type": "string", "minLength": 10_000}}
        },
    }
    with _raw_post(url, "/v1/messages", f"x-api-key: {KEY}", body):
        daemon.wait_until_busy()
    daemon.assert_dropped(ticks)


def test_an_ollama_client_leaving_a_quiet_stream_cancels_it(
    olla: ollama.Client, daemon: DaemonProc
) -> None:
    """A stream that sends nothing (a reply opening with ``[`` is held as a
    possible tool call) is cancelled when its client leaves, not when it ends."""
    daemon.wait_idle()
    ticks = daemon.ticks()
    body = {
        "model": MODEL,
        "messages": _chat(5),
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        # An array of at least 5,000 numbers: it cannot end before MANY tokens.
        "format": {"type": "array", "items": {"type": "integer"}, "minItems": 5000},
        "options": {"num_predict": MANY},
    }
    with _raw_post(olla_url(olla), "/api/chat", f"Authorization: Bearer {KEY}", body):
        daemon.wait_until_busy()
    daemon.assert_dropped(ticks)


def test_ollama_keep_alive_sets_and_unloads(olla: ollama.Client, llamad_client: Client) -> None:
    options = {"num_predict": 2}
    olla.chat(model=MODEL, messages=_chat(4), keep_alive="10m", stream=False, options=options)
    assert llamad_client.model_info(MODEL).keep_alive_s == 600.0
    olla.chat(model=MODEL, messages=_chat(4), keep_alive=-1, stream=False, options=options)
    assert llamad_client.model_info(MODEL).keep_alive_s is None
    # An empty prompt with keep_alive 0: Ollama's "unload this model now".
    unloaded = olla.generate(model=MODEL, keep_alive=0)
    assert unloaded.done_reason == "unload"
    wait_until(
        lambda: llamad_client.model_info(MODEL).state is ModelState.UNLOADED,
        "keep_alive 0 to unload the model",
    )
    assert f"{MODEL}:latest" not in [m.model for m in olla.ps().models]
    # Still listed, and the next request loads it again.
    assert f"{MODEL}:latest" in [m.model for m in olla.list().models]
    again = olla.chat(model=MODEL, messages=_chat(4), keep_alive=-1, stream=False, options=options)
    assert again.message.content is not None
    assert llamad_client.model_info(MODEL).state is ModelState.READY
