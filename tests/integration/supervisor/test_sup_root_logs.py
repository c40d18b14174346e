"""A root supervisor process (``run_root``) logs the way the settings say."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from llamad.supervisor import SupervisorSpec, SupFlags
from sup_helpers import EventLog, toy

pytestmark = pytest.mark.timeout(120)


def test_root_supervisor_logs_json_lines_on_stderr_when_the_format_is_json(
    events: EventLog,
) -> None:
    spec = SupervisorSpec("root", SupFlags(), (toy(events, "sleeper", "a"),))
    root = subprocess.Popen(
        [sys.executable, "-m", "sup_toys", json.dumps(spec.to_wire())],
        env={**os.environ, "LLAMAD_LOG_FORMAT": "json"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        events.wait_for("start", "a")
        root.send_signal(signal.SIGTERM)
        out, err = root.communicate(timeout=60)
    finally:
        if root.poll() is None:
            root.kill()
            root.communicate()
    assert root.returncode == 0
    lines = err.decode().splitlines()
    records = [json.loads(line) for line in lines]  # every line is JSON, or this raises
    assert [r["event"] for r in records if r.get("sup") == "root"] == [
        "child.started",
        "sup.started",
        "sup.shutting_down",
        "child.stopped",
        "sup.stopped",
    ]
    assert out == b""
