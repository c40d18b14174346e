"""How the ``llamad`` command reports an error: one line on stderr and an exit status per family.

Every failure prints ``llamad: <code>: <message>`` (the error's stable code,
:mod:`llamad.errors`) and exits with the status of its family, so a script
can tell "try again later" from "fix your request" from "start the daemon"
without parsing text. The numbers follow BSD's ``sysexits.h`` where one fits,
as the daemon's own exits do (78: a configuration refused):

======  ===================  ==============================================================
status  family               codes
======  ===================  ==============================================================
0       success
1       any other error      ``internal``, cache and supervisor errors, ...
2       usage                a bad command line (argparse)
65      refused request      ``bad_request`` and its kin (``invalid_token``,
                             ``invalid_grammar``, ``bad_schema``, ...), ``context_overflow``,
                             ``template_error``, ``transcript_mismatch``, ``session_exists``,
                             ``too_large``, ``unknown_op``
66      not found            ``model_not_found``, ``no_session``, ``asset_missing``
69      unavailable          ``unavailable``: no daemon at the endpoint (the line says how to
                             start one), or a worker that is not serving; ``permission_denied``:
                             another user's socket, or a CURVE key the daemon refuses
70      the model failed     ``worker_crashed``, ``model_failed``, ``model_load_failed`` and
                             other failures inside llama.cpp
75      try again            ``overloaded``, ``sticky_busy``, ``timeout``, ``cancelled``
78      configuration        ``config_error`` and its kin (``path_not_allowed``, a config file
                             ``llamad config check`` refuses), ``not_gguf``, ``truncated_gguf``,
                             ``model_file_error``
130     interrupted          Ctrl-C
======  ===================  ==============================================================

Pure functions: tested in ``tests/unit/cli``.
"""

from __future__ import annotations

from typing import Final

from llamad.errors import BadRequest, ConfigError, LlamadError, LlamaError

__all__ = [
    "DAEMON_HINT",
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_MODEL_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_TRY_AGAIN",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "error_line",
    "exit_code",
]

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_REFUSED: Final = 65
EXIT_NOT_FOUND: Final = 66
EXIT_UNAVAILABLE: Final = 69
EXIT_MODEL_FAILED: Final = 70
EXIT_TRY_AGAIN: Final = 75
EXIT_CONFIG: Final = 78
EXIT_INTERRUPTED: Final = 130

# Codes whose class says nothing about its family (they derive from
# LlamadError or LlamaError directly). Subclasses of BadRequest and
# ConfigError are placed by their base, so a new refusal lands in its family.
_BY_CODE: Final[dict[str, int]] = {
    "context_overflow": EXIT_REFUSED,
    "template_error": EXIT_REFUSED,
    "template_security": EXIT_REFUSED,
    "transcript_mismatch": EXIT_REFUSED,
    "session_exists": EXIT_REFUSED,
    "too_large": EXIT_REFUSED,
    "unknown_op": EXIT_REFUSED,
    "model_not_found": EXIT_NOT_FOUND,
    "no_session": EXIT_NOT_FOUND,
    "asset_missing": EXIT_NOT_FOUND,
    "unavailable": EXIT_UNAVAILABLE,
    "permission_denied": EXIT_UNAVAILABLE,
    "worker_crashed": EXIT_MODEL_FAILED,
    "model_failed": EXIT_MODEL_FAILED,
    "overloaded": EXIT_TRY_AGAIN,
    "sticky_busy": EXIT_TRY_AGAIN,
    "timeout": EXIT_TRY_AGAIN,
    "cancelled": EXIT_TRY_AGAIN,
    "not_gguf": EXIT_CONFIG,
    "truncated_gguf": EXIT_CONFIG,
    "model_file_error": EXIT_CONFIG,
}


def exit_code(err: LlamadError) -> int:
    """The exit status of ``err``'s family (see the module doc)."""
    by_code = _BY_CODE.get(err.code)
    if by_code is not None:
        return by_code
    if isinstance(err, BadRequest):
        return EXIT_REFUSED
    if isinstance(err, ConfigError):
        return EXIT_CONFIG
    if isinstance(err, LlamaError):
        return EXIT_MODEL_FAILED
    return EXIT_ERROR


DAEMON_HINT: Final = (
    "is the daemon running? start it with `llamad daemon` "
    "(or point --endpoint or --config at yours)"
)


def error_line(err: LlamadError, *, endpoint: str | None = None) -> str:
    """The one line printed for ``err`` (no newline). ``endpoint``: the daemon's,
    when the error may mean that no daemon runs there (then the line says how
    to start one)."""
    message = " ".join(err.message.split())  # one line, whatever the peer sent
    line = f"llamad: {err.code}: {message}"
    # The front's unavailability names its endpoint (in details, or as the
    # target of the message); a worker's names the worker, and gets no hint.
    if (
        endpoint is not None
        and err.code == "unavailable"
        and (err.details.get("endpoint") == endpoint or endpoint in err.message)
    ):
        line += f"; {DAEMON_HINT}"
    return line
