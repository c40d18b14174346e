"""Every error a request can meet arrives as its own class, and timeouts hold.

The served model has no admission queue (``max_queue=0``), so a fifth
request while four run is refused with ``overloaded``. After each refusal
the worker goes on serving.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from daemon_proc import start_served
from llamad import (
    AdapterError,
    BadRequest,
    Client,
    ClientClosed,
    ContextOverflow,
    GrammarError,
    InvalidToken,
    LlamadError,
    ModelNotFound,
    NoSession,
    Overloaded,
    RequestTimeout,
    SchemaError,
    SessionExists,
    Stream,
    TokenEvent,
)
from served import ENDLESS, MANY, Served, prompt_text

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from start_served(max_queue=0)


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[Client]:
    with Client(served.endpoint, timeout=120) as c:
        yield c


@pytest.fixture(autouse=True)
def _still_serving(served: Served, client: Client) -> Iterator[None]:
    """Whatever a test provoked, the worker still answers afterwards."""
    yield
    served.wait_idle()
    assert client.complete(served.model_id, "Hi", max_tokens=1).stats.completion_tokens == 1


def _code(exc: LlamadError) -> str:
    return exc.code


@pytest.mark.parametrize(
    ("kwargs", "cls"),
    [
        ({"prompt": [10**7]}, InvalidToken),
        ({"prompt": ""}, BadRequest),
        ({"prompt": "x", "grammar": "root ::= ("}, GrammarError),
        ({"prompt": "x", "json_schema": {"type": "bogus"}}, SchemaError),
        ({"prompt": "x", "session_id": "nobody", "continue_": True}, NoSession),
    ],
)
def test_a_refused_request_raises_its_own_class(
    served: Served, client: Client, kwargs: dict[str, object], cls: type[LlamadError]
) -> None:
    with pytest.raises(cls) as info:
        client.complete(served.model_id, max_tokens=1, **kwargs)  # type: ignore[arg-type]
    assert type(info.value) is cls
    assert _code(info.value) == cls.code


def test_a_prompt_longer_than_the_context_is_context_overflow(
    served: Served, client: Client
) -> None:
    too_long = client.tokenize(served.model_id, prompt_text(1, words=2600))
    assert len(too_long) > 2048
    with pytest.raises(ContextOverflow):
        client.complete(served.model_id, too_long, max_tokens=1)
    with pytest.raises(ContextOverflow):
        list(client.infer(served.model_id, too_long, max_tokens=1))


def test_an_unknown_model_is_model_not_found(client: Client) -> None:
    with pytest.raises(ModelNotFound):
        client.complete("no-such-model", "Hi", max_tokens=1)
    with pytest.raises(ModelNotFound):
        client.tokenize("no-such-model", "Hi")


def test_bad_parameters_are_refused_before_sending(served: Served, client: Client) -> None:
    # Settled: the previous test's refusals are counted a moment after their answers.
    before = served.settled_board()
    for bad in ({"max_tokens": -1}, {"max_tokens": 1 << 30}, {"top_p": 0.0}, {"stop": [""]}):
        with pytest.raises(BadRequest) as info:
            client.complete(served.model_id, "Hi", **bad)  # type: ignore[arg-type]
        assert info.value.details["field"]
    after = served.settled_board()
    assert after.requests_total == before.requests_total


def test_forking_into_a_taken_session_id_is_session_exists(served: Served, client: Client) -> None:
    client.complete(served.model_id, prompt_text(300), session_id="a", max_tokens=1)
    client.complete(served.model_id, prompt_text(301), session_id="b", max_tokens=1)
    with pytest.raises(SessionExists):
        client.fork_session(served.model_id, "a", "b")
    with pytest.raises(NoSession):
        client.fork_session(served.model_id, "nobody", "c")
    client.end_session(served.model_id, "a")
    client.end_session(served.model_id, "b")


def test_an_unknown_adapter_is_adapter_error(served: Served, client: Client) -> None:
    with pytest.raises(AdapterError):
        client.unload_adapter(served.model_id, "nope")
    assert client.list_adapters(served.model_id) == []


def test_a_full_worker_refuses_with_overloaded(served: Served, client: Client) -> None:
    streams: list[Stream] = []
    try:
        for i in range(4):
            # A grammar that never lets the model stop: a sequence freed by an
            # end-of-generation token would admit the fifth request.
            stream = client.infer(
                served.model_id, prompt_text(310 + i), max_tokens=300, grammar=ENDLESS
            )
            next(stream)  # admitted and generating
            streams.append(stream)
        with pytest.raises(Overloaded):
            client.complete(served.model_id, "Hi", max_tokens=1)
    finally:
        for stream in streams:
            stream.close()


def test_a_call_past_its_timeout_raises_and_the_worker_drops_it(
    served: Served, client: Client
) -> None:
    before = served.ticks()
    with pytest.raises(RequestTimeout):
        client.complete(
            served.model_id, prompt_text(320), max_tokens=MANY, grammar=ENDLESS, timeout=0.3
        )
    served.assert_dropped(before)


def test_a_stream_past_its_first_token_timeout_raises(served: Served, client: Client) -> None:
    # A cold prompt of some 2,000 tokens takes seconds to prefill on one thread.
    long = prompt_text(330, words=1500)
    stream = client.infer(served.model_id, long, max_tokens=4, timeout=0.05)
    with pytest.raises(RequestTimeout):
        next(stream)
    assert stream.finished
    served.wait_idle(timeout=10)


def test_a_stream_past_its_idle_timeout_raises(served: Served, client: Client) -> None:
    before = served.ticks()
    stream = client.infer(
        served.model_id, prompt_text(331), max_tokens=MANY, grammar=ENDLESS, idle_timeout=0.0005
    )
    with pytest.raises(RequestTimeout):
        for event in stream:
            assert isinstance(event, TokenEvent)
    served.assert_dropped(before)


def test_a_closed_client_refuses_calls(served: Served) -> None:
    c = Client(served.endpoint)
    c.close()
    with pytest.raises(ClientClosed):
        c.tokenize(served.model_id, "Hi")
