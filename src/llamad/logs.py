"""One place that configures structlog for every llamad process.

Modules log with ``structlog.get_logger(__name__)`` and never configure
anything themselves. Processes call :func:`configure` once at start:
``LLAMAD_LOG_LEVEL`` (debug/info/warning/error) and ``LLAMAD_LOG_FORMAT``
(``json`` for the daemon under systemd, ``console`` for people) override the
arguments.
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
