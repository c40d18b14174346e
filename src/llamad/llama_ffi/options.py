"""Load and context options: frozen, validated at construction.

An invalid value raises :class:`llamad.errors.ConfigError` naming the field, so
a bad model configuration is a refusal to start rather than a surprise inside
llama.cpp.

Nothing here loads libllama: the root and the front build these options from
the config and never load a model, and the binding costs each of them several
MB resident (SPEC P9). The enum values and the two limits below are therefore
literals, llama.h's ABI at the pinned commit;
tests/unit/llama_ffi/test_ffi_abi_literals.py compares every one with the
binding, so a pin bump that changes one fails there.
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass, field
from typing import Any

from llamad.errors import ConfigError

__all__ = [
    "ContextOptions",
    "FlashAttn",
    "KVType",
    "LoadMode",
    "ModelOptions",
    "PoolingType",
    "RopeScaling",
    "SplitMode",
    "default_threads",
]

MAX_DEVICES = 16
"""``llama_max_devices()``: the most entries ``tensor_split`` may have."""
MAX_PARALLEL_SEQUENCES = 256
"""``llama_max_parallel_sequences()`` (``LLAMA_MAX_SEQ``): the most ``n_seq_max`` may be."""


class LoadMode(enum.IntEnum):
    """How llama.cpp maps the weights (``llama_load_mode``)."""

    AUTO = -1  # LLAMA_LOAD_MODE_AUTO
    NONE = 0  # LLAMA_LOAD_MODE_NONE
    MMAP = 1  # LLAMA_LOAD_MODE_MMAP
    MLOCK = 2  # LLAMA_LOAD_MODE_MLOCK
    MMAP_MLOCK = 3  # LLAMA_LOAD_MODE_MMAP_MLOCK
    DIRECT_IO = 4  # LLAMA_LOAD_MODE_DIRECT_IO


class SplitMode(enum.IntEnum):
    """How a model is split across several GPUs (``llama_split_mode``)."""

    NONE = 0  # LLAMA_SPLIT_MODE_NONE
    LAYER = 1  # LLAMA_SPLIT_MODE_LAYER
    ROW = 2  # LLAMA_SPLIT_MODE_ROW
    TENSOR = 3  # LLAMA_SPLIT_MODE_TENSOR


class FlashAttn(enum.IntEnum):
    """Flash attention: let llama.cpp decide, force off, or force on."""

    AUTO = -1  # LLAMA_FLASH_ATTN_TYPE_AUTO
    OFF = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    ON = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED


class PoolingType(enum.IntEnum):
    """How token embeddings are pooled per sequence (``llama_pooling_type``)."""

    UNSPECIFIED = -1  # LLAMA_POOLING_TYPE_UNSPECIFIED
    NONE = 0  # LLAMA_POOLING_TYPE_NONE
    MEAN = 1  # LLAMA_POOLING_TYPE_MEAN
    CLS = 2  # LLAMA_POOLING_TYPE_CLS
    LAST = 3  # LLAMA_POOLING_TYPE_LAST
    RANK = 4  # LLAMA_POOLING_TYPE_RANK


class RopeScaling(enum.IntEnum):
    """How RoPE positions are scaled (``llama_rope_scaling_type``);
    ``UNSPECIFIED`` takes the model's own choice."""

    UNSPECIFIED = -1  # LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    NONE = 0  # LLAMA_ROPE_SCALING_TYPE_NONE
    LINEAR = 1  # LLAMA_ROPE_SCALING_TYPE_LINEAR
    YARN = 2  # LLAMA_ROPE_SCALING_TYPE_YARN
    LONGROPE = 3  # LLAMA_ROPE_SCALING_TYPE_LONGROPE


class KVType(enum.IntEnum):
    """Element type of the K and V caches (a subset of ``ggml_type``).

    The one vocabulary of KV types: the value is the ``ggml_type`` number, which
    is also what the cache key hashes (:func:`llamad.cache.key.ctx_params_hash`
    takes the number and knows no names).
    """

    F32 = 0  # GGML_TYPE_F32
    F16 = 1  # GGML_TYPE_F16
    BF16 = 30  # GGML_TYPE_BF16
    Q8_0 = 8  # GGML_TYPE_Q8_0
    Q5_1 = 7  # GGML_TYPE_Q5_1
    Q5_0 = 6  # GGML_TYPE_Q5_0
    Q4_1 = 3  # GGML_TYPE_Q4_1
    Q4_0 = 2  # GGML_TYPE_Q4_0
    IQ4_NL = 20  # GGML_TYPE_IQ4_NL

    @property
    def quantized(self) -> bool:
        return self not in (KVType.F32, KVType.F16, KVType.BF16)


def default_threads() -> int:
    """Cores this process may run on (the benchmark bar assumes all of them)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _coerce_enum(owner: object, name: str, kind: type[enum.IntEnum]) -> None:
    value = getattr(owner, name)
    if isinstance(value, kind):
        return
    try:
        coerced = kind[value.upper()] if isinstance(value, str) else kind(value)
    except (KeyError, ValueError):
        choices = ", ".join(m.name.lower() for m in kind)
        raise ConfigError(f"{name}: {value!r} is not one of {choices}") from None
    object.__setattr__(owner, name, coerced)


def _require(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{name}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_F32_MAX = 3.4028234663852886e38


def _is_f32(value: Any) -> bool:
    # llama.cpp keeps these as float: a value float32 cannot hold would become
    # inf (or raise) on the way in.
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= _F32_MAX
    )


@dataclass(frozen=True)
class ModelOptions:
    """How to load a model (SPEC L2).

    ``n_gpu_layers`` -1 offloads every layer (no effect on a CPU build);
    ``tensor_split`` gives each GPU's share (at most ``llama_max_devices()``
    entries); ``vocab_only`` loads the tokenizer without weights.
    ``repack`` lets the CPU backend repack weights into interleaved layouts
    (``use_extra_bufts``: Q4_0, IQ4_NL and the K-quants on AVX2). A repacked
    matrix multiply takes one kernel for each group of 4 batch rows and
    another for the rest, so a row's result depends on where it sits in its
    batch; off, every row takes the plain kernel (slower prompts).
    """

    n_gpu_layers: int = -1
    load_mode: LoadMode = LoadMode.AUTO
    vocab_only: bool = False
    split_mode: SplitMode = SplitMode.LAYER
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    check_tensors: bool = False
    repack: bool = True

    def __post_init__(self) -> None:
        _coerce_enum(self, "load_mode", LoadMode)
        _coerce_enum(self, "split_mode", SplitMode)
        _require(_is_int(self.n_gpu_layers), "n_gpu_layers", "must be an integer")
        _require(self.n_gpu_layers >= -1, "n_gpu_layers", "must be >= -1 (-1 = all)")
        _require(_is_int(self.main_gpu) and self.main_gpu >= 0, "main_gpu", "must be >= 0")
        _require(isinstance(self.vocab_only, bool), "vocab_only", "must be a bool")
        _require(isinstance(self.check_tensors, bool), "check_tensors", "must be a bool")
        _require(isinstance(self.repack, bool), "repack", "must be a bool")
        _require(
            isinstance(self.tensor_split, list | tuple),
            "tensor_split",
            "must be a sequence of shares",
        )
        split = tuple(self.tensor_split)
        object.__setattr__(self, "tensor_split", split)
        _require(
            len(split) <= MAX_DEVICES,
            "tensor_split",
            f"at most {MAX_DEVICES} entries (llama_max_devices)",
        )
        _require(
            all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in split),
            "tensor_split",
            "entries must be finite and >= 0",
        )


@dataclass(frozen=True)
class ContextOptions:
    """Options of one inference context (SPEC L3).

    ``n_threads``/``n_threads_batch`` default to every core this process may
    use. ``n_ctx`` is the total across sequences; unless ``kv_unified`` each
    of the ``n_seq_max`` sequences gets ``n_ctx / n_seq_max`` positions.
    ``pooling`` only matters with ``embeddings`` (or :meth:`Context.embed`);
    ``UNSPECIFIED`` takes the model's own choice.

    ``swa_full`` keeps a full-size cache for sliding-window layers.
    The RoPE/YaRN settings follow llama.cpp: ``rope_scaling_type``
    ``UNSPECIFIED``, a frequency base or scale of 0, and a negative YaRN factor
    or beta all mean "the model's own value"; ``yarn_orig_ctx`` 0 likewise.
    Every field either changes the KV state a context produces (and is part of
    its cache namespace) or is listed as excluded, with the reason, in
    :mod:`llamad.model.identity`.
    """

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int = field(default_factory=default_threads)
    n_threads_batch: int = field(default_factory=default_threads)
    flash_attn: FlashAttn = FlashAttn.AUTO
    type_k: KVType = KVType.F16
    type_v: KVType = KVType.F16
    embeddings: bool = False
    pooling: PoolingType = PoolingType.UNSPECIFIED
    kv_unified: bool = False
    offload_kqv: bool = True
    swa_full: bool = True
    rope_scaling_type: RopeScaling = RopeScaling.UNSPECIFIED
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_fast: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_orig_ctx: int = 0

    def __post_init__(self) -> None:
        _coerce_enum(self, "flash_attn", FlashAttn)
        _coerce_enum(self, "rope_scaling_type", RopeScaling)
        _coerce_enum(self, "type_k", KVType)
        _coerce_enum(self, "type_v", KVType)
        _coerce_enum(self, "pooling", PoolingType)
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads", "n_threads_batch"):
            _require(_is_int(getattr(self, name)), name, "must be an integer")
        _require(self.n_ctx >= 1, "n_ctx", "must be >= 1")
        _require(self.n_batch >= 1, "n_batch", "must be >= 1")
        _require(1 <= self.n_ubatch <= self.n_batch, "n_ubatch", "must be in [1, n_batch]")
        _require(
            1 <= self.n_seq_max <= MAX_PARALLEL_SEQUENCES,
            "n_seq_max",
            f"must be in [1, {MAX_PARALLEL_SEQUENCES}]",
        )
        _require(
            self.n_ctx >= self.n_seq_max,
            "n_ctx",
            "must be >= n_seq_max (every sequence needs room)",
        )
        _require(self.n_threads >= 1, "n_threads", "must be >= 1")
        _require(self.n_threads_batch >= 1, "n_threads_batch", "must be >= 1")
        # llama.cpp can only read a quantised V cache through flash attention.
        _require(
            not (self.type_v.quantized and self.flash_attn is FlashAttn.OFF),
            "type_v",
            f"{self.type_v.name} needs flash_attn on or auto",
        )
        for name in ("embeddings", "kv_unified", "offload_kqv", "swa_full"):
            _require(isinstance(getattr(self, name), bool), name, "must be a bool")
        for name in (
            "rope_freq_base",
            "rope_freq_scale",
            "yarn_ext_factor",
            "yarn_attn_factor",
            "yarn_beta_fast",
            "yarn_beta_slow",
        ):
            _require(_is_f32(getattr(self, name)), name, "must be a finite float32 number")
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("rope_freq_base", "rope_freq_scale"):
            _require(getattr(self, name) >= 0, name, "must be >= 0 (0 = the model's value)")
        _require(
            _is_int(self.yarn_orig_ctx) and 0 <= self.yarn_orig_ctx < 2**32,
            "yarn_orig_ctx",
            "must be an integer in [0, 2**32) (0 = the model's value)",
        )
