"""Exit reasons of child processes, and the exit codes supervisors use.

OTP tells three exit reasons apart because ``transient`` depends on it; an OS
process only leaves a wait status, so we map statuses onto OTP's reasons:

========================================  =========  ===================================
wait status (``Popen.returncode``)        reason     OTP analogue
========================================  =========  ===================================
exit code 0                               normal     ``normal``
killed by SIGTERM, or exit code 143       shutdown   ``shutdown`` (the conventional
(128 + SIGTERM, what shells and many                 "asked to stop" reason)
runtimes use after a SIGTERM)
any other exit code, any other signal     abnormal   any other reason (``killed`` for
(SIGKILL, SIGSEGV, SIGABRT, ...)                     SIGKILL, a crash for the rest)
========================================  =========  ===================================

A child that the supervisor itself is terminating is reported with reason
``shutdown`` whatever its status (the status is still logged), exactly as OTP
never restarts a child it is terminating.

Supervisor processes exit 0 when asked to stop (SIGTERM/SIGINT) or on
``auto_shutdown``, and with :data:`EXIT_ESCALATED` / :data:`EXIT_START_FAILED`
when they give up, so their own supervisor sees an abnormal exit.
"""

from __future__ import annotations

import signal
from enum import StrEnum

__all__ = [
    "EXIT_CHILD_BOOT_FAILED",
    "EXIT_CHILD_ERROR",
    "EXIT_CRASHED",
    "EXIT_ESCALATED",
    "EXIT_NORMAL",
    "EXIT_ORPHANED",
    "EXIT_START_FAILED",
    "ExitReason",
    "classify_exit",
    "describe_exit",
]

EXIT_NORMAL = 0
#: The child's entry function raised (the runner printed the traceback).
EXIT_CHILD_ERROR = 1
#: A supervisor's own loop failed (a bug); its children were killed first.
EXIT_CRASHED = 1
#: The child runner could not read its boot record or import its target.
EXIT_CHILD_BOOT_FAILED = 2
#: A supervisor exceeded its restart intensity and stopped its children.
EXIT_ESCALATED = 3
#: A supervisor could not start one of its initial children.
EXIT_START_FAILED = 4
#: The child found its supervisor already gone right after it started.
EXIT_ORPHANED = 5

_SHUTDOWN_CODE = 128 + signal.SIGTERM


class ExitReason(StrEnum):
    """OTP's three exit reasons."""

    NORMAL = "normal"
    SHUTDOWN = "shutdown"
    ABNORMAL = "abnormal"


def classify_exit(returncode: int) -> ExitReason:
    """Map a ``Popen.returncode`` (negative = killed by that signal) to a reason."""
    if returncode == 0:
        return ExitReason.NORMAL
    if returncode in (-signal.SIGTERM, _SHUTDOWN_CODE):
        return ExitReason.SHUTDOWN
    return ExitReason.ABNORMAL


def describe_exit(returncode: int) -> str:
    """A short human form for logs: ``"exit 3"`` or ``"signal SIGKILL"``."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"
