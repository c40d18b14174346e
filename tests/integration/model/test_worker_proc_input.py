"""Bad input is refused with a typed error and the worker goes on serving: the same
process answers the next good request (SPEC M6, M7, ARCHITECTURE "Messages")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from llamad.actors import Client
from llamad.actors.wire import PROTOCOL_VERSION, Kind
from llamad.errors import (
    BadRequest,
    ContextOverflow,
    LlamadError,
    NoSession,
    SchemaError,
    UnknownOp,
)
from llamad.llama_ffi.errors import GrammarError, InvalidToken
from llamad.model.results import FinishReason
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(n_ctx=512, n_batch=128, n_seq_max=2, prefix="lmi")


@pytest.fixture
def worker(tree: WorkerTree) -> Iterator[WorkerClient]:
    pid = tree.pid()
    w = tree.client()
    yield w
    # Still the same process, and it still serves.
    assert tree.pid() == pid
    ok = w.complete(prompt_text(1, words=8), max_tokens=2, temperature=0.0)
    assert ok.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)


def test_token_id_outside_the_vocabulary_is_invalid_token(worker: WorkerClient) -> None:
    n_vocab = 49152
    with pytest.raises(InvalidToken) as exc:
        worker.complete([1, 2, n_vocab], max_tokens=2)
    assert exc.value.details["index"] == 2
    with pytest.raises(InvalidToken):
        worker.complete([-1], max_tokens=2)


def test_prompt_longer_than_the_context_is_context_overflow(worker: WorkerClient) -> None:
    with pytest.raises(ContextOverflow):
        worker.complete([1] * 600, max_tokens=2)


def test_invalid_grammar_and_schema_are_refused_at_submit(worker: WorkerClient) -> None:
    with pytest.raises(GrammarError) as refused:
        worker.complete("hi", grammar="root ::= (", max_tokens=2)
    # llama.cpp's own reason reaches the client, not a pointer to a log it cannot see.
    assert "expecting ')'" in refused.value.message
    with pytest.raises(SchemaError):
        worker.complete("hi", json_schema={"type": "no-such-type"}, max_tokens=2)


def test_absurd_parameters_are_bad_requests_naming_the_field(tree: WorkerTree) -> None:
    raw = tree.client().actor
    for params, field in [
        ({"max_tokens": 10**9}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"logprobs": 999}, "logprobs"),
        ({"stop": ["x"] * 100}, "stop"),
    ]:
        with pytest.raises(BadRequest) as exc:
            raw.call("complete", {"prompt": "hi", "params": params})
        assert exc.value.details.get("field") == field, params


def test_unknown_session_is_no_session(worker: WorkerClient) -> None:
    with pytest.raises(NoSession):
        worker.end_session("never-was")
    with pytest.raises(NoSession):
        worker.reset_session("never-was")
    with pytest.raises(NoSession):
        worker.fork_session("never-was", "child")


def test_malformed_chat_messages_are_bad_requests(worker: WorkerClient) -> None:
    for messages in (
        [{"content": "no role"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": "x", "tool_calls": "not a list"}],
    ):
        with pytest.raises(BadRequest):
            worker.complete(messages=messages, max_tokens=2)


@pytest.mark.parametrize(
    ("op", "body"),
    [
        ("complete", {"prompt": "x", "surprise": True}),
        ("complete", {"prompt": {"not": "a prompt"}}),
        ("complete", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}),
        ("complete", "not a map"),
        ("infer", {"prompt": ["a", "b"]}),
        ("cancel", {"request_id": 7}),
        ("tokenize", {}),
    ],
)
def test_malformed_body_is_a_bad_request(tree: WorkerTree, op: str, body: Any) -> None:
    raw = tree.client().actor
    with pytest.raises(BadRequest):
        if op == "infer":
            list(raw.stream(op, body))
        else:
            raw.call(op, body)


def test_unknown_op_is_refused(tree: WorkerTree) -> None:
    with pytest.raises(UnknownOp):
        tree.client().actor.call("explode", {})


def test_garbage_frames_leave_the_worker_serving(tree: WorkerTree, worker: WorkerClient) -> None:
    """Raw frames that are not even an envelope: answered (or dropped) at the door."""
    entry = tree.registry.lookup(tree.spec.actor_name)
    assert entry is not None
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(entry.endpoint)
        sock.send(b"\xc1 definitely not msgpack")
        err = msgspec.msgpack.decode(sock.recv())
        assert err[1] == Kind.ERROR and err[4]["code"] == "bad_request"
        # A well-formed request from a peer that never said hello.
        sock.send(msgspec.msgpack.encode([PROTOCOL_VERSION, int(Kind.CALL), 1, "status", {}]))
        err = msgspec.msgpack.decode(sock.recv())
        assert err[4]["code"] == "bad_request"
    finally:
        sock.close()
        ctx.term()


def test_each_error_class_arrives_as_itself(tree: WorkerTree) -> None:
    """The client rebuilds the worker's typed errors (not a generic one)."""
    raw: Client = tree.client().actor
    with pytest.raises(LlamadError) as exc:
        raw.call("complete", {"prompt": [1] * 600})
    assert type(exc.value) is ContextOverflow
