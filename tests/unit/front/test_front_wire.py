"""The front's wire speaks the one vocabulary: tier names and the no-argument body."""

from __future__ import annotations

import msgspec
import pytest

from llamad.actors.ops import NoArgs
from llamad.cache import meta_wire
from llamad.front import wire
from llamad.model import wire as worker_wire
from llamad.tiers import TierKind


def test_evict_bytes_names_tiers_by_the_cache_s_enum() -> None:
    body = msgspec.convert({"n": 1, "tiers": ["ram_file", "disk"]}, wire.EvictBytes)
    assert body.tiers == [TierKind.RAM_FILE, TierKind.DISK]


def test_an_unknown_tier_is_refused_by_the_wire_itself() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.tiers\[0\]"):
        msgspec.convert({"n": 1, "tiers": ["nvme"]}, wire.EvictBytes)


def test_every_actor_s_wire_has_the_one_no_argument_body() -> None:
    assert wire.NoArgs is NoArgs
    assert worker_wire.NoArgs is NoArgs
    assert meta_wire.NoArgs is NoArgs
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"extra": 1}, NoArgs)


def test_status_reports_tiers_by_their_names() -> None:
    status = msgspec.convert(
        {"pid": 1, "uptime_s": 0.0, "tiers": {"ram": {"bytes": 1, "quota": 2}}},
        wire.DaemonStatus,
    )
    assert list(status.tiers) == [TierKind.RAM]
    assert msgspec.json.decode(msgspec.json.encode(status))["tiers"] == {
        "ram": {"bytes": 1, "quota": 2}
    }
