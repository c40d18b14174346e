"""The gateway's start rules: a non-loopback bind needs API keys (exit 78 naming
``http.keys``), a port another program holds refuses the start (exit 75 naming
``http.port``), and a previous run's address file is removed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from llamad.actors import Registry
from llamad.config.dirs import default_ram_file_root
from llamad.daemon.main import EXIT_CONFIG, EXIT_IN_USE
from llamad.errors import ModelNotFound
from llamad.paths import HTTP_ADDRESS_FILE, http_address
from llamad.testing import EVENTUALLY, Launcher, daemon_command, scrubbed_env, wait_until
from wakeups import voluntary_switches

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


def _run(
    tmp_path: Path, toml: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "llamad.toml"
    instance = f"g{tmp_path.name[-12:].replace('_', '')}"
    config.write_text(
        f"""
[daemon]
runtime_dir = "{tmp_path / "run"}"
state_dir = "{tmp_path / "state"}"
log_format = "json"
[cache]
instance = "{instance}"
{toml}
"""
    )
    try:
        return subprocess.run(
            daemon_command(config),
            capture_output=True,
            text=True,
            timeout=100,
            env=scrubbed_env(env),
            check=False,
        )
    finally:
        # A start refused after the claim leaves the instance's ram_file
        # directory (on /dev/shm, outside tmp_path), as any stop does: a
        # daemon's ram_file rows outlive it by design. This instance is the test's.
        shutil.rmtree(default_ram_file_root(instance), ignore_errors=True)


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


def test_an_idle_daemon_leaves_the_cores_alone() -> None:
    """An idle daemon's gateway, cache-meta and front wake a few times a
    second at most (voluntary context switches of all their threads): each
    wakeup takes a core from a decode beside them (ggml's threads wait for
    each other), and an idle service should cost nothing. Before: the
    gateway woke 10 times a second (uvicorn's tick), cache-meta
    20 (a floor on its housekeeping), the front 14 (its
    supervisor watch's crash-check ticks). Counted over 3 s, once every
    child has served (heartbeats, the front's keep-alive look and its
    watch's re-subscription each second remain)."""
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
port = 0
"""
        )
        d.start()
        with pytest.raises(ModelNotFound):  # the front serves
            d.route("none", timeout=EVENTUALLY)
        address = wait_until(lambda: http_address(d.runtime), "the gateway serving")
        registry = Registry(d.registry_root)
        pids = {"gateway": address["pid"]}
        for role, name in (("cache-meta", "cache-meta"), ("front", "llamad.front")):
            entry = registry.lookup(name)
            assert entry is not None, name
            pids[role] = entry.pid
        time.sleep(1.0)
        before = {role: voluntary_switches(pid) for role, pid in pids.items()}
        time.sleep(3.0)
        per_s = {role: (voluntary_switches(pid) - before[role]) / 3.0 for role, pid in pids.items()}
        assert d.stop() == 0
    finally:
        d.close()
    assert per_s["gateway"] <= 4, per_s
    assert per_s["cache-meta"] <= 4, per_s
    assert per_s["front"] <= 10, per_s
