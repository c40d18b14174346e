"""A GGUF file's metadata, for Ollama's ``/api/show``.

The header is read by :func:`llamad.llama_ffi.gguf_reader.read_gguf`, the
pure-Python reader that checks model files with ggml's own rules (it loads
no libllama: the gateway never does): the key/value section's scalars
(arrays, such as the vocabulary, left out) and the tensor table, whose
element counts sum to the model's parameter count, as llama.cpp's
``llama_model_n_params`` does.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Final

from llamad.llama_ffi.gguf_reader import GGUFCorrupt, Scalar, read_gguf

__all__ = ["FTYPE_NAMES", "GGUFMeta", "human_number", "read_gguf_meta"]

FTYPE_NAMES: Final[dict[int, str]] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}
"""``general.file_type`` (llama.cpp's ``llama_ftype``) as Ollama's ``quantization_level``."""


@dataclass(frozen=True)
class GGUFMeta:
    """``values``: the header's scalar keys (arrays, such as the vocabulary,
    left out); ``parameter_count``: the tensors' elements summed."""

    values: dict[str, Scalar]
    parameter_count: int

    @property
    def family(self) -> str:
        """``general.architecture`` (``llama``, ``qwen2``, ...), Ollama's ``family``."""
        arch = self.values.get("general.architecture")
        return arch if isinstance(arch, str) else ""

    @property
    def parameter_size(self) -> str:
        """The parameter count as Ollama shows it (``135M``, ``1.7B``)."""
        return human_number(self.parameter_count) if self.parameter_count else ""

    @property
    def quantization_level(self) -> str:
        ftype = self.values.get("general.file_type")
        if isinstance(ftype, int) and not isinstance(ftype, bool):
            return FTYPE_NAMES.get(ftype, f"ftype {ftype}")
        return ""


def human_number(n: int) -> str:
    """``n`` as Ollama's ``format.HumanNumber``: ``8B``, ``1.7B``, ``134.52M``, ``12K``."""
    for scale, suffix, decimals in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            number = n / scale
            return (
                f"{number:.0f}{suffix}"
                if number == math.floor(number)
                else (f"{number:.{decimals}f}{suffix}")
            )
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


def read_gguf_meta(path: str | os.PathLike[str]) -> GGUFMeta:
    """The metadata of the GGUF file at ``path`` (``ValueError``: not a GGUF
    file ggml would read, or its header is cut short; ``OSError``: not readable)."""
    with open(path, "rb") as f:
        try:
            layout = read_gguf(f.fileno(), os.fstat(f.fileno()).st_size, tensors=True, values=True)
        except GGUFCorrupt as exc:
            raise ValueError(f"{path}: not a GGUF file ggml would read: {exc}") from None
    assert layout.values is not None and layout.tensors is not None
    count = sum(math.prod(t.dims) for t in layout.tensors)
    return GGUFMeta(dict(layout.values), count)
