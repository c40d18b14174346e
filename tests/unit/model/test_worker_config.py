"""WorkerConfig and RequestParams refuse bad values at construction, naming the field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from llamad.errors import BadRequest, ConfigError
from llamad.model.config import MarkerPair, WorkerConfig, default_chunk_size
from llamad.model.requests import MAX_TOKENS_LIMIT, RequestParams, parse_params
from llamad.model.strategies import STRATEGIES

pytestmark = pytest.mark.timeout(60)

KEY = b"\x01" * 32


def test_default_chunk_is_max_64_or_a_quarter_of_n_batch() -> None:
    assert WorkerConfig(n_ctx=4096, n_batch=2048).chunk == 512
    assert WorkerConfig(n_ctx=4096, n_batch=128).chunk == 64
    # Never above n_batch, or no chunk could be planned.
    assert WorkerConfig(n_ctx=4096, n_batch=32, n_seq_max=1).chunk == 32
    assert default_chunk_size(256) == 64


def test_every_named_strategy_is_accepted() -> None:
    for name in STRATEGIES:
        assert WorkerConfig(n_ctx=64, strategy=name).strategy == name


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("n_ctx", {"n_ctx": 0}),
        ("n_batch", {"n_batch": 0}),
        ("n_seq_max", {"n_seq_max": 0}),
        ("n_seq_max", {"n_seq_max": 9, "n_batch": 8}),
        ("max_queue", {"max_queue": -1}),
        ("prefill_chunk_size", {"prefill_chunk_size": 0}),
        ("prefill_chunk_size", {"prefill_chunk_size": 4096, "n_batch": 2048}),
        ("strategy", {"strategy": "fastest"}),
        ("policy", {"policy": {"min_tokens": 1}}),
        ("miss_window", {"miss_window": -1}),
        ("n_ctx", {"n_ctx": True}),
        ("live_reuse", {"live_reuse": 1}),
        ("release_saved_idle", {"release_saved_idle": "yes"}),
        (
            "tool_call",
            {"thinking": MarkerPair("<x>", "</x>"), "tool_call": MarkerPair("<x>", "</y>")},
        ),
    ],
)
def test_invalid_worker_config_names_the_field(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        WorkerConfig(**{"n_ctx": 1024, **kwargs})
    assert err.value.details["field"] == field


def test_marker_pair_refuses_empty_markers() -> None:
    with pytest.raises(ConfigError):
        MarkerPair("", "</think>")


def test_request_defaults_are_valid_and_travel_the_wire() -> None:
    params = RequestParams(stop=("\n\n",), session_id="s", continue_=True, expect_committed=3)
    wire = msgspec.msgpack.encode(params)
    assert msgspec.msgpack.decode(wire, type=RequestParams) == params
    # `continue` is a Python keyword; on the wire it keeps its own name.
    assert msgspec.to_builtins(params)["continue"] is True


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("temperature", {"temperature": -0.1}),
        ("temperature", {"temperature": float("nan")}),
        ("top_k", {"top_k": -1}),
        ("top_p", {"top_p": 0.0}),
        ("top_p", {"top_p": 1.5}),
        ("min_p", {"min_p": 2.0}),
        ("repetition_penalty", {"repetition_penalty": 0.0}),
        ("seed", {"seed": -1}),
        ("seed", {"seed": 2**32}),
        ("max_tokens", {"max_tokens": 0}),
        ("max_tokens", {"max_tokens": MAX_TOKENS_LIMIT + 1}),
        ("stop", {"stop": ("",)}),
        ("stop", {"stop": tuple(str(i) for i in range(17))}),
        ("stop", {"stop": ["a"]}),
        ("logprobs", {"logprobs": 21}),
        ("json_schema", {"grammar": "root ::= x", "json_schema": {"type": "object"}}),
        ("parent_key", {"parent_key": b"short"}),
        ("continue", {"continue_": True}),
        ("parent_key", {"continue_": True, "session_id": "s", "parent_key": KEY}),
        ("expect_committed", {"expect_committed": 3}),
        ("session_id", {"session_id": ""}),
        ("cache_salt", {"cache_salt": "x" * 257}),
    ],
)
def test_invalid_request_params_name_the_field(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as err:
        RequestParams(**kwargs)
    assert err.value.details["field"] == field


def test_decoding_checks_the_same_bounds_as_construction() -> None:
    with pytest.raises(BadRequest) as err:
        parse_params({"max_tokens": 10**12})
    assert err.value.details["field"] == "max_tokens"


def test_parse_params_names_wrong_types_and_unknown_fields() -> None:
    with pytest.raises(BadRequest) as err:
        parse_params({"temperature": "hot"})
    assert err.value.details["field"] == "temperature"
    with pytest.raises(BadRequest) as err:
        parse_params({"tempreature": 0.5})
    assert "tempreature" in err.value.message


def test_salt_is_the_utf8_of_cache_salt() -> None:
    assert RequestParams(cache_salt="tenant-a").salt == b"tenant-a"
    assert RequestParams().salt is None
