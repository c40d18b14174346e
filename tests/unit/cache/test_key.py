"""Key stability and sensitivity (SPEC C1)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.cache.errors import FingerprintMismatch, InvalidCacheValue
from llamad.cache.key import (
    QUANT_BYTES,
    FingerprintMode,
    Namespace,
    bytes_to_tokens,
    ctx_params_hash,
    effective_fingerprint,
    model_fingerprint,
    quant_byte,
    quant_name,
    tokens_to_bytes,
)
from llamad.errors import BadRequest

pytestmark = pytest.mark.timeout(60)

digests = st.binary(min_size=32, max_size=32)
token_ids = st.integers(min_value=0, max_value=2**32 - 1)
token_lists = st.lists(token_ids, min_size=0, max_size=64)
namespaces = st.builds(Namespace, fingerprint=digests, quant=st.integers(0, 255), ctx_hash=digests)


def test_key_matches_the_documented_formula() -> None:
    ns = Namespace(fingerprint=b"\xaa" * 32, quant=3, ctx_hash=b"\xbb" * 32)
    tokens = [1, 2, 70000, 2**32 - 1]
    expected = hashlib.sha256(
        b"\xaa" * 32 + b"\x03" + b"\xbb" * 32 + struct.pack("<4I", *tokens)
    ).digest()
    assert ns.key(tokens) == expected
    assert ns.header() == b"\xaa" * 32 + b"\x03" + b"\xbb" * 32


@given(namespaces, token_lists)
def test_key_is_stable_for_ints_and_packed_bytes(ns: Namespace, tokens: list[int]) -> None:
    assert ns.key(tokens) == ns.key(tokens_to_bytes(tokens)) == ns.key(tuple(tokens))
    assert bytes_to_tokens(tokens_to_bytes(tokens)) == tokens


@given(namespaces, st.lists(token_ids, min_size=1, max_size=64), st.data())
def test_any_token_change_changes_the_key(
    ns: Namespace, tokens: list[int], data: st.DataObject
) -> None:
    i = data.draw(st.integers(0, len(tokens) - 1))
    other = data.draw(token_ids.filter(lambda t: t != tokens[i]))
    changed = [*tokens[:i], other, *tokens[i + 1 :]]
    assert ns.key(changed) != ns.key(tokens)
    assert ns.key(tokens[:-1]) != ns.key(tokens)
    assert ns.key([*tokens, 0]) != ns.key(tokens)


@given(namespaces, token_lists, digests, st.integers(0, 255), digests)
def test_any_namespace_change_changes_the_key(
    ns: Namespace, tokens: list[int], fp: bytes, quant: int, ctx: bytes
) -> None:
    for other in (
        Namespace(fp, ns.quant, ns.ctx_hash),
        Namespace(ns.fingerprint, quant, ns.ctx_hash),
        Namespace(ns.fingerprint, ns.quant, ctx),
    ):
        assert (other.key(tokens) == ns.key(tokens)) == (other == ns)


@given(namespaces, token_lists, st.data())
def test_keys_at_equals_key_of_each_prefix(
    ns: Namespace, tokens: list[int], data: st.DataObject
) -> None:
    lengths = data.draw(st.lists(st.integers(0, len(tokens)), max_size=8))
    assert ns.keys_at(tokens, lengths) == [ns.key(tokens[:n]) for n in lengths]


def test_keys_at_rejects_a_length_past_the_tokens() -> None:
    ns = Namespace(b"\x00" * 32, 0, b"\x00" * 32)
    with pytest.raises(InvalidCacheValue) as err:
        ns.keys_at([1, 2, 3], [4])
    assert err.value.field == "lengths"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"fingerprint": b"\x00" * 31, "quant": 0, "ctx_hash": b"\x00" * 32}, "fingerprint"),
        ({"fingerprint": b"\x00" * 32, "quant": 256, "ctx_hash": b"\x00" * 32}, "quant"),
        ({"fingerprint": b"\x00" * 32, "quant": True, "ctx_hash": b"\x00" * 32}, "quant"),
        ({"fingerprint": b"\x00" * 32, "quant": 1, "ctx_hash": "x" * 32}, "ctx_hash"),
    ],
)
def test_namespace_rejects_bad_fields_naming_them(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        Namespace(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field
    assert isinstance(err.value, BadRequest)
    assert err.value.code == "invalid_cache_value"


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], b"\x00\x01\x02"])
def test_tokens_out_of_u32_range_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidCacheValue):
        tokens_to_bytes(bad)  # type: ignore[arg-type]


def test_quant_byte_table_is_llama_ftype_and_fits_a_byte() -> None:
    assert quant_byte("q4_1") == 3
    assert quant_byte("Q4_K_M") == 15
    assert quant_byte("bf16") == 32
    assert quant_byte(1024) == 255  # LLAMA_FTYPE_GUESSED
    assert quant_byte(7) == 7
    assert len(set(QUANT_BYTES.values())) == len(QUANT_BYTES)
    assert all(0 <= b <= 255 for b in QUANT_BYTES.values())
    assert all(quant_name(b) == name for name, b in QUANT_BYTES.items())
    with pytest.raises(InvalidCacheValue):
        quant_byte("q9_z")
    with pytest.raises(InvalidCacheValue):
        quant_byte(300)


def test_ctx_params_hash_changes_with_every_layout_parameter() -> None:
    # KV types and flash-attention modes are llama.cpp's numbers (ggml_type
    # f16=1, q8_0=8; llama_flash_attn_type off=0, on=1): the cache has no names.
    base = {"n_ctx": 4096, "type_k": 1, "type_v": 1, "flash_attn": 0, "n_seq_max": 1}
    changes = {
        "n_ctx": 2048,
        "type_k": 8,
        "type_v": 8,
        "flash_attn": 1,
        "n_seq_max": 4,
        "kv_unified": True,
        "swa_full": False,
        "rope_scaling_type": 1,
        "rope_freq_base": 10000.0,
        "rope_freq_scale": 0.5,
        "yarn_ext_factor": 1.0,
        "yarn_attn_factor": 1.0,
        "yarn_beta_fast": 32.0,
        "yarn_beta_slow": 1.0,
        "yarn_orig_ctx": 8192,
    }
    reference = ctx_params_hash(**base)  # type: ignore[arg-type]
    seen = {reference}
    for name, value in changes.items():
        digest = ctx_params_hash(**{**base, name: value})  # type: ignore[arg-type]
        assert digest != reference, name
        seen.add(digest)
    assert len(seen) == len(changes) + 1
    assert len(reference) == 32


def test_ctx_params_hash_is_stable_across_equal_float32_values() -> None:
    a = ctx_params_hash(n_ctx=4096, type_k=1, flash_attn=0, rope_freq_base=0.0)
    b = ctx_params_hash(n_ctx=4096, type_k=1, flash_attn=0, rope_freq_base=-0.0)
    assert a == b
    assert ctx_params_hash(n_ctx=16, yarn_beta_fast=32.0) == ctx_params_hash(
        n_ctx=16, yarn_beta_fast=32.000000001
    )


def test_ctx_params_hash_takes_numbers_not_names() -> None:
    # One vocabulary: the names live in the binding's enums (llama_ffi.KVType).
    for kwargs in ({"type_k": "f16"}, {"flash_attn": "on"}, {"flash_attn": True}):
        with pytest.raises(InvalidCacheValue):
            ctx_params_hash(n_ctx=16, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_ctx": 0}, "n_ctx"),
        ({"n_ctx": 16, "type_k": "q9"}, "type_k"),
        ({"n_ctx": 16, "flash_attn": "maybe"}, "flash_attn"),
        ({"n_ctx": 16, "rope_freq_base": float("nan")}, "rope_freq_base"),
        ({"n_ctx": 16, "n_seq_max": 0}, "n_seq_max"),
    ],
)
def test_ctx_params_hash_rejects_bad_values(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        ctx_params_hash(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


@settings(max_examples=50)
@given(
    digests,
    st.lists(st.tuples(digests, st.floats(-4, 4, allow_nan=False)), min_size=1, max_size=4),
    st.randoms(),
)
def test_effective_fingerprint_ignores_adapter_order(
    base: bytes, adapters: list[tuple[bytes, float]], rnd: object
) -> None:
    shuffled = list(adapters)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert effective_fingerprint(base, adapters) == effective_fingerprint(base, shuffled)
    assert effective_fingerprint(base, adapters) != base


def test_effective_fingerprint_without_adapters_is_the_base() -> None:
    assert effective_fingerprint(b"\x05" * 32, []) == b"\x05" * 32


def test_effective_fingerprint_depends_on_scale_and_adapter() -> None:
    base, a, b = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    one = effective_fingerprint(base, [(a, 1.0)])
    assert one != effective_fingerprint(base, [(a, 0.5)])
    assert one != effective_fingerprint(base, [(b, 1.0)])
    assert one != effective_fingerprint(b"\x09" * 32, [(a, 1.0)])
    # Fixed point: a difference below a micro-unit is the same mix.
    assert one == effective_fingerprint(base, [(a, 1.0 + 1e-9)])


def test_model_fingerprint_safe_is_the_file_sha256(tmp_path: Path) -> None:
    path = tmp_path / "m.bin"
    path.write_bytes(b"weights" * 1000)
    digest = hashlib.sha256(path.read_bytes()).digest()
    assert model_fingerprint(path, "safe") == digest
    assert model_fingerprint(path, FingerprintMode.SAFE, supplied=digest) == digest
    with pytest.raises(FingerprintMismatch):
        model_fingerprint(path, "safe", supplied=b"\x00" * 32)


def test_fast_unsafe_trusts_the_supplied_fingerprint_and_requires_one() -> None:
    assert model_fingerprint("/nonexistent", "fast_unsafe", supplied=b"\x07" * 32) == b"\x07" * 32
    with pytest.raises(InvalidCacheValue):
        model_fingerprint("/nonexistent", "fast_unsafe")
    with pytest.raises(InvalidCacheValue):
        model_fingerprint("/nonexistent", "sloppy")
