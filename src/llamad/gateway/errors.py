"""llamad's error codes as HTTP statuses: the one table every protocol uses.

A protocol module renders an error in its own shape (OpenAI's
``{"error": {...}}``, Anthropic's, Ollama's) but never picks the status: it asks
:func:`status_of`. ``docs/internals/gateway.md`` has the table with the reasons.
"""

from __future__ import annotations

from typing import Final

from llamad.errors import LlamadError

__all__ = ["STATUS", "HttpError", "param_of", "status_of"]

STATUS: Final[dict[str, int]] = {
    # The request is wrong: the caller must change it.
    "bad_request": 400,
    "bad_schema": 400,
    "invalid_grammar": 400,
    "invalid_token": 400,
    "context_overflow": 400,
    "template_error": 400,
    "template_security": 400,
    "chat_template_unsupported": 400,
    "embeddings_unavailable": 400,
    "unsupported": 400,
    "adapter_error": 400,
    "config_error": 400,
    "not_gguf": 400,
    "truncated_gguf": 400,
    "model_file_error": 400,
    "unknown_op": 400,
    "invalid_api_key": 401,
    "permission_denied": 403,
    "path_not_allowed": 403,
    "model_not_found": 404,
    "no_session": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "session_exists": 409,
    "sticky_busy": 409,
    "transcript_mismatch": 409,
    "too_large": 413,
    # Busy: the same request may succeed later (clients retry these).
    "overloaded": 429,
    "too_many_streams": 429,
    "cancelled": 499,
    "worker_crashed": 502,
    "model_failed": 503,
    "model_load_failed": 503,
    "unavailable": 503,
    "timeout": 504,
}
"""Status per llamad error code; any other code is a 500."""


class HttpError(Exception):
    """A refusal of the gateway's own (a key, a body, a limit, a field no
    llamad request has), with its code in :data:`STATUS`; ``param`` names the
    request field when there is one. Not a :class:`~llamad.errors.LlamadError`:
    it never crosses llamad's wire."""

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def status_of(error: LlamadError | HttpError) -> int:
    """The HTTP status of ``error``."""
    return STATUS.get(error.code, 500)


def param_of(error: LlamadError | HttpError) -> str | None:
    """The request field an error is about, when it says."""
    if isinstance(error, HttpError):
        return error.param
    field = error.details.get("field") or error.details.get("param")
    return field if isinstance(field, str) and field else None
