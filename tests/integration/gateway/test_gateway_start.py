"""The gateway's start rules: a non-loopback bind needs API keys (exit 78 naming
``http.keys``), a port another program holds refuses the start (exit 75 naming
``http.port``), and a previous run's address file is removed."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from llamad.daemon.main import EXIT_CONFIG, EXIT_IN_USE
from llamad.errors import ModelNotFound
from llamad.paths import HTTP_ADDRESS_FILE, http_address
from llamad.testing import EVENTUALLY, Launcher, daemon_command, scrubbed_env

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


def _run(
    tmp_path: Path, toml: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "llamad.toml"
    config.write_text(
        f"""
[daemon]
runtime_dir = "{tmp_path / "run"}"
state_dir = "{tmp_path / "state"}"
log_format = "json"
[cache]
instance = "g{tmp_path.name[-12:].replace("_", "")}"
{toml}
"""
    )
    return subprocess.run(
        daemon_command(config),
        capture_output=True,
        text=True,
        timeout=100,
        env=scrubbed_env(env),
        check=False,
    )


def test_a_non_loopback_bind_without_keys_is_refused_naming_http_keys(tmp_path: Path) -> None:
    proc = _run(tmp_path, '[http]\nhost = "0.0.0.0"\n')
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert "http.keys: http.host 0.0.0.0 is not a loopback address" in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_port_another_program_holds_is_refused_naming_http_port(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = _run(tmp_path, "", env={"LLAMAD_HTTP__PORT": str(port)})
    assert proc.returncode == EXIT_IN_USE, proc.stderr
    refusals = [
        json.loads(line) for line in proc.stderr.splitlines() if "daemon.http_port_in_use" in line
    ]
    assert len(refusals) == 1, proc.stderr
    assert f"http.port: 127.0.0.1:{port} is in use by another program" in refusals[0]["error"]
    # Refused before any child started.
    assert "child.started" not in proc.stderr


def test_a_previous_runs_address_is_forgotten_at_start() -> None:
    # A SIGKILLed daemon leaves http.json behind; the next start removes it,
    # even with its gateway off (nothing would replace it then).
    d = Launcher(prefix="lgw-")
    try:
        d.write_config(
            f"""
[daemon]
runtime_dir = "{d.runtime}"
state_dir = "{d.state}"
serve_default_model = false
[cache]
instance = "{d.instance}"
[http]
enabled = false
"""
        )
        d.runtime.mkdir(mode=0o700)
        stale = d.runtime / HTTP_ADDRESS_FILE
        stale.write_text(json.dumps({"url": "http://127.0.0.1:1", "port": 1, "pid": 1}))
        d.start()
        with pytest.raises(ModelNotFound):  # the front serves: the start is done
            d.route("none", timeout=EVENTUALLY)
        assert not stale.exists()
        assert http_address(d.runtime) is None
        assert d.stop() == 0
    finally:
        d.close()
