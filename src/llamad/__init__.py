"""llamad: a supervised, multi-process llama.cpp daemon with a token-exact KV cache.

The public client API (see ``docs/internals/client.md``)::

    from llamad import Client, AsyncClient, StickyBusy, Completion

Every name below is imported on first use, so ``import llamad`` costs almost
nothing and never loads libllama, ZeroMQ or msgspec: a program that only
wants ``llamad.__version__`` pays for nothing else. The error classes are the
ones the daemon's processes raise; each error code arrives as its own class.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from llamad.actors.errors import (
        ActorConfigError,
        ClientClosed,
        NameTaken,
        WrongProcess,
    )
    from llamad.cache.counters import CountersFull, CountersUnavailable
    from llamad.cache.errors import (
        AlreadyCached,
        CacheError,
        CacheFull,
        FingerprintMismatch,
        GgufMalformed,
        InvalidCacheValue,
        KvcCorrupt,
        PublishAbandoned,
        SaveInFlight,
        SaveRefused,
        TierError,
        TierFull,
        TierLocked,
    )
    from llamad.cache.meta import GcReport
    from llamad.cache.tiers import RowMissing
    from llamad.client import Client
    from llamad.client_async import AsyncClient
    from llamad.client_async_stream import AsyncStream
    from llamad.client_ops import AdapterInfo
    from llamad.client_stream import Stream
    from llamad.errors import (
        BadRequest,
        Cancelled,
        ConfigError,
        ContextOverflow,
        LlamadError,
        LlamaError,
        ModelNotFound,
        NoSession,
        Overloaded,
        PermissionDenied,
        RequestTimeout,
        SchemaError,
        SessionExists,
        StickyBusy,
        TemplateError,
        TemplateSecurityError,
        TooLarge,
        TranscriptMismatch,
        Unavailable,
        UnknownOp,
        VersionMismatch,
        WorkerCrashed,
    )
    from llamad.front_wire import (
        DaemonStatus,
        LoadProgress,
        ModelFailed,
        ModelInfo,
        ModelState,
        ModelStatus,
        PathNotAllowed,
        SupervisedChild,
        SupervisorStatus,
        TierUsage,
    )
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
        LoadCancelled,
        ModelFileError,
        ModelLoadError,
        NoLogits,
        NotGGUF,
        StateError,
        ThreadpoolError,
        ThreadsExceedPool,
        TruncatedGGUF,
        Unsupported,
    )
    from llamad.model.requests import RequestParams
    from llamad.model.results import (
        CacheDelta,
        CacheHitKind,
        CacheMiss,
        Completion,
        DoneEvent,
        ErrorEvent,
        Event,
        EventKind,
        FinishReason,
        Stats,
        ThinkingEvent,
        TokenEvent,
        TokenLogprob,
        ToolCallEvent,
        TopLogprob,
    )
    from llamad.model.status_board import WorkerSnapshot
    from llamad.model.wire import ChatOptions
    from llamad.paths import AssetMissing
    from llamad.supervisor.errors import (
        ChildAlreadyPresent,
        ChildAlreadyStarted,
        ChildNotFound,
        ChildRestarting,
        ChildRunning,
        InvalidSpec,
        SimpleOneForOne,
        StartFailed,
        SupervisorError,
        SupervisorStopped,
    )

_CLIENT = {
    "Client": "llamad.client",
    "AsyncClient": "llamad.client_async",
    "Stream": "llamad.client_stream",
    "AsyncStream": "llamad.client_async_stream",
    "AdapterInfo": "llamad.client_ops",
}
_RESULTS = {
    name: "llamad.model.results"
    for name in (
        "CacheDelta",
        "CacheHitKind",
        "CacheMiss",
        "Completion",
        "DoneEvent",
        "ErrorEvent",
        "Event",
        "EventKind",
        "FinishReason",
        "Stats",
        "ThinkingEvent",
        "TokenEvent",
        "TokenLogprob",
        "ToolCallEvent",
        "TopLogprob",
    )
}
_TYPES = {
    **dict.fromkeys(
        (
            "DaemonStatus",
            "LoadProgress",
            "ModelInfo",
            "ModelState",
            "ModelStatus",
            "SupervisedChild",
            "SupervisorStatus",
            "TierUsage",
        ),
        "llamad.front_wire",
    ),
    "RequestParams": "llamad.model.requests",
    "ChatOptions": "llamad.model.wire",
    "WorkerSnapshot": "llamad.model.status_board",
    "GcReport": "llamad.cache.meta",
}


def _names(module: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, module)


# Every error class of the package, by the name it has where it is defined
# (tests/unit/client/test_exports.py fails when a class with a code is missing).
_ERRORS = {
    **_names(
        "llamad.errors",
        "BadRequest",
        "Cancelled",
        "ConfigError",
        "ContextOverflow",
        "LlamadError",
        "LlamaError",
        "ModelNotFound",
        "NoSession",
        "Overloaded",
        "PermissionDenied",
        "RequestTimeout",
        "SchemaError",
        "SessionExists",
        "StickyBusy",
        "TemplateError",
        "TemplateSecurityError",
        "TooLarge",
        "TranscriptMismatch",
        "Unavailable",
        "UnknownOp",
        "VersionMismatch",
        "WorkerCrashed",
    ),
    **_names(
        "llamad.actors.errors", "ActorConfigError", "ClientClosed", "NameTaken", "WrongProcess"
    ),
    **_names("llamad.cache.counters", "CountersFull", "CountersUnavailable"),
    **_names(
        "llamad.cache.errors",
        "AlreadyCached",
        "CacheError",
        "CacheFull",
        "FingerprintMismatch",
        "GgufMalformed",
        "InvalidCacheValue",
        "KvcCorrupt",
        "PublishAbandoned",
        "SaveInFlight",
        "SaveRefused",
        "TierError",
        "TierFull",
        "TierLocked",
    ),
    **_names("llamad.cache.tiers", "RowMissing"),
    **_names(
        "llamad.llama_ffi.errors",
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
    ),
    **_names("llamad.front_wire", "ModelFailed", "PathNotAllowed"),
    **_names("llamad.paths", "AssetMissing"),
    **_names(
        "llamad.supervisor.errors",
        "ChildAlreadyPresent",
        "ChildAlreadyStarted",
        "ChildNotFound",
        "ChildRestarting",
        "ChildRunning",
        "InvalidSpec",
        "SimpleOneForOne",
        "StartFailed",
        "SupervisorError",
        "SupervisorStopped",
    ),
}

_EXPORTS: dict[str, str] = {**_CLIENT, **_RESULTS, **_TYPES, **_ERRORS}

__all__ = [
    "ActorConfigError",
    "AdapterError",
    "AdapterInfo",
    "AlreadyCached",
    "AssetMissing",
    "AsyncClient",
    "AsyncStream",
    "BadRequest",
    "BatchTooLarge",
    "BufferTooSmall",
    "CacheDelta",
    "CacheError",
    "CacheFull",
    "CacheHitKind",
    "CacheMiss",
    "Cancelled",
    "ChatOptions",
    "ChatTemplateError",
    "ChildAlreadyPresent",
    "ChildAlreadyStarted",
    "ChildNotFound",
    "ChildRestarting",
    "ChildRunning",
    "Client",
    "ClientClosed",
    "Closed",
    "Completion",
    "ConfigError",
    "ContextCreateError",
    "ContextOverflow",
    "CountersFull",
    "CountersUnavailable",
    "DaemonStatus",
    "DecodeError",
    "DoneEvent",
    "EmbeddingsUnavailable",
    "ErrorEvent",
    "Event",
    "EventKind",
    "FingerprintMismatch",
    "FinishReason",
    "GcReport",
    "GgufMalformed",
    "GrammarError",
    "InvalidCacheValue",
    "InvalidSequence",
    "InvalidSpec",
    "InvalidToken",
    "KvcCorrupt",
    "LlamaError",
    "LlamadError",
    "LoadCancelled",
    "LoadProgress",
    "ModelFailed",
    "ModelFileError",
    "ModelInfo",
    "ModelLoadError",
    "ModelNotFound",
    "ModelState",
    "ModelStatus",
    "NameTaken",
    "NoLogits",
    "NoSession",
    "NotGGUF",
    "Overloaded",
    "PathNotAllowed",
    "PermissionDenied",
    "PublishAbandoned",
    "RequestParams",
    "RequestTimeout",
    "RowMissing",
    "SaveInFlight",
    "SaveRefused",
    "SchemaError",
    "SessionExists",
    "SimpleOneForOne",
    "StartFailed",
    "StateError",
    "Stats",
    "StickyBusy",
    "Stream",
    "SupervisedChild",
    "SupervisorError",
    "SupervisorStatus",
    "SupervisorStopped",
    "TemplateError",
    "TemplateSecurityError",
    "ThinkingEvent",
    "ThreadpoolError",
    "ThreadsExceedPool",
    "TierError",
    "TierFull",
    "TierLocked",
    "TierUsage",
    "TokenEvent",
    "TokenLogprob",
    "TooLarge",
    "ToolCallEvent",
    "TopLogprob",
    "TranscriptMismatch",
    "TruncatedGGUF",
    "Unavailable",
    "UnknownOp",
    "Unsupported",
    "VersionMismatch",
    "WorkerCrashed",
    "WorkerSnapshot",
    "WrongProcess",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llamad' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
