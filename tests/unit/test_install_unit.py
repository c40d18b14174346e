"""``llamad install-unit`` and the unit it renders (``llamad.cli.install``, ``llamad.daemon.unit``).

The unit is checked here line by line; ``systemd-analyze verify`` and
``security`` run on it in ``tests/integration/systemd/test_unit_file.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cli.errors import EXIT_CONFIG, EXIT_ERROR, EXIT_OK
from llamad.cli.install import Refused, _exposure
from llamad.cli.main import main
from llamad.daemon.readiness import LATE_FRACTION
from llamad.daemon.tree import SUPERVISOR_LIVENESS_S
from llamad.daemon.unit import WATCHDOG_S, UnitPlan, render_unit, shipped_plan

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "packaging" / "systemd" / "llamad.service"
NO_MODEL = "[daemon]\nserve_default_model = false\n"


def directives(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, in order, comments left out."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def plan(**changes: object) -> UnitPlan:
    values: dict[str, object] = {
        "exec_start": ("/usr/bin/python3", "-m", "llamad.daemon"),
        "user": "llamad",
        "cache_dir": "/var/cache/llamad",
        "stop_timeout_s": 90,
        **changes,
    }
    return UnitPlan(**values)  # type: ignore[arg-type]


@pytest.fixture
def visible_dir() -> Iterator[Path]:
    """A directory the service would see: not in a home, not in /tmp (PrivateTmp)."""
    path = Path(tempfile.mkdtemp(prefix="llamad-install-unit-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_shipped_unit_is_what_install_unit_renders_for_the_shipped_layout() -> None:
    # One source for both: regenerate with
    # python -c "from llamad.daemon.unit import *; print(render_unit(shipped_plan()), end='')"
    assert SHIPPED.read_text() == render_unit(shipped_plan())


def test_the_shipped_unit_has_the_service_contract() -> None:
    d = directives(SHIPPED.read_text())
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["KillMode"] == ["mixed"] and d["Restart"] == ["on-failure"]
    assert d["RestartPreventExitStatus"] == ["78"]
    assert d["WatchdogSec"] == [f"{WATCHDOG_S}s"]
    assert d["TimeoutStopSec"] == ["90s"]  # 10 front + 40 workers + 10 cache-meta + 30
    assert d["ExecStart"] == [
        "/opt/llamad/.venv/bin/llamad daemon --config /etc/llamad/llamad.toml"
    ]
    assert d["User"] == ["llamad"] and d["RemoveIPC"] == ["no"]
    assert "DynamicUser" not in d
    assert d["RuntimeDirectory"] == ["llamad"] and d["RuntimeDirectoryMode"] == ["0700"]
    assert d["StateDirectory"] == ["llamad"] and d["CacheDirectory"] == ["llamad"]
    assert "LLAMAD_RUNTIME_DIR=/run/llamad" in d["Environment"]
    assert "LLAMAD_CACHE_DIR=/var/cache/llamad" in d["Environment"]
    for key, value in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "NoNewPrivileges": "yes",
        "MemoryDenyWriteExecute": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "CapabilityBoundingSet": "",
        "PrivateNetwork": "yes",
    }.items():
        assert d[key] == [value], key
    assert d["SystemCallFilter"] == ["@system-service", "~@privileged"]


def test_the_watchdog_leaves_the_root_time_to_restart_a_silent_child() -> None:
    # systemd fires no sooner than WatchdogSec/2 after a child went silent past
    # LATE_FRACTION of its window; the root kills it at the whole window.
    slack = WATCHDOG_S / 2 - SUPERVISOR_LIVENESS_S * (1 - LATE_FRACTION)
    assert slack >= 10.0


def test_a_static_user_keeps_ipc_and_a_dynamic_user_is_dynamic() -> None:
    static = directives(render_unit(plan(user="alice")))
    assert static["User"] == ["alice"] and static["RemoveIPC"] == ["no"]
    assert "Group" not in static and "DynamicUser" not in static
    dynamic = directives(render_unit(plan(user=None)))
    assert dynamic["DynamicUser"] == ["yes"]
    assert "User" not in dynamic and "RemoveIPC" not in dynamic


def test_a_tcp_endpoint_keeps_the_network_and_a_gpu_build_its_devices() -> None:
    tcp = directives(render_unit(plan(private_network=False)))
    assert "PrivateNetwork" not in tcp and "IPAddressDeny" not in tcp
    loopback = directives(render_unit(plan(private_network=False, loopback_only=True)))
    assert "PrivateNetwork" not in loopback
    assert loopback["IPAddressDeny"] == ["any"] and loopback["IPAddressAllow"] == ["localhost"]
    gpu = directives(render_unit(plan(gpu=True)))
    assert gpu["PrivateDevices"] == ["no"] and "MemoryDenyWriteExecute" not in gpu


def test_paths_in_a_home_are_bound_and_a_private_tmp_is_refused() -> None:
    read_only, bind = _exposure(
        ["/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7/lib", "/usr/lib"],
        ["/home/ann/models", "/srv/models"],
    )
    assert bind == ["/home/ann/models", "/root/.pyenv/versions/3.11.7"]
    assert read_only == ["/srv/models"]  # /usr/lib is read-only already
    d = directives(render_unit(plan(bind_read_only=tuple(bind), read_only=tuple(read_only))))
    assert d["ProtectHome"] == ["tmpfs"]
    assert d["BindReadOnlyPaths"] == ["/home/ann/models /root/.pyenv/versions/3.11.7"]
    assert "/srv/models" in d["ReadOnlyPaths"]
    with pytest.raises(Refused, match="PrivateTmp"):
        _exposure([], ["/tmp/models"])


def test_install_unit_writes_this_interpreter_and_its_config(
    tmp_path: Path,
    visible_dir: Path,
    capsys: pytest.CaptureFixture[str],
    installation_seen_by_the_service: None,
) -> None:
    config = visible_dir / "llamad.toml"
    config.write_text(NO_MODEL)
    args = ["install-unit", "--dir", str(tmp_path), "--config", str(config)]
    args += ["--model-dir", str(visible_dir)]
    assert main(args) == EXIT_OK
    unit = tmp_path / "llamad.service"
    d = directives(unit.read_text())
    assert d["ExecStart"] == [f"{sys.executable} -m llamad.daemon --config {config}"]
    assert d["User"] == ["llamad"]
    assert str(visible_dir) in d["ReadOnlyPaths"][-1].split()
    assert unit.stat().st_mode & 0o777 == 0o644
    out = capsys.readouterr().out
    assert f"wrote {unit}" in out
    assert "systemctl daemon-reload" in out and "systemctl enable --now llamad.service" in out


def test_install_unit_never_replaces_a_unit_without_force(
    tmp_path: Path,
    visible_dir: Path,
    capsys: pytest.CaptureFixture[str],
    installation_seen_by_the_service: None,
) -> None:
    unit = tmp_path / "llamad.service"
    unit.write_text("# an operator's own unit\n")
    config = visible_dir / "llamad.toml"
    config.write_text(NO_MODEL)
    args = ["install-unit", "--dir", str(tmp_path), "--config", str(config)]
    assert main(args) == EXIT_ERROR
    assert "exists; --force" in capsys.readouterr().err
    assert unit.read_text() == "# an operator's own unit\n"
    assert main([*args, "--force", "--dynamic-user"]) == EXIT_OK
    assert directives(unit.read_text())["DynamicUser"] == ["yes"]


def test_install_unit_prints_the_unit_with_stdout(
    visible_dir: Path, capsys: pytest.CaptureFixture[str], installation_seen_by_the_service: None
) -> None:
    config = visible_dir / "llamad.toml"
    config.write_text(NO_MODEL + 'endpoint = "tcp://127.0.0.1:7771"\n')
    assert main(["install-unit", "--stdout", "--config", str(config), "--user", "bob"]) == EXIT_OK
    out, err = capsys.readouterr()
    d = directives(out)
    assert d["Type"] == ["notify"] and d["User"] == ["bob"]
    assert "PrivateNetwork" not in d  # clients reach a tcp endpoint
    # ... on loopback, as the HTTP gateway (on by default): loopback traffic only.
    assert d["IPAddressDeny"] == ["any"] and d["IPAddressAllow"] == ["localhost"]
    assert "systemctl enable --now llamad.service" in err


def test_install_unit_refuses_a_config_that_writes_where_the_unit_cannot(
    visible_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = visible_dir / "llamad.toml"
    config.write_text(NO_MODEL + 'state_dir = "/srv/llamad"\n')
    assert main(["install-unit", "--stdout", "--config", str(config)]) == EXIT_CONFIG
    out, err = capsys.readouterr()
    assert out == ""
    assert "daemon.state_dir: /srv/llamad is not writable under ProtectSystem=strict" in err


def test_install_unit_refuses_a_config_in_a_private_tmp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "llamad.toml"
    config.write_text(NO_MODEL)
    assert main(["install-unit", "--stdout", "--config", str(config)]) == EXIT_CONFIG
    assert "PrivateTmp=yes" in capsys.readouterr().err


def test_install_unit_refuses_a_config_the_daemon_would_refuse(
    visible_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = visible_dir / "llamad.toml"
    config.write_text(NO_MODEL + "log_fromat = 'json'\n")
    assert main(["install-unit", "--stdout", "--config", str(config)]) == EXIT_CONFIG
    assert "daemon.log_fromat: unknown key" in capsys.readouterr().err
