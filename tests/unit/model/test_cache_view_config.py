"""CacheViewConfig: which tiers a model saves to and restores from, validated at start."""

from __future__ import annotations

from typing import Any

import pytest

from llamad.cache.key import FingerprintMode
from llamad.cache.tier_kind import TierKind
from llamad.errors import ConfigError
from llamad.model.cache_view_config import ALL_TIERS, CacheViewConfig

pytestmark = pytest.mark.timeout(30)

ALL_QUOTAS = {TierKind.RAM: 1 << 20, TierKind.RAM_FILE: 1 << 20, TierKind.DISK: 1 << 20}


def test_defaults_let_the_cache_choose_the_save_tier_and_restore_from_any_tier() -> None:
    cfg = CacheViewConfig()
    assert cfg.save_tier is None  # auto: the fastest tier with room
    assert CacheViewConfig(save_tier="auto").save_tier is None  # type: ignore[arg-type]
    assert cfg.restore_tiers == ALL_TIERS == frozenset(TierKind)
    assert cfg.fingerprint_mode is FingerprintMode.GGUF_CHUNKED
    # The local tiers cache-meta answers from; the remote tier is asked by the
    # view itself, when [cache.remote] is configured.
    assert cfg.check_against(ALL_QUOTAS) == ALL_TIERS - {TierKind.REMOTE}


def test_tier_names_become_the_tier_enum() -> None:
    cfg = CacheViewConfig(save_tier="disk", restore_tiers=["ram", "disk"])  # type: ignore[arg-type]
    assert cfg.save_tier is TierKind.DISK
    assert cfg.restore_tiers == {TierKind.RAM, TierKind.DISK}
    assert all(isinstance(t, TierKind) for t in cfg.restore_tiers)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("save_tier", "tape"),
        ("save_tier", 3),
        ("restore_tiers", []),
        ("restore_tiers", "ram"),
        ("restore_tiers", ["ram", "floppy"]),
        ("fingerprint_mode", "guess"),
        ("supplied_fingerprint", b"short"),
        ("lookup_timeout_s", 0),
        ("lookup_timeout_s", float("nan")),
        ("lookup_timeout_s", True),
        ("cooldown_s", -1.0),
        ("sync_save_timeout_s", 0.0),
        ("writer_threads", 0),
        ("writer_threads", 65),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        CacheViewConfig(**{field: value})
    assert err.value.details["field"] == field


def test_fast_unsafe_needs_a_supplied_digest() -> None:
    with pytest.raises(ConfigError) as err:
        CacheViewConfig(fingerprint_mode=FingerprintMode.FAST_UNSAFE)
    assert err.value.details["field"] == "supplied_fingerprint"
    ok = CacheViewConfig(fingerprint_mode="fast_unsafe", supplied_fingerprint=b"\1" * 32)  # type: ignore[arg-type]
    assert ok.fingerprint_mode is FingerprintMode.FAST_UNSAFE


def test_a_save_tier_the_cache_lacks_or_cannot_hold_is_a_refusal_to_start() -> None:
    only_disk = {TierKind.DISK: 1 << 20}
    ram = CacheViewConfig(save_tier=TierKind.RAM)
    with pytest.raises(ConfigError) as err:
        ram.check_against(only_disk)
    assert err.value.details["field"] == "save_tier"
    with pytest.raises(ConfigError) as err:
        ram.check_against({**ALL_QUOTAS, TierKind.RAM: 0})
    assert err.value.details["field"] == "save_tier"
    # auto needs one restore tier that holds bytes.
    assert CacheViewConfig().check_against(only_disk) == {TierKind.DISK}
    with pytest.raises(ConfigError) as err:
        CacheViewConfig(restore_tiers={TierKind.RAM}).check_against({**ALL_QUOTAS, TierKind.RAM: 0})
    assert err.value.details["field"] == "save_tier"


def test_restores_read_the_configured_tiers_the_cache_has() -> None:
    cfg = CacheViewConfig(save_tier=TierKind.DISK)
    assert cfg.check_against({TierKind.DISK: 1, TierKind.RAM: 1}) == {
        TierKind.DISK,
        TierKind.RAM,
    }
    ram_only = CacheViewConfig(restore_tiers={TierKind.RAM}, save_tier=TierKind.DISK)
    with pytest.raises(ConfigError) as err:
        ram_only.check_against({TierKind.DISK: 1})
    assert err.value.details["field"] == "restore_tiers"
