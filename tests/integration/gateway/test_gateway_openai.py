"""The HTTP gateway through the official ``openai`` package, against a real daemon.

One daemon per module (``python -m llamad.daemon``, the default model, one
thread) with its gateway on a free loopback port and three API keys: two
tenants and one of no tenant. Generations are short (4-24 tokens), except the
ones a test cancels.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import signal
import socket
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from daemon_proc import DaemonProc
from llamad import Client
from llamad.paths import http_address
from served import EVENTUALLY, MANY, wait_until

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

KEYS = {
    name: f"sk-{name}-{secrets.token_hex(16)}"
    for name in ("alice", "bob", "carol", "plain", "other")
}
TENANTS = {"alice": "a", "bob": "b", "carol": "c"}
"""Each tenant is used by one test only: its first request finds nothing of its own."""
MAX_STREAMS = 2
MAX_BODY = 64 * 1024


def _http_table() -> str:
    lines = [
        "[http]",
        f'max_body_bytes = "{MAX_BODY // 1024}KiB"',
        f"max_streams_per_key = {MAX_STREAMS}",
    ]
    for name, key in KEYS.items():
        lines.append(f"[http.keys.{name}]")
        lines.append(f'sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"')
        if name in TENANTS:
            lines.append(f'tenant = "{TENANTS[name]}"')
    return "\n".join(lines)


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProc]:
    d = DaemonProc(extra=_http_table())
    try:
        d.start()
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def url(daemon: DaemonProc) -> str:
    return daemon.http_url()


def _client(url: str, who: str = "plain") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEYS[who], max_retries=0, timeout=EVENTUALLY)


@pytest.fixture(scope="module")
def oai(url: str) -> openai.OpenAI:
    return _client(url)


def _ask(i: int) -> list[dict[str, str]]:
    """A chat no earlier request shares a prefix with when ``i`` is the
    test's own (the system message, the template's first text, starts with
    it: the module's daemon starts with an empty cache).

    The same every run: greedy replies are then the same every run too, so
    a test that counts the tokens of a reply cannot meet one that ends
    early. (Prompts with a random tag did: 2 in ~500 ended at the end of
    turn after 5 tokens, "You tell stories.", and failed a count of 6.)"""
    words = " ".join(["river", "stone", "lamp", "cloud", "paper"][(i + j) % 5] for j in range(30))
    return [
        {"role": "system", "content": f"{i}: you tell stories."},
        {"role": "user", "content": f"{words}. Go on."},
    ]


# -- models, chat ------------------------------------------------------------------------


def test_models_lists_the_served_model(oai: openai.OpenAI) -> None:
    ids = [m.id for m in oai.models.list()]
    assert ids == ["smol"]
    assert oai.models.retrieve("smol").id == "smol"


def test_a_chat_completion_answers_with_its_usage(oai: openai.OpenAI) -> None:
    messages = _ask(1)
    cold = oai.chat.completions.create(model="smol", messages=messages, max_tokens=4, temperature=0)
    assert cold.object == "chat.completion"
    choice = cold.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert cold.usage is not None
    assert cold.usage.completion_tokens == 4
    assert cold.usage.total_tokens == cold.usage.prompt_tokens + 4
    assert cold.usage.prompt_tokens_details is not None
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    # The same prompt again: the worker reuses what the first one left.
    warm = oai.chat.completions.create(model="smol", messages=messages, max_tokens=4, temperature=0)
    assert warm.usage is not None and warm.usage.prompt_tokens_details is not None
    assert warm.usage.prompt_tokens == cold.usage.prompt_tokens
    assert warm.usage.prompt_tokens_details.cached_tokens >= cold.usage.prompt_tokens - 1
    assert warm.choices[0].message.content == choice.message.content


def test_a_streamed_chat_completion_ends_with_its_usage(oai: openai.OpenAI) -> None:
    messages = _ask(2)
    whole = oai.chat.completions.create(
        model="smol", messages=messages, max_tokens=6, temperature=0
    )
    stream = oai.chat.completions.create(
        model="smol",
        messages=messages,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == 6
    assert last.usage.prompt_tokens_details is not None
    # A warm repeat: its cached tokens, counted while streaming.
    assert last.usage.prompt_tokens_details.cached_tokens >= last.usage.prompt_tokens - 1


def test_a_stream_without_include_usage_carries_no_usage(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.chat.completions.create(model="smol", messages=_ask(3), max_tokens=3, stream=True)
    )
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_stop_and_seed_are_honoured(oai: openai.OpenAI) -> None:
    messages = _ask(4)
    first = oai.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=1.0, seed=7
    )
    again = oai.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=1.0, seed=7
    )
    assert first.choices[0].message.content == again.choices[0].message.content
    text = first.choices[0].message.content or ""
    assert len(text) > 2
    stop = text[1:3]
    cut = oai.chat.completions.create(
        model="smol", messages=messages, max_tokens=8, temperature=1.0, seed=7, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


def test_logprobs_name_each_token_and_its_alternatives(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(
        model="smol", messages=_ask(5), max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    assert "".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 2
        # Greedy: the sampled token is the most likely one.
        assert t.top_logprobs[0].token == t.token


def test_json_schema_constrains_the_reply(oai: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    out = oai.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Is water wet? Answer in JSON."}],
        max_tokens=24,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        },
    )
    assert out.choices[0].finish_reason == "stop"
    reply = json.loads(out.choices[0].message.content or "")
    assert set(reply) == {"ok"} and isinstance(reply["ok"], bool)


def test_json_object_gives_an_object(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Give me a JSON object."}],
        max_tokens=24,
        temperature=0,
        response_format={"type": "json_object"},
    )
    text = out.choices[0].message.content or ""
    assert text.lstrip().startswith("{")
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_concurrent_streams_each_end_once_with_their_own_usage(url: str) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model="smol",
            messages=_ask(100 + i),
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert [f for f in finishes if f] == ["length"]
        usage = chunks[-1].usage
        assert usage is not None
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, usage.completion_tokens

    async def all_of() -> list[tuple[str, int]]:
        client = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key=KEYS["plain"], max_retries=0, timeout=EVENTUALLY
        )
        async with client:
            return list(await asyncio.gather(*(one(client, i) for i in range(MAX_STREAMS))))

    results = asyncio.run(all_of())
    assert [n for _, n in results] == [6] * MAX_STREAMS
    assert all(text for text, _ in results)


# -- completions, embeddings ---------------------------------------------------------------


def test_a_text_completion_streamed_and_not(oai: openai.OpenAI) -> None:
    # Fixed, like _ask: a reply counted to its length is never one that
    # meets the end of text early in some run.
    prompt = "Once upon a time, in a land far away,"
    whole = oai.completions.create(model="smol", prompt=prompt, max_tokens=5, temperature=0)
    assert whole.object == "text_completion"
    assert whole.usage is not None and whole.usage.completion_tokens == 5
    streamed = list(
        oai.completions.create(
            model="smol",
            prompt=prompt,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == whole.choices[0].text
    assert streamed[-1].usage is not None
    assert streamed[-1].usage.prompt_tokens_details is not None
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_embeddings_float_and_base64(oai: openai.OpenAI, daemon: DaemonProc) -> None:
    # The SDK asks for base64 unless told otherwise, and decodes it.
    b64 = oai.embeddings.create(model="smol", input=["a red fox", "a blue whale"])
    floats = oai.embeddings.create(model="smol", input="a red fox", encoding_format="float")
    assert [d.index for d in b64.data] == [0, 1]
    with Client(daemon.endpoint) as c:
        direct = c.embed("smol", "a red fox")
        tokens = len(c.tokenize("smol", "a red fox")) + len(c.tokenize("smol", "a blue whale"))
    assert floats.data[0].embedding == pytest.approx(direct, abs=1e-6)
    assert b64.data[0].embedding == pytest.approx(direct, abs=1e-6)
    assert b64.data[1].embedding != b64.data[0].embedding
    assert b64.usage.prompt_tokens == tokens


# -- errors --------------------------------------------------------------------------------


def _error(exc: openai.APIStatusError) -> dict[str, object]:
    body = exc.response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_an_unknown_model_is_404_model_not_found(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        oai.chat.completions.create(model="nope", messages=_ask(0), max_tokens=2)
    err = _error(caught.value)
    assert err["code"] == "model_not_found"
    assert err["type"] == "invalid_request_error"


def test_n_above_one_is_refused_naming_n(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="smol", messages=_ask(0), max_tokens=2, n=2)
    err = _error(caught.value)
    assert err["param"] == "n"
    assert "one choice per request" in str(err["message"])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stop": 5}, "stop"),
    ],
)
def test_a_bad_field_is_400_naming_it(
    oai: openai.OpenAI, extra: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="smol", messages=_ask(0), max_tokens=2, extra_body=extra)
    err = _error(caught.value)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"


def test_a_bad_value_llamad_refuses_is_400_naming_it(oai: openai.OpenAI) -> None:
    # Checked by the client with the worker's own rules.
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="smol", messages=_ask(0), max_tokens=2, top_p=0)
    err = _error(caught.value)
    assert err["code"] == "bad_request"
    assert err["param"] == "top_p"


def test_a_prompt_beyond_the_context_is_context_length_exceeded(oai: openai.OpenAI) -> None:
    long = " ".join(["river stone lamp"] * 1200)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            oai.chat.completions.create(
                model="smol",
                messages=[{"role": "user", "content": long}],
                max_tokens=2,
                stream=stream,
            )
        assert _error(caught.value)["code"] == "context_length_exceeded"


def test_a_wrong_key_is_401(url: str) -> None:
    bad = openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.models.list()
    err = _error(caught.value)
    assert err["code"] == "invalid_api_key"
    assert err["type"] == "authentication_error"
    missing = httpx.get(url + "/v1/models")
    assert missing.status_code == 401


def test_a_body_too_large_is_413(url: str) -> None:
    r = httpx.post(
        url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEYS['plain']}"},
        json={"model": "smol", "messages": [{"role": "user", "content": "x" * MAX_BODY}]},
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "too_large"


def test_a_body_that_is_not_json_is_400(url: str) -> None:
    r = httpx.post(
        url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEYS['plain']}", "Content-Type": "application/json"},
        content=b"{not json",
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_paths_and_methods_answer_in_openai_shape(url: str) -> None:
    headers = {"Authorization": f"Bearer {KEYS['plain']}"}
    missing = httpx.get(url + "/v1/nothing", headers=headers)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = httpx.get(url + "/v1/chat/completions", headers=headers)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


#: A reply that cannot end before MANY tokens: a JSON string of at least
#: 10,000 characters (the JSON-schema grammar lets no end-of-generation in).
ENDLESS = {
    "type": "json_schema",
    "json_schema": {"name": "long", "schema": {"type": "string", "minLength": 10_000}},
}


def _send(url: str, key: str, body: dict[str, object]) -> socket.socket:
    """A chat request on a raw socket (a client that can go away at any moment)."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    sock = socket.create_connection((where.hostname, where.port), timeout=EVENTUALLY)
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def _open_stream(url: str, key: str, max_tokens: int) -> tuple[socket.socket, bytes]:
    """An endless streamed chat request, read up to its first data line."""
    body = {
        "model": "smol",
        "messages": _ask(9),
        "max_tokens": max_tokens,
        "stream": True,
        "response_format": ENDLESS,
    }
    sock = _send(url, key, body)
    seen = b""
    while b"data:" not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    return sock, seen


def test_too_many_streams_of_one_key_is_429(
    url: str, daemon: DaemonProc, oai: openai.OpenAI
) -> None:
    held = [_open_stream(url, KEYS["plain"], MANY)[0] for _ in range(MAX_STREAMS)]
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            oai.chat.completions.create(model="smol", messages=_ask(0), max_tokens=2)
        assert _error(caught.value)["code"] == "too_many_streams"
        # Another key has its own count.
        other = _client(url, "other").chat.completions.create(
            model="smol", messages=_ask(0), max_tokens=2
        )
        assert other.choices[0].message.content is not None
    finally:
        for sock in held:
            sock.close()
    daemon.wait_idle()


# -- disconnects -----------------------------------------------------------------------------


def test_a_client_leaving_a_stream_cancels_its_request(url: str, daemon: DaemonProc) -> None:
    daemon.wait_idle()
    ticks = daemon.ticks()
    sock, first = _open_stream(url, KEYS["plain"], MANY)
    assert first.startswith(b"HTTP/1.1 200")
    assert daemon.wait_until_busy().status.active_sequences == 1
    sock.close()
    # The request could end only after MANY steps: it was dropped well before.
    daemon.assert_dropped(ticks)


def test_a_client_leaving_a_call_cancels_its_request(url: str, daemon: DaemonProc) -> None:
    daemon.wait_idle()
    ticks = daemon.ticks()
    body = {"model": "smol", "messages": _ask(10), "max_tokens": MANY, "response_format": ENDLESS}
    sock = _send(url, KEYS["plain"], body)
    daemon.wait_until_busy()
    sock.close()
    daemon.assert_dropped(ticks)


# -- tenants ---------------------------------------------------------------------------------


def _cached(client: openai.OpenAI, messages: list[dict[str, str]]) -> int:
    out = client.chat.completions.create(
        model="smol", messages=messages, max_tokens=2, temperature=0
    )
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    return out.usage.prompt_tokens_details.cached_tokens or 0


def test_a_tenant_never_hits_another_tenants_prompt(url: str, daemon: DaemonProc) -> None:
    alice, bob, carol = _client(url, "alice"), _client(url, "bob"), _client(url, "carol")
    messages = _ask(20)
    assert _cached(alice, messages) == 0
    # alice's KV is live in the worker, her rows in ram and on disk: none is bob's.
    assert _cached(bob, messages) == 0
    assert _cached(alice, messages) >= 10
    assert _cached(bob, messages) >= 10  # his own now
    # alice's rows live and on disk only (ram emptied): none is carol's.
    other = _ask(21)
    _cached(alice, other)
    daemon.wait_idle()
    with Client(daemon.endpoint) as c:
        assert c.evict_bytes(sys.maxsize, tiers=["ram"]) > 0
    assert _cached(carol, other) == 0
    assert _cached(alice, other) >= 10


def test_a_request_salt_of_a_tenant_stays_in_its_namespace(url: str) -> None:
    alice, plain = _client(url, "alice"), _client(url, "plain")
    messages = _ask(22)
    _cached(alice, messages)
    assert _cached(alice, messages) >= 10
    # A caller of no tenant naming alice's salt does not reach her rows.
    out = plain.chat.completions.create(
        model="smol", messages=messages, max_tokens=2, extra_body={"cache_salt": "t/a"}
    )
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 0


def test_the_gateway_publishes_a_loopback_address(url: str) -> None:
    host = urlsplit(url).hostname
    assert host == "127.0.0.1"
    wait_until(lambda: httpx.get(url + "/v1/models").status_code == 401, "the gateway answers")


# -- the gateway's crash ---------------------------------------------------------------------


def test_a_killed_gateway_comes_back_on_its_port_and_the_worker_never_notices(
    url: str, daemon: DaemonProc
) -> None:
    daemon.wait_idle()
    worker = daemon.worker_pid()
    old = http_address(daemon.launcher.runtime)
    assert old is not None
    ticks = daemon.ticks()
    sock, _ = _open_stream(url, KEYS["plain"], MANY)
    daemon.wait_until_busy()
    os.kill(int(str(old["pid"])), signal.SIGKILL)
    # Its request is cancelled like any client's that went away.
    daemon.assert_dropped(ticks)
    sock.close()

    def restarted() -> dict[str, object] | None:
        now = http_address(daemon.launcher.runtime)
        return now if now is not None and now["pid"] != old["pid"] else None

    new = wait_until(restarted, "a new gateway", EVENTUALLY)
    assert new["url"] == url  # the port the root chose for port = 0 stays
    out = _client(url).chat.completions.create(model="smol", messages=_ask(30), max_tokens=2)
    assert out.usage is not None and out.usage.completion_tokens == 2
    assert daemon.worker_pid() == worker


def test_a_worker_crash_is_502_for_a_call_and_an_error_event_for_a_stream(
    url: str, daemon: DaemonProc
) -> None:
    daemon.wait_idle()
    client = _client(url)
    endless: dict[str, object] = {"response_format": ENDLESS}
    stream = client.chat.completions.create(
        model="smol", messages=_ask(40), max_tokens=MANY, stream=True, extra_body=endless
    )
    next(iter(stream))  # the stream is running
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            client.chat.completions.create,
            model="smol",
            messages=_ask(41),
            max_tokens=MANY,
            extra_body=endless,
        )
        wait_until(
            lambda: (b := daemon.board()) is not None and b.status.active_sequences == 2,
            "both requests running",
            EVENTUALLY,
        )
        old = daemon.kill_worker()
        with pytest.raises(openai.APIStatusError) as caught:
            call.result(timeout=EVENTUALLY)
    assert caught.value.status_code == 502
    assert _error(caught.value)["code"] == "worker_crashed"
    with pytest.raises(openai.APIError) as ended:
        for _ in stream:
            pass
    assert ended.value.code == "worker_crashed"
    assert ended.value.type == "server_error"
    daemon.wait_worker_back(old)
    out = client.chat.completions.create(model="smol", messages=_ask(42), max_tokens=2)
    assert out.usage is not None and out.usage.completion_tokens == 2


# -- last: stops the module's daemon ---------------------------------------------------------


def test_a_daemon_stopped_during_a_stream_ends_it_and_exits_0(url: str, daemon: DaemonProc) -> None:
    daemon.wait_idle()
    sock, _ = _open_stream(url, KEYS["plain"], MANY)
    daemon.wait_until_busy()
    assert daemon.stop() == 0  # the gateway first: its stream cancelled, nothing left
    sock.settimeout(EVENTUALLY)
    while sock.recv(65536):  # the rest of the stream, then the end of the connection
        pass
    sock.close()
    assert http_address(daemon.launcher.runtime) is None
