"""Threads of a context: per-decode thread counts and attached ggml threadpools (SPEC M14)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from llamad.errors import BadRequest, ConfigError
from llamad.llama_ffi import Closed, Context, threadpool
from llamad.llama_ffi.build_info import build_record
from llamad.llama_ffi.errors import ThreadsExceedPool
from llamad.llama_ffi.threadpool import (
    MAX_THREADS,
    Threadpool,
    ThreadpoolOptions,
    ThreadPriority,
    openmp_build,
    worker_threadpool,
)

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

MakeCtx = Callable[..., Context]


def _last_logits(ctx: Context, tokens: Sequence[int]) -> list[float]:
    ctx.clear()
    ctx.prefill(list(tokens))
    return list(ctx.logits())


def test_set_threads_is_what_the_next_decode_reads(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    assert ctx.threads == (1, 1)
    ctx.set_threads(2)
    assert ctx.threads == (2, 2)
    ctx.set_threads(1, 2)
    assert ctx.threads == (1, 2)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_set_threads_refuses_a_count_that_is_not_a_positive_int(
    make_ctx: MakeCtx, bad: object
) -> None:
    ctx = make_ctx()
    with pytest.raises(BadRequest):
        ctx.set_threads(bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        ctx.set_threads(1, bad)  # type: ignore[arg-type]
    assert ctx.threads == (1, 1)


def test_thread_count_changes_between_decodes_keep_the_results(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    # One 2-thread prefill only: tests share two cores with other suites.
    ctx = make_ctx()
    one = _last_logits(ctx, prompt_tokens)
    ctx.set_threads(2)
    two = _last_logits(ctx, prompt_tokens)
    ctx.set_threads(1)
    again = _last_logits(ctx, prompt_tokens)
    assert again == one  # same thread count, same kernels: bit-identical
    top = max(range(len(one)), key=one.__getitem__)
    assert max(range(len(two)), key=two.__getitem__) == top
    assert max(abs(a - b) for a, b in zip(one, two, strict=True)) < 1e-2


def test_decoding_on_an_attached_pool_matches_ggml_own_threads(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    ctx = make_ctx()
    plain = _last_logits(ctx, prompt_tokens)
    with Threadpool(ThreadpoolOptions(n_threads=1)) as pool:
        ctx.attach_threadpool(pool)
        threadpool = ctx.threadpool
        assert threadpool is not None and threadpool[0] is pool and threadpool[1] is pool
        assert _last_logits(ctx, prompt_tokens) == plain
        assert ctx.detach_threadpool()
    assert ctx.threadpool is None
    assert not ctx.detach_threadpool()


def test_threads_beyond_the_attached_pool_are_refused_not_crashed(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    # ggml would index past the pool's per-thread state (measured: SIGSEGV).
    ctx = make_ctx()
    pool = Threadpool(1)
    ctx.attach_threadpool(pool)
    with pytest.raises(ThreadsExceedPool) as err:
        ctx.set_threads(2)
    assert err.value.details["field"] == "n_threads"
    with pytest.raises(ThreadsExceedPool) as err:
        ctx.set_threads(1, 2)
    assert err.value.details["field"] == "n_threads_batch"
    assert ctx.threads == (1, 1)
    ctx.prefill(list(prompt_tokens))  # still usable
    assert ctx.detach_threadpool()
    ctx.set_threads(2)  # ggml's own threads: any count
    assert ctx.threads == (2, 2)
    pool.close()


def test_attaching_a_pool_smaller_than_the_context_threads_is_refused(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(n_threads=1, n_threads_batch=2)
    pool = Threadpool(1)
    with pytest.raises(ThreadsExceedPool) as err:
        ctx.attach_threadpool(pool)
    assert err.value.details["field"] == "n_threads_batch"
    assert ctx.threadpool is None
    assert pool.native_handle.leases == 0
    with Threadpool(2) as big:
        ctx.attach_threadpool(pool, big)
        assert pool.native_handle.leases == 1 and big.native_handle.leases == 1
        ctx.detach_threadpool()
    pool.close()
    assert pool.native_handle.freed


def test_a_closed_pool_lives_until_its_context_lets_go(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    ctx = make_ctx()
    pool = Threadpool(1)
    ctx.attach_threadpool(pool)
    pool.close()
    assert pool.closed and not pool.native_handle.freed
    ctx.prefill(list(prompt_tokens))  # computes on the still-live pool
    with pytest.raises(Closed):
        make_ctx().attach_threadpool(pool)
    ctx.close()
    assert pool.native_handle.freed


def test_reattaching_releases_the_previous_pool(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    first, second = Threadpool(1), Threadpool(1)
    ctx.attach_threadpool(first)
    ctx.attach_threadpool(second)
    assert first.native_handle.leases == 0
    assert second.native_handle.leases == 2  # pool and batch pool
    first.close()
    assert first.native_handle.freed
    second.close()
    assert not second.native_handle.freed
    ctx.close()
    assert second.native_handle.freed


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_threads": 0}, "n_threads"),
        ({"n_threads": MAX_THREADS + 1}, "n_threads"),
        ({"n_threads": True}, "n_threads"),
        ({"n_threads": 1, "poll": 101}, "poll"),
        ({"n_threads": 1, "poll": -1}, "poll"),
        ({"n_threads": 1, "priority": "urgent"}, "priority"),
        ({"n_threads": 1, "priority": 7}, "priority"),
        ({"n_threads": 1, "cpus": (0, 0)}, "cpus"),
        ({"n_threads": 1, "cpus": (-1,)}, "cpus"),
        ({"n_threads": 1, "cpus": (MAX_THREADS,)}, "cpus"),
        ({"n_threads": 1, "strict_cpu": True}, "strict_cpu"),
        ({"n_threads": 1, "strict_cpu": 1}, "strict_cpu"),
    ],
)
def test_threadpool_options_refuse_bad_values_naming_the_field(
    kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        ThreadpoolOptions(**kwargs)  # type: ignore[arg-type]
    assert err.value.details["field"] == field
    assert field in err.value.message


def test_threadpool_options_coerce_priority_names() -> None:
    assert ThreadpoolOptions(1, priority="low").priority is ThreadPriority.LOW  # type: ignore[arg-type]
    assert ThreadpoolOptions(1, priority=-1).priority is ThreadPriority.LOW  # type: ignore[arg-type]
    assert ThreadpoolOptions(1).priority is ThreadPriority.NORMAL
    assert ThreadpoolOptions(1).poll == 0


def test_the_pinned_cpu_build_runs_ggml_under_openmp() -> None:
    # What docs/internals/threads.md's measurements (and the spin bound) assume.
    if build_record()["backend"] == "cpu":
        assert openmp_build()


def test_a_worker_attaches_no_pool_under_openmp_and_a_sleeping_one_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threadpool, "openmp_build", lambda: True)
    assert worker_threadpool(2) is None
    monkeypatch.setattr(threadpool, "openmp_build", lambda: False)
    pool = worker_threadpool(2)
    assert pool is not None
    assert (pool.n_threads, pool.options.poll) == (2, 0)
    pool.close()
