"""llamad.llama_ffi: the only code that touches libllama.

Typed, lifetime-safe wrappers over the pinned llama.cpp (SPEC L2-L12)::

    from llamad.llama_ffi import Model, ContextOptions, SamplerParams, Sampler

    with Model(path) as model, model.context(ContextOptions(n_ctx=2048)) as ctx:
        ctx.prefill(model.tokenize("Hello"))
        tokens = ctx.generate(Sampler(model, SamplerParams(greedy=True)), 16)

Misuse that llama.cpp would answer with an abort raises a subclass of
:class:`llamad.errors.LlamadError` instead (see :mod:`llamad.llama_ffi.errors`).

Names are imported on first use, so the pure-Python parts (the JSON Schema
converter, the Jinja chat templates) work without loading libllama.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

if TYPE_CHECKING:
    from llamad.errors import ContextOverflow
    from llamad.llama_ffi.batch import Batch
    from llamad.llama_ffi.builtin_template import builtin_chat_template, builtin_template_names
    from llamad.llama_ffi.chat_template import ChatFormatter, ChatTemplate, apply_chat_template
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
    from llamad.llama_ffi.json_schema import GrammarOptions, json_schema_to_gbnf
    from llamad.llama_ffi.lora import LoraAdapter
    from llamad.llama_ffi.model import Model, ProgressCallback
    from llamad.llama_ffi.native import ensure_backend, set_log_level, system_info
    from llamad.llama_ffi.options import (
        ContextOptions,
        FlashAttn,
        KVType,
        LoadMode,
        ModelOptions,
        PoolingType,
        RopeScaling,
        SplitMode,
        default_threads,
    )
    from llamad.llama_ffi.sampling import Sampler, SamplerParams
    from llamad.llama_ffi.state import PAGE_SIZE, StateBuffer, prefault


__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.errors": ("ContextOverflow",),
        "llamad.llama_ffi.batch": ("Batch",),
        "llamad.llama_ffi.builtin_template": (
            "builtin_chat_template",
            "builtin_template_names",
        ),
        "llamad.llama_ffi.chat_template": (
            "ChatFormatter",
            "ChatTemplate",
            "apply_chat_template",
        ),
        "llamad.llama_ffi.context": ("Context",),
        "llamad.llama_ffi.errors": (
            "AdapterError",
            "BatchTooLarge",
            "BufferTooSmall",
            "ChatTemplateError",
            "Closed",
            "ContextCreateError",
            "DecodeError",
            "EmbeddingsUnavailable",
            "GrammarError",
            "InvalidSequence",
            "InvalidToken",
            "LlamaError",
            "LoadCancelled",
            "ModelFileError",
            "ModelLoadError",
            "NoLogits",
            "NotGGUF",
            "StateError",
            "TruncatedGGUF",
            "Unsupported",
        ),
        "llamad.llama_ffi.gguf_check": (
            "GGUFInfo",
            "check_gguf",
        ),
        "llamad.llama_ffi.json_schema": (
            "GrammarOptions",
            "json_schema_to_gbnf",
        ),
        "llamad.llama_ffi.lora": ("LoraAdapter",),
        "llamad.llama_ffi.model": (
            "Model",
            "ProgressCallback",
        ),
        "llamad.llama_ffi.native": (
            "ensure_backend",
            "set_log_level",
            "system_info",
        ),
        "llamad.llama_ffi.options": (
            "ContextOptions",
            "FlashAttn",
            "KVType",
            "LoadMode",
            "ModelOptions",
            "PoolingType",
            "RopeScaling",
            "SplitMode",
            "default_threads",
        ),
        "llamad.llama_ffi.sampling": (
            "Sampler",
            "SamplerParams",
        ),
        "llamad.llama_ffi.state": (
            "PAGE_SIZE",
            "StateBuffer",
            "prefault",
        ),
    },
)


__all__ = [
    "PAGE_SIZE",
    "AdapterError",
    "Batch",
    "BatchTooLarge",
    "BufferTooSmall",
    "ChatFormatter",
    "ChatTemplate",
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
    "GrammarOptions",
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
    "RopeScaling",
    "Sampler",
    "SamplerParams",
    "SplitMode",
    "StateBuffer",
    "StateError",
    "TruncatedGGUF",
    "Unsupported",
    "apply_chat_template",
    "builtin_chat_template",
    "builtin_template_names",
    "check_gguf",
    "default_threads",
    "ensure_backend",
    "json_schema_to_gbnf",
    "prefault",
    "set_log_level",
    "system_info",
]
