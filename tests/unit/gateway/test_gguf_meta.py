"""The gateway's GGUF header reader (Ollama's /api/show) on hand-made files."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

from llamad.front.wire import ModelInfo, ModelState
from llamad.gateway import ollama
from llamad.gateway.gguf_meta import human_number, read_gguf_meta


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf(kvs: list[bytes], tensors: list[tuple[str, list[int]]]) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    offset = 0  # each tensor's data follows the one before (Q4_0: 32 values in 18 bytes)
    for name, dims in tensors:
        out += _string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 2, offset)
        nbytes = dims[0] // 32 * 18 * math.prod(dims[1:])
        offset += -(-nbytes // 32) * 32
    return out


def _kv(key: str, kind: int, value: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + value


FILE = _gguf(
    [
        _kv("general.architecture", 8, _string("qwen2")),
        _kv("general.file_type", 4, struct.pack("<I", 15)),
        # Arrays are skipped: strings (each its own length) and numbers.
        _kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + b"".join(map(_string, "abc"))),
        _kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2) + struct.pack("<ff", 1, 2)),
        _kv("qwen2.context_length", 4, struct.pack("<I", 32768)),
        _kv("qwen2.rope.freq_base", 6, struct.pack("<f", 0.5)),
        _kv("general.quantized", 7, b"\x01"),
    ],
    [("token_embd.weight", [896, 151936]), ("output_norm.weight", [896])],
)


def test_scalars_and_the_parameter_count(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(FILE + b"\0" * 64)  # (tensor data follows the header)
    meta = read_gguf_meta(path)
    assert meta.values == {
        "general.architecture": "qwen2",
        "general.file_type": 15,
        "qwen2.context_length": 32768,
        "qwen2.rope.freq_base": 0.5,
        "general.quantized": True,
    }
    assert meta.parameter_count == 896 * 151936 + 896
    assert (meta.family, meta.parameter_size, meta.quantization_level) == (
        "qwen2",
        "136.14M",
        "Q4_K_M",
    )
    info = ModelInfo(model_id="q", path=str(path), state=ModelState.READY, n_ctx=512)
    shown = ollama.show_body(info, path.stat().st_size, None, meta)
    assert shown["details"]["family"] == "qwen2"
    assert shown["details"]["families"] == ["qwen2"]
    assert shown["details"]["parameter_size"] == "136.14M"
    assert shown["details"]["quantization_level"] == "Q4_K_M"
    assert shown["model_info"]["general.parameter_count"] == meta.parameter_count
    assert shown["model_info"]["qwen2.context_length"] == 32768
    assert shown["model_info"]["general.file_type"] == 15
    assert not any(k.startswith("tokenizer.") for k in shown["model_info"])


@pytest.mark.parametrize("cut", [3, 30, len(FILE) - 5])
def test_a_cut_or_foreign_file_is_a_value_error(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(FILE[:cut])
    with pytest.raises(ValueError):
        read_gguf_meta(path)
    path.write_bytes(b"GGML" + FILE[4:])
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_meta(path)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (8_000_000_000, "8B"),
        (1_711_376_384, "1.7B"),
        (134_515_008, "134.52M"),
        (12_000, "12K"),
        (7_000_000, "7M"),
        (999, "999"),
    ],
)
def test_human_numbers_as_ollama_writes_them(n: int, text: str) -> None:
    assert human_number(n) == text
