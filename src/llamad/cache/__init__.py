"""The token-exact, multi-tier KV cache (SPEC C1-C11).

Storage side: keys (:mod:`.key`), the ``.kvc`` format (:mod:`.kvc`), tiers
(:mod:`.tiers`), the writer's half of the publish protocol (:mod:`.publish`),
the writer pool (:mod:`.writer`), save policy (:mod:`.policy`) and shared
counters (:mod:`.counters`). The sole writer, cache-meta, and its client live
in :mod:`.meta`, :mod:`.meta_proc` and :mod:`.client`.
"""

from __future__ import annotations

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
from llamad.cache.policy import (
    CachePolicy,
    cold_save_split,
    should_continued_save,
    should_finish_save,
    trim_boundary,
)
from llamad.cache.publish import PublishMeta, PublishOutcome, PublishResult, publish
from llamad.cache.tiers import Tier, TierConfig, TierKind, TierStore, load
from llamad.cache.writer import PermitSet, WriterPool

__all__ = [
    "KEY_LEN",
    "QUANT_BYTES",
    "CachePolicy",
    "Counters",
    "FingerprintMode",
    "KvcMeta",
    "KvcSpec",
    "Namespace",
    "PermitSet",
    "PublishMeta",
    "PublishOutcome",
    "PublishResult",
    "SaveReason",
    "Tier",
    "TierConfig",
    "TierKind",
    "TierStore",
    "WriterPool",
    "cold_save_split",
    "ctx_params_hash",
    "effective_fingerprint",
    "load",
    "model_fingerprint",
    "parse",
    "parse_meta",
    "publish",
    "quant_byte",
    "should_continued_save",
    "should_finish_save",
    "tokens_to_bytes",
    "trim_boundary",
    "write_kvc",
]
