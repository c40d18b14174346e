"""Contracts of the meta side: settings, configs and wire shapes validate and round-trip."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamad.actors.ops import OpKind
from llamad.cache.errors import InvalidCacheValue
from llamad.cache.key import Namespace, tokens_to_bytes
from llamad.cache.kvc import SaveReason
from llamad.cache.lookup import HitKind, Lookup, LookupPolicy, RowRef, choose_restore
from llamad.cache.meta import MetaConfig
from llamad.cache.meta_wire import OPS, ReserveSave
from llamad.cache.prefix import PrefixMatch
from llamad.cache.pressure import PressureConfig
from llamad.cache.reservation import SaveIntent
from llamad.cache.settings import CacheSettings
from llamad.cache.sup import cache_sup_spec
from llamad.cache.tier_kind import TIER_ORDER, TierKind
from llamad.cache.tiers import Tier, TierConfig
from llamad.errors import BadRequest
from llamad.supervisor.spec import Strategy, SupervisorSpec
from llamad.testing import discard_scratch, scratch_settings

pytestmark = pytest.mark.timeout(30)

keys = st.binary(min_size=32, max_size=32)
NS_FOR_TIERS = Namespace(fingerprint=b"\x01" * 32, quant=1, ctx_hash=b"\x02" * 32)
row_refs = st.builds(
    RowRef,
    key=keys,
    tier=st.sampled_from(list(TierKind)),
    location=st.text(min_size=1, max_size=50),
    file_size=st.integers(1, 2**40),
    n_tokens=st.integers(1, 2**24),
    pin=st.none() | st.integers(0, 2**62),
)


# What the actor and the client do with these structs: cache-meta's handlers
# return them and the actor encodes them as they are; CacheClient decodes the
# reply straight into the type.
ROW_DECODER = msgspec.msgpack.Decoder(RowRef)
LOOKUP_DECODER = msgspec.msgpack.Decoder(Lookup)


def row_array(ref: RowRef) -> list[object]:
    return [ref.key, ref.tier, ref.location, ref.file_size, ref.n_tokens, ref.pin]


@given(row_refs)
def test_row_ref_travels_as_its_fields_in_order_and_round_trips(ref: RowRef) -> None:
    wire = msgspec.msgpack.encode(ref)
    assert msgspec.msgpack.decode(wire) == row_array(ref)
    assert ROW_DECODER.decode(wire) == ref


@given(
    st.builds(
        Lookup,
        kind=st.none() | st.sampled_from(list(HitKind)),
        row=st.none() | row_refs,
        use_tokens=st.integers(0, 2**24),
        common_tokens=st.integers(0, 2**24),
        common_key=st.none() | keys,
        resumed=st.booleans(),
        probes=st.integers(0, 1000),
    )
)
def test_lookup_travels_as_its_fields_in_order_and_round_trips(found: Lookup) -> None:
    wire = msgspec.msgpack.encode(found)
    assert msgspec.msgpack.decode(wire) == [
        None if found.kind is None else found.kind.value,
        None if found.row is None else row_array(found.row),
        found.use_tokens,
        found.common_tokens,
        found.common_key,
        found.resumed,
        found.probes,
        found.inflight_key,
        found.inflight_tokens,
    ]
    assert LOOKUP_DECODER.decode(wire) == found
    # A cache-meta from before the in-flight report sends seven fields.
    older = msgspec.msgpack.encode(msgspec.msgpack.decode(wire)[:7])
    assert LOOKUP_DECODER.decode(older) == msgspec.structs.replace(
        found, inflight_key=None, inflight_tokens=0
    )


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"key": b"k"},
        [1, "disk", "x", 1, 1, None],
        [b"k" * 32, "disk", "x", "1", 1, None],
        [b"k" * 32, "tape", "x", 1, 1, None],
    ],
)
def test_malformed_row_ref_is_refused_by_its_decoder(body: object) -> None:
    with pytest.raises(msgspec.ValidationError):
        ROW_DECODER.decode(msgspec.msgpack.encode(body))


@pytest.mark.parametrize(
    "body",
    [None, {}, ["sideways", None, 0, 0, None], [None, [b"k"], 0, 0, None]],
)
def test_malformed_lookup_is_refused_by_its_decoder(body: object) -> None:
    with pytest.raises(msgspec.ValidationError):
        LOOKUP_DECODER.decode(msgspec.msgpack.encode(body))


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("common_min_tokens", {"common_min_tokens": 0}),
        ("restore_cost", {"restore_cost": 2.0}),
        ("restore_cost", {"restore_cost": float("nan")}),
    ],
)
def test_invalid_lookup_policy_names_the_field(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(BadRequest) as err:
        LookupPolicy(**kwargs)  # type: ignore[arg-type]
    assert err.value.details["field"] == field


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("quotas", {"quotas": {}}),
        ("tier", {"quotas": {"tape": 1}}),
        ("quotas", {"quotas": {TierKind.DISK: -1}}),
        ("reservation_ttl_s", {"quotas": {TierKind.DISK: 1}, "reservation_ttl_s": 0}),
        ("max_wait_s", {"quotas": {TierKind.DISK: 1}, "max_wait_s": -1}),
    ],
)
def test_invalid_meta_config_names_the_field(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        MetaConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def settings(tmp: Path, **kw: object) -> CacheSettings:
    return CacheSettings.defaults(state_dir=tmp / "state", runtime_dir=tmp / "run", **kw)  # type: ignore[arg-type]


def test_cache_settings_round_trip_through_their_wire_form(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        reservation_ttl_s=12.5,
        lookup=LookupPolicy(common_min_tokens=64, restore_cost=0.1, allow_common=False),
        pressure=PressureConfig(enabled=True, source="noop", evict_tiers=(TierKind.RAM,)),
        stats_flush_s=3.0,
        registry_root=tmp_path / "reg",
        liveness_timeout=20.0,
        permits_path=tmp_path / "permits",
        save_permits=7,
    )
    assert CacheSettings.from_wire(s.to_wire()) == s
    assert s.meta_config().quotas == {
        TierKind.RAM: 2 << 30,
        TierKind.RAM_FILE: 4 << 30,
        TierKind.DISK: 32 << 30,
    }


def test_a_tier_configured_twice_is_refused(tmp_path: Path) -> None:
    disk = TierConfig(TierKind.DISK, tmp_path, 10)
    with pytest.raises(InvalidCacheValue) as err:
        CacheSettings(tiers=(disk, disk), counters_path=tmp_path / "c")
    assert err.value.field == "tiers"


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("stats_flush_s", {"stats_flush_s": 0}),
        ("reservation_ttl_s", {"reservation_ttl_s": 0}),
        ("save_permits", {"save_permits": 0}),
        ("save_permits", {"save_permits": 2000}),
        ("save_permits", {"save_permits": True}),
    ],
)
def test_invalid_cache_settings_name_the_field(
    tmp_path: Path, field: str, kwargs: dict[str, object]
) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        settings(tmp_path, **kwargs)
    assert err.value.field == field


def test_permits_file_defaults_to_beside_the_counters_file(tmp_path: Path) -> None:
    s = CacheSettings(
        tiers=(TierConfig(TierKind.DISK, tmp_path, 10),), counters_path=tmp_path / "c"
    )
    assert s.permits_path == tmp_path / "c.permits"
    assert s.save_permits == 4
    assert settings(tmp_path).permits_path == tmp_path / "run" / "cache-permits"


def test_settings_on_the_wire_without_optional_keys_take_the_defaults(tmp_path: Path) -> None:
    full = settings(tmp_path)
    wire = full.to_wire()
    for name in ("reservation_ttl_s", "stats_flush_s", "permits_path", "save_permits"):
        del wire[name]
    back = CacheSettings.from_wire(wire)
    assert back.reservation_ttl_s == 60.0 and back.stats_flush_s == 10.0
    assert back.save_permits == 4
    assert back.permits_path == full.counters_path.with_name("cache-counters.permits")


def test_malformed_settings_on_the_wire_are_refused(tmp_path: Path) -> None:
    wire = settings(tmp_path).to_wire()
    del wire["tiers"][0]["quota"]
    with pytest.raises(InvalidCacheValue) as err:
        CacheSettings.from_wire(wire)
    assert err.value.field == "settings"


def test_settings_on_the_wire_with_an_unknown_key_are_refused(tmp_path: Path) -> None:
    wire = settings(tmp_path).to_wire()
    wire["save_permit"] = 3  # a misspelt key is not a default silently taken
    with pytest.raises(InvalidCacheValue) as err:
        CacheSettings.from_wire(wire)
    assert err.value.field == "settings"


@pytest.mark.parametrize(
    ("field", "value"), [("save_permits", 0), ("save_permits", 2.5), ("stats_flush_s", -1.0)]
)
def test_invalid_settings_on_the_wire_name_the_field(
    tmp_path: Path, field: str, value: object
) -> None:
    wire = settings(tmp_path).to_wire()
    wire[field] = value
    with pytest.raises(InvalidCacheValue) as err:
        CacheSettings.from_wire(wire)
    assert err.value.field == field


def test_cache_sup_starts_cache_meta_first_rest_for_one(tmp_path: Path) -> None:
    spec = cache_sup_spec(settings(tmp_path))
    assert isinstance(spec, SupervisorSpec)
    assert spec.flags.strategy is Strategy.REST_FOR_ONE
    assert spec.children[0].start.target == "llamad.cache.meta_proc:run_meta"
    # The start arguments carry the settings and rebuild them exactly.
    assert CacheSettings.from_wire(spec.children[0].start.kwargs["settings"]) == settings(tmp_path)


def test_every_meta_op_is_a_declared_call() -> None:
    # Two casts, which nothing waits on: a worker's idle entries for the KV
    # events, and a worker's pin release between its restore and first token.
    casts = {"live_entries", "release"}
    assert {n for n, s in OPS.items() if s.kind is OpKind.CAST} == casts
    assert {n for n, s in OPS.items() if s.kind is not OpKind.CALL} == casts
    assert set(OPS) - casts == {
        "reserve_save",
        "check_reservation",
        "mark_published",
        "announce_saved",
        "cancel_reservation",
        "checkout",
        "checkin",
        "forget",
        "lookup_exact",
        "lookup_exact_or_wait",
        "longest_prefix",
        "resolve",
        "evict_bytes",
        "gc",
        "dump",
        "counters",
        "reset_counters",
        "status",
        "pressure_check",
    }
    assert {n for n, s in OPS.items() if s.min_blobs == 1} == {
        "reserve_save",
        "longest_prefix",
        "resolve",
    }


def test_choose_restore_prefers_the_wholly_shared_row_on_a_tie() -> None:
    match = PrefixMatch(b"p" * 32, 1000, b"c" * 32, 1000, 5000, 3)
    plan = choose_restore(match, 2000, LookupPolicy())
    assert plan is not None and plan.key == b"p" * 32 and plan.kind is HitKind.PREFIX


def test_choose_restore_misses_below_common_min_tokens() -> None:
    match = PrefixMatch(None, 0, b"c" * 32, 100, 5000, 3)
    assert choose_restore(match, 2000, LookupPolicy(common_min_tokens=256)) is None
    plan = choose_restore(match, 2000, LookupPolicy(common_min_tokens=64, restore_cost=0.01))
    assert plan is not None and plan.kind is HitKind.COMMON and plan.use_tokens == 100


def test_scratch_cache_is_private_and_discard_removes_it() -> None:
    a = scratch_settings(prefix="lcu")
    b = scratch_settings(prefix="lcu")
    try:
        assert {t.root for t in a.tiers if t.kind is not TierKind.RAM}.isdisjoint(
            {t.root for t in b.tiers if t.kind is not TierKind.RAM}
        )
        assert a.registry_root != b.registry_root
        for cfg in a.tiers:
            Tier(cfg).prepare()
        assert a.registry_root is not None
        a.registry_root.mkdir()
        a.counters_path.write_bytes(b"x")
        a.create_permits()
    finally:
        discard_scratch(a)
        discard_scratch(b)
    assert a.registry_root is not None
    assert not a.registry_root.parent.exists()
    assert not a.counters_path.exists()
    assert a.permits_path is not None and not a.permits_path.exists()
    assert all(not t.root.exists() for t in a.tiers if t.kind is not TierKind.RAM)


def test_a_tier_named_by_its_string_becomes_the_one_tier_enum_wherever_it_enters(
    tmp_path: Path,
) -> None:
    # One vocabulary: a config file or a peer may spell a tier as its value,
    # but past the boundary every tier is a TierKind member, never a string.
    it = SaveIntent(
        key=NS_FOR_TIERS.key(tokens_to_bytes([1])),
        namespace=NS_FOR_TIERS.header(),
        tokens=tokens_to_bytes([1]),
        tier="ram_file",  # type: ignore[arg-type]
        size=10,
        reason=SaveReason.COLD,
    )
    config = MetaConfig(quotas={"disk": 1, "ram": 2})  # type: ignore[dict-item]
    pressure = PressureConfig(evict_tiers=("ram_file",))  # type: ignore[arg-type]
    tier_config = TierConfig("disk", tmp_path, 1)  # type: ignore[arg-type]
    ref = ROW_DECODER.decode(msgspec.msgpack.encode([b"k" * 32, "ram", "/x", 1, 1, None]))
    body = msgspec.msgpack.Decoder(ReserveSave).decode(
        msgspec.msgpack.encode(
            {"key": b"k" * 32, "namespace": b"n" * 65, "tier": "disk", "size": 1, "reason": 1}
        )
    )
    found = [it.tier, *config.quotas, *pressure.evict_tiers, tier_config.kind, ref.tier, body.tier]
    assert [type(t) for t in found] == [TierKind] * len(found)
    assert found == ["ram_file", "disk", "ram", "ram_file", "disk", "ram", "disk"]
    assert [t.value for t in TIER_ORDER] == ["ram", "ram_file", "disk", "remote"]
