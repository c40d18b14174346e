"""The ``[models.<id>]`` tables: one model worker each (SPEC M1-M4, M14, M15, C7, D7).

Key names are the fields they set (``ContextOptions``, ``ModelOptions``,
``WorkerConfig``, ``WorkerSpec``, ``CacheViewConfig``, ``CachePolicy``,
``ThreadPolicy``), so one name means one thing from the config file to the
worker. Defaults equal those classes' own (``tests/unit/config`` holds them
to it); a ``None`` default means "computed where the daemon runs" (thread
counts) or "inherited from the daemon-wide table" (policy and governor
overrides). Cross-field rules (``n_ubatch <= n_batch``, a quantised V cache
needs flash attention, ...) are those classes' own, applied when the config
is loaded (:mod:`llamad.config.convert`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Annotated

import msgspec

from llamad.cache.key import FingerprintMode
from llamad.cache.tier_kind import AUTO, TierKind
from llamad.config.keys import Key, Section
from llamad.config.kinds import (
    AbsPath,
    Boolean,
    Duration,
    Integer,
    ManyOf,
    Number,
    NumberList,
    OneOf,
    Text,
)
from llamad.config.sections import Table
from llamad.model.cache_view_config import LOOKUP_TIMEOUT_S
from llamad.model.strategies import DEFAULT_STRATEGY, STRATEGIES
from llamad.tiers import LOCAL_TIERS

__all__ = [
    "DEFAULT_MODEL_PATH",
    "LOCAL_TIER_NAMES",
    "TIER_NAMES",
    "Markers",
    "ModelCache",
    "ModelConfig",
    "ModelPolicy",
    "ModelThreads",
]

DEFAULT_MODEL_PATH = "default"
"""The ``path`` that names the default model (:func:`llamad.paths.default_model_path`)."""

TIER_NAMES: tuple[str, ...] = tuple(t.value for t in TierKind)
LOCAL_TIER_NAMES: tuple[str, ...] = tuple(t.value for t in LOCAL_TIERS)
"""The tiers cache-meta owns: a save lands in one of them and memory pressure
evicts from them; the remote tier is only restored from (and written behind)."""


def _binding_names(enum_name: str) -> Callable[[], tuple[str, ...]]:
    """The lower-case member names of a binding enum, read when first needed.
    (It once kept libllama out of every process that imports the schema; the
    enums are literals now, and the lazy read stays as the schema's one way
    to name them.)"""

    def names() -> tuple[str, ...]:
        options = importlib.import_module("llamad.llama_ffi.options")
        return tuple(m.name.lower() for m in getattr(options, enum_name))

    return names


_count = Integer(ge=1)
_seconds = Duration(positive=True)


class Markers(Table, frozen=True, kw_only=True):
    """Text that opens and closes a marked section of the output."""

    open: Annotated[str, Key("The text that opens the section.", Text(), required=True)] = ""
    close: Annotated[str, Key("The text that closes it.", Text(), required=True)] = ""


class ModelPolicy(Table, frozen=True, kw_only=True):
    """Per-model save policy overrides; each unset key takes ``[cache.policy]``'s value."""

    min_tokens: Annotated[int | None, Key("See [cache.policy].", Integer(ge=0))] = None
    cold_min_tokens: Annotated[int | None, Key("See [cache.policy].", Integer(ge=0))] = None
    cold_max_tokens: Annotated[int | None, Key("See [cache.policy].", Integer(ge=0))] = None
    continued_interval: Annotated[int | None, Key("See [cache.policy].", _count)] = None
    boundary_trim_tokens: Annotated[int | None, Key("See [cache.policy].", Integer(ge=0))] = None
    boundary_align_tokens: Annotated[int | None, Key("See [cache.policy].", _count)] = None
    session_resume_wait_ms: Annotated[
        int | None, Key("See [cache.policy].", Duration(unit="ms"))
    ] = None
    evict_save_timeout_ms: Annotated[
        int | None, Key("See [cache.policy].", Duration(unit="ms"))
    ] = None


class ModelCache(Table, frozen=True, kw_only=True):
    """How this model uses the cache (``CacheViewConfig``) and its policy overrides."""

    save_tier: Annotated[
        str,
        Key(
            "The tier every save of this model is written to (the cache must have it, "
            'with a quota > 0), or "auto": the fastest of restore_tiers with room, ram '
            "while it has some, its older rows demoting down the tiers.",
            OneOf((AUTO, *LOCAL_TIER_NAMES)),
        ),
    ] = AUTO
    restore_tiers: Annotated[
        tuple[str, ...] | None,
        Key(
            "The tiers a restore may read: a lookup answers a row's fastest copy among "
            "them, and a row with none there counts as a miss; with remote, the shared "
            "Redis tier (cache.remote.url) is asked after the local ones.",
            ManyOf(TIER_NAMES),
            default_text="every tier the cache has",
            example=list(TIER_NAMES),
        ),
    ] = None
    fingerprint_mode: Annotated[
        str,
        Key(
            "How the model file is identified in cache keys: safe (sha256 of the whole "
            "file), gguf_chunked (header, metadata, tensor table and first tensor), "
            "fast_unsafe (trust `fingerprint`).",
            OneOf(tuple(m.value for m in FingerprintMode)),
        ),
    ] = FingerprintMode.GGUF_CHUNKED.value
    fingerprint: Annotated[
        str | None,
        Key(
            "The model's digest as 64 hex digits; required with fingerprint_mode = "
            '"fast_unsafe", which trusts it as is.',
            Text(pattern=r"[0-9a-fA-F]{64}", hint="64 hex digits"),
            default_text="none",
            example="0" * 64,
        ),
    ] = None
    lookup_timeout_s: Annotated[
        float,
        Key(
            "The most a cache lookup may hold the worker's loop beyond a wait for a save "
            "in flight (and the most cache-meta may stay silent during one); a slower "
            "lookup runs the request cold and the cache is taken for down.",
            _seconds,
        ),
    ] = LOOKUP_TIMEOUT_S
    cooldown_s: Annotated[
        float,
        Key(
            "While the cache is taken for down (after a lookup timeout), lookups are "
            "skipped and synchronous saves not tried for at least this long, and until "
            "cache-meta answers again.",
            Duration(),
        ),
    ] = 0.0
    sync_save_timeout_s: Annotated[
        float, Key("Bound of a synchronous save whose job carries no deadline.", _seconds)
    ] = 30.0
    writer_threads: Annotated[
        int, Key("Threads of the worker's save writer pool.", Integer(ge=1, le=64))
    ] = 2
    policy: Annotated[
        ModelPolicy, Section("Save policy overrides for this model (keys of [cache.policy]).")
    ] = msgspec.field(default_factory=ModelPolicy)


class ModelThreads(Table, frozen=True, kw_only=True):
    """Per-model thread governor overrides; each unset key takes ``[daemon.threads]``'s."""

    collapse_factor: Annotated[float | None, Key("See [daemon.threads].", Number(gt=1))] = None
    collapse_min_s: Annotated[float | None, Key("See [daemon.threads].", _seconds)] = None
    window: Annotated[int | None, Key("See [daemon.threads].", _count)] = None
    min_samples: Annotated[int | None, Key("See [daemon.threads].", _count)] = None
    settle_steps: Annotated[int | None, Key("See [daemon.threads].", Integer(ge=0))] = None
    cooldown_s: Annotated[float | None, Key("See [daemon.threads].", _seconds)] = None
    cooldown_max_s: Annotated[float | None, Key("See [daemon.threads].", _seconds)] = None
    probe_steps: Annotated[int | None, Key("See [daemon.threads].", _count)] = None
    probe_gain: Annotated[float | None, Key("See [daemon.threads].", Number(gt=0, le=1))] = None
    explore_first_s: Annotated[float | None, Key("See [daemon.threads].", Duration())] = None
    explore_s: Annotated[float | None, Key("See [daemon.threads].", _seconds)] = None
    explore_max_s: Annotated[float | None, Key("See [daemon.threads].", _seconds)] = None
    busy_linger_s: Annotated[float | None, Key("See [daemon.threads].", _seconds)] = None


_float = Number()


class ModelConfig(Table, frozen=True, kw_only=True):
    """One model: its file, its context, how it schedules, saves and idles."""

    path: Annotated[
        str,
        Key(
            'The GGUF file (absolute; `~` is expanded), or "default" for the default '
            "model that `make setup` installs. Its real path (symlinks resolved) must lie "
            'in one of security.model_dirs. Under the default model\'s id ("smollm2") it '
            'may be left out: it is then "default".',
            AbsPath(keywords=(DEFAULT_MODEL_PATH,)),
            required=True,
            example=DEFAULT_MODEL_PATH,
        ),
    ] = ""
    keep_alive: Annotated[
        float | None,
        Key(
            "Unload the model after it has been idle this long; the next request loads "
            "it again (its cache rows stay on the ram_file and disk tiers).",
            Duration(never=True),
        ),
    ] = None
    # -- the context (ContextOptions) -----------------------------------------
    n_ctx: Annotated[
        int, Key("KV cells of the context, shared by its sequences (kv_unified).", _count)
    ] = 4096
    n_batch: Annotated[int, Key("Most tokens one llama_decode carries.", _count)] = 2048
    n_ubatch: Annotated[int, Key("Physical batch size (<= n_batch).", _count)] = 512
    n_seq_max: Annotated[
        int, Key("Sequences: the most requests decoding at once (<= n_batch).", _count)
    ] = 1
    n_threads: Annotated[
        int | None,
        Key(
            "Threads of a single-token decode.",
            _count,
            default_text="every CPU the daemon may run on",
            example=4,
        ),
    ] = None
    n_threads_batch: Annotated[
        int | None,
        Key(
            "Threads of a prompt (batch) decode.",
            _count,
            default_text="every CPU the daemon may run on",
            example=4,
        ),
    ] = None
    flash_attn: Annotated[
        str,
        Key(
            "Flash attention; auto is llama.cpp's choice (on, on a CPU build). off makes"
            " CPU one-row decodes 2-4x faster, but replies then change with the KV"
            " cells' history: an exact hit or a batched request may not reproduce a reply.",
            OneOf(_binding_names("FlashAttn")),
        ),
    ] = "auto"
    type_k: Annotated[str, Key("Element type of the K cache.", OneOf(_binding_names("KVType")))] = (
        "f16"
    )
    type_v: Annotated[
        str,
        Key(
            "Element type of the V cache (a quantised type needs flash_attn on or auto).",
            OneOf(_binding_names("KVType")),
        ),
    ] = "f16"
    embeddings: Annotated[bool, Key("Compute embeddings instead of logits.", Boolean())] = False
    pooling: Annotated[
        str,
        Key(
            "How embeddings are pooled per sequence (unspecified: the model's choice).",
            OneOf(_binding_names("PoolingType")),
        ),
    ] = "unspecified"
    offload_kqv: Annotated[bool, Key("Keep the KV cache on the GPU.", Boolean())] = True
    swa_full: Annotated[
        bool, Key("Full-size cache for sliding-window attention layers.", Boolean())
    ] = True
    rope_scaling_type: Annotated[
        str,
        Key(
            "RoPE scaling (unspecified: the model's choice).",
            OneOf(_binding_names("RopeScaling")),
        ),
    ] = "unspecified"
    rope_freq_base: Annotated[float, Key("RoPE base frequency (0: the model's).", Number(ge=0))] = (
        0.0
    )
    rope_freq_scale: Annotated[
        float, Key("RoPE frequency scale (0: the model's).", Number(ge=0))
    ] = 0.0
    yarn_ext_factor: Annotated[
        float, Key("YaRN extrapolation mix (< 0: the model's).", _float)
    ] = -1.0
    yarn_attn_factor: Annotated[
        float, Key("YaRN attention magnitude (< 0: the model's).", _float)
    ] = -1.0
    yarn_beta_fast: Annotated[
        float, Key("YaRN low correction dim (< 0: the model's).", _float)
    ] = -1.0
    yarn_beta_slow: Annotated[
        float, Key("YaRN high correction dim (< 0: the model's).", _float)
    ] = -1.0
    yarn_orig_ctx: Annotated[
        int, Key("YaRN original context size (0: the model's).", Integer(ge=0, le=2**32 - 1))
    ] = 0
    # -- loading (ModelOptions) -----------------------------------------------
    n_gpu_layers: Annotated[
        int, Key("Layers offloaded to the GPU (-1: all; no effect on CPU).", Integer(ge=-1))
    ] = -1
    load_mode: Annotated[
        str, Key("How the weights are mapped.", OneOf(_binding_names("LoadMode")))
    ] = "auto"
    split_mode: Annotated[
        str, Key("How a model is split across GPUs.", OneOf(_binding_names("SplitMode")))
    ] = "layer"
    main_gpu: Annotated[int, Key("The GPU used when split_mode is none.", Integer(ge=0))] = 0
    tensor_split: Annotated[
        tuple[float, ...], Key("Each GPU's share of the model.", NumberList())
    ] = ()
    check_tensors: Annotated[bool, Key("Validate tensor data while loading (slow).", Boolean())] = (
        False
    )
    # -- the scheduler (WorkerConfig) -----------------------------------------
    max_queue: Annotated[
        int,
        Key(
            "Requests waiting for a sequence before `overloaded` (0: no queue).",
            Integer(ge=0),
        ),
    ] = 64
    prefill_chunk_size: Annotated[
        int | None,
        Key(
            "Most prompt tokens one sequence prefills per tick (<= n_batch).",
            _count,
            default_text="max(64, n_batch // 4)",
            example=512,
        ),
    ] = None
    strategy: Annotated[str, Key("The batch strategy of each tick.", OneOf(tuple(STRATEGIES)))] = (
        DEFAULT_STRATEGY
    )
    miss_window: Annotated[
        int,
        Key(
            "Prompt tokens shown on each side of the point where a miss diverged.",
            Integer(ge=0),
        ),
    ] = 16
    live_reuse: Annotated[
        bool,
        Key(
            "Keep a finished request's KV in its sequence as an idle entry, so that the "
            "next request sharing a prefix with it reuses those cells at once (least "
            "recently used entry dropped first when a sequence or its cells are needed); "
            "false clears a sequence when its request ends.",
            Boolean(),
        ),
    ] = True
    release_saved_idle: Annotated[
        bool,
        Key(
            "When a request starts, clear the idle entries whose KV is exactly a row the "
            "cache has published or is writing (but any the request reuses): in a unified KV "
            "every decode "
            "attends over idle entries' cells, and the next request for such a prompt "
            "restores its row instead (a few ms). Entries never saved stay; false keeps "
            "every idle entry live.",
            Boolean(),
        ),
    ] = True
    deterministic: Annotated[
        bool,
        Key(
            "Greedy replies and logprobs that do not depend on what shares a batch, how a "
            "prompt was chunked or where its cells sit: prompts are processed without "
            "ggml-cpu's tiled flash attention (and K-quant weights without its tiled "
            "matmul), at a cost in prompt processing speed (bench/results/numerics-*.md). "
            "Decodes give the same logits on any thread count and beside any other "
            "sequence either way. Rows saved under each "
            "setting are kept apart in the cache.",
            Boolean(),
        ),
    ] = False
    thinking: Annotated[
        Markers | None,
        Section("Thinking markers, surfaced as their own stream events.", optional=True),
    ] = None
    tool_call: Annotated[
        Markers | None,
        Section("Tool-call markers, surfaced as their own stream events.", optional=True),
    ] = None
    # -- the process (WorkerSpec) ---------------------------------------------
    decode_timeout_ms: Annotated[
        int,
        Key(
            "A decode that runs longer is stopped, its requests fail `timeout`; "
            "a tick still busy at 1.5 times it is hung: the worker is restarted (M15).",
            Duration(unit="ms", positive=True),
        ),
    ] = 30_000
    liveness_s: Annotated[
        float, Key("How long the supervisor waits for a heartbeat.", _seconds)
    ] = 5.0
    load_timeout_s: Annotated[
        float, Key("How long loading may take before the start counts as failed.", _seconds)
    ] = 120.0
    cache: Annotated[ModelCache, Section("How this model uses the cache.")] = msgspec.field(
        default_factory=ModelCache
    )
    threads: Annotated[ModelThreads, Section("Thread governor overrides for this model.")] = (
        msgspec.field(default_factory=ModelThreads)
    )
