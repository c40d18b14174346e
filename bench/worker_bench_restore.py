"""Where a warm hit's restore goes, part by part (issue 8).

    python -m bench.worker_bench_restore [--rounds 9] [--no-record]

The model worker's context (``n_ctx`` 4096, ``n_seq_max`` 4, ``kv_unified``,
flash attention ``auto`` as the worker's default, or ``--flash-attn``) prefills a 2,048-token
prompt; its state is saved to ``ram`` through
:class:`~llamad.model.client_cache_view.ClientCacheView` against a real cache-meta.
Each round then times, in alternating order:

- ``resolve + checkin``: the lookup round trip (row pinned) and its checkin;
- ``read (validate in place)``: the view's ``read`` of the mapped segment:
  header/TLV compare and the payload's CRC32C;
- ``crc32c``: the payload's CRC32C alone;
- ``unpack``: ``llama_state_seq_set_data`` from the mapping;
- ``truncate``: dropping the held-back last token's cell;
- ``restore (as the worker)``: resolve, read, unpack, truncate, checkin;
- ``restore, crc beside unpack``: the same with the CRC32C computed on
  another thread while the unpack runs (a prototype reading the segment
  through the tier's internals: what checking concurrently would save; not
  what the worker does, since it hands unchecked bytes to llama.cpp, whose
  state reader crashed on a damaged payload:
  ``test_cache_view_backend.py::test_a_ram_payload_damaged_under_its_mapping_is_never_served``);
- ``exact hit through WorkerCore``: the same prompt submitted to a
  :class:`~llamad.model.core.WorkerCore` over :class:`LlamaBackend` (its
  thread governor on) and this view, in this process, greedy, one token:
  submit to the first token event, with the core's own ``restore_ms`` and
  ``prefill_ms`` (the held-back last token decoded alone); its finish save is
  written and drained before the next case runs.

Results are written only by this script (``bench/results/worker-restore-<date>.md``,
rendered by :func:`render` from ``worker-restore-<date>.json`` beside it: every
round's ms of every part, and the core's own stats and calls per hit).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import crc32c

from bench.common import record, show, table
from llamad import paths
from llamad.cache.kvc import SaveReason, check_prefix_unchanged
from llamad.cache.lookup import RowRef
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import SEGMENTS
from llamad.llama_ffi import ContextOptions, FlashAttn, Model, StateBuffer
from llamad.llama_ffi.build_info import compute_backend
from llamad.model.client_cache_view import ClientCacheView
from llamad.model.config import WorkerConfig
from llamad.model.core import WorkerCore
from llamad.model.llama_backend import LlamaBackend
from llamad.model.requests import RequestParams
from llamad.model.results import DoneEvent, TokenEvent
from llamad.model.savepoints import SaveJob
from llamad.model.threads import ThreadGovernor, ThreadPolicy
from llamad.testing import MetaProcess, discard_scratch, scratch_settings

N_TOKENS, N_CTX, N_SEQ = 2048, 4096, 4
RENDER = "bench.worker_bench_restore:render"


class _Lease:
    def __init__(self, buffer: StateBuffer, nbytes: int) -> None:
        self.buffer, self._nbytes = buffer, nbytes

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def view(self) -> memoryview:
        return self.buffer.view(self._nbytes)

    def release(self) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--flash-attn", choices=("auto", "off", "on"), default="auto")
    args = ap.parse_args()
    load_start = os.getloadavg()
    settings = scratch_settings(prefix="lwr", ram_quota=512 << 20)
    meta = MetaProcess(settings).start()
    model = Model(paths.default_model_path())
    opts = ContextOptions(
        n_ctx=N_CTX,
        n_batch=512,
        n_ubatch=512,
        n_seq_max=N_SEQ,
        kv_unified=True,
        n_threads=2,
        n_threads_batch=2,
        flash_attn=FlashAttn[args.flash_attn.upper()],
    )
    ctx = model.context(opts)
    view = ClientCacheView.from_settings(settings, ctx)
    crc_thread = ThreadPoolExecutor(1, thread_name_prefix="crc")
    try:
        tokens = tuple((17 * i + 5) % (model.n_vocab - 10) + 5 for i in range(N_TOKENS))
        ctx.prefill(list(tokens), seq_id=0)
        buf = StateBuffer(ctx.seq_state_size(0))
        nbytes = ctx.pack_seq(0, buf)
        ns = view.namespace(None)
        job = SaveJob(SaveReason.FINISH, ns.key(tokens), ns, tokens, seq=0)
        assert view.save(job, _Lease(buf, nbytes))
        deadline = time.monotonic() + 60
        saved: list[tuple[bytes, bool]] = []
        while not saved:
            assert time.monotonic() < deadline, "the save did not finish"
            time.sleep(0.01)
            saved += view.completions.drain()
        assert saved == [(job.key, True)], saved
        ctx.seq_remove(0)
        found = view.resolve(ns, tokens, parent_key=None, wait_s=0.0)
        assert found.row is not None and found.row.tier is TierKind.RAM
        row: RowRef = found.row
        view.checkin(row.pin)
        tier = view._client.tiers[TierKind.RAM]  # the prototype reads the tier directly

        def resolve() -> None:
            got = view.resolve(ns, tokens, parent_key=None, wait_s=0.0)
            assert got.row is not None
            view.checkin(got.row.pin)

        def read() -> None:
            with view.read(row) as got_row:
                assert got_row is not None

        def crc() -> None:
            with view.read(row) as got_row:  # mapped already: the CRC is re-run below
                assert got_row is not None
                payload = got_row.payload
                crc32c.crc32c(payload)

        def unpack() -> None:
            with view.read(row) as got_row:
                assert got_row is not None
                payload = got_row.payload
                ctx.unpack_seq(1, payload)
            ctx.seq_remove(1)

        def truncate() -> None:
            ctx.seq_remove(1, N_TOKENS - 1)

        def restore() -> None:
            got = view.resolve(ns, tokens, parent_key=None, wait_s=0.0)
            assert got.row is not None
            try:
                with view.read(got.row) as got_row:
                    assert got_row is not None
                    payload = got_row.payload
                    ctx.unpack_seq(1, payload)
                ctx.seq_remove(1, N_TOKENS - 1)
            finally:
                view.checkin(got.row.pin)

        def restore_overlapped() -> None:
            got = view.resolve(ns, tokens, parent_key=None, wait_s=0.0)
            assert got.row is not None
            try:
                key, path = tier._resolve(got.row.location)
                segment = SEGMENTS.get(path, key)
                check_prefix_unchanged(segment.view, segment.meta)
                payload = segment.view[segment.meta.payload_offset : segment.meta.file_size]
                try:
                    checked = crc_thread.submit(crc32c.crc32c, payload)
                    ctx.unpack_seq(1, payload)
                    assert checked.result() == segment.meta.payload_crc32c
                finally:
                    payload.release()
                ctx.seq_remove(1, N_TOKENS - 1)
            finally:
                view.checkin(got.row.pin)

        backend = LlamaBackend(ctx, governor=ThreadGovernor(ThreadPolicy(max_threads=2)))
        # No idle entries: with them every hit after the first would keep the
        # previous hit's KV in place (a live hit), never reading the row; and
        # the cases above unpack into sequence 1 behind the core's back.
        core = WorkerCore(
            WorkerConfig(n_ctx=ctx.n_ctx, n_batch=512, n_seq_max=N_SEQ, live_reuse=False),
            backend,
            view,
        )
        hits = iter(range(1 << 30))
        core_stats: dict[str, list[float]] = {"restore_ms": [], "prefill_ms": []}
        # Where the core's restore goes: each door's calls timed on the instances.
        spans: list[tuple[str, float, float]] = []

        def timed(name: str, fn: Callable[..., object]) -> Callable[..., object]:
            def wrapper(*a: object, **kw: object) -> object:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    spans.append((name, t0, time.perf_counter()))

            return wrapper

        for name in ("resolve", "checkin"):
            setattr(view, name, timed(f"view.{name}", getattr(view, name)))
        for name in ("unpack", "seq_truncate", "decode"):
            setattr(backend, name, timed(f"backend.{name}", getattr(backend, name)))
        core_parts: dict[str, list[float]] = {}

        def through_core() -> None:
            rid = f"hit-{next(hits)}"
            spans.clear()
            t0 = time.perf_counter()
            core.submit(rid, tokens, RequestParams(max_tokens=1, temperature=0.0))
            first = None
            done = None
            while done is None:
                for got, event in core.step().events:
                    if got == rid and first is None and isinstance(event, TokenEvent):
                        first = time.perf_counter() - t0
                    if got == rid and isinstance(event, DoneEvent):
                        done = event
            assert first is not None and done.result.cache_hit_kind.value == "exact"
            # The spans up to the first token: what the core called, and the gaps.
            mine = [sp for sp in spans if sp[1] < t0 + first]
            prev, gaps = t0, 0.0
            for name, start, end in mine:
                core_parts.setdefault(name, []).append((end - start) * 1e3)
                gaps += max(0.0, start - prev)
                prev = max(prev, end)
            core_parts.setdefault("between the calls", []).append(
                (gaps + max(0.0, t0 + first - prev)) * 1e3
            )
            core_stats["restore_ms"].append(done.result.stats.restore_ms)
            core_stats["prefill_ms"].append(done.result.stats.prefill_ms)
            # Settle its finish save (off the clock) so it competes with nothing.
            deadline = time.monotonic() + 60
            while view.in_flight() or view.completions.pending():
                assert time.monotonic() < deadline, "the finish save did not finish"
                time.sleep(0.005)
                for key, published in view.completions.drain():
                    core.save_done(key, published)
            for key, published in view.completions.drain():
                core.save_done(key, published)
            times["exact hit through WorkerCore"].append(first * 1e3)

        # (name, run, needs a restored sequence 1 first, clears it after)
        cases: list[tuple[str, Callable[[], None]]] = [
            ("resolve + checkin", resolve),
            ("read (validate in place)", read),
            ("crc32c", crc),
            ("unpack", unpack),
            ("truncate", truncate),
            ("restore (as the worker)", restore),
            ("restore, crc beside unpack", restore_overlapped),
            ("exact hit through WorkerCore", through_core),
        ]
        times: dict[str, list[float]] = {name: [] for name, _ in cases}

        def run(name: str, fn: Callable[[], None]) -> float:
            if name == "exact hit through WorkerCore":  # timed inside
                fn()
                return times[name].pop() / 1e3
            if name == "truncate":  # a restored sequence to cut
                with view.read(row) as got_row:
                    assert got_row is not None
                    payload = got_row.payload
                    ctx.unpack_seq(1, payload)
            t0 = time.perf_counter()
            fn()
            took = time.perf_counter() - t0
            if name == "crc32c":  # the read around it is not the CRC's
                t1 = time.perf_counter()
                read()
                took -= time.perf_counter() - t1
            ctx.seq_remove(1)
            return took

        for name, fn in cases:  # warm-up: the segment mapped, pages touched
            run(name, fn)
        loads = []
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for name, fn in cases if r % 2 == 0 else cases[::-1]:
                times[name].append(run(name, fn) * 1e3)
        print("rounds done", file=sys.stderr, flush=True)
    finally:
        crc_thread.shutdown()
        backend.close()
        view.close()
        ctx.close()
        model.close()
        meta.stop()
        discard_scratch(settings)

    params = {
        "backend": compute_backend(),
        "n_ctx": N_CTX,
        "n_seq_max": N_SEQ,
        "flash_attn": opts.flash_attn.name.lower(),
        "n_tokens": N_TOKENS,
        "state_bytes": nbytes,
        "rounds": args.rounds,
        "load_start": list(load_start),
        "loads": loads,
    }
    data = {"parts_ms": times, "core_stats_ms": core_stats, "core_calls_ms": core_parts}
    print(show(RENDER, params, data))
    if not args.no_record:
        title = "A warm hit's restore, part by part (issue 8)"
        name = (
            "worker-restore"
            if args.flash_attn == "auto"
            else f"worker-restore-fa-{args.flash_attn}"
        )
        print(f"recorded {record(name, title, RENDER, params, data)}")
    return 0


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body from :func:`main`'s ``params`` and ``data``: every
    round's ms of every part; the core's stats and calls of every hit (the
    warm-up's first: the table takes the last ``rounds``)."""
    times: dict[str, list[float]] = data["parts_ms"]
    rounds = len(times["unpack"])

    def spread(v: list[float]) -> str:
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

    load_start = "/".join(f"{x:.2f}" for x in params["load_start"])
    return (
        f"Model `default`, compute backend {params['backend']}; context n_ctx "
        f"{params['n_ctx']}, n_seq_max {params['n_seq_max']}, kv_unified, flash attention "
        f"{params['flash_attn']}; a {params['n_tokens']}-token state of "
        f"{params['state_bytes'] / 1e6:.1f} MB saved to `ram` and restored into another "
        f"sequence. {params['rounds']} rounds after a warm-up, order alternating. "
        "Values: ms, median (range) over rounds. `crc32c` is the read's time with and "
        "without a second CRC pass, subtracted.\n\n"
        f"Load average (1/5/15 min) at start {load_start}; "
        f"1-min at each round's start: {', '.join(f'{x:.2f}' for x in params['loads'])}.\n\n"
        + table(["part", "ms"], [[name, spread(v)] for name, v in times.items()])
        + "\n\nThe exact hit through WorkerCore, from the core's own stats: "
        + ", ".join(f"`{k}` {spread(v[-rounds:])}" for k, v in data["core_stats_ms"].items())
        + " ms (the first token follows `prefill_ms`: the held-back token's decode). "
        + "Its calls until the first token, ms (median (range); a call made twice in one "
        + "hit counts each time):\n\n"
        + table(
            ["call", "ms"],
            [[k, spread(v[-rounds:])] for k, v in sorted(data["core_calls_ms"].items())],
        )
        + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
