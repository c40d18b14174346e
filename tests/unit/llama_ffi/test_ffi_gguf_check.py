"""check_gguf refuses non-GGUF and truncated files before llama.cpp sees them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from llamad.llama_ffi import ModelFileError, NotGGUF, TruncatedGGUF, check_gguf

pytestmark = pytest.mark.timeout(30)


def _write_gguf(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_string("general.name", "tiny")
    w.add_tensor("a", np.arange(256, dtype=np.float32))
    w.add_tensor("b", np.ones((4, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_complete_gguf_passes_and_reports_its_extent(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "ok.gguf")
    info = check_gguf(path, keys=["general.name", "missing.key"])
    assert info.n_tensors == 2
    assert info.data_end <= info.size == path.stat().st_size
    assert info.key_types["missing.key"] == -1
    assert info.key_types["general.name"] >= 0


def test_wrong_magic_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(NotGGUF):
        check_gguf(path)


def test_file_shorter_than_magic_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "short.gguf"
    path.write_bytes(b"GG")
    with pytest.raises(TruncatedGGUF):
        check_gguf(path)


@pytest.mark.parametrize("cut", [8, 40, 200])
def test_header_cut_short_is_truncated(tmp_path: Path, cut: int) -> None:
    full = _write_gguf(tmp_path / "full.gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(full[:cut])
    with pytest.raises(TruncatedGGUF):
        check_gguf(path)


def test_tensor_data_cut_short_is_truncated(tmp_path: Path) -> None:
    full = _write_gguf(tmp_path / "full.gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(full[:-100])
    with pytest.raises(TruncatedGGUF) as err:
        check_gguf(path)
    assert err.value.details["needed"] > err.value.details["size"]


def test_missing_file_is_model_file_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError):
        check_gguf(tmp_path / "nope.gguf")


def test_directory_is_model_file_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError):
        check_gguf(tmp_path)


def test_a_header_check_loads_no_libllama(tmp_path: Path) -> None:
    # The root and the front check GGUF headers and never load a model: the
    # binding would cost each several MB resident (SPEC P9). A fresh
    # interpreter, so no other test has loaded it before.
    path = _write_gguf(tmp_path / "ok.gguf")
    code = (
        "import sys\n"
        "from llamad.llama_ffi import check_gguf\n"
        "info = check_gguf(sys.argv[1], keys=['general.name'])\n"
        "print(info.n_tensors, sorted(m for m in sys.modules\n"
        "      if m in ('llamad.llama_ffi._llama', 'llamad.llama_ffi.native', '_cffi_backend')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == "2 []"
