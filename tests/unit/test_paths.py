"""Native assets are found where the pins say, and misconfiguration is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamad import _pins, paths
from llamad.errors import LlamadError


def test_backend_defaults_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMA_BACKEND", raising=False)
    assert paths.backend() == "cpu"


def test_unknown_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_BACKEND", "tpu")
    with pytest.raises(LlamadError, match="tpu"):
        paths.backend()


def test_llama_prefix_is_keyed_by_pin_and_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLAMAD_CACHE_DIR", str(tmp_path))
    cpu = paths.llama_prefix("cpu")
    cuda = paths.llama_prefix("cuda")
    assert cpu != cuda
    assert cpu.is_relative_to(tmp_path)
    assert _pins.LLAMA_CPP_COMMIT in cpu.name
    assert _pins.LLAMA_CPP_PYTHON_VERSION in cpu.name
    # llamad's patches are part of the pin: another patch set, another folder.
    assert f"-p{_pins.LLAMA_CPP_PATCHES_SHA256[:8]}-" in cpu.name
    monkeypatch.setattr(_pins, "LLAMA_CPP_PATCHES_SHA256", "f" * 64)
    assert paths.llama_prefix("cpu") != cpu


def test_missing_default_model_raises_asset_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLAMAD_DEFAULT_MODEL", str(tmp_path / "absent.gguf"))
    with pytest.raises(paths.AssetMissing) as info:
        paths.default_model_path()
    assert info.value.code == "asset_missing"
