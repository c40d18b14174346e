"""What ``llamad`` exports: every error class, the client, the result types; lazily."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import llamad
import llamad.errors
from llamad._lazy import exports

pytestmark = pytest.mark.timeout(60)


def _every_error_class() -> dict[str, type[llamad.errors.LlamadError]]:
    for name in llamad.errors.ERROR_MODULES:
        importlib.import_module(name)
    importlib.import_module("llamad.front.wire")
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
    assert sorted(llamad.__all__) == sorted(exports("llamad"))
    assert set(llamad.__all__) <= set(dir(llamad))


FACES = (
    "llamad",
    "llamad.actors",
    "llamad.cache",
    "llamad.client",
    "llamad.config",
    "llamad.llama_ffi",
    "llamad.model",
    "llamad.supervisor",
    "llamad.testing",
)


@pytest.mark.parametrize("package", FACES)
def test_every_package_face_exports_what_it_lists_from_where_it_says(package: str) -> None:
    face = importlib.import_module(package)
    homes = exports(package)
    # A submodule's import binds its name on the package: an export of that
    # name would turn into the module once anything imported it.
    submodules = {m.name for m in pkgutil.iter_modules(face.__path__)}
    assert not submodules & set(homes)
    assert sorted(face.__all__) == sorted(homes)
    for name, home in homes.items():
        value = getattr(face, name)
        assert value is getattr(importlib.import_module(home), name)
    assert set(face.__all__) <= set(dir(face))
    with pytest.raises(AttributeError):
        face.NoSuchThing  # noqa: B018


def test_a_face_naming_one_export_twice_is_refused() -> None:
    from llamad._lazy import lazy_face  # noqa: PLC0415

    with pytest.raises(ValueError, match="'Client' exported from two modules"):
        lazy_face("llamad.nowhere", {"a": ("Client",), "b": ("Client",)})


def test_the_version_is_the_distribution_s() -> None:
    import tomllib  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    assert llamad.__version__ == tomllib.loads(pyproject.read_text())["project"]["version"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        llamad.NoSuchThing  # noqa: B018


def test_the_public_api_names_are_exported() -> None:
    from llamad import AsyncClient, Client, Completion, StickyBusy, WorkerCrashed  # noqa: PLC0415 (the lazy import is the point)

    assert Client.__module__ == "llamad.client.sync"
    assert AsyncClient.__module__ == "llamad.client.aio"
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
    assert sorted(loaded) == ["llamad", "llamad._lazy", "llamad._pins"]


def test_the_client_and_every_error_load_no_libllama() -> None:
    loaded = _fresh(
        "import sys, llamad\n"
        "from llamad import Client, AsyncClient\n"
        "[getattr(llamad, n) for n in llamad.__all__]\n"
        "print(' '.join(m for m in sys.modules if m.startswith('llamad.llama_ffi')))"
    )
    assert "llamad.llama_ffi._llama" not in loaded
    assert "llamad.llama_ffi.native" not in loaded
