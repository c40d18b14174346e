"""What ``llamad`` exports: every error class, the client, the result types; lazily."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import llamad
import llamad.errors

pytestmark = pytest.mark.timeout(60)


def _every_error_class() -> dict[str, type[llamad.errors.LlamadError]]:
    for name in llamad.errors.ERROR_MODULES:
        importlib.import_module(name)
    importlib.import_module("llamad.front_wire")
    return {cls.__name__: cls for cls in llamad.errors._BY_CODE.values()}


def test_every_error_class_with_a_code_is_importable_from_llamad() -> None:
    classes = _every_error_class()
    missing = sorted(name for name in classes if name not in llamad.__all__)
    assert not missing, f"error classes not exported from llamad: {missing}"
    for name, cls in classes.items():
        assert getattr(llamad, name) is cls


def test_every_exported_name_resolves() -> None:
    for name in llamad.__all__:
        assert getattr(llamad, name) is not None, name
    assert sorted(llamad.__all__) == sorted(llamad._EXPORTS)
    assert set(llamad.__all__) <= set(dir(llamad))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        llamad.NoSuchThing  # noqa: B018


def test_the_public_api_names_are_exported() -> None:
    from llamad import AsyncClient, Client, Completion, StickyBusy, WorkerCrashed  # noqa: PLC0415 (the lazy import is the point)

    assert Client.__module__ == "llamad.client"
    assert AsyncClient.__module__ == "llamad.client_async"
    assert Completion.__name__ == "Completion"
    assert StickyBusy.code == "sticky_busy"
    assert WorkerCrashed.code == "worker_crashed"


def _fresh(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return out.split()


def test_importing_llamad_loads_nothing_else() -> None:
    loaded = _fresh(
        "import sys, llamad; print(' '.join(m for m in sys.modules"
        " if m.startswith('llamad') or m in ('zmq', 'msgspec', 'structlog')))"
    )
    assert loaded == ["llamad"]


def test_the_client_and_every_error_load_no_libllama() -> None:
    loaded = _fresh(
        "import sys, llamad\n"
        "from llamad import Client, AsyncClient\n"
        "[getattr(llamad, n) for n in llamad.__all__]\n"
        "print(' '.join(m for m in sys.modules if m.startswith('llamad.llama_ffi')))"
    )
    assert "llamad.llama_ffi._llama" not in loaded
    assert "llamad.llama_ffi.native" not in loaded
