"""One place that configures structlog for every llamad process.

Modules log with ``structlog.get_logger(__name__)`` and never configure
anything themselves. llamad's own processes (the daemon and its children,
the ``llamad`` command) call :func:`configure` once at start:
``LLAMAD_LOG_LEVEL`` (debug/info/warning/error) and ``LLAMAD_LOG_FORMAT``
(``json`` for the daemon under systemd, ``console`` for people) override the
arguments.

A program that only *uses* llamad (the public client) is a library user:
structlog's own default would print every debug line of the client on its
stdout. :func:`library_default`, called when a client is created, routes
llamad's events into the standard library's ``logging`` instead, unless the
program configured structlog itself, which is never overridden. With no
logging configured either, Python's last-resort handler shows warnings and
errors on stderr and nothing else; a program that configures ``logging``
gets llamad's events through its own handlers and levels, under the logger
names of the modules that emit them (``llamad.actors.client``, ...).
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def configure(level: str = "info", fmt: str = "console") -> None:
    """Configure structlog for this process (idempotent; env wins over args)."""
    level = os.environ.get("LLAMAD_LOG_LEVEL", level).lower()
    fmt = os.environ.get("LLAMAD_LOG_FORMAT", fmt).lower()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def library_default() -> None:
    """Send llamad's logs to :mod:`logging` unless structlog is configured already.

    Idempotent; an application that configures structlog later replaces this
    as usual (loggers are not cached on first use)."""
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            # Dropped before any rendering below the stdlib logger's level
            # (WARNING when the application configured nothing).
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(
                key_order=["level", "logger", "event"], sort_keys=True
            ),
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
