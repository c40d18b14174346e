"""The ``gguf_chunked`` fingerprint over small GGUF files written with ``gguf``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from llamad.cache.errors import FingerprintMismatch, GgufMalformed
from llamad.cache.key import model_fingerprint
from llamad.paths import AssetMissing, default_model_path

pytestmark = pytest.mark.timeout(60)


def write_gguf(path: Path, *, name: str = "tiny", first: float = 1.0, second: float = 2.0) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(128)
    w.add_token_list(["<s>", "</s>", "a", "b"])
    w.add_tensor("first.weight", np.full((4, 8), first, dtype=np.float32))
    w.add_tensor("second.weight", np.full((8,), second, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_chunked_is_stable_and_distinct_from_safe(tmp_path: Path) -> None:
    a = write_gguf(tmp_path / "a.gguf")
    b = write_gguf(tmp_path / "b.gguf")
    chunked = model_fingerprint(a, "gguf_chunked")
    assert chunked == model_fingerprint(b, "gguf_chunked")
    assert chunked != model_fingerprint(a, "safe")
    assert model_fingerprint(a, "gguf_chunked", supplied=chunked) == chunked


def test_gguf_chunked_changes_with_metadata_or_first_tensor(tmp_path: Path) -> None:
    base = model_fingerprint(write_gguf(tmp_path / "base.gguf"), "gguf_chunked")
    renamed = model_fingerprint(write_gguf(tmp_path / "n.gguf", name="other"), "gguf_chunked")
    first = model_fingerprint(write_gguf(tmp_path / "f.gguf", first=3.0), "gguf_chunked")
    assert len({base, renamed, first}) == 3


def test_gguf_chunked_mismatch_raises(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "a.gguf")
    with pytest.raises(FingerprintMismatch):
        model_fingerprint(path, "gguf_chunked", supplied=b"\x00" * 32)


@pytest.mark.parametrize("cut", [0, 3, 10, 30, 100])
def test_truncated_gguf_is_malformed_not_a_crash(tmp_path: Path, cut: int) -> None:
    data = write_gguf(tmp_path / "a.gguf").read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:cut])
    with pytest.raises(GgufMalformed):
        model_fingerprint(bad, "gguf_chunked")


def test_gguf_with_absurd_counts_is_malformed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") * 2)
    with pytest.raises(GgufMalformed):
        model_fingerprint(bad, "gguf_chunked")


@pytest.mark.model
def test_gguf_chunked_reads_the_default_model() -> None:
    try:
        path = default_model_path()
    except AssetMissing:
        pytest.skip("default model not fetched (make setup)")
    chunked = model_fingerprint(path, "gguf_chunked")
    assert len(chunked) == 32
    assert chunked != model_fingerprint(path, "safe")
