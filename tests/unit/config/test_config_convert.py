"""Every key reaches the class it configures: CacheSettings, WorkerSpec (and its parts),
CacheViewConfig, ThreadPolicy, Limits; each built by its own constructor, so its own
validation runs."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import msgspec
import pytest

from config_helpers import Workspace
from llamad.actors.wire import Limits
from llamad.cache.key import FingerprintMode
from llamad.cache.lookup import LookupPolicy
from llamad.cache.policy import CachePolicy
from llamad.cache.pressure import PressureConfig
from llamad.cache.settings import CacheSettings
from llamad.cache.sup import meta_child_spec
from llamad.cache.tier_kind import AUTO, TierKind
from llamad.config import LlamadConfig
from llamad.config.keys import fields_of
from llamad.config.model_schema import ModelCache, ModelConfig, ModelPolicy, ModelThreads
from llamad.config.schema import (
    CacheSection,
    DiskTier,
    LookupSection,
    PolicySection,
    PressureSection,
    RamFileTier,
    RamTier,
    SecuritySection,
    ThreadsSection,
)
from llamad.errors import ModelNotFound
from llamad.llama_ffi.options import (
    ContextOptions,
    FlashAttn,
    KVType,
    LoadMode,
    ModelOptions,
    PoolingType,
    RopeScaling,
    SplitMode,
    default_threads,
)
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.config import MarkerPair, WorkerConfig
from llamad.model.threads import ThreadPolicy
from llamad.model.worker_spec import WorkerSpec

pytestmark = pytest.mark.timeout(60)


def _full(ws: Workspace) -> str:
    """Every table, every key, none at its default."""
    run = ws.env["LLAMAD_RUNTIME_DIR"]
    return f"""
[daemon]
endpoint = "tcp://127.0.0.1:7070"
runtime_dir = "{run}/r"
state_dir = "{ws.dir}/state"
log_format = "json"
log_level = "debug"
serve_default_model = false

[daemon.threads]
cores = 3
collapse_factor = 4.0
collapse_min_s = 0.01
window = 16
min_samples = 8
settle_steps = 3
cooldown_s = "3s"
cooldown_max_s = "2m"
probe_steps = 5
probe_gain = 0.8
explore_first_s = 1
explore_s = 40
explore_max_s = "10m"
busy_linger_s = "250ms"

[cache]
instance = "test-1"
save_permits = 7
reservation_ttl_s = 90
max_wait_s = "45s"
stats_flush_s = 20
liveness_s = "4s"

[cache.ram]
quota = "1GiB"

[cache.ram_file]
quota = "3GiB"
root = "{ws.dir}/ramfile"

[cache.disk]
quota = "10GiB"
root = "{ws.dir}/disk"

[cache.policy]
min_tokens = 256
cold_min_tokens = 300
cold_max_tokens = 20000
continued_interval = 1024
boundary_trim_tokens = 16
boundary_align_tokens = 512
session_resume_wait_ms = 250
evict_save_timeout_ms = "20s"

[cache.lookup]
common_min_tokens = 128
restore_cost = 0.1
allow_common = false

[cache.pressure]
enabled = true
source = "noop"
interval_s = 2
high_watermark = 0.9
low_watermark = 0.6
min_evict_bytes = "4MiB"
evict_tiers = ["ram"]

[security]
model_dirs = ["{ws.models_dir}"]
max_message_bytes = "32MiB"
max_header_bytes = "512KiB"

[models.smol]
path = "{ws.tiny}"
keep_alive = "5m"
n_ctx = 2048
n_batch = 512
n_ubatch = 256
n_seq_max = 4
n_threads = 2
n_threads_batch = 3
flash_attn = "on"
type_k = "q8_0"
type_v = "q8_0"
embeddings = true
pooling = "mean"
offload_kqv = false
swa_full = false
rope_scaling_type = "yarn"
rope_freq_base = 10000.0
rope_freq_scale = 0.5
yarn_ext_factor = 1.0
yarn_attn_factor = 2.0
yarn_beta_fast = 32.0
yarn_beta_slow = 1.0
yarn_orig_ctx = 1024
n_gpu_layers = 0
load_mode = "mmap"
split_mode = "none"
main_gpu = 1
tensor_split = [1.0]
check_tensors = true
max_queue = 8
prefill_chunk_size = 128
strategy = "balanced"
miss_window = 4
live_reuse = false
release_saved_idle = false
decode_timeout_ms = "10s"
liveness_s = 3
load_timeout_s = "1m"

[models.smol.thinking]
open = "<think>"
close = "</think>"

[models.smol.tool_call]
open = "<tool_call>"
close = "</tool_call>"

[models.smol.cache]
save_tier = "disk"
restore_tiers = ["ram_file", "disk"]
fingerprint_mode = "fast_unsafe"
fingerprint = "{"ab" * 32}"
lookup_timeout_s = 1.5
cooldown_s = 0
sync_save_timeout_s = 15
writer_threads = 3

[models.smol.cache.policy]
min_tokens = 64
evict_save_timeout_ms = 5000

[models.smol.threads]
window = 8
probe_gain = 0.5
"""


@pytest.fixture
def full(ws: Workspace) -> LlamadConfig:
    return ws.loaded(_full(ws))


def test_every_table_of_the_full_config_parses(full: LlamadConfig, ws: Workspace) -> None:
    run = ws.env["LLAMAD_RUNTIME_DIR"]
    assert full.endpoint == "tcp://127.0.0.1:7070"
    assert full.runtime_dir == Path(f"{run}/r")
    assert full.state_dir == ws.dir / "state"
    assert full.registry_root == Path(f"{run}/r/actors")
    assert (full.daemon.log_format, full.daemon.log_level) == ("json", "debug")
    assert full.daemon.threads.busy_linger_s == 0.25
    assert full.cache.pressure.evict_tiers == ("ram",)
    assert full.security.max_header_bytes == 512 << 10
    assert full.models["smol"].keep_alive == 300.0
    assert list(full.models) == ["smol"]


def test_cache_settings_carry_every_cache_key(full: LlamadConfig, ws: Workspace) -> None:
    s = full.cache_settings()
    assert isinstance(s, CacheSettings)
    assert [(t.kind, t.root, t.quota, t.instance) for t in s.tiers] == [
        (TierKind.RAM, Path("/dev/shm"), 1 << 30, "test-1"),
        (TierKind.RAM_FILE, ws.dir / "ramfile", 3 << 30, "test-1"),
        (TierKind.DISK, ws.dir / "disk", 10 << 30, "test-1"),
    ]
    assert s.counters_path == full.runtime_dir / "cache-counters"
    assert s.permits_path == full.runtime_dir / "cache-permits"
    assert s.registry_root == full.registry_root
    assert (s.save_permits, s.reservation_ttl_s, s.max_wait_s, s.stats_flush_s) == (
        7,
        90.0,
        45.0,
        20.0,
    )
    assert s.liveness_timeout == 4.0
    assert meta_child_spec(s).liveness_timeout == 4.0
    assert s.lookup == LookupPolicy(common_min_tokens=128, restore_cost=0.1, allow_common=False)
    assert s.pressure == PressureConfig(
        enabled=True,
        source="noop",
        interval_s=2.0,
        high_watermark=0.9,
        low_watermark=0.6,
        min_evict_bytes=4 << 20,
        evict_tiers=(TierKind.RAM,),
    )
    assert CacheSettings.from_wire(s.to_wire()) == s


def test_the_worker_spec_carries_every_model_key(full: LlamadConfig) -> None:
    spec = full.worker_spec("smol")
    assert isinstance(spec, WorkerSpec)
    assert spec.context == ContextOptions(
        n_ctx=2048,
        n_batch=512,
        n_ubatch=256,
        n_seq_max=4,
        n_threads=2,
        n_threads_batch=3,
        flash_attn=FlashAttn.ON,
        type_k=KVType.Q8_0,
        type_v=KVType.Q8_0,
        embeddings=True,
        pooling=PoolingType.MEAN,
        kv_unified=True,
        offload_kqv=False,
        swa_full=False,
        rope_scaling_type=RopeScaling.YARN,
        rope_freq_base=10000.0,
        rope_freq_scale=0.5,
        yarn_ext_factor=1.0,
        yarn_attn_factor=2.0,
        yarn_beta_fast=32.0,
        yarn_beta_slow=1.0,
        yarn_orig_ctx=1024,
    )
    assert spec.model == ModelOptions(
        n_gpu_layers=0,
        load_mode=LoadMode.MMAP,
        split_mode=SplitMode.NONE,
        main_gpu=1,
        tensor_split=(1.0,),
        check_tensors=True,
    )
    assert spec.worker == WorkerConfig(
        n_ctx=2048,
        n_batch=512,
        n_seq_max=4,
        max_queue=8,
        prefill_chunk_size=128,
        strategy="balanced",
        policy=CachePolicy(
            min_tokens=64,
            cold_min_tokens=300,
            cold_max_tokens=20000,
            continued_interval=1024,
            boundary_trim_tokens=16,
            boundary_align_tokens=512,
            session_resume_wait_ms=250,
            evict_save_timeout_ms=5000,
        ),
        thinking=MarkerPair(open="<think>", close="</think>"),
        tool_call=MarkerPair(open="<tool_call>", close="</tool_call>"),
        miss_window=4,
        live_reuse=False,
        release_saved_idle=False,
    )
    assert (spec.decode_timeout_ms, spec.liveness_s, spec.load_timeout_s) == (10_000, 3.0, 60.0)
    assert spec.model_id == "smol"
    assert spec.cache == full.cache_settings()
    assert spec.registry == str(full.registry_root)
    # The spec travels to the worker process as msgpack and is validated there again.
    assert WorkerSpec.from_wire(spec.to_wire()) == spec


def test_the_thread_policy_merges_the_daemon_and_the_model(full: LlamadConfig) -> None:
    assert full.worker_spec("smol").threads == ThreadPolicy(
        max_threads=3,  # the larger of n_threads and n_threads_batch
        cores=3,
        collapse_factor=4.0,
        collapse_min_s=0.01,
        window=8,
        min_samples=8,
        settle_steps=3,
        cooldown_s=3.0,
        cooldown_max_s=120.0,
        probe_steps=5,
        probe_gain=0.5,
        explore_first_s=1.0,
        explore_s=40.0,
        explore_max_s=600.0,
        busy_linger_s=0.25,
    )


def test_the_cache_view_carries_the_model_cache_keys(full: LlamadConfig) -> None:
    assert full.cache_view_config("smol") == CacheViewConfig(
        save_tier=TierKind.DISK,
        restore_tiers=frozenset({TierKind.RAM_FILE, TierKind.DISK}),
        fingerprint_mode=FingerprintMode.FAST_UNSAFE,
        supplied_fingerprint=bytes.fromhex("ab" * 32),
        lookup_timeout_s=1.5,
        cooldown_s=0.0,
        sync_save_timeout_s=15.0,
        writer_threads=3,
    )


def test_the_worker_spec_carries_the_model_cache_view(full: LlamadConfig) -> None:
    spec = full.worker_spec("smol")
    assert spec.cache_view == full.cache_view_config("smol")
    assert spec.cache_view.save_tier is TierKind.DISK  # not the default ram
    assert WorkerSpec.from_wire(spec.to_wire()).cache_view == spec.cache_view


def test_limits_carry_the_message_sizes(full: LlamadConfig) -> None:
    assert full.limits() == Limits(max_frame_bytes=32 << 20, max_header_bytes=512 << 10)


def test_a_model_policy_override_keeps_the_other_daemon_wide_keys(ws: Workspace) -> None:
    config = ws.loaded(
        ws.data(
            {
                ("cache", "policy", "min_tokens"): 100,
                ("cache", "policy", "continued_interval"): 999,
                ("models", "smol", "cache", "policy", "min_tokens"): 50,
            }
        )
    )
    policy = config.worker_spec("smol").worker.policy
    assert (policy.min_tokens, policy.continued_interval) == (50, 999)
    assert policy.cold_max_tokens == CachePolicy().cold_max_tokens


def test_cache_meta_has_a_liveness_window_by_default(ws: Workspace) -> None:
    # Without one, a stopped cache-meta is never found hung (issue 17).
    settings = ws.loaded(ws.data()).cache_settings()
    assert settings.liveness_timeout == 10.0
    spec = meta_child_spec(settings)
    assert spec.liveness_timeout == 10.0


def test_a_tier_with_quota_0_is_left_out(ws: Workspace) -> None:
    config = ws.loaded(
        ws.data(
            {
                ("cache", "ram", "quota"): 0,
                ("cache", "disk", "quota"): 0,
                ("models", "smol", "cache", "save_tier"): "ram_file",
            }
        )
    )
    assert [t.kind for t in config.cache_settings().tiers] == [TierKind.RAM_FILE]
    assert config.cache_view_config("smol").save_tier is TierKind.RAM_FILE


def test_the_save_tier_must_be_one_the_cache_has(ws: Workspace) -> None:
    data = ws.data({("cache", "ram", "quota"): 0, ("models", "smol", "cache", "save_tier"): "ram"})
    problems = ws.refused(data)
    assert problems == {"models.smol.cache.save_tier": "the cache has no ram tier"}


def test_the_default_save_tier_is_auto_and_takes_whatever_tier_there_is(ws: Workspace) -> None:
    config = ws.loaded(ws.data({("cache", "ram", "quota"): 0}))
    assert config.cache_view_config("smol").save_tier is None


def test_with_no_thread_settings_the_worker_chooses(ws: Workspace) -> None:
    config = ws.loaded(ws.data())
    assert config.worker_spec("smol").threads is None


def test_the_thread_budget_caps_the_default_thread_counts(ws: Workspace) -> None:
    data = ws.data({("daemon", "threads", "cores"): 1})
    del data["models"]["smol"]["n_threads"]
    spec = ws.loaded(data).worker_spec("smol")
    assert (spec.context.n_threads, spec.context.n_threads_batch) == (1, 1)
    assert spec.threads == ThreadPolicy(max_threads=1, cores=1)


def test_default_thread_counts_are_the_daemons_cpus(ws: Workspace) -> None:
    data = ws.data()
    del data["models"]["smol"]["n_threads"]
    spec = ws.loaded(data).worker_spec("smol")
    assert spec.context.n_threads == spec.context.n_threads_batch == default_threads()


def test_an_unknown_model_id_is_model_not_found(ws: Workspace) -> None:
    config = ws.loaded(ws.data())
    with pytest.raises(ModelNotFound):
        config.worker_spec("nope")


# -- the schema's defaults are the classes' defaults --------------------------

# (schema table, class, keys of the table that are not fields of the class)
SAME_DEFAULTS: list[tuple[type[msgspec.Struct], Any, set[str]]] = [
    (PolicySection, CachePolicy(), set()),
    (LookupSection, LookupPolicy(), set()),
    (PressureSection, PressureConfig(), set()),
    (ThreadsSection, ThreadPolicy(max_threads=1), {"cores"}),
    # save_tier: "auto" in the file is None in the class (test below).
    (ModelCache, CacheViewConfig(), {"restore_tiers", "fingerprint", "policy", "save_tier"}),
]


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "name") and hasattr(value, "value"):  # an enum: its config spelling
        return value.value if isinstance(value.value, str) else value.name.lower()
    return value


@pytest.mark.parametrize(
    ("table", "instance", "skip"), SAME_DEFAULTS, ids=[t[0].__name__ for t in SAME_DEFAULTS]
)
def test_a_tables_defaults_are_its_classs(
    table: type[msgspec.Struct], instance: Any, skip: set[str]
) -> None:
    for f in fields_of(table):
        if f.name not in skip:
            assert f.default_value() == _plain(getattr(instance, f.name)), f.name


def test_model_defaults_are_the_worker_classes_defaults() -> None:
    defaults = {f.name: f.default_value() for f in fields_of(ModelConfig)}
    context, options, worker = ContextOptions(), ModelOptions(), WorkerConfig(n_ctx=4096)
    for cls, instance in ((ContextOptions, context), (ModelOptions, options)):
        for f in dataclasses.fields(cls):
            # Not configured: repack is off only under deterministic (load_options).
            if f.name in ("n_threads", "n_threads_batch", "kv_unified", "vocab_only", "repack"):
                continue
            assert defaults[f.name] == _plain(getattr(instance, f.name)), f.name
    for name in ("n_batch", "n_seq_max", "max_queue", "strategy", "miss_window"):
        assert defaults[name] == getattr(worker, name), name
    assert defaults["n_ctx"] == context.n_ctx
    spec_defaults = {p.name: p.default for p in inspect.signature(WorkerSpec).parameters.values()}
    for name in ("decode_timeout_ms", "liveness_s", "load_timeout_s"):
        assert defaults[name] == spec_defaults[name], name


def test_cache_and_security_defaults_are_the_daemons_classes() -> None:
    tiers = inspect.signature(CacheSettings.defaults).parameters
    assert RamTier().quota == tiers["ram_quota"].default
    assert RamFileTier().quota == tiers["ram_file_quota"].default
    assert DiskTier().quota == tiers["disk_quota"].default
    settings = inspect.signature(CacheSettings).parameters
    cache = CacheSection()
    for name in (
        "save_permits",
        "reservation_ttl_s",
        "max_wait_s",
        "stats_flush_s",
        "promote_hits",
        "stop_moves_s",
    ):
        assert getattr(cache, name) == settings[name].default, name
    assert cache.liveness_s == settings["liveness_timeout"].default
    assert cache.disk.write_behind == settings["write_behind"].default
    assert ModelCache().save_tier == AUTO and CacheViewConfig().save_tier is None
    limits, security = Limits(), SecuritySection()
    assert security.max_message_bytes == limits.max_frame_bytes
    assert security.max_header_bytes == limits.max_header_bytes


# -- every field of the classes has a key ---------------------------------------

NOT_KEYS = {
    ContextOptions: {"kv_unified"},  # always on: any sequence may restore any row
    # a served model needs its weights; repack is off only under deterministic
    ModelOptions: {"vocab_only", "repack"},
    WorkerConfig: {"policy", "thinking", "tool_call"},  # tables of their own
}


@pytest.mark.parametrize("cls", [ContextOptions, ModelOptions, WorkerConfig])
def test_every_worker_field_is_a_model_key(cls: type[Any]) -> None:
    keys = {f.name for f in fields_of(ModelConfig)}
    fields = {f.name for f in dataclasses.fields(cls)} - NOT_KEYS.get(cls, set())
    assert fields <= keys, fields - keys
    assert {"thinking", "tool_call"} <= keys


@pytest.mark.parametrize(
    ("cls", "table", "not_keys"),
    [
        (CachePolicy, PolicySection, set()),
        (CachePolicy, ModelPolicy, set()),
        (LookupPolicy, LookupSection, set()),
        (PressureConfig, PressureSection, set()),
        (ThreadPolicy, ThreadsSection, {"max_threads"}),  # from the context's counts
        (ThreadPolicy, ModelThreads, {"max_threads", "cores"}),  # the budget is daemon-wide
        (CacheViewConfig, ModelCache, {"supplied_fingerprint"}),  # the `fingerprint` key
    ],
)
def test_every_field_of_a_class_is_a_key_of_its_table(
    cls: type[Any], table: type[msgspec.Struct], not_keys: set[str]
) -> None:
    keys = {f.name for f in fields_of(table)}
    fields = {f.name for f in dataclasses.fields(cls)} - not_keys
    assert fields <= keys, fields - keys


def test_the_remote_tier_is_off_by_default_and_built_when_a_url_is_set(ws: Workspace) -> None:
    assert ws.loaded(ws.data()).cache_settings().remote is None
    data = ws.data(
        {
            ("cache", "remote", "url"): "redis://127.0.0.1:6390/0",
            ("cache", "remote", "timeout_ms"): "80ms",
            ("cache", "remote", "chunk_bytes"): "1MiB",
            ("cache", "remote", "min_tokens"): 256,
        }
    )
    remote = ws.loaded(data).cache_settings().remote
    assert remote is not None
    assert (remote.url, remote.timeout_ms, remote.chunk_bytes, remote.min_tokens) == (
        "redis://127.0.0.1:6390/0",
        80,
        1 << 20,
        256,
    )
    # A worker's settings carry it across the wire.
    assert CacheSettings.from_wire(ws.loaded(data).cache_settings().to_wire()).remote == remote


def test_a_remote_url_without_the_redis_package_is_refused_naming_the_key(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util  # noqa: PLC0415

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    problems = ws.refused(ws.data({("cache", "remote", "url"): "redis://127.0.0.1:6390/0"}))
    assert problems == {
        "cache.remote.url": "the remote tier needs the redis package: install llamad[remote]"
    }
