"""A decode stopped under way (issue 21: cancel and hang within a tick).

llama.cpp's abort check stops a ``llama_decode`` between graph nodes; it
drops the rows of the micro-batch it was computing and keeps those of
earlier micro-batches of the same call. ``StubBackend.abort_next`` plays
that: the first ``rows`` rows land, the rest do not. The core must put every
sequence of the batch back where the plan found it, end a cancelled request,
plan the other rows again, and fail the batch's requests ``timeout`` when the
decode ran past its deadline.
"""

from __future__ import annotations

import pytest

from llamad.model.results import FinishReason
from worker_harness import Harness, make, prompt

pytestmark = pytest.mark.timeout(60)

LONG = prompt(60, start=3)
OTHER = prompt(40, start=11)


def _solo(tokens: list[int], max_tokens: int) -> list[int]:
    return (
        make(n_seq_max=2, n_batch=64, chunk=32)
        .complete("solo", tokens, max_tokens=max_tokens)
        .generated
    )


def _consistent(h: Harness) -> None:
    """The backend's KV of every sequence is what the core thinks it holds."""
    for slot in h.core.slots:
        assert h.backend.tokens[slot.seq] == list(slot.kv), slot.seq


def test_a_cancel_that_stops_a_decode_drops_its_rows_and_the_other_reply_is_its_solo_one() -> None:
    h = make(n_seq_max=2, n_batch=64, chunk=32)
    h.submit("victim", LONG, max_tokens=4)
    h.submit("other", OTHER, max_tokens=6)
    h.step()  # both prefill a chunk
    held = {s.seq: len(s.kv) for s in h.core.slots}
    victim_seq = h.core.requests["victim"].seq
    # The victim's cancel arrives during the next decode, which the shell's
    # probe then stops after 20 rows (an earlier micro-batch landed).

    def probe() -> bool:
        h.backend.probe = None
        assert h.core.decoding
        return h.core.cancel("victim")

    h.backend.probe = probe
    h.backend.probe_rows = 20
    h.step()
    assert h.backend.aborts == 1
    # Nothing of the stopped step counts, for either sequence.
    assert {s.seq: len(s.kv) for s in h.core.slots} == held
    _consistent(h)
    h.run()
    done = h.result("victim")
    assert done.finish_reason is FinishReason.CANCELLED
    assert done.generated == []
    assert h.result("other").generated == _solo(OTHER, 6)
    _consistent(h)
    assert victim_seq is not None


def test_a_decode_stopped_without_a_cancel_is_planned_again_and_changes_no_reply() -> None:
    h = make(n_seq_max=2, n_batch=64, chunk=32)
    h.submit("a", LONG, max_tokens=5)
    h.submit("b", OTHER, max_tokens=5)
    h.step()
    for rows in (0, 17, 30):  # none landed, part of the batch, all but its last row
        h.backend.abort_next = ("stop", rows)
        h.step()
        _consistent(h)
    h.run()
    assert h.backend.aborts == 3
    assert h.result("a").generated == _solo(LONG, 5)
    assert h.result("b").generated == _solo(OTHER, 5)


def test_a_decode_past_its_deadline_fails_its_requests_with_timeout_and_the_worker_serves_on() -> (
    None
):
    h = make(n_seq_max=2, n_batch=64, chunk=32)
    h.submit("slow", LONG, max_tokens=4)
    h.step()
    h.backend.abort_next = ("deadline", 10)
    h.step()
    err = h.error("slow")
    assert err.code == "timeout"
    assert err.details["where"] == "decode"
    assert not h.core.requests
    _consistent(h)
    assert h.complete("next", OTHER, max_tokens=3).generated == _solo(OTHER, 3)


def test_a_queued_request_cancelled_during_a_decode_ends_at_the_next_tick() -> None:
    h = make(n_seq_max=1, n_batch=64, chunk=32)
    h.submit("running", LONG, max_tokens=3)
    h.step()
    h.submit("queued", OTHER, max_tokens=3)
    # As the shell's probe does, from inside the decode: only a mark.
    h.core.decoding = True
    assert h.core.cancel("queued")
    h.core.decoding = False
    assert "queued" in h.core.requests
    h.step()
    assert h.result("queued").finish_reason is FinishReason.CANCELLED
    assert "queued" not in h.core.queue
    h.run()
    assert h.result("running").generated == _solo(LONG, 3)
