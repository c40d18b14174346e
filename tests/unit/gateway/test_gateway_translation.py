"""The gateway's translation and its gate, with a fake client (no daemon).

The app runs in-process under starlette's test client; the fake records what
the gateway asked of llamad's client and answers with canned results.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec
import pytest
from starlette.testclient import TestClient

from llamad.cli.main import main as cli_main
from llamad.client.aio import AsyncClient
from llamad.config.sections import HttpKey, HttpSection
from llamad.errors import (
    ContextOverflow,
    ModelNotFound,
    Overloaded,
    RequestTimeout,
    SchemaError,
    WorkerCrashed,
)
from llamad.gateway import openai
from llamad.gateway.app import build_app
from llamad.gateway.errors import STATUS, HttpError
from llamad.gateway.gate import Caller, Gate
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    DoneEvent,
    FinishReason,
    Stats,
    ThinkingEvent,
    TokenEvent,
    TokenLogprob,
    TokenSources,
    TopLogprob,
)

pytestmark = pytest.mark.timeout(30)


def _completion(reply: str = "Hello there", **kw: Any) -> Completion:
    fields: dict[str, Any] = {
        "reply": reply,
        "generated": [1, 2],
        "context_tokens": [],
        "committed_tokens": 0,
        "cache_hit_kind": CacheHitKind.PARTIAL,
        "finish_reason": FinishReason.LENGTH,
        "stats": Stats(prompt_tokens=10, completion_tokens=2),
        "cache_delta": CacheDelta(read=7, sources=TokenSources(live=3, ram=4, computed=3)),
    }
    fields.update(kw)
    return Completion(**fields)


class _Stream:
    def __init__(self, events: list[Any], error: Exception | None = None) -> None:
        self.events = events
        self.error = error
        self.taken = 0
        self.closed = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[Any]:
        for e in self.events:
            self.taken += 1
            yield e
        if self.error is not None:
            raise self.error

    def buffered(self) -> int:
        """Every event is there at once (as an AsyncStream's that arrived together)."""
        return len(self.events) - self.taken

    async def aclose(self) -> None:
        self.closed = True


class FakeClient:
    """What the gateway calls of :class:`llamad.AsyncClient`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, dict[str, Any]]] = []
        self.result = _completion()
        self.events: list[Any] = [
            TokenEvent("Hel", 5),
            ThinkingEvent("hmm"),
            TokenEvent("", 6),
            TokenEvent("lo", 7),
            DoneEvent(_completion("Hello")),
        ]
        self.stream_error: Exception | None = None
        self.raises: Exception | None = None
        self.streams: list[_Stream] = []

    async def complete(self, model_id: str, prompt: Any = None, **kw: Any) -> Completion:
        self.calls.append(("complete", model_id, prompt, kw))
        if self.raises is not None:
            raise self.raises
        return self.result

    async def infer(self, model_id: str, prompt: Any = None, **kw: Any) -> _Stream:
        self.calls.append(("infer", model_id, prompt, kw))
        if self.raises is not None:
            raise self.raises
        stream = _Stream(self.events, self.stream_error)
        self.streams.append(stream)
        return stream

    async def embed(self, model_id: str, tokens: Any, **kw: Any) -> list[float]:
        self.calls.append(("embed", model_id, tokens, kw))
        return [0.5, -0.25, float(len(tokens))]

    async def tokenize(self, model_id: str, text: str, **kw: Any) -> list[int]:
        return list(range(len(text.split())))

    async def detokenize(self, model_id: str, tokens: list[int], **kw: Any) -> str:
        return {5: "Hel", 6: "", 7: "lo", 8: "Hi", 1: "A", 2: "B"}.get(tokens[0], "?")

    async def list_models(self, **kw: Any) -> list[Any]:
        from llamad.front.wire import ModelInfo, ModelState  # noqa: PLC0415

        return [ModelInfo(model_id="m", path="/x", state=ModelState.READY, loaded_at=12.5)]


KEY = "sk-test-1"


def _app(fake: FakeClient, **http: Any) -> TestClient:
    gate = Gate(HttpSection(**http), cast(AsyncClient, fake))
    return TestClient(build_app(gate))


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


@pytest.fixture
def app(fake: FakeClient) -> TestClient:
    return _app(fake)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


# -- requests into client calls -----------------------------------------------------------


def test_chat_options_become_the_clients_keywords(app: TestClient, fake: FakeClient) -> None:
    body = {
        **CHAT,
        "messages": [
            {
                "role": "developer",
                "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
            },
            {"role": "user", "content": "hi", "name": "bob"},
        ],
        "max_completion_tokens": 7,
        "max_tokens": 99,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": -1,
        "stop": "END",
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "top_k": 5,
        "user": "ignored",
    }
    assert app.post("/v1/chat/completions", json=body).status_code == 200
    op, model, prompt, kw = fake.calls[-1]
    assert (op, model, prompt) == ("complete", "m", None)
    assert kw["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert kw["max_tokens"] == 7  # max_completion_tokens wins
    assert kw["temperature"] == 0.5 and kw["top_p"] == 0.9 and kw["top_k"] == 5
    assert kw["seed"] == 0xFFFFFFFF
    assert kw["stop"] == ("END",)
    assert kw["frequency_penalty"] == 0.1 and kw["presence_penalty"] == 0.2
    assert kw["request_id"].startswith("r-")
    assert "cache_salt" not in kw and "logprobs" not in kw and "json_schema" not in kw


@pytest.mark.parametrize(
    ("fmt", "schema"),
    [
        ({"type": "json_object"}, {"type": "object"}),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
            {"type": "array"},
        ),
        ({"type": "text"}, None),
    ],
)
def test_response_format_becomes_a_json_schema(
    app: TestClient, fake: FakeClient, fmt: dict[str, Any], schema: dict[str, Any] | None
) -> None:
    assert (
        app.post("/v1/chat/completions", json={**CHAT, "response_format": fmt}).status_code == 200
    )
    assert fake.calls[-1][3].get("json_schema") == schema


def test_a_chat_answer_has_openais_shape_and_cached_tokens(app: TestClient) -> None:
    out = app.post("/v1/chat/completions", json=CHAT).json()
    assert out["object"] == "chat.completion"
    assert out["id"].startswith("chatcmpl-")
    assert out["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    # cached: every prompt token not computed (live 3 + ram 4).
    assert out["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 7},
    }


def test_logprobs_carry_token_texts(app: TestClient, fake: FakeClient) -> None:
    fake.result = _completion(
        "AB",
        logprobs=[
            TokenLogprob(1, -0.5, (TopLogprob(1, -0.5), TopLogprob(8, -1.5))),
            TokenLogprob(2, -0.1, (TopLogprob(2, -0.1), TopLogprob(1, -3.0))),
        ],
    )
    out = app.post(
        "/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2}
    ).json()
    assert fake.calls[-1][3]["logprobs"] == 2
    content = out["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["A", "B"]
    assert content[0]["bytes"] == [65]
    assert content[0]["top_logprobs"] == [
        {"token": "A", "logprob": -0.5, "bytes": [65]},
        {"token": "Hi", "logprob": -1.5, "bytes": [72, 105]},
    ]


def test_a_stream_is_sse_chunks_then_usage_then_done(app: TestClient, fake: FakeClient) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with app.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "content-length" not in r.headers  # a stream of unknown length
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [msgspec.json.decode(line[6:]) for line in lines[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "Hel"},
        {"reasoning_content": "hmm"},
        {"content": "lo"},
        {},
    ]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes == [None, None, None, None, "length"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}
    assert fake.streams[-1].closed


def test_a_stream_without_include_usage_has_no_usage_field(app: TestClient) -> None:
    with app.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        chunks = [
            msgspec.json.decode(line[6:]) for line in r.iter_lines() if line.startswith("data: {")
        ]
    assert chunks and all("usage" not in c for c in chunks)


def test_an_error_after_the_first_event_ends_the_stream_with_an_error_object(
    app: TestClient, fake: FakeClient
) -> None:
    fake.events = [TokenEvent("a", 1)]
    fake.stream_error = WorkerCrashed("the worker died")
    with app.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    last = msgspec.json.decode(lines[-2][6:])
    assert last["error"]["code"] == "worker_crashed"
    assert last["error"]["type"] == "server_error"


def test_an_error_before_the_first_event_keeps_its_status(
    app: TestClient, fake: FakeClient
) -> None:
    fake.events = []
    fake.stream_error = ContextOverflow("too long")
    r = app.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert fake.streams[-1].closed


def test_text_completions_and_their_defaults(app: TestClient, fake: FakeClient) -> None:
    out = app.post("/v1/completions", json={"model": "m", "prompt": ["Once"]}).json()
    assert fake.calls[-1][2] == "Once"  # a batch of one
    assert fake.calls[-1][3]["max_tokens"] == 16
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"] == "Hello there"
    app.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3], "logprobs": 1})
    assert fake.calls[-1][2] == [1, 2, 3]
    assert fake.calls[-1][3]["logprobs"] == 1


def test_embeddings_as_floats_and_base64(app: TestClient, fake: FakeClient) -> None:
    out = app.post("/v1/embeddings", json={"model": "m", "input": ["a b", "c"]}).json()
    assert [d["embedding"] for d in out["data"]] == [[0.5, -0.25, 2.0], [0.5, -0.25, 1.0]]
    assert out["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    b64 = app.post(
        "/v1/embeddings", json={"model": "m", "input": "a b", "encoding_format": "base64"}
    ).json()
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert struct.unpack("<3f", raw) == (0.5, -0.25, 2.0)


def test_models_list(app: TestClient) -> None:
    entry = {"id": "m", "object": "model", "created": 12, "owned_by": "llamad"}
    assert app.get("/v1/models").json() == {"object": "list", "data": [entry]}
    assert app.get("/v1/models/m").json() == entry
    missing = app.get("/v1/models/x")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "n": 2}, "n"),
        ({"messages": CHAT["messages"]}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "max_tokens": 1.5}, "max_tokens"),
        ({**CHAT, "stop": [1]}, "stop"),
        ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
        ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({**CHAT, "response_format": {"type": "yaml"}}, "response_format"),
        ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "cache_salt": 3}, "cache_salt"),
    ],
)
def test_bad_chat_fields_are_400_naming_the_field(
    app: TestClient, fake: FakeClient, body: dict[str, Any], param: str
) -> None:
    r = app.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert fake.calls == []


@pytest.mark.parametrize(
    "prompt", [[1, True, 3], [1, 2.0], [1, "2"], [], [[1], [2]], [1, None], {"a": 1}]
)
def test_a_completions_prompt_is_a_string_or_token_ids_only(
    app: TestClient, fake: FakeClient, prompt: Any
) -> None:
    """Token ids are ints: a bool (an int to Python), a float, a string among
    them, an empty list or a batch of several is refused naming ``prompt``."""
    r = app.post("/v1/completions", json={"model": "m", "prompt": prompt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt"
    assert fake.calls == []


@pytest.mark.parametrize(
    ("error", "status", "code", "kind"),
    [
        (ModelNotFound("no model 'x'"), 404, "model_not_found", "invalid_request_error"),
        (
            SchemaError("bad schema", details={"field": "json_schema"}),
            400,
            "bad_schema",
            "invalid_request_error",
        ),
        (Overloaded("queue full"), 429, "overloaded", "rate_limit_error"),
        (WorkerCrashed("gone"), 502, "worker_crashed", "server_error"),
        (RequestTimeout("no first token"), 504, "timeout", "server_error"),
        (RuntimeError("bug"), 500, "internal", "server_error"),
    ],
)
def test_llamad_errors_map_to_status_and_openai_shape(
    app: TestClient, fake: FakeClient, error: Exception, status: int, *, code: str, kind: str
) -> None:
    fake.raises = error
    r = app.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["type"] == kind


def test_every_mapped_status_is_an_http_error_status() -> None:
    assert all(400 <= s < 600 for s in STATUS.values())


def test_unknown_routes_and_methods_in_openai_shape(app: TestClient) -> None:
    r = app.get("/v1/nope")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    r = app.get("/v1/chat/completions")
    assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")
    assert r.headers["allow"] == "POST"  # RFC 9110: a 405 names the methods served


def test_each_protocol_is_built_on_its_first_request(fake: FakeClient) -> None:
    gate = Gate(HttpSection(), cast(AsyncClient, fake))
    app = build_app(gate)
    client = TestClient(app)
    assert app.loaded() == []  # idle: no protocol module's routes built
    assert client.get("/v1/models").status_code == 200
    assert app.loaded() == ["openai"]
    # An unknown path under a prefix builds that protocol, and has its shape.
    r = client.get("/v1/messages/nope")
    assert r.status_code == 404 and r.json()["type"] == "error"
    r = client.get("/api/nope")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    r = client.get("/v1/responses/resp_nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert app.loaded() == ["anthropic", "ollama", "openai", "openai-responses"]
    # A path under no prefix is OpenAI's, whose table is built already.
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert "prometheus" not in app.loaded()


def test_a_body_too_large_or_not_json_is_refused(fake: FakeClient) -> None:
    app = _app(fake, max_body_bytes=1024)
    r = app.post("/v1/chat/completions", content=b"x" * 2000)
    assert (r.status_code, r.json()["error"]["code"]) == (413, "too_large")
    r = app.post("/v1/chat/completions", content=b"[1, 2]")
    assert r.status_code == 400
    assert fake.calls == []


# -- keys, tenants, limits -------------------------------------------------------------------


def _keyed(fake: FakeClient, **http: Any) -> TestClient:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    keys = {"k": HttpKey(sha256=digest, tenant="acme")}
    return _app(fake, keys=keys, **http)


def test_with_keys_a_request_needs_one(fake: FakeClient) -> None:
    app = _keyed(fake)
    assert app.get("/v1/models").status_code == 401
    bad = app.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert (bad.status_code, bad.json()["error"]["type"]) == (401, "authentication_error")
    assert app.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert app.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200


def test_a_tenants_requests_carry_its_salt(fake: FakeClient) -> None:
    app = _keyed(fake)
    auth = {"Authorization": f"Bearer {KEY}"}
    app.post("/v1/chat/completions", json=CHAT, headers=auth)
    assert fake.calls[-1][3]["cache_salt"] == "t/acme"
    app.post("/v1/completions", json={"model": "m", "prompt": "x", "cache_salt": "s"}, headers=auth)
    assert fake.calls[-1][3]["cache_salt"] == "t/acme/s"
    app.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth)
    assert fake.calls[-1][3]["cache_salt"] == "t/acme"


def test_a_salt_without_a_tenant_cannot_name_a_tenants_namespace(
    app: TestClient, fake: FakeClient
) -> None:
    app.post("/v1/chat/completions", json={**CHAT, "cache_salt": "t/acme"})
    assert fake.calls[-1][3]["cache_salt"] == "u/t/acme"


def test_requests_carry_the_configured_timeouts(fake: FakeClient) -> None:
    app = _app(fake, request_timeout_s=12.0, idle_timeout_s=3.0)
    app.post("/v1/chat/completions", json=CHAT)
    assert fake.calls[-1][3]["timeout"] == 12.0
    app.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert fake.calls[-1][3]["timeout"] == 12.0
    assert fake.calls[-1][3]["idle_timeout"] == 3.0
    app.post("/v1/embeddings", json={"model": "m", "input": "x"})
    assert fake.calls[-1][3]["timeout"] == 12.0


def test_the_running_requests_of_a_key_are_bounded() -> None:
    gate = Gate(HttpSection(max_streams_per_key=2), cast(AsyncClient, FakeClient()))
    who = Caller("k")
    first, second = gate._take_slot(who), gate._take_slot(who)
    with pytest.raises(HttpError) as caught:
        gate._take_slot(who)
    assert caught.value.code == "too_many_streams" and STATUS[caught.value.code] == 429
    gate._take_slot(Caller("other"))()  # another key's own count
    first()
    first()  # idempotent
    gate._take_slot(who)()
    second()
    assert gate.running() == {}


def test_keys_http_prints_a_key_its_table_admits(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib  # noqa: PLC0415

    assert cli_main(["keys", "http", "laptop", "--tenant", "acme"]) == 0
    out = capsys.readouterr().out
    key = out.split()[1]
    table = tomllib.loads(out[out.index("[http.keys.laptop]") :])["http"]["keys"]["laptop"]
    assert table == {"sha256": hashlib.sha256(key.encode()).hexdigest(), "tenant": "acme"}
    assert key.startswith("sk-llamad-") and len(key) > 40


def test_openai_module_names_its_error_codes() -> None:
    body = openai.error_body(400, "context_overflow", "too long", None)
    assert body["error"]["code"] == "context_length_exceeded"
