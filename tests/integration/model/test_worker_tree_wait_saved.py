"""The worker tree's ``wait_saved`` against a real cache-meta: a row whose save
is not even reserved yet when the test asks is still waited for (issue 8: the
writer reserves a finish save on its own thread, and a lookup made before
that is answered with a miss at once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.tier_kind import TierKind
from llamad.cache.writer import WriterPool
from llamad.testing import MetaProcess, discard_scratch
from worker_tree import WorkerTree

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tree() -> Iterator[WorkerTree]:
    # Only the tree's cache is started: wait_saved talks to cache-meta alone.
    t = WorkerTree(prefix="lwts")
    meta = MetaProcess(t.settings).start()
    try:
        yield t
    finally:
        meta.stop()
        discard_scratch(t.settings)


def test_wait_saved_waits_for_a_save_not_yet_reserved(tree: WorkerTree) -> None:
    ns = Namespace(fingerprint=b"\x11" * 32, quant=3, ctx_hash=b"\x22" * 32)
    spec = KvcSpec(
        namespace=ns,
        tokens=tokens_to_bytes(range(32)),
        mode=FingerprintMode.GGUF_CHUNKED,
        reason=SaveReason.FINISH,
    )
    payload = bytes(range(256)) * 64
    saved = threading.Event()
    errors: list[BaseException] = []

    def save_later() -> None:
        try:
            time.sleep(0.5)  # the writer thread has not reserved it yet
            pool = WriterPool.from_settings(tree.settings, client_name="test-writer")
            try:
                pool.save_sync(spec, TierKind.RAM, payload, timeout_s=30.0)
            finally:
                pool.close()
            saved.set()
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=save_later)
    writer.start()
    try:
        tree.wait_saved(spec.key, timeout=30.0)
    finally:
        writer.join(60)
    assert not errors, errors
    assert saved.is_set()
