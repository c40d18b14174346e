"""Each request's events reach its own client end, the terminal closes it, and a
client that goes away cancels its request (SPEC M7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llamad.errors import ContextOverflow, LlamadError
from llamad.model.deliveries import Deliveries
from llamad.model.results import (
    CacheHitKind,
    Completion,
    DoneEvent,
    ErrorEvent,
    FinishReason,
    Stats,
    ThinkingEvent,
    TokenEvent,
)

pytestmark = pytest.mark.timeout(60)


class FakeHandle:
    """Records what a StreamSender / PendingReply was asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.done = False
        self._callbacks: list[Callable[[str], None]] = []

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        self._callbacks.append(callback)

    def cancel(self, reason: str) -> None:
        if not self.done:
            self.done = True
            for cb in self._callbacks:
                cb(reason)

    def _close(self, what: str, body: Any) -> bool:
        assert not self.done, f"{what} after the terminal"
        self.done = True
        self._callbacks.clear()
        self.sent.append((what, body))
        return True

    def emit(self, body: Any = None, blobs: Any = ()) -> bool:
        assert not self.done
        self.sent.append(("emit", body))
        return True

    def end(self, body: Any = None, blobs: Any = ()) -> bool:
        return self._close("end", body)

    def reply(self, body: Any = None, blobs: Any = ()) -> bool:
        return self._close("reply", body)

    def fail(self, error: BaseException) -> bool:
        return self._close("fail", error)


def completion(reply: str = "hi") -> Completion:
    return Completion(
        reply=reply,
        generated=[1],
        context_tokens=[0, 1],
        committed_tokens=1,
        cache_hit_kind=CacheHitKind.COLD,
        finish_reason=FinishReason.STOP,
        stats=Stats(),
    )


def test_stream_gets_every_event_then_ends_with_the_completion() -> None:
    d = Deliveries()
    h = FakeHandle()
    d.add_stream("a", h, lambda rid: pytest.fail("not gone"))
    d.deliver("a", TokenEvent("h", 1))
    d.deliver("a", ThinkingEvent("hmm"))
    d.deliver("a", DoneEvent(completion()))
    assert [w for w, _ in h.sent] == ["emit", "emit", "end"]
    assert h.sent[2][1] == completion()
    assert "a" not in d
    d.deliver("a", TokenEvent("late", 2))  # after the terminal: dropped
    assert len(h.sent) == 3


def test_error_event_fails_the_stream_with_the_typed_error() -> None:
    d = Deliveries()
    h = FakeHandle()
    d.add_stream("a", h, lambda rid: None)
    wire = ContextOverflow("too long", details={"n_ctx": 8}).to_wire()
    d.deliver("a", ErrorEvent(wire["code"], wire["message"], wire["details"]))
    ((what, err),) = h.sent
    assert what == "fail"
    assert isinstance(err, ContextOverflow) and err.details == {"n_ctx": 8}


def test_call_gets_only_the_terminal() -> None:
    d = Deliveries()
    h = FakeHandle()
    d.add_reply("c", h, lambda rid: None)
    d.deliver("c", TokenEvent("h", 1))
    d.deliver("c", DoneEvent(completion("x")))
    assert h.sent == [("reply", completion("x"))]


def test_unknown_error_code_still_fails_the_call() -> None:
    d = Deliveries()
    h = FakeHandle()
    d.add_reply("c", h, lambda rid: None)
    d.deliver("c", ErrorEvent("no_such_code", "boom"))
    ((what, err),) = h.sent
    assert what == "fail" and isinstance(err, LlamadError)


def test_client_gone_cancels_its_request_once() -> None:
    d = Deliveries()
    h = FakeHandle()
    gone: list[str] = []
    d.add_stream("a", h, gone.append)
    h.cancel("peer_died")
    assert gone == ["a"]
    assert "a" not in d
    d.deliver("a", DoneEvent(completion()))  # the cancelled request's done: nobody to tell
    assert h.sent == []


def test_finished_request_is_not_cancelled_by_a_late_disconnect() -> None:
    d = Deliveries()
    h = FakeHandle()
    gone: list[str] = []
    d.add_stream("a", h, gone.append)
    d.deliver("a", DoneEvent(completion()))
    h.cancel("peer_closed")
    assert gone == []


def test_reused_id_is_not_cancelled_by_the_old_clients_departure() -> None:
    d = Deliveries()
    old, new = FakeHandle(), FakeHandle()
    gone: list[str] = []
    d.add_reply("a", old, gone.append)
    d.forget("a")
    d.add_reply("a", new, gone.append)
    old.cancel("peer_died")
    assert gone == []
    assert "a" in d
