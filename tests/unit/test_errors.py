"""Errors keep their class, code, message, details and attributes across a process boundary."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import pkgutil
import subprocess
import sys
from typing import Any

import msgspec
import pytest

import llamad
from llamad import errors
from llamad.actors.wire import error_body
from llamad.llama_ffi import errors as ffi_errors

# The compiled binding defines no error classes. `make test-unit` runs before
# it is built; modules that load it are then skipped (`make test` builds it
# first, so there every module is walked).
_BINDING = "llamad.llama_ffi._llama"
_BINDING_BUILT = importlib.util.find_spec(_BINDING) is not None


def _all_error_classes() -> list[type[errors.LlamadError]]:
    for info in pkgutil.walk_packages(llamad.__path__, "llamad."):
        if info.name == _BINDING or info.name.endswith(".__main__"):
            continue  # a __main__ runs its program when imported
        try:
            importlib.import_module(info.name)
        except errors.LlamaError:
            if _BINDING_BUILT:
                raise
    found: list[type[errors.LlamadError]] = []
    todo = [errors.LlamadError]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


ALL_CLASSES = _all_error_classes()


def _instance(cls: type[errors.LlamadError]) -> errors.LlamadError:
    """Build ``cls`` the way its own raisers do, from its constructor's signature."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in inspect.signature(cls).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            kwargs["extra"] = 7
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.name == "details":
            kwargs["details"] = {"n": 3, "nested": {"k": [1, 2]}}
        elif p.default is p.empty:
            args.append(f"{p.name}-value")
        elif p.name == "message":
            kwargs["message"] = "went wrong"
    return cls(*args, **kwargs)


def test_error_classes_are_enumerated() -> None:
    # Guards the enumeration itself: a walk that found nothing would make the
    # round-trip test below pass vacuously.
    names = {c.__name__ for c in ALL_CLASSES}
    assert {"ActorConfigError", "InvalidSpec", "KvcCorrupt", "NotGGUF", "RowMissing"} <= names
    assert len(ALL_CLASSES) > 50


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_survives_the_wire(cls: type[errors.LlamadError]) -> None:
    sent = _instance(cls)
    # Through the real encoder and decoder, as an actor's error reply travels.
    payload = msgspec.msgpack.decode(msgspec.msgpack.encode(error_body(sent)))
    got = errors.from_wire(payload)
    assert type(got) is cls
    assert got.code == sent.code
    assert got.message == sent.message
    assert got.details == sent.details
    # Attributes a class keeps beside details (``field``, ``reason``...) too.
    assert vars(got) == vars(sent)
    assert got.args == sent.args


def test_every_class_has_its_own_wire_code() -> None:
    seen: dict[str, type[errors.LlamadError]] = {}
    for cls in ALL_CLASSES:
        assert "code" in cls.__dict__, f"{cls.__qualname__} inherits {cls.code!r}"
        assert cls.code not in seen, (
            f"{cls.__qualname__} reuses {seen[cls.code].__qualname__}'s code"
        )
        seen[cls.code] = cls


def test_a_fresh_process_rebuilds_every_code_without_importing_its_module() -> None:
    # A client imports llamad.errors alone; from_wire must still find the class
    # the worker raised (ERROR_MODULES lists where they live).
    expected = {c.code: f"{c.__module__}.{c.__qualname__}" for c in ALL_CLASSES}
    script = (
        "import json, sys\n"
        "from llamad.errors import error_class\n"
        "codes = json.load(sys.stdin)\n"
        "out = {c: (k := error_class(c)).__module__ + '.' + k.__qualname__ for c in codes}\n"
        "json.dump(out, sys.stdout)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(sorted(expected)),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(proc.stdout) == expected


def test_context_overflow_is_a_binding_error() -> None:
    assert issubclass(errors.ContextOverflow, ffi_errors.LlamaError)
    with pytest.raises(ffi_errors.LlamaError):
        raise errors.ContextOverflow("past n_ctx")


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


def test_junk_details_for_a_class_with_attributes_still_rebuild() -> None:
    got = errors.from_wire({"code": "kvc_corrupt", "message": "m", "details": "nope"})
    assert type(got).__name__ == "KvcCorrupt"
    assert got.details == {}
    assert got.reason == ""  # type: ignore[attr-defined]
