"""The HTTP status of each llamad error code, shared by the protocol modules.

A protocol module (Anthropic, Ollama) wraps the status in its own error
shape; the status itself depends only on what went wrong, so it is decided
once here. A code not listed is a server-side fault: 500.
"""

from __future__ import annotations

from typing import Final

from llamad.errors import LlamadError

__all__ = ["STATUS_BY_CODE", "http_status"]

STATUS_BY_CODE: Final[dict[str, int]] = {
    # The request itself is wrong: the caller must change it.
    "bad_request": 400,
    "bad_schema": 400,
    "invalid_grammar": 400,
    "invalid_token": 400,
    "context_overflow": 400,
    "template_error": 400,
    "template_security": 400,
    "transcript_mismatch": 409,
    "no_session": 404,
    "session_exists": 409,
    "sticky_busy": 409,
    "unauthenticated": 401,
    "permission_denied": 403,
    "path_not_allowed": 403,
    "model_not_found": 404,
    "unknown_op": 404,
    "too_large": 413,
    # The daemon cannot take it now: the same request may succeed later.
    "overloaded": 429,
    "rate_limited": 429,
    "unavailable": 503,
    "model_failed": 503,
    "worker_crashed": 502,
    "timeout": 504,
    # The client left: nobody reads this status (nginx's "client closed request").
    "cancelled": 499,
}


def http_status(error: LlamadError) -> int:
    """The HTTP status for ``error`` (500 for a code not listed: a fault of ours)."""
    return STATUS_BY_CODE.get(error.code, 500)
