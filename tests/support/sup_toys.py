"""Toy child programs for the supervisor tests.

Each toy appends JSON lines (``event``, ``name``, ``pid``) to a log file
shared by the test, so a test can read back the order in which children
started and stopped and which pids they ran as. A toy records ``start``
before it reports ready, so the log's start order is the supervisor's.

Toys run as real supervised children, ``Start("sup_toys:<function>", ...)``;
the test conftest puts this folder on the children's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

from llamad.supervisor.child import heartbeat, notifies_ready, notify_ready


def record(log_path: str, event: str, name: str, **fields: Any) -> None:
    """Append one event line; O_APPEND keeps lines from many processes whole."""
    line = json.dumps({"event": event, "name": name, "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _on_term(log_path: str, name: str, term_delay: float, ignore: bool) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        record(log_path, "term", name)
        if ignore:
            return
        if term_delay:
            time.sleep(term_delay)
        record(log_path, "term_done", name)
        # Die of SIGTERM like a program without a handler would.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


@notifies_ready
def sleeper(log_path: str, name: str, term_delay: float = 0.0, ignore_term: bool = False) -> None:
    """Start, then idle until signalled; SIGTERM is recorded (then delayed or ignored)."""
    _on_term(log_path, name, term_delay, ignore_term)
    record(log_path, "start", name)
    notify_ready()
    while True:
        signal.pause()


@notifies_ready
def exiter(log_path: str, name: str, code: int = 0, after: float = 0.0) -> None:
    """Start, wait ``after`` seconds, exit with ``code``."""
    record(log_path, "start", name)
    notify_ready()
    if after:
        time.sleep(after)
    record(log_path, "exit", name, code=code)
    sys.exit(code)


@notifies_ready
def beater(log_path: str, name: str, beat_for: float) -> None:
    """Heartbeat for ``beat_for`` seconds, then hang (alive, silent)."""
    _on_term(log_path, name, 0.0, False)
    record(log_path, "start", name)
    notify_ready()
    stop_at = time.monotonic() + beat_for
    while time.monotonic() < stop_at:
        heartbeat()
        time.sleep(0.02)
    record(log_path, "hang", name)
    while True:
        signal.pause()


@notifies_ready
def gated(log_path: str, name: str, fail_marker: str) -> None:
    """Fail to start (exit 7 before ready) while ``fail_marker`` exists, else run."""
    if os.path.exists(fail_marker):
        record(log_path, "start_fail", name)
        sys.exit(7)
    _on_term(log_path, name, 0.0, False)
    record(log_path, "start", name)
    notify_ready()
    while True:
        signal.pause()


@notifies_ready
def slow_ready(log_path: str, name: str, delay: float) -> None:
    """Report ready only after ``delay`` seconds."""
    record(log_path, "booting", name)
    time.sleep(delay)
    notify_ready()
    record(log_path, "start", name)
    while True:
        signal.pause()


def reporter(log_path: str, name: str, variables: list[str]) -> None:
    """Record the working directory and the named environment variables, then idle."""
    seen = {v: os.environ.get(v) for v in variables}
    record(log_path, "start", name, cwd=os.getcwd(), env=seen)
    while True:
        signal.pause()


if __name__ == "__main__":
    # ``python -m sup_toys '<spec as JSON>'``: a root supervisor process.
    from llamad.supervisor import SupervisorSpec, run_root

    run_root(SupervisorSpec.from_wire(json.loads(sys.argv[1])))
