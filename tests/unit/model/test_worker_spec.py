"""WorkerSpec refuses a bad worker at construction (naming the field) and travels as msgpack."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest

from llamad.cache.key import FingerprintMode
from llamad.cache.policy import CachePolicy
from llamad.cache.tier_kind import TierKind
from llamad.errors import ConfigError
from llamad.llama_ffi.options import ContextOptions, FlashAttn, KVType
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.config import MarkerPair, WorkerConfig
from llamad.model.worker_spec import (
    NT_THRESHOLD,
    TILED_ENV,
    TILED_MM_ENV,
    WORKER_ENTRY,
    WorkerSpec,
    apply_numerics,
    worker_actor_name,
    worker_child_spec,
    worker_env,
    worker_template,
)
from llamad.supervisor.spec import ChildSpec, Restart
from llamad.testing import discard_scratch, scratch_settings

pytestmark = pytest.mark.timeout(60)


def context(**kw: Any) -> ContextOptions:
    opts: dict[str, Any] = {
        "n_ctx": 1024,
        "n_batch": 256,
        "n_ubatch": 256,
        "n_seq_max": 4,
        "kv_unified": True,
        "n_threads": 1,
        "n_threads_batch": 1,
        **kw,
    }
    return ContextOptions(**opts)


def spec(**kw: Any) -> WorkerSpec:
    fields: dict[str, Any] = {
        "model_id": "smol",
        "model_path": "/models/smol.gguf",
        "context": context(),
        "worker": WorkerConfig(n_ctx=1024, n_batch=256, n_seq_max=4),
        **kw,
    }
    return WorkerSpec(**fields)


def field_of(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    return str(exc.value.details.get("field"))


def test_spec_round_trips_through_msgpack_unchanged() -> None:
    settings = scratch_settings()
    try:
        original = spec(
            context=context(flash_attn=FlashAttn.OFF, type_k=KVType.Q8_0),
            worker=WorkerConfig(
                n_ctx=1024,
                n_batch=256,
                n_seq_max=4,
                max_queue=3,
                policy=CachePolicy(min_tokens=16, cold_min_tokens=16),
                thinking=MarkerPair("<think>", "</think>"),
            ),
            cache=settings,
            decode_timeout_ms=1234,
            liveness_s=0.5,
            deterministic=True,
            cache_view=CacheViewConfig(
                save_tier=TierKind.DISK,
                restore_tiers=frozenset({TierKind.DISK, TierKind.RAM_FILE}),
                fingerprint_mode=FingerprintMode.FAST_UNSAFE,
                supplied_fingerprint=b"\xab" * 32,
                lookup_timeout_s=0.75,
                cooldown_s=0.0,
                sync_save_timeout_s=9.0,
                writer_threads=3,
            ),
        )
        wire = msgpack.unpackb(msgpack.packb(original.to_wire(), use_bin_type=True), raw=False)
        assert WorkerSpec.from_wire(wire) == original
    finally:
        discard_scratch(settings)


def test_the_cache_view_defaults_to_saving_to_ram_and_restoring_from_any_tier() -> None:
    assert spec().cache_view == CacheViewConfig()
    wire = spec().to_wire()
    del wire["cache_view"]  # a spec from before the field
    assert WorkerSpec.from_wire(wire).cache_view == CacheViewConfig()


def test_a_cache_view_the_cache_cannot_serve_is_refused_naming_the_field() -> None:
    settings = scratch_settings(disk_quota=0)
    try:
        with pytest.raises(ConfigError) as exc:
            spec(cache=settings, cache_view=CacheViewConfig(save_tier=TierKind.DISK))
        assert field_of(exc) == "cache_view.save_tier"
        # The same view without a cache: nothing to check it against yet.
        assert spec(cache_view=CacheViewConfig(save_tier=TierKind.DISK)).cache is None
    finally:
        discard_scratch(settings)


@pytest.mark.parametrize(
    ("expected", "kwargs"),
    [
        ("model_id", {"model_id": "has space"}),
        ("model_path", {"model_path": "relative/model.gguf"}),
        ("context.kv_unified", {"context": context(kv_unified=False)}),
        ("worker.n_seq_max", {"worker": WorkerConfig(n_ctx=1024, n_batch=256, n_seq_max=2)}),
        ("worker.n_ctx", {"worker": WorkerConfig(n_ctx=2048, n_batch=256, n_seq_max=4)}),
        ("decode_timeout_ms", {"decode_timeout_ms": 0}),
        ("liveness_s", {"liveness_s": float("nan")}),
        ("load_timeout_s", {"load_timeout_s": -1}),
        ("registry_root", {"registry_root": "relative"}),
        ("parts", {"parts": "not a target"}),
        ("cache_view", {"cache_view": {"save_tier": "disk"}}),
        ("deterministic", {"deterministic": 1}),
    ],
)
def test_bad_spec_is_refused_naming_the_field(expected: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as exc:
        spec(**kwargs)
    assert field_of(exc) == expected


@pytest.mark.parametrize(
    ("expected", "patch"),
    [
        ("context.n_ubatch", {"context": {"n_ubatch": 0}}),
        ("context.nonsense", {"context": {"nonsense": 1}}),
        ("worker.max_queue", {"worker": {"max_queue": -1}}),
        ("worker.policy", {"worker": {"policy": {"min_tokens": -1}}}),
        ("cache_view.save_tier", {"cache_view": {"save_tier": "nowhere"}}),
        ("cache_view.restore_tiers", {"cache_view": {"restore_tiers": []}}),
        ("cache_view.writer_threads", {"cache_view": {"writer_threads": 0}}),
        ("cache_view.bogus", {"cache_view": {"bogus": 1}}),
        ("cache_view", {"cache_view": [1, 2]}),
        ("extra", {"extra": 1}),
    ],
)
def test_bad_wire_spec_is_refused_naming_the_field(expected: str, patch: dict[str, Any]) -> None:
    wire = spec().to_wire()
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(wire.get(key), dict):
            wire[key] = {**wire[key], **value}
        else:
            wire[key] = value
    with pytest.raises(ConfigError) as exc:
        WorkerSpec.from_wire(wire)
    assert field_of(exc).startswith(expected)


def test_actor_name_is_namespaced_under_model() -> None:
    assert worker_actor_name("smol") == "model.smol"
    assert spec().actor_name == "model.smol"


def test_registry_defaults_to_the_caches() -> None:
    settings = scratch_settings()
    try:
        assert spec(cache=settings).registry == str(settings.registry_root)
        assert spec(cache=settings, registry_root="/tmp/x").registry == "/tmp/x"
        assert spec().registry is None
    finally:
        discard_scratch(settings)


def test_child_spec_carries_the_spec_and_the_worker_timings() -> None:
    s = spec(
        worker=WorkerConfig(
            n_ctx=1024,
            n_batch=256,
            n_seq_max=4,
            policy=CachePolicy(evict_save_timeout_ms=7_000),
        ),
        liveness_s=1.5,
        load_timeout_s=90,
    )
    child = worker_child_spec(s)
    assert child.id == "model.smol"
    assert child.start.target == WORKER_ENTRY
    assert WorkerSpec.from_wire(child.start.args[0]) == s
    assert child.liveness_timeout == 1.5
    assert child.start_timeout == 90
    # The shutdown saves must fit in the supervisor's shutdown allowance.
    assert isinstance(child.shutdown, float) and child.shutdown > 7.0
    assert ChildSpec.from_wire(child.to_wire()) == child


def test_template_appends_the_spec_as_the_argument() -> None:
    template = worker_template(liveness_s=3.0, restart=Restart.TRANSIENT)
    started = template.start.with_extra_args([spec().to_wire()])
    assert started.target == WORKER_ENTRY
    assert WorkerSpec.from_wire(started.args[0]) == spec()
    assert template.liveness_timeout == 3.0
    assert template.restart is Restart.TRANSIENT


def test_a_deterministic_worker_turns_the_tiled_attention_off_in_its_process() -> None:
    environ: dict[str, str] = {}
    apply_numerics(spec(), environ)
    assert environ == {}  # the default leaves the library's default alone
    apply_numerics(spec(deterministic=True), environ)
    assert environ == {TILED_ENV: "0", TILED_MM_ENV: "0"}


NT = f"glibc.cpu.x86_non_temporal_threshold={NT_THRESHOLD:#x}"


def test_a_worker_starts_with_the_non_temporal_threshold_after_the_operators_tunables() -> None:
    assert worker_env({}) == {"GLIBC_TUNABLES": NT}
    assert worker_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {
        "GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{NT}"
    }
    # An operator's own threshold is theirs.
    mine = "glibc.malloc.arena_max=2:glibc.cpu.x86_non_temporal_threshold=0x100000"
    assert worker_env({"GLIBC_TUNABLES": mine}) == {}
    # Both ways a worker is started carry it.
    assert worker_template().env == worker_env()
    assert worker_child_spec(spec()).env == worker_env()


def _loader() -> str | None:
    for name in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"):
        if Path(name).exists():
            return name
    return shutil.which("ld.so")


def test_glibc_reads_the_workers_threshold() -> None:
    loader = _loader()
    if loader is None:
        pytest.skip("no glibc loader here")
    env = {**os.environ, **worker_env({})}
    run = subprocess.run(
        [loader, "--list-tunables"], env=env, capture_output=True, text=True, check=False
    )
    if run.returncode != 0 or "x86_non_temporal_threshold" not in run.stdout:
        pytest.skip("this glibc does not list x86 tunables")
    line = next(x for x in run.stdout.splitlines() if "x86_non_temporal_threshold" in x)
    assert line.split(":")[1].split()[0] == f"{NT_THRESHOLD:#x}", line
