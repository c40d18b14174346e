"""The cache namespace of real contexts on the real model (SPEC C1, L10).

``namespace`` reads the live model, context and adapter set; contexts that
cannot exchange KV states never share a namespace.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from llamad.cache.key import ctx_params_hash, model_fingerprint, quant_byte
from llamad.llama_ffi import (
    Closed,
    Context,
    FlashAttn,
    KVType,
    Model,
    RopeScaling,
    StateError,
)
from llamad.llama_ffi.build_info import build_identity
from llamad.model.identity import HASHED_CONTEXT_FIELDS, base_fingerprint, namespace, with_build
from lora_gguf import write_lora

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

MakeCtx = Callable[..., Context]


def _packed(ctx: Context, seq: int = 0) -> bytes:
    buf = bytearray(ctx.seq_state_size(seq))
    return bytes(buf[: ctx.pack_seq(seq, buf)])


def test_namespace_is_the_loaded_files_fingerprint_and_quant(
    model: Model, model_path: Path, make_ctx: MakeCtx
) -> None:
    ns = namespace(make_ctx())
    assert ns.fingerprint == model_fingerprint(model_path, "gguf_chunked")
    assert ns.quant == quant_byte(model.ftype) == 3  # the default model is Q4_1
    assert base_fingerprint(model) is base_fingerprint(model)
    st = os.stat(model_path)
    assert model.file_identity == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def test_namespace_reads_the_context_llama_cpp_created_not_the_request(
    make_ctx: MakeCtx,
) -> None:
    asked_300, asked_512 = make_ctx(n_ctx=300), make_ctx(n_ctx=512)
    # llama.cpp pads n_ctx to a multiple of 256: both contexts hold 512 cells.
    assert asked_300.n_ctx == asked_512.n_ctx == 512
    assert namespace(asked_300) == namespace(asked_512)
    requested = {name: getattr(asked_300.options, name) for name in HASHED_CONTEXT_FIELDS}
    as_requested = with_build(ctx_params_hash(**requested), build_identity())  # type: ignore[arg-type]
    assert namespace(asked_300).ctx_hash != as_requested
    actual = {**requested, "n_ctx": 512}
    assert namespace(asked_300).ctx_hash == with_build(
        ctx_params_hash(**actual),  # type: ignore[arg-type]
        build_identity(),
    )
    assert namespace(make_ctx(n_ctx=513)) != namespace(asked_512)


def test_namespace_follows_the_adapters_attached_now(
    model: Model, make_ctx: MakeCtx, tmp_path: Path
) -> None:
    ctx, other = make_ctx(), make_ctx()
    plain = namespace(ctx)
    a = model.load_adapter(write_lora(tmp_path / "a.gguf", seed=1))
    b = model.load_adapter(write_lora(tmp_path / "b.gguf", seed=2))
    try:
        seen = [plain]
        ctx.set_adapter(a, 1.0)
        seen.append(namespace(ctx))
        ctx.set_adapter(a, 0.5)
        seen.append(namespace(ctx))
        ctx.set_adapter(b, 1.0)
        seen.append(namespace(ctx))
        assert len(set(seen)) == 4
        assert {(ns.quant, ns.ctx_hash) for ns in seen} == {(plain.quant, plain.ctx_hash)}
        # Attach order does not matter; scale 0 is out of the graph.
        other.set_adapter(b, 1.0)
        other.set_adapter(a, 0.5)
        assert namespace(other) == seen[-1]
        ctx.set_adapter(a, 0.0)
        ctx.set_adapter(b, 0.0)
        assert namespace(ctx) == plain
        ctx.remove_adapter(a)
        b.unload()
        assert namespace(ctx) == plain
    finally:
        a.unload()
        b.unload()


# Each entry differs from the baseline (and from every other entry) in one
# setting that changes what a KV cell holds or how cells are laid out.
LAYOUTS: dict[str, dict[str, object]] = {
    "baseline": {},
    "n_seq_max": {"n_seq_max": 2, "n_ctx": 1024},
    "kv_unified": {"n_seq_max": 2, "n_ctx": 1024, "kv_unified": True},
    "type_k": {"type_k": KVType.F32},
    "type_v": {"type_v": KVType.F32},
    "flash_attn_on": {"flash_attn": FlashAttn.ON},
    "flash_attn_off": {"flash_attn": FlashAttn.OFF},
    "swa_full": {"swa_full": False},
    "rope_scaling_type": {"rope_scaling_type": RopeScaling.LINEAR},
    "rope_freq_base": {"rope_freq_base": 20000.0},
    "rope_freq_scale": {"rope_freq_scale": 0.5},
    "yarn_ext_factor": {"yarn_ext_factor": 0.5},
    "yarn_attn_factor": {"yarn_attn_factor": 2.0},
    "yarn_beta_fast": {"yarn_beta_fast": 16.0},
    "yarn_beta_slow": {"yarn_beta_slow": 2.0},
    "yarn_orig_ctx": {"yarn_orig_ctx": 4096},
}


def test_contexts_that_cannot_exchange_states_never_share_a_namespace(
    make_ctx: MakeCtx,
) -> None:
    spaces = {name: namespace(make_ctx(**opts)) for name, opts in LAYOUTS.items()}
    for (x, nx), (y, ny) in itertools.combinations(spaces.items(), 2):
        assert nx != ny, f"{x} and {y} share a namespace"
    assert set(HASHED_CONTEXT_FIELDS) - {"n_ctx"} <= {k for o in LAYOUTS.values() for k in o}


@pytest.mark.parametrize(
    ("source", "target"),
    [("n_seq_max", "kv_unified"), ("baseline", "type_k"), ("flash_attn_on", "flash_attn_off")],
)
def test_llama_cpp_refuses_states_across_these_layouts(
    model: Model, make_ctx: MakeCtx, source: str, target: str
) -> None:
    """The premise: these layouts really cannot exchange states."""
    a, b = make_ctx(**LAYOUTS[source]), make_ctx(**LAYOUTS[target])
    a.prefill(model.tokenize("A state that only fits its own layout."))
    with pytest.raises(StateError):
        b.unpack_seq(0, _packed(a))
    assert namespace(a) != namespace(b)


def test_a_state_from_another_rope_base_restores_silently_so_only_the_namespace_tells(
    model: Model, make_ctx: MakeCtx
) -> None:
    """llama.cpp accepts K rotated under another RoPE base: only the namespace stops it."""
    tokens = model.tokenize("Positions are baked into every cached key vector.")
    a, b = make_ctx(), make_ctx(rope_freq_base=20000.0)
    a.prefill(tokens)
    b.unpack_seq(0, _packed(a))
    assert b.seq_pos_max(0) == len(tokens) - 1
    assert namespace(a) != namespace(b)


def test_a_closed_context_has_no_namespace(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    ctx.close()
    with pytest.raises(Closed):
        namespace(ctx)
