"""The extension knows what it was built for, and where layers run (numerics by backend)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from llamad import _pins
from llamad.llama_ffi import build_info

pytestmark = pytest.mark.timeout(30)


def test_build_record_names_the_backend_and_the_library_folder_it_links() -> None:
    record = build_info.build_record()
    assert record["backend"] in _pins.BACKENDS
    assert any(Path(record["lib_dir"]).glob("libllama.so*"))
    assert set(record["sha256"]) >= {"cdef.h", "llama.h", "libllama"}


@pytest.mark.parametrize(("gpu_visible", "expected"), [(False, "cpu"), (True, "cuda")])
def test_compute_backend_is_cpu_unless_a_gpu_build_sees_a_gpu(
    monkeypatch: pytest.MonkeyPatch, gpu_visible: bool, expected: str
) -> None:
    monkeypatch.setattr(
        build_info, "lib", SimpleNamespace(llama_supports_gpu_offload=lambda: gpu_visible)
    )
    monkeypatch.setattr(build_info, "build_record", lambda: {"backend": "cuda"})
    assert build_info.compute_backend() == expected
