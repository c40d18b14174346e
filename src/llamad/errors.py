"""Typed errors with stable codes.

Every exception llamad raises derives from :class:`LlamadError`. Errors that
cross a process boundary travel as ``{"code", "message", "details"}`` and are
rebuilt on the other side by :func:`from_wire`, so a client catches the same
class the worker raised. Codes are part of the public contract: never rename
one, only add.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

_BY_CODE: dict[str, type[LlamadError]] = {}


class LlamadError(Exception):
    """Base of every llamad error; ``code`` is stable across releases."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str = "", *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details: dict[str, Any] = dict(details or {})

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


class ContextOverflow(LlamadError):
    code = "context_overflow"


class ConfigError(LlamadError):
    """Invalid configuration: llamad refuses to start."""

    code = "config_error"


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
    return _BY_CODE.get(code, LlamadError)


def from_wire(payload: Mapping[str, Any]) -> LlamadError:
    """Rebuild an error sent by :meth:`LlamadError.to_wire`; tolerant of junk."""
    code = payload.get("code")
    message = payload.get("message")
    details = payload.get("details")
    cls = error_class(code) if isinstance(code, str) else LlamadError
    err = cls(
        message if isinstance(message, str) else "",
        details=details if isinstance(details, Mapping) else None,
    )
    if cls is LlamadError and isinstance(code, str) and code != LlamadError.code:
        # Keep an unknown peer code visible rather than flattening it.
        err.details.setdefault("code", code)
    return err
