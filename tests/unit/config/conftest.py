"""Fixtures of the config tests: an isolated environment and a model directory.

Every test loads with an explicit ``env`` (never the developer's), with the
runtime directory in a short /tmp path (ipc socket paths must fit in 107
bytes) and ``LLAMAD_DEFAULT_MODEL`` pointing at a tiny GGUF, so that the
default model exists without ``make setup``. Tests of the real default
model are marked ``model``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from config_helpers import Workspace, write_gguf


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


@pytest.fixture
def tiny(models_dir: Path) -> Path:
    """A GGUF file in the allowed model directory."""
    return write_gguf(models_dir / "tiny.gguf")


@pytest.fixture
def default_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default model (``LLAMAD_DEFAULT_MODEL``), in a directory of its own."""
    path = write_gguf(tmp_path / "default-model" / "smollm2.gguf")
    monkeypatch.setenv("LLAMAD_DEFAULT_MODEL", str(path))
    monkeypatch.setenv("LLAMAD_CACHE_DIR", str(tmp_path / "cache"))
    return path


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lcfg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(tmp_path: Path, runtime_dir: Path, default_model: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp_path / "home"),
        "LLAMAD_RUNTIME_DIR": str(runtime_dir),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }


@pytest.fixture
def base(models_dir: Path, tiny: Path) -> dict[str, Any]:
    """A valid config: one model ``smol`` on the tiny file."""
    return {
        "security": {"model_dirs": [str(models_dir)]},
        "models": {"smol": {"path": str(tiny), "n_ctx": 1024, "n_threads": 1}},
    }


@pytest.fixture
def ws(
    tmp_path: Path, env: dict[str, str], base: dict[str, Any], models_dir: Path, tiny: Path
) -> Workspace:
    return Workspace(tmp_path, env, base, models_dir, tiny)
