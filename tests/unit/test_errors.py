"""Errors keep their class and code across a process boundary."""

from __future__ import annotations

import pytest

from llamad import errors


@pytest.mark.parametrize(
    "cls",
    [
        errors.BadRequest,
        errors.UnknownOp,
        errors.TooLarge,
        errors.VersionMismatch,
        errors.WorkerCrashed,
        errors.RequestTimeout,
        errors.ModelNotFound,
        errors.StickyBusy,
        errors.NoSession,
        errors.ContextOverflow,
        errors.ConfigError,
    ],
)
def test_wire_round_trip_keeps_class_code_and_details(cls: type[errors.LlamadError]) -> None:
    sent = cls("went wrong", details={"n": 3})
    got = errors.from_wire(sent.to_wire())
    assert type(got) is cls
    assert got.code == cls.code
    assert got.message == "went wrong"
    assert got.details == {"n": 3}


def test_every_wire_code_is_unique() -> None:
    seen: dict[str, type[errors.LlamadError]] = {}
    for cls in errors.LlamadError.__subclasses__():
        if "code" in cls.__dict__:
            assert cls.code not in seen, f"{cls} reuses {seen.get(cls.code)}'s code"
            seen[cls.code] = cls


def test_unknown_peer_code_stays_visible() -> None:
    got = errors.from_wire({"code": "from_the_future", "message": "m"})
    assert type(got) is errors.LlamadError
    assert got.details["code"] == "from_the_future"


@pytest.mark.parametrize(
    "junk",
    [{}, {"code": 5}, {"code": None, "message": b"x"}, {"message": 1, "details": [1, 2]}],
)
def test_from_wire_tolerates_junk(junk: dict[str, object]) -> None:
    err = errors.from_wire(junk)
    assert isinstance(err, errors.LlamadError)
    assert isinstance(err.message, str)
    assert isinstance(err.details, dict)
