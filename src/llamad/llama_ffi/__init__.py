"""llamad.llama_ffi: the only code that touches libllama.

Typed, lifetime-safe wrappers over the pinned llama.cpp (SPEC L2-L12)::

    from llamad.llama_ffi import Model, ContextOptions, SamplerParams, Sampler

    with Model(path) as model, model.context(ContextOptions(n_ctx=2048)) as ctx:
        ctx.prefill(model.tokenize("Hello"))
        tokens = ctx.generate(Sampler(model, SamplerParams(greedy=True)), 16)

Misuse that llama.cpp would answer with an abort raises a subclass of
:class:`llamad.errors.LlamadError` instead (see :mod:`llamad.llama_ffi.errors`).
"""

from llamad.errors import ContextOverflow
from llamad.llama_ffi.batch import Batch
from llamad.llama_ffi.builtin_template import builtin_chat_template, builtin_template_names
from llamad.llama_ffi.context import Context
from llamad.llama_ffi.errors import (
    AdapterError,
    BatchTooLarge,
    BufferTooSmall,
    ChatTemplateError,
    Closed,
    ContextCreateError,
    DecodeError,
    EmbeddingsUnavailable,
    GrammarError,
    InvalidSequence,
    InvalidToken,
    LlamaError,
    LoadCancelled,
    ModelFileError,
    ModelLoadError,
    NoLogits,
    NotGGUF,
    StateError,
    TruncatedGGUF,
    Unsupported,
)
from llamad.llama_ffi.gguf_check import GGUFInfo, check_gguf
from llamad.llama_ffi.lora import LoraAdapter, effective_fingerprint
from llamad.llama_ffi.model import Model, ProgressCallback
from llamad.llama_ffi.native import ensure_backend, set_log_level, system_info
from llamad.llama_ffi.options import (
    ContextOptions,
    FlashAttn,
    KVType,
    LoadMode,
    ModelOptions,
    PoolingType,
    SplitMode,
    default_threads,
)
from llamad.llama_ffi.sampling import Sampler, SamplerParams
from llamad.llama_ffi.state import PAGE_SIZE, StateBuffer, prefault

__all__ = [
    "PAGE_SIZE",
    "AdapterError",
    "Batch",
    "BatchTooLarge",
    "BufferTooSmall",
    "ChatTemplateError",
    "Closed",
    "Context",
    "ContextCreateError",
    "ContextOptions",
    "ContextOverflow",
    "DecodeError",
    "EmbeddingsUnavailable",
    "FlashAttn",
    "GGUFInfo",
    "GrammarError",
    "InvalidSequence",
    "InvalidToken",
    "KVType",
    "LlamaError",
    "LoadCancelled",
    "LoadMode",
    "LoraAdapter",
    "Model",
    "ModelFileError",
    "ModelLoadError",
    "ModelOptions",
    "NoLogits",
    "NotGGUF",
    "PoolingType",
    "ProgressCallback",
    "Sampler",
    "SamplerParams",
    "SplitMode",
    "StateBuffer",
    "StateError",
    "TruncatedGGUF",
    "Unsupported",
    "builtin_chat_template",
    "builtin_template_names",
    "check_gguf",
    "default_threads",
    "effective_fingerprint",
    "ensure_backend",
    "prefault",
    "set_log_level",
    "system_info",
]
