"""The LlamaBackend's pure parts, no model: the sampler mapping, C logprobs, the state pool."""

from __future__ import annotations

import math
import random
import threading
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamad.errors import BadRequest, ConfigError, SchemaError
from llamad.llama_ffi import PAGE_SIZE, Closed, InvalidToken, NoLogits, PoolingType
from llamad.llama_ffi.json_schema import json_schema_to_gbnf
from llamad.llama_ffi.logprobs import token_logprobs
from llamad.model import sampler_factory
from llamad.model.adapters import MAX_SCALE, check_scale
from llamad.model.embedder import EmbedderOptions
from llamad.model.requests import RequestParams
from llamad.model.sampler_factory import sampler_params
from llamad.model.state_pool import StatePool, size_class

pytestmark = pytest.mark.timeout(60)


# -- sampler_params -------------------------------------------------------------------------------


def test_every_sampling_field_reaches_the_chain() -> None:
    p = sampler_params(
        RequestParams(
            temperature=0.7,
            top_k=12,
            top_p=0.9,
            min_p=0.1,
            repetition_penalty=1.3,
            penalty_last_n=32,
            frequency_penalty=0.2,
            presence_penalty=-0.4,
            seed=99,
        )
    )
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.7, 12, 0.9, 0.1)
    assert (p.repeat_penalty, p.penalty_last_n) == (1.3, 32)
    assert (p.frequency_penalty, p.presence_penalty) == (0.2, -0.4)
    assert p.seed == 99
    assert not p.is_greedy
    assert p.typical_p == 1.0 and p.logit_bias == ()
    assert p.grammar is None and p.grammar_root == "root"


def test_temperature_zero_is_greedy() -> None:
    assert sampler_params(RequestParams(temperature=0.0)).is_greedy
    assert not sampler_params(RequestParams(temperature=0.01)).is_greedy


def test_a_random_seed_is_left_to_the_chain() -> None:
    assert sampler_params(RequestParams()).seed is None


def test_grammar_passes_through_unchanged() -> None:
    grammar = 'root ::= "a" | "b"'
    assert sampler_params(RequestParams(grammar=grammar)).grammar == grammar


def test_json_schema_becomes_the_converters_grammar() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    p = sampler_params(RequestParams(json_schema=schema))
    assert p.grammar == json_schema_to_gbnf(schema)
    assert p.grammar_root == "root"


def test_an_unsupported_schema_is_bad_schema() -> None:
    with pytest.raises(SchemaError) as err:
        sampler_params(RequestParams(json_schema={"type": "string", "pattern": "a+"}))
    assert err.value.code == "bad_schema"


def test_a_schema_too_deep_to_convert_is_bad_schema() -> None:
    def deep(_: Any) -> str:
        raise RecursionError

    with pytest.raises(SchemaError) as err:
        sampler_params(RequestParams(json_schema={"type": "object"}), convert_schema=deep)
    assert err.value.details["field"] == "json_schema"


def test_a_binding_refusal_names_the_requests_field(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**_: Any) -> None:
        raise ConfigError("repeat_penalty: must be > 0 (1 disables)")

    monkeypatch.setattr(sampler_factory, "SamplerParams", refuse)
    with pytest.raises(BadRequest) as err:
        sampler_params(RequestParams())
    assert err.value.code == "bad_request"
    assert err.value.details["field"] == "repetition_penalty"


# -- token_logprobs -------------------------------------------------------------------------------


def _reference(logits: list[float], chosen: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    m = max(logits)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in logits))
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))[:k]
    return logits[chosen] - lse, [(i, logits[i] - lse) for i in order]


@given(
    st.lists(
        st.floats(-30.0, 30.0, width=32, allow_nan=False, allow_infinity=False),
        min_size=1,
        max_size=300,
    ),
    st.data(),
)
def test_logprobs_match_a_float64_log_softmax(logits: list[float], data: st.DataObject) -> None:
    chosen = data.draw(st.integers(0, len(logits) - 1))
    k = data.draw(st.integers(0, 25))
    got = token_logprobs(array("f", logits), chosen, k)
    want_chosen, want_top = _reference(logits, chosen, k)
    assert got.chosen == pytest.approx(want_chosen, abs=1e-4)
    assert got.chosen <= 0.0
    assert [t for t, _ in got.top] == [t for t, _ in want_top]
    for (_, a), (_, b) in zip(got.top, want_top, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
        assert a <= 0.0
    assert math.fsum(math.exp(v) for _, v in got.top) <= 1.0 + 1e-5


def test_logprobs_over_a_vocabulary_sized_row_sum_to_one() -> None:
    rng = random.Random(5)
    logits = array("f", (rng.gauss(0.0, 4.0) for _ in range(49_152)))
    best = max(range(len(logits)), key=logits.__getitem__)
    got = token_logprobs(logits, best, 20)
    assert got.top[0] == (best, got.chosen)
    everything = token_logprobs(logits, best, len(logits))
    assert len(everything.top) == len(logits)
    assert math.fsum(math.exp(v) for _, v in everything.top) == pytest.approx(1.0, abs=1e-4)


def test_ties_go_to_the_smaller_token_id_like_greedy() -> None:
    got = token_logprobs(array("f", [1.0, 3.0, 0.5, 3.0, 3.0]), 3, 3)
    assert [t for t, _ in got.top] == [1, 3, 4]
    assert got.top[0][1] == got.top[1][1] == got.chosen


def test_banned_tokens_have_minus_infinite_logprob() -> None:
    got = token_logprobs(array("f", [0.0, -math.inf, 0.0]), 1, 3)
    assert got.chosen == -math.inf
    assert got.top[0][1] == pytest.approx(math.log(0.5))
    assert got.top[2] == (1, -math.inf)


def test_nan_logits_and_bad_arguments_are_refused() -> None:
    with pytest.raises(NoLogits):
        token_logprobs(array("f", [0.0, math.nan]), 0, 1)
    with pytest.raises(NoLogits):
        token_logprobs(array("f", [-math.inf, -math.inf]), 0, 1)
    with pytest.raises(InvalidToken):
        token_logprobs(array("f", [0.0, 1.0]), 2, 1)
    with pytest.raises(BadRequest):
        token_logprobs(array("f", [0.0, 1.0]), 0, -1)
    with pytest.raises(BadRequest):
        token_logprobs(array("d", [0.0, 1.0]), 0, 1)


# -- the state pool -------------------------------------------------------------------------------


@given(st.integers(1, 1 << 34))
def test_size_class_covers_the_request_and_wastes_at_most_a_quarter(nbytes: int) -> None:
    cap = size_class(nbytes)
    assert cap >= nbytes
    assert cap >= PAGE_SIZE
    if nbytes > PAGE_SIZE:
        assert cap <= nbytes * 1.25 + 1
    assert size_class(cap) == cap  # a class is its own class


@given(st.integers(1, 1 << 30), st.integers(1, 1 << 30))
def test_size_class_is_monotone(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert size_class(lo) <= size_class(hi)


def test_a_released_buffer_is_leased_again() -> None:
    pool = StatePool()
    first = pool.lease(100_000)
    first.writable()[:3] = b"abc"
    first.set_nbytes(3)
    assert bytes(first.view()) == b"abc"
    first.release()
    again = pool.lease(90_000)
    assert pool.mapped == 1
    assert again.capacity == size_class(100_000)
    again.release()
    assert pool.leased == 0
    pool.close()


def test_a_larger_state_maps_a_new_buffer_and_idle_ones_are_bounded() -> None:
    pool = StatePool(max_idle=2)
    leases = [pool.lease(n) for n in (10_000, 200_000, 50_000, 400_000)]
    assert pool.mapped == 4 and pool.leased == 4
    for lease in leases:
        lease.release()
    assert pool.leased == 0
    assert pool.idle == 2  # the two largest are kept
    big = pool.lease(300_000)
    assert big.capacity >= 400_000
    big.release()
    assert pool.trim() == 2 and pool.idle == 0
    pool.close()


def test_release_is_idempotent_and_the_bytes_are_gone_after_it() -> None:
    pool = StatePool()
    lease = pool.lease(10)
    lease.release()
    lease.release()
    assert pool.leased == 0
    assert lease.released
    with pytest.raises(Closed):
        lease.view()
    with pytest.raises(Closed):
        lease.set_nbytes(1)
    pool.close()


def test_fill_gives_the_buffer_back_when_the_writer_fails() -> None:
    pool = StatePool()

    def failing(_: memoryview) -> int:
        raise OSError("disk on fire")

    with pytest.raises(OSError):
        pool.fill(1000, failing)
    assert pool.leased == 0 and pool.idle == 1
    lease = pool.fill(1000, lambda _: 7)
    assert lease.nbytes == 7
    with pytest.raises(BadRequest):
        lease.set_nbytes(lease.capacity + 1)
    lease.release()
    pool.close()


def test_concurrent_releases_from_writer_threads_lose_no_lease() -> None:
    pool = StatePool(max_idle=4)
    leases = [pool.lease(PAGE_SIZE * (1 + i % 5)) for i in range(64)]
    barrier = threading.Barrier(8)

    def release(part: list[Any]) -> None:
        barrier.wait(timeout=10)
        for lease in part:
            lease.release()
            lease.release()

    threads = [threading.Thread(target=release, args=(leases[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert pool.leased == 0
    assert pool.idle == 4
    pool.close()


def test_a_closed_pool_refuses_leases_and_unmaps_returns() -> None:
    pool = StatePool()
    lease = pool.lease(10)
    pool.close()
    with pytest.raises(Closed):
        pool.lease(10)
    lease.release()
    assert pool.leased == 0 and pool.idle == 0


def test_pool_and_lease_sizes_are_validated() -> None:
    with pytest.raises(BadRequest):
        StatePool(max_idle=-1)
    pool = StatePool()
    for bad in (0, -5, True, 1.5):
        with pytest.raises(BadRequest):
            pool.lease(bad)  # type: ignore[arg-type]
    pool.close()


# -- options of the M11 helpers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_ctx": 0}, "n_ctx"),
        ({"n_seq_max": 3, "n_ctx": 512}, "n_ctx"),
        ({"n_threads": True}, "n_threads"),
        ({"pooling": PoolingType.NONE}, "pooling"),
    ],
)
def test_embedder_options_name_the_bad_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        EmbedderOptions(**kwargs)
    assert err.value.details["field"] == field


@pytest.mark.parametrize("scale", [math.nan, math.inf, MAX_SCALE * 2, True, "1"])
def test_adapter_scales_must_be_finite_and_bounded(scale: object) -> None:
    with pytest.raises(BadRequest) as err:
        check_scale(scale)
    assert err.value.details["field"] == "scale"
