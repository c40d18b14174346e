"""llama.cpp's own log output is routed into structlog, quiet by default (SPEC L11)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

CHILD = """
import json, sys
import structlog
structlog.configure(
    processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
    logger_factory=structlog.PrintLoggerFactory(sys.stdout),
)
from llamad.llama_ffi import Model, ModelOptions
with Model(sys.argv[1], ModelOptions(vocab_only=True)) as m:
    m.tokenize("hello")
"""


def _llama_events(model_path: Path, level: str | None) -> list[dict[str, str]]:
    env = dict(os.environ)
    env.pop("LLAMAD_LLAMA_LOG", None)
    if level is not None:
        env["LLAMAD_LLAMA_LOG"] = level
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(model_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "llama.log":
                events.append(event)
    # Nothing from llama.cpp may bypass the callback and hit stderr directly.
    assert "llama_model_loader" not in proc.stderr
    return events


def test_default_drops_debug_and_info_messages(model_path: Path) -> None:
    events = _llama_events(model_path, None)
    assert all(e["level"] in ("warning", "error") for e in events)


def test_info_level_routes_llama_messages_into_structlog(model_path: Path) -> None:
    events = _llama_events(model_path, "info")
    infos = [e for e in events if e["level"] == "info"]
    assert infos, "llama.cpp info messages did not reach structlog"
    assert any("llama_model_loader" in e["message"] for e in infos)
    assert not any(e["level"] == "debug" for e in events)


def test_off_silences_everything(model_path: Path) -> None:
    assert _llama_events(model_path, "off") == []
