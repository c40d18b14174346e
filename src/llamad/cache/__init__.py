"""The token-exact, multi-tier KV cache (SPEC C1-C11).

Storage side: keys (:mod:`.key`), the ``.kvc`` format (:mod:`.kvc`), tiers
(:mod:`.tiers`), the writer's half of the publish protocol (:mod:`.publish`),
the writer pool (:mod:`.writer`), save policy (:mod:`.policy`) and shared
counters (:mod:`.counters`). Meta side: the sole writer's state machine
(:mod:`.meta`, :mod:`.reservation`, :mod:`.eviction`), lookups (:mod:`.prefix`,
:mod:`.lookup`), the pressure scheduler (:mod:`.pressure`), the process
(:mod:`.meta_proc`, wire contract in :mod:`.meta_wire`), the client every other
process uses (:mod:`.client`), cache-meta's settings (:mod:`.settings`), the
``ram`` tier's purge between daemon runs (:mod:`.ram_purge`) and cache_sup
(:mod:`.sup`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

if TYPE_CHECKING:
    from llamad.cache.client import CacheClient
    from llamad.cache.counters import Counters
    from llamad.cache.key import (
        KEY_LEN,
        QUANT_BYTES,
        FingerprintMode,
        Namespace,
        ctx_params_hash,
        effective_fingerprint,
        model_fingerprint,
        quant_byte,
        tokens_to_bytes,
    )
    from llamad.cache.kvc import KvcMeta, KvcSpec, SaveReason, parse, parse_meta, write_kvc
    from llamad.cache.lookup import HitKind, Lookup, LookupPolicy, RowRef
    from llamad.cache.meta import CacheMeta
    from llamad.cache.meta_config import MetaConfig
    from llamad.cache.meta_wire import GcResult
    from llamad.cache.policy import (
        CachePolicy,
        cold_save_split,
        should_continued_save,
        should_finish_save,
        trim_boundary,
    )
    from llamad.cache.prefix import PrefixIndex, PrefixMatch
    from llamad.cache.pressure import PressureConfig, PressureScheduler
    from llamad.cache.publish import PublishMeta, PublishOutcome, PublishResult
    from llamad.cache.ram_purge import purge_ram
    from llamad.cache.reservation import SaveIntent, Stage
    from llamad.cache.settings import CacheSettings
    from llamad.cache.sup import cache_sup_spec
    from llamad.cache.tier_kind import TierKind
    from llamad.cache.tier_lock import TierLocks
    from llamad.cache.tiers import Tier, TierConfig, TierStore, load, load_mapped
    from llamad.cache.writer import PermitSet, WriterPool

__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.cache.client": ("CacheClient",),
        "llamad.cache.counters": ("Counters",),
        "llamad.cache.key": (
            "KEY_LEN",
            "QUANT_BYTES",
            "FingerprintMode",
            "Namespace",
            "ctx_params_hash",
            "effective_fingerprint",
            "model_fingerprint",
            "quant_byte",
            "tokens_to_bytes",
        ),
        "llamad.cache.kvc": (
            "KvcMeta",
            "KvcSpec",
            "SaveReason",
            "parse",
            "parse_meta",
            "write_kvc",
        ),
        "llamad.cache.lookup": (
            "HitKind",
            "Lookup",
            "LookupPolicy",
            "RowRef",
        ),
        "llamad.cache.meta_wire": ("GcResult",),
        "llamad.cache.meta": ("CacheMeta",),
        "llamad.cache.meta_config": ("MetaConfig",),
        "llamad.cache.policy": (
            "CachePolicy",
            "cold_save_split",
            "should_continued_save",
            "should_finish_save",
            "trim_boundary",
        ),
        "llamad.cache.prefix": (
            "PrefixIndex",
            "PrefixMatch",
        ),
        "llamad.cache.pressure": (
            "PressureConfig",
            "PressureScheduler",
        ),
        "llamad.cache.publish": (
            "PublishMeta",
            "PublishOutcome",
            "PublishResult",
        ),
        "llamad.cache.reservation": (
            "SaveIntent",
            "Stage",
        ),
        "llamad.cache.ram_purge": ("purge_ram",),
        "llamad.cache.settings": ("CacheSettings",),
        "llamad.cache.sup": ("cache_sup_spec",),
        "llamad.cache.tier_kind": ("TierKind",),
        "llamad.cache.tier_lock": ("TierLocks",),
        "llamad.cache.tiers": (
            "Tier",
            "TierConfig",
            "TierStore",
            "load",
            "load_mapped",
        ),
        "llamad.cache.writer": (
            "PermitSet",
            "WriterPool",
        ),
    },
)

__all__ = [
    "KEY_LEN",
    "QUANT_BYTES",
    "CacheClient",
    "CacheMeta",
    "CachePolicy",
    "CacheSettings",
    "Counters",
    "FingerprintMode",
    "GcResult",
    "HitKind",
    "KvcMeta",
    "KvcSpec",
    "Lookup",
    "LookupPolicy",
    "MetaConfig",
    "Namespace",
    "PermitSet",
    "PrefixIndex",
    "PrefixMatch",
    "PressureConfig",
    "PressureScheduler",
    "PublishMeta",
    "PublishOutcome",
    "PublishResult",
    "RowRef",
    "SaveIntent",
    "SaveReason",
    "Stage",
    "Tier",
    "TierConfig",
    "TierKind",
    "TierLocks",
    "TierStore",
    "WriterPool",
    "cache_sup_spec",
    "cold_save_split",
    "ctx_params_hash",
    "effective_fingerprint",
    "load",
    "load_mapped",
    "model_fingerprint",
    "parse",
    "parse_meta",
    "purge_ram",
    "quant_byte",
    "should_continued_save",
    "should_finish_save",
    "tokens_to_bytes",
    "trim_boundary",
    "write_kvc",
]
