"""Typed errors of the llama.cpp binding.

Every misuse that llama.cpp would answer with an abort (``GGML_ASSERT``) or
undefined behaviour is checked before the call and raised as one of these.
Codes are stable and travel across process boundaries (see
:mod:`llamad.errors`). The base :class:`LlamaError` and
:class:`ContextOverflow` (running past the end of the context) live in
:mod:`llamad.errors`, because the model worker raises ``context_overflow`` too,
and are re-exported here.
"""

from __future__ import annotations

from llamad.errors import BadRequest, ContextOverflow, LlamaError

__all__ = [
    "AdapterError",
    "BatchTooLarge",
    "BufferTooSmall",
    "ChatTemplateError",
    "Closed",
    "ContextCreateError",
    "ContextOverflow",
    "DecodeAborted",
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
    "ThreadpoolError",
    "ThreadsExceedPool",
    "TruncatedGGUF",
    "Unsupported",
]


class Closed(LlamaError):
    """A model, context, sampler or adapter was used after it was closed."""

    code = "closed"


class ModelFileError(LlamaError):
    """The model path cannot be loaded as a GGUF file."""

    code = "model_file_error"


class NotGGUF(ModelFileError):
    """The file does not start with the GGUF magic (or cannot be read)."""

    code = "not_gguf"


class TruncatedGGUF(ModelFileError):
    """The GGUF header or tensor data extends past the end of the file."""

    code = "truncated_gguf"


class ModelLoadError(LlamaError):
    """llama.cpp refused to load a file that passed our header checks."""

    code = "model_load_failed"


class LoadCancelled(ModelLoadError):
    """The progress callback asked to stop loading."""

    code = "load_cancelled"


class ContextCreateError(LlamaError):
    """llama.cpp could not create a context with the given options."""

    code = "context_create_failed"


class InvalidToken(LlamaError, BadRequest):
    """A token id outside ``[0, n_vocab)``."""

    code = "invalid_token"


class InvalidSequence(LlamaError, BadRequest):
    """A sequence id outside ``[0, n_seq_max)`` (or otherwise unusable)."""

    code = "invalid_sequence"


class BatchTooLarge(LlamaError, BadRequest):
    """A batch holds more rows than the context's ``n_batch`` (or its capacity)."""

    code = "batch_too_large"


class NoLogits(LlamaError):
    """Sampling or reading logits for a row that produced none in the last decode."""

    code = "no_logits"


class DecodeError(LlamaError):
    """``llama_decode`` failed for a reason other than a full context."""

    code = "decode_failed"


class DecodeAborted(DecodeError):
    """``llama_decode`` stopped between graph nodes by the context's abort check
    (:meth:`llamad.llama_ffi.Context.decode`): ``details["reason"]`` is
    ``stop`` (:meth:`~llamad.llama_ffi.Context.abort_now`), ``deadline`` or
    ``probe``. llama.cpp has dropped the positions of the micro-batch it was
    computing from every sequence in it; earlier micro-batches of the same
    call stay in the KV."""

    code = "decode_aborted"

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class GrammarError(LlamaError, BadRequest):
    """A GBNF grammar that llama.cpp cannot parse."""

    code = "invalid_grammar"


class StateError(LlamaError):
    """Packing or unpacking a sequence's KV state failed."""

    code = "state_error"


class BufferTooSmall(StateError, BadRequest):
    """The caller's buffer cannot hold the packed state."""

    code = "buffer_too_small"


class AdapterError(LlamaError):
    """A LoRA adapter could not be loaded or applied."""

    code = "adapter_error"


class EmbeddingsUnavailable(LlamaError, BadRequest):
    """The context cannot produce pooled embeddings (pooling type is ``NONE``)."""

    code = "embeddings_unavailable"


class ChatTemplateError(LlamaError, BadRequest):
    """llama.cpp has no built-in template matching the given name or text."""

    code = "chat_template_unsupported"


class Unsupported(LlamaError, BadRequest):
    """The operation is not supported by this model or context layout."""

    code = "unsupported"


class ThreadpoolError(LlamaError):
    """A ggml threadpool could not be created or used as asked."""

    code = "threadpool_error"


class ThreadsExceedPool(ThreadpoolError, BadRequest):
    """A context would compute on more threads than its attached pool has
    (ggml would index past the pool's per-thread state)."""

    code = "threads_exceed_pool"
