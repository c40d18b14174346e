"""A cancel stops the decode under way (issue 21), through a real daemon.

The model prefills in 256-row chunks, one ``llama_decode`` each: seconds
on one thread. A cancel sent while the first chunk of a long prompt
decodes must end the request before that chunk lands (the abort check
stops ``llama_decode`` between graph nodes), leave the context as if the
chunk never ran, and leave the request decoding beside it untouched.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from daemon_proc import DaemonProc, start_served
from llamad import Client, FinishReason
from llamad.model.results import WorkerPhase
from llamad.testing.launcher import wait_until
from served import EVENTUALLY, prompt_text

pytestmark = [pytest.mark.timeout(600), pytest.mark.model]

CHUNK = 256
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def served() -> Iterator[DaemonProc]:
    yield from start_served(
        n_ctx=2048,
        n_batch=CHUNK,
        n_ubatch=CHUNK,
        prefill_chunk_size=CHUNK,
        n_seq_max=2,
    )


@pytest.fixture(scope="module")
def client(served: DaemonProc) -> Iterator[Client]:
    with Client(served.endpoint, timeout=300) as c:
        yield c


def test_a_cancel_mid_prefill_stops_the_chunk_under_way_and_leaves_the_context_consistent(
    served: DaemonProc, client: Client
) -> None:
    model = served.model_id
    long_prompt = client.tokenize(model, prompt_text(211, words=300))[:280]
    assert len(long_prompt) == 280
    other_prompt = prompt_text(212, words=12)
    # Solo references, each in a namespace of its own (no row or live KV is
    # shared with the runs below).
    solo_long = client.complete(model, long_prompt, max_tokens=4, cache_salt="solo", **GREEDY)
    solo_other = client.complete(model, other_prompt, max_tokens=12, cache_salt="solo2", **GREEDY)

    # The other request generates one row a step; the long prompt's first
    # chunk joins its batch.
    other = client.infer(model, other_prompt, max_tokens=12, cache_salt="beside", **GREEDY)
    victim = client.infer(
        model, long_prompt, request_id="victim", max_tokens=4, cache_salt="cut", **GREEDY
    )

    def chunk_under_way() -> bool:
        snap = served.board()
        # Published just before each decode: both sequences busy, one prefilling.
        return (
            snap is not None
            and snap.busy_since is not None
            and snap.status.active_sequences == 2
            and snap.status.phase is WorkerPhase.PREFILLING
        )

    wait_until(chunk_under_way, "the long prompt's first chunk to decode", EVENTUALLY)
    with Client(served.endpoint, timeout=60) as other_client:
        assert other_client.cancel("victim", model_id=model)
    done = victim.completion()
    assert done.finish_reason is FinishReason.CANCELLED
    # Stopped inside its first chunk: not one of its tokens was committed.
    assert done.stats.prefill_tokens == 0
    beside = other.completion()
    assert beside.generated == solo_other.generated

    # The cancelled sequence's cells are gone: the same prompt again (in the
    # cancelled run's namespace) runs cold and replies as the solo run did.
    again = client.complete(model, long_prompt, max_tokens=4, cache_salt="cut", **GREEDY)
    assert again.generated == solo_long.generated
    assert again.stats.prefill_tokens == len(long_prompt)
