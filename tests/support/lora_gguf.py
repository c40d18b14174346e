"""Write small random LoRA adapter GGUFs for the default model (test helper).

Tensor names and metadata follow llama.cpp's convert_lora_to_gguf.py:
``<base tensor name>.lora_a`` / ``.lora_b``, ``general.type = adapter``,
``adapter.type = lora``, ``adapter.lora.alpha``. Shapes are given in ggml
order (ne0 = input features): A is ``[n_in, rank]`` and B is ``[rank, n_out]``,
which numpy (row-major, reversed) stores as ``(rank, n_in)`` and ``(n_out, rank)``.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

# (base tensor, n_in, n_out) of SmolLM2-135M.
TARGETS = [
    ("blk.0.attn_q.weight", 576, 576),
    ("blk.1.attn_v.weight", 576, 192),
    ("blk.2.ffn_up.weight", 576, 1536),
    ("blk.3.attn_output.weight", 576, 576),
]


def write_lora(
    path: Path,
    *,
    seed: int,
    rank: int = 4,
    targets: list[tuple[str, int, int]] | None = None,
    arch: str = "llama",
    general_type: str | int = "adapter",
) -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch=arch)
    if isinstance(general_type, str):
        w.add_string("general.type", general_type)
    else:
        w.add_uint32("general.type", general_type)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    for name, n_in, n_out in targets or TARGETS:
        a = rng.normal(0.0, 0.3, size=(rank, n_in)).astype(np.float32)
        b = rng.normal(0.0, 0.3, size=(n_out, rank)).astype(np.float32)
        w.add_tensor(f"{name}.lora_a", a)
        w.add_tensor(f"{name}.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
