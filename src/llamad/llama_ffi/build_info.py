"""What the compiled extension was built for, and where a model's layers run.

``build_ffi.py`` writes ``<extension>.build.json`` beside the extension: the
``LLAMA_BACKEND`` of the llama.cpp build it links against, that build's library
folder and the sha256 of every input. :func:`compute_backend` combines it with
what ggml sees at run time.

Numerics depend on the answer. On the CPU backend a token's computation gives
the same bits whatever else shares its batch or KV cache, so batched and
one-at-a-time results are identical. On a GPU the kernels are chosen by batch
shape and KV layout, so only the same computation path reproduces bits: the
same batch shapes over the same cache layout. Across shapes, results agree to
within floating-point noise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from llamad.llama_ffi.errors import LlamaError
from llamad.llama_ffi.native import ensure_backend, lib

__all__ = ["build_record", "compute_backend"]

STAMP_SUFFIX = ".build.json"


def build_record() -> dict[str, Any]:
    """The record ``build_ffi.py`` wrote for the loaded extension."""
    ext = Path(sys.modules["llamad.llama_ffi._llama"].__file__ or "")
    stamp = ext.with_name(ext.name + STAMP_SUFFIX)
    try:
        record = json.loads(stamp.read_text())
    except (OSError, ValueError) as exc:
        raise LlamaError(f"{stamp}: no build record ({exc}); rebuild with build_ffi.py") from exc
    if not isinstance(record, dict) or not isinstance(record.get("backend"), str):
        raise LlamaError(f"{stamp}: malformed build record; rebuild with build_ffi.py")
    return record


def compute_backend() -> str:
    """Where offloaded layers run in this process: ``"cpu"`` when the build has
    no GPU backend or no GPU is visible, else the backend the extension was
    built for (``"cuda"``, ``"metal"``, ``"vulkan"``)."""
    ensure_backend()
    if not lib.llama_supports_gpu_offload():
        return "cpu"
    return str(build_record()["backend"])
