"""The Anthropic and Ollama routes through the gate, with a fake client (no daemon):
keys, tenants' salts, errors after the first event, keep_alive's order."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from llamad.client.aio import AsyncClient
from llamad.config.sections import HttpKey, HttpSection
from llamad.errors import ContextOverflow, WorkerCrashed
from llamad.front.wire import ModelInfo, ModelState
from llamad.gateway.app import build_app
from llamad.gateway.gate import Gate
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    DoneEvent,
    FinishReason,
    Stats,
    TokenEvent,
)

pytestmark = pytest.mark.timeout(30)

KEY = "sk-acme-1"


def _completion(reply: str = "Hi") -> Completion:
    return Completion(
        reply=reply,
        generated=[1, 2],
        context_tokens=[7, 8, 1, 2],
        committed_tokens=3,
        cache_hit_kind=CacheHitKind.PARTIAL,
        finish_reason=FinishReason.STOP,
        stats=Stats(prompt_tokens=2, completion_tokens=2),
        cache_delta=CacheDelta(read=1, created=1),
    )


class _Stream:
    def __init__(self, events: list[Any], error: Exception | None) -> None:
        self.events = events
        self.error = error
        self.taken = 0

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
        pass


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self.events: list[Any] = [TokenEvent("Hi", 1), DoneEvent(_completion())]
        self.stream_error: Exception | None = None

    async def complete(self, model_id: str, prompt: Any = None, **kw: Any) -> Completion:
        self.calls.append(("complete", model_id, kw))
        return _completion()

    async def infer(self, model_id: str, prompt: Any = None, **kw: Any) -> _Stream:
        self.calls.append(("infer", model_id, kw))
        return _Stream(self.events, self.stream_error)

    async def tokenize(self, model_id: str, text: str, **kw: Any) -> list[int]:
        self.calls.append(("tokenize", model_id, kw))
        return [5] * len(text.split())

    async def apply_chat_template(self, model_id: str, messages: Any, **kw: Any) -> list[int]:
        self.calls.append(("apply_chat_template", model_id, kw))
        return [1, 2, 3]

    async def set_keep_alive(self, model_id: str, seconds: float | None, **kw: Any) -> None:
        self.calls.append(("set_keep_alive", model_id, {"seconds": seconds}))

    async def list_models(self, **kw: Any) -> list[ModelInfo]:
        return [ModelInfo(model_id="m", path="/nonexistent.gguf", state=ModelState.READY)]


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


@pytest.fixture
def app(fake: FakeClient) -> TestClient:
    keys = {"acme": HttpKey(sha256=hashlib.sha256(KEY.encode()).hexdigest(), tenant="acme")}
    gate = Gate(HttpSection(keys=keys), cast(AsyncClient, fake))
    return TestClient(build_app(gate))


MESSAGES = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC_KEY = {"x-api-key": KEY}
BEARER = {"Authorization": f"Bearer {KEY}"}


def test_a_tenants_requests_carry_its_salt(app: TestClient, fake: FakeClient) -> None:
    for stream in (False, True):
        ok = app.post("/v1/messages", json={**MESSAGES, "stream": stream}, headers=ANTHROPIC_KEY)
        assert ok.status_code == 200
        assert fake.calls[-1][2]["cache_salt"] == "t/acme"
        ok = app.post("/api/chat", json={**CHAT, "stream": stream}, headers=BEARER)
        assert ok.status_code == 200
        assert fake.calls[-1][2]["cache_salt"] == "t/acme"
    ok = app.post("/api/generate", json={"model": "m", "prompt": "x"}, headers=BEARER)
    assert ok.status_code == 200
    assert fake.calls[-1][2]["cache_salt"] == "t/acme"


def test_without_a_key_each_protocol_refuses_in_its_shape(app: TestClient) -> None:
    refused = app.post("/v1/messages", json=MESSAGES)
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    refused = app.post("/api/chat", json=CHAT)
    assert refused.status_code == 401
    assert set(refused.json()) == {"error"}
    assert app.get("/api/tags").status_code == 401


def test_an_anthropic_stream_failing_after_its_first_event_ends_with_an_error_event(
    app: TestClient, fake: FakeClient
) -> None:
    fake.events = [TokenEvent("Hi", 1)]
    fake.stream_error = WorkerCrashed("the worker died")
    out = app.post("/v1/messages", json={**MESSAGES, "stream": True}, headers=ANTHROPIC_KEY)
    assert out.status_code == 200
    events = [line[len("event: ") :] for line in out.text.splitlines() if line.startswith("event:")]
    assert events[0] == "message_start"
    assert events[-1] == "error"
    data = [
        json.loads(line[len("data: ") :])
        for line in out.text.splitlines()
        if line.startswith("data:")
    ]
    assert data[-1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "the worker died"},
    }


def test_a_refusal_before_the_first_event_keeps_its_status(
    app: TestClient, fake: FakeClient
) -> None:
    fake.events = []
    fake.stream_error = ContextOverflow("too long")
    out = app.post("/v1/messages", json={**MESSAGES, "stream": True}, headers=ANTHROPIC_KEY)
    assert out.status_code == 400
    assert out.json()["error"] == {"type": "invalid_request_error", "message": "too long"}
    out = app.post("/api/chat", json=CHAT, headers=BEARER)
    assert out.status_code == 400
    assert out.json() == {"error": "too long"}


def test_an_ollama_stream_failing_after_its_first_line_ends_with_an_error_line(
    app: TestClient, fake: FakeClient
) -> None:
    fake.events = [TokenEvent("Hi", 1)]
    fake.stream_error = WorkerCrashed("the worker died")
    out = app.post("/api/chat", json=CHAT, headers=BEARER)
    assert out.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in out.text.splitlines()]
    assert lines[0]["message"]["content"] == "Hi"
    assert lines[-1] == {"error": "the worker died"}


def test_keep_alive_durations_go_before_the_request_and_zero_after(
    app: TestClient, fake: FakeClient
) -> None:
    app.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": "5m"}, headers=BEARER)
    assert [c[0] for c in fake.calls] == ["set_keep_alive", "complete"]
    assert fake.calls[0][2] == {"seconds": 300.0}
    fake.calls.clear()
    app.post("/api/chat", json={**CHAT, "keep_alive": 0}, headers=BEARER)
    assert [c[0] for c in fake.calls] == ["infer", "set_keep_alive"]
    assert fake.calls[1][2] == {"seconds": 0.0}
    fake.calls.clear()
    app.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": -1}, headers=BEARER)
    assert fake.calls[0] == ("set_keep_alive", "m", {"seconds": None})


def test_an_empty_generate_only_loads_or_unloads(app: TestClient, fake: FakeClient) -> None:
    loaded = app.post("/api/generate", json={"model": "m:latest"}, headers=BEARER).json()
    assert loaded["done_reason"] == "load"
    assert [c[:2] for c in fake.calls] == [("tokenize", "m")]
    fake.calls.clear()
    gone = app.post("/api/generate", json={"model": "m", "keep_alive": 0}, headers=BEARER).json()
    assert gone["done_reason"] == "unload"
    assert fake.calls == [("set_keep_alive", "m", {"seconds": 0.0})]


def test_count_tokens_renders_the_prompt(app: TestClient, fake: FakeClient) -> None:
    body = {"model": "m", "system": "S", "messages": [{"role": "user", "content": "hi"}]}
    out = app.post("/v1/messages/count_tokens", json=body, headers=ANTHROPIC_KEY)
    assert out.json() == {"input_tokens": 3}
    assert fake.calls[-1][0] == "apply_chat_template"


def test_generate_with_context_sends_its_tokens_then_the_prompts(
    app: TestClient, fake: FakeClient
) -> None:
    body = {"model": "m", "prompt": "a b", "context": [7, 8], "stream": False}
    app.post("/api/generate", json=body, headers=BEARER)
    assert fake.calls[0] == ("tokenize", "m", {"add_special": False})
    assert fake.calls[1][0] == "complete"


def test_unsupported_ollama_routes_are_501(app: TestClient) -> None:
    out = app.post("/api/pull", json={"model": "m"}, headers=BEARER)
    assert out.status_code == 501
    assert "GGUF" in out.json()["error"]
    assert app.delete("/api/delete", headers=BEARER).status_code == 501
