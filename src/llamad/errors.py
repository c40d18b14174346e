"""Typed errors with stable codes.

Every exception llamad raises derives from :class:`LlamadError`. Errors that
cross a process boundary travel as ``{"code", "message", "details"}`` and are
rebuilt on the other side by :func:`from_wire`, so a client catches the same
class the worker raised. Codes are part of the public contract: never rename
one, only add. Every class has a code of its own (a subclass that shared its
parent's code would come back as the parent).

Classes may have constructors of their own (``ActorConfigError(field,
problem)``); the wire never calls them. :func:`from_wire` rebuilds the instance
from message and details alone, and a class restores the attributes it keeps
beside ``details`` by naming them in ``detail_attrs``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, ClassVar

_BY_CODE: dict[str, type[LlamadError]] = {}

# Modules that define error classes outside this one. A process that receives
# an error may not have imported the module that raised it (a client never
# imports the cache), so :func:`error_class` imports these on the first code it
# does not know. They are plain-Python modules: none loads libllama.
# tests/unit/test_errors.py fails when a class lives in a module not listed.
ERROR_MODULES: tuple[str, ...] = (
    "llamad.actors.errors",
    "llamad.supervisor.errors",
    "llamad.cache.errors",
    "llamad.cache.counters",
    "llamad.cache.tiers",
    "llamad.llama_ffi.errors",
    "llamad.paths",
    "llamad.front.wire",
)
_modules_loaded = False


class LlamadError(Exception):
    """Base of every llamad error; ``code`` is stable across releases."""

    code: ClassVar[str] = "internal"
    # Instance attributes mirrored from ``details`` of the same name, restored
    # when the error is rebuilt from the wire.
    detail_attrs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str = "", *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details: dict[str, Any] = dict(details or {})

    @classmethod
    def rebuild(cls, message: str, details: Mapping[str, Any] | None) -> LlamadError:
        """The instance a peer sent, without calling a subclass's constructor."""
        err = cls.__new__(cls)
        LlamadError.__init__(err, message, details=details)
        for name in cls.detail_attrs:
            setattr(err, name, err.details.get(name, ""))
        return err

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The first class to claim a code is its wire representative; subclasses
        # that only refine behaviour inherit the code without taking it over.
        if "code" in cls.__dict__:
            _BY_CODE.setdefault(cls.code, cls)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


_BY_CODE[LlamadError.code] = LlamadError


class BadRequest(LlamadError):
    """A message or argument failed validation."""

    code = "bad_request"


class UnknownOp(LlamadError):
    code = "unknown_op"


class TooLarge(LlamadError):
    code = "too_large"


class VersionMismatch(LlamadError):
    code = "version_mismatch"


class WorkerCrashed(LlamadError):
    """The process serving a call died before it answered."""

    code = "worker_crashed"


class Unavailable(LlamadError):
    """The target is known but not serving (e.g. restarting)."""

    code = "unavailable"


class PermissionDenied(LlamadError):
    """The target refused this client: the ipc socket or its directory belongs
    to another user, or the security handshake failed (a CURVE key it does not
    allow, no CURVE key where it requires one, the wrong server key).

    Not an :class:`Unavailable`: retrying cannot help, so nothing waits for it."""

    code = "permission_denied"


class RequestTimeout(LlamadError):
    code = "timeout"


class Cancelled(LlamadError):
    code = "cancelled"


class ModelNotFound(LlamadError):
    code = "model_not_found"


class StickyBusy(LlamadError):
    code = "sticky_busy"


class NoSession(LlamadError):
    code = "no_session"


class SessionExists(LlamadError):
    """A session of that id already exists (``fork_session`` into a taken id)."""

    code = "session_exists"


class TranscriptMismatch(LlamadError):
    """``continue`` with ``expect_committed`` that differs from the worker's
    committed token count: the caller's view of the session is stale."""

    code = "transcript_mismatch"


class Overloaded(LlamadError):
    """Every sequence is busy and the admission queue is full; retry later."""

    code = "overloaded"


class LlamaError(LlamadError):
    """Base of every failure of llama.cpp or the binding over it.

    Defined here rather than in :mod:`llamad.llama_ffi.errors` (which re-exports
    it) so that :class:`ContextOverflow`, raised by the binding and by the model
    worker alike, is caught by ``except LlamaError``.
    """

    code = "llama_error"


class ContextOverflow(LlamaError):
    """The tokens do not fit in the context (prompt too long, or decoding past ``n_ctx``)."""

    code = "context_overflow"


class ConfigError(LlamadError):
    """Invalid configuration: llamad refuses to start."""

    code = "config_error"


class PathNotAllowed(ConfigError):
    """A model or adapter path outside ``[security].model_dirs`` once symlinks
    and ``..`` are resolved (``details``: ``field``, ``problem``)."""

    code = "path_not_allowed"


class DaemonInUse(LlamadError):
    """Another llamad daemon holds a place this one would use (its runtime
    directory, a tier): this one refuses to start, having changed nothing there.
    ``details["held"]``: one ``{place, lock, holder_pid}`` per place held."""

    code = "daemon_in_use"


class SchemaError(BadRequest):
    """A JSON Schema that cannot become a grammar; details name ``path`` and ``keyword``."""

    code = "bad_schema"


class TemplateError(LlamadError):
    """A chat template failed to render (its own ``raise_exception`` included)."""

    code = "template_error"


class TemplateSecurityError(TemplateError):
    """A chat template reached for something the sandbox forbids."""

    code = "template_security"


def error_class(code: str) -> type[LlamadError]:
    """The class that represents ``code`` on the wire (base class if unknown)."""
    global _modules_loaded
    cls = _BY_CODE.get(code)
    if cls is None and not _modules_loaded:
        _modules_loaded = True
        for name in ERROR_MODULES:
            importlib.import_module(name)
        cls = _BY_CODE.get(code)
    return cls or LlamadError


def from_wire(payload: Mapping[str, Any]) -> LlamadError:
    """Rebuild an error sent by :meth:`LlamadError.to_wire`; tolerant of junk."""
    code = payload.get("code")
    message = payload.get("message")
    details = payload.get("details")
    cls = error_class(code) if isinstance(code, str) else LlamadError
    err = cls.rebuild(
        message if isinstance(message, str) else "",
        details if isinstance(details, Mapping) else None,
    )
    if cls is LlamadError and isinstance(code, str) and code != LlamadError.code:
        # Keep an unknown peer code visible rather than flattening it.
        err.details.setdefault("code", code)
    return err
