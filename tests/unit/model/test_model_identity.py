"""The model layer's cache identity: which fields make a namespace, read live (SPEC C1).

These run without a model: the context, model and adapters are stand-ins that
carry a real :class:`ContextOptions` and the attributes :func:`namespace`
reads. The real model is exercised in ``tests/integration/model``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from llamad.cache.errors import FingerprintMismatch
from llamad.cache.key import (
    FingerprintMode,
    ctx_params_hash,
    effective_fingerprint,
    model_fingerprint,
    quant_byte,
)
from llamad.llama_ffi import Closed, ContextOptions, KVType, ModelOptions
from llamad.llama_ffi.build_identity import BuildIdentity
from llamad.llama_ffi.build_info import build_identity
from llamad.model.identity import (
    BUILD_DOMAIN,
    EXCLUDED_CONTEXT_FIELDS,
    EXCLUDED_MODEL_FIELDS,
    HASHED_CONTEXT_FIELDS,
    base_fingerprint,
    salted,
    with_build,
)
from llamad.model.identity import namespace as _namespace

pytestmark = pytest.mark.timeout(60)

CONTEXT_FIELDS = [f.name for f in dataclasses.fields(ContextOptions)]


def namespace(ctx: Any, mode: str = "safe", **kw: Any) -> Any:
    # The stand-in model file is not a GGUF, so hash it whole.
    return _namespace(ctx, mode, **kw)


class FakeModel:
    def __init__(self, path: Path, ftype: int = 3) -> None:
        self.path = path
        self.ftype = ftype
        st = os.stat(path)
        self.file_identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FakeAdapter:
    def __init__(self, name: str) -> None:
        self.sha256 = hashlib.sha256(name.encode()).digest()


class FakeContext:
    """Reports the sizes llama.cpp would run with, which may differ from the options."""

    def __init__(
        self,
        model: FakeModel,
        options: ContextOptions,
        *,
        n_ctx: int | None = None,
        adapters: Sequence[tuple[FakeAdapter, float]] = (),
    ) -> None:
        self.model = model
        self.options = options
        self.n_ctx = options.n_ctx if n_ctx is None else n_ctx
        self.n_seq_max = options.n_seq_max
        self.adapters = tuple(adapters)
        self.closed = False


@pytest.fixture
def fake_model(tmp_path: Path) -> FakeModel:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    return FakeModel(path)


def _opts(**kwargs: Any) -> ContextOptions:
    return ContextOptions(n_threads=1, n_threads_batch=1, **kwargs)


def _other_value(name: str, value: Any) -> Any:
    """A different valid value for any ContextOptions field, derived from its type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, enum.Enum):
        return next(m for m in type(value) if m != value and not getattr(m, "quantized", False))
    if isinstance(value, int):
        return value * 2 if value > 0 else value + 1
    if isinstance(value, float):
        return value + 0.5
    raise AssertionError(f"no rule to vary {name}={value!r}")


def test_every_context_option_is_hashed_or_excluded_with_a_reason() -> None:
    hashed, excluded = set(HASHED_CONTEXT_FIELDS), set(EXCLUDED_CONTEXT_FIELDS)
    assert not hashed & excluded
    undecided = set(CONTEXT_FIELDS) - hashed - excluded
    assert not undecided, f"decide whether these change the KV bytes: {sorted(undecided)}"
    stale = (hashed | excluded) - set(CONTEXT_FIELDS)
    assert not stale, f"no longer ContextOptions fields: {sorted(stale)}"
    assert all(
        r.strip() for r in [*HASHED_CONTEXT_FIELDS.values(), *EXCLUDED_CONTEXT_FIELDS.values()]
    )


def test_hashed_fields_are_exactly_the_parameters_of_ctx_params_hash() -> None:
    # Each parameter is passed from the context, so none of its defaults is ever used.
    assert set(inspect.signature(ctx_params_hash).parameters) == set(HASHED_CONTEXT_FIELDS)


def test_every_model_option_is_excluded_with_a_reason() -> None:
    assert {f.name for f in dataclasses.fields(ModelOptions)} == set(EXCLUDED_MODEL_FIELDS)
    assert all(reason.strip() for reason in EXCLUDED_MODEL_FIELDS.values())


@pytest.mark.parametrize("name", sorted(HASHED_CONTEXT_FIELDS))
def test_changing_a_hashed_field_changes_the_namespace(fake_model: FakeModel, name: str) -> None:
    base = _opts()
    changed = dataclasses.replace(base, **{name: _other_value(name, getattr(base, name))})
    assert getattr(changed, name) != getattr(base, name)
    assert namespace(FakeContext(fake_model, changed)) != namespace(FakeContext(fake_model, base))


@pytest.mark.parametrize("name", sorted(EXCLUDED_CONTEXT_FIELDS))
def test_changing_an_excluded_field_keeps_the_namespace(fake_model: FakeModel, name: str) -> None:
    base = _opts()
    changed = dataclasses.replace(base, **{name: _other_value(name, getattr(base, name))})
    assert namespace(FakeContext(fake_model, changed)) == namespace(FakeContext(fake_model, base))


def test_namespace_hashes_the_sizes_the_context_runs_with_not_the_request(
    fake_model: FakeModel,
) -> None:
    asked_300 = FakeContext(fake_model, _opts(n_ctx=300), n_ctx=512)
    asked_512 = FakeContext(fake_model, _opts(n_ctx=512), n_ctx=512)
    assert namespace(asked_300) == namespace(asked_512)
    assert namespace(asked_300) != namespace(FakeContext(fake_model, _opts(n_ctx=300)))


def test_namespace_components_come_from_the_model_and_every_option(
    fake_model: FakeModel,
) -> None:
    opts = _opts(type_k=KVType.F32, n_seq_max=2, kv_unified=True, rope_freq_base=5e5)
    ns = namespace(FakeContext(fake_model, opts))
    assert ns.fingerprint == model_fingerprint(fake_model.path, "safe")
    assert ns.quant == quant_byte(fake_model.ftype)
    layout = ctx_params_hash(
        **{name: getattr(opts, name) for name in HASHED_CONTEXT_FIELDS}  # type: ignore[arg-type]
    )
    build = build_identity()
    assert ns.ctx_hash == hashlib.sha256(BUILD_DOMAIN + layout + build.digest).digest()
    assert ns.ctx_hash == with_build(layout, build) != layout


def test_active_adapters_fold_into_the_fingerprint_and_zero_scales_do_not(
    fake_model: FakeModel,
) -> None:
    a, b = FakeAdapter("a"), FakeAdapter("b")
    opts = _opts()
    plain = namespace(FakeContext(fake_model, opts))
    with_a = namespace(FakeContext(fake_model, opts, adapters=[(a, 1.0), (b, 0.0)]))
    assert with_a.fingerprint == effective_fingerprint(plain.fingerprint, [(a.sha256, 1.0)])
    assert with_a.fingerprint != plain.fingerprint
    assert (with_a.quant, with_a.ctx_hash) == (plain.quant, plain.ctx_hash)
    assert namespace(FakeContext(fake_model, opts, adapters=[(b, 0.0)])) == plain
    ab = namespace(FakeContext(fake_model, opts, adapters=[(a, 1.0), (b, 0.5)]))
    ba = namespace(FakeContext(fake_model, opts, adapters=[(b, 0.5), (a, 1.0)]))
    assert ab == ba != with_a


def test_base_fingerprint_is_computed_once_per_model_and_mode(fake_model: FakeModel) -> None:
    first = base_fingerprint(fake_model, "safe")
    assert first == hashlib.sha256(fake_model.path.read_bytes()).digest()
    # The file is not looked at again (a missing file would be refused): the
    # digest belongs to the model object.
    fake_model.path.unlink()
    assert base_fingerprint(fake_model, FingerprintMode.SAFE) is first
    with pytest.raises(FingerprintMismatch):
        base_fingerprint(fake_model, "gguf_chunked")


def test_a_model_file_changed_since_load_is_refused(fake_model: FakeModel) -> None:
    data = fake_model.path.read_bytes()
    fake_model.path.write_bytes(data[:-1] + b"\xff")
    os.utime(fake_model.path, ns=(0, fake_model.file_identity[3] + 1_000_000))
    with pytest.raises(FingerprintMismatch) as err:
        base_fingerprint(fake_model, "safe")
    assert err.value.details["reason"] == "file_changed"
    with pytest.raises(FingerprintMismatch):
        namespace(FakeContext(fake_model, _opts()))


def test_a_model_file_replaced_by_another_inode_is_refused(fake_model: FakeModel) -> None:
    copy = fake_model.path.with_suffix(".new")
    copy.write_bytes(fake_model.path.read_bytes())
    os.utime(copy, ns=(0, fake_model.file_identity[3]))
    os.replace(copy, fake_model.path)
    with pytest.raises(FingerprintMismatch):
        base_fingerprint(fake_model, "safe")


def test_fast_unsafe_trusts_the_supplied_digest_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    model = FakeModel(path)
    path.unlink()
    digest = b"\x42" * 32
    assert base_fingerprint(model, "fast_unsafe", supplied=digest) == digest


def test_a_closed_context_has_no_namespace(fake_model: FakeModel) -> None:
    ctx = FakeContext(fake_model, _opts())
    ctx.closed = True
    with pytest.raises(Closed):
        namespace(ctx)


# -- the libllama build (SPEC C12) ------------------------------------------------------

THIS_BUILD = build_identity()
# Builds that differ from this one in one component each: the pin (a future
# llama.cpp that saves states in another format), the backend (CPU <-> GPU),
# a flag that changes numerics. The components are the real ones, changed.
OTHER_BUILDS = {
    "pin": THIS_BUILD.with_components(pin="llama.cpp 9f1e2d3 (llama-cpp-python 0.3.40)"),
    "backend": THIS_BUILD.with_components(
        backend="cuda", **{"ggml.backends": "CPU,CUDA", "ggml.devices": "CPU:cpu,CUDA:gpu"}
    ),
    "numerics_flag": THIS_BUILD.with_components(
        cmake=THIS_BUILD.as_dict()["cmake"] + " GGML_LLAMAFILE=OFF"
    ),
    "cpu_features": THIS_BUILD.with_components(**{"features.CPU": "SSE3=1"}),
}


def test_the_namespace_is_made_under_the_build_loaded_in_this_process(
    fake_model: FakeModel,
) -> None:
    ctx = FakeContext(fake_model, _opts())
    assert namespace(ctx) == namespace(ctx, build=build_identity())


@pytest.mark.parametrize("name", sorted(OTHER_BUILDS))
def test_another_build_is_another_namespace_and_other_keys(
    fake_model: FakeModel, name: str
) -> None:
    ctx = FakeContext(fake_model, _opts())
    here, there = namespace(ctx, build=THIS_BUILD), namespace(ctx, build=OTHER_BUILDS[name])
    assert here != there
    # The build is folded into ctx_hash only: the row still names its model file.
    assert (here.fingerprint, here.quant) == (there.fingerprint, there.quant)
    assert here.ctx_hash != there.ctx_hash
    tokens = list(range(1, 65))
    assert here.key(tokens) != there.key(tokens)
    assert set(here.keys_at(tokens, [1, 32, 64])).isdisjoint(there.keys_at(tokens, [1, 32, 64]))


def test_other_builds_are_pairwise_distinct_namespaces(fake_model: FakeModel) -> None:
    ctx = FakeContext(fake_model, _opts())
    spaces = {namespace(ctx, build=b) for b in (THIS_BUILD, *OTHER_BUILDS.values())}
    assert len(spaces) == 1 + len(OTHER_BUILDS)


@pytest.mark.parametrize("build", [THIS_BUILD, OTHER_BUILDS["backend"]], ids=["this", "cuda"])
def test_thread_counts_never_split_a_builds_namespace(
    fake_model: FakeModel, build: BuildIdentity
) -> None:
    one = FakeContext(fake_model, _opts())
    many = FakeContext(
        fake_model, ContextOptions(n_threads=8, n_threads_batch=16, n_batch=4096, n_ubatch=1024)
    )
    assert namespace(one, build=build) == namespace(many, build=build)
    assert namespace(one, build=build).key([1, 2, 3]) == namespace(many, build=build).key([1, 2, 3])


def test_a_salt_keeps_the_build(fake_model: FakeModel) -> None:
    ctx = FakeContext(fake_model, _opts())
    for build in (THIS_BUILD, OTHER_BUILDS["pin"]):
        ns = namespace(ctx, build=build)
        assert _namespace(ctx, "safe", salt=b"t", build=build) == salted(ns, b"t")
        assert salted(ns, b"t").ctx_hash == ns.ctx_hash


def test_a_namespace_asked_again_is_not_hashed_again_and_any_change_is(
    fake_model: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker asks on every status publish (once per decode step): the
    same live context answers from memory, and an adapter, a salt or a size
    that changed is hashed anew."""
    from llamad.model import identity  # noqa: PLC0415

    calls: list[int] = []
    real = identity.ctx_params_hash

    def counting(**params: Any) -> bytes:
        calls.append(1)
        return real(**params)

    monkeypatch.setattr(identity, "ctx_params_hash", counting)
    monkeypatch.setattr(identity, "_NAMESPACES", {})
    opts = _opts(n_ctx=1536)
    ctx = FakeContext(fake_model, opts)
    first = namespace(ctx)
    assert namespace(ctx) is first
    assert len(calls) == 1
    a = FakeAdapter("memo")
    ctx.adapters = ((a, 1.0),)
    assert namespace(ctx).fingerprint == effective_fingerprint(first.fingerprint, [(a.sha256, 1.0)])
    ctx.adapters = ()
    assert namespace(ctx, salt=b"t") == salted(first, b"t")
    ctx.n_ctx = 2048
    assert namespace(ctx).ctx_hash != first.ctx_hash
    assert len(calls) == 4


def test_a_cacheless_workers_namespace_follows_its_adapters_and_salt(
    fake_model: FakeModel,
) -> None:
    """NoCache keeps its namespace between calls (the status publish asks
    before every decode step) but computes it again once an adapter is
    attached, rescaled or detached: live KV of other adapters is not reused."""
    from llamad.model.worker_parts import NoCache  # noqa: PLC0415

    a = FakeAdapter("a")
    ctx = FakeContext(fake_model, _opts())
    cache = NoCache(ctx)  # type: ignore[arg-type]

    def fresh(salt: bytes | None = None) -> Any:
        return _namespace(ctx, FingerprintMode.FAST_UNSAFE, supplied=bytes(32), salt=salt)

    plain = cache.namespace(None)
    assert plain == fresh() and cache.namespace(None) is plain
    ctx.adapters = ((a, 1.0),)
    styled = cache.namespace(None)
    assert styled == fresh() != plain
    ctx.adapters = ((a, 0.5),)
    assert cache.namespace(None) == fresh() != styled
    assert cache.namespace(b"tenant") == fresh(b"tenant") != fresh()
    ctx.adapters = ()
    assert cache.namespace(None) == plain
    ctx.closed = True
    with pytest.raises(Closed):
        cache.namespace(None)
