"""The systemd unit that runs llamad as a service: what differs between one
unit and another (:class:`UnitPlan`) and the file itself (:func:`render_unit`).

``packaging/systemd/llamad.service`` is :func:`render_unit` of
:func:`shipped_plan` (a test keeps them equal); ``llamad install-unit``
(:mod:`llamad.cli.install`) renders a plan for this machine.
``docs/internals/operations.md`` says why each line is there.
"""

from __future__ import annotations

import math
import posixpath
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from llamad.config import LlamadConfig

__all__ = [
    "CACHE_DIR",
    "RUNTIME_DIR",
    "SERVICE_USER",
    "SHIPPED_CONFIG",
    "SHIPPED_EXEC",
    "STATE_DIR",
    "UNIT_NAME",
    "WATCHDOG_S",
    "UnitPlan",
    "render_unit",
    "service_env",
    "shipped_plan",
    "stop_timeout_s",
]

UNIT_NAME: Final = "llamad.service"
SERVICE_USER: Final = "llamad"
RUNTIME_DIR: Final = "/run/llamad"
STATE_DIR: Final = "/var/lib/llamad"
CACHE_DIR: Final = "/var/cache/llamad"
SHIPPED_EXEC: Final = ("/opt/llamad/.venv/bin/llamad", "daemon")
SHIPPED_CONFIG: Final = "/etc/llamad/llamad.toml"

WATCHDOG_S: Final = 60
"""Twice ``SUPERVISOR_LIVENESS_S`` (30 s), the longest liveness window of the
root's children. The root withholds its ping once a child is silent for half
its window (15 s) and kills it at the whole window (30 s); systemd acts no
sooner than ``WatchdogSec/2`` after a child fell silent past half of it, which
leaves the root 15 s to kill and restart that child before systemd restarts
everything. Shorter and systemd would race the root's own remedy."""

START_TIMEOUT_S: Final = 180
"""The root's three children each have 60 s to start (``DEFAULT_START_TIMEOUT``);
model loads after that extend the start themselves (``EXTEND_TIMEOUT_USEC``)."""

STOP_MARGIN_S: Final = 30
"""Beyond the shutdown chain: the root's own exit, a loaded machine."""


def service_env(cache_dir: str) -> dict[str, str]:
    """The environment the unit gives the daemon (``Environment=`` and what
    systemd sets itself), as :func:`llamad.config.load_config` reads it."""
    return {
        "LLAMAD_RUNTIME_DIR": RUNTIME_DIR,
        "LLAMAD_CACHE_DIR": cache_dir,
        "STATE_DIRECTORY": STATE_DIR,
        "HOME": STATE_DIR,
    }


def stop_timeout_s(config: LlamadConfig) -> int:
    """``TimeoutStopSec`` for ``config``: the root stops its children one after
    another (the front, then every worker's shutdown saves at once, then
    cache-meta; the HTTP gateway first when it runs), each bounded by its
    shutdown policy, plus :data:`STOP_MARGIN_S`."""
    from llamad.cache.sup import meta_child_spec  # noqa: PLC0415 (loads the cache)
    from llamad.daemon.tree import (  # noqa: PLC0415
        FRONT_SHUTDOWN_S,
        GATEWAY_SHUTDOWN_S,
        template_limits,
    )

    chain = [FRONT_SHUTDOWN_S, template_limits(config).shutdown_s]
    if config.http.enabled:
        chain.append(GATEWAY_SHUTDOWN_S)
    meta = meta_child_spec(config.cache_settings()).shutdown_policy
    chain.append(meta if isinstance(meta, float | int) else 0.0)
    return math.ceil(sum(chain) + STOP_MARGIN_S)


@dataclass(frozen=True)
class UnitPlan:
    """Everything that differs between one unit and another."""

    exec_start: tuple[str, ...]
    user: str | None
    """``User=``; ``None``: ``DynamicUser=yes``."""
    cache_dir: str
    """``LLAMAD_CACHE_DIR``: the native builds and the default model."""
    stop_timeout_s: int
    private_network: bool = True
    """False for a tcp endpoint or the HTTP gateway: clients must reach them."""
    loopback_only: bool = False
    """Without a private network: IP traffic to and from loopback only (a tcp
    endpoint and the HTTP gateway on loopback addresses)."""
    gpu: bool = False
    read_only: tuple[str, ...] = ()
    bind_read_only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.exec_start or not posixpath.isabs(self.exec_start[0]):
            raise ValueError(f"exec_start: {self.exec_start!r} must start with an absolute path")
        if self.stop_timeout_s < 1:
            raise ValueError(f"stop_timeout_s: {self.stop_timeout_s} must be >= 1")
        for name in ("read_only", "bind_read_only"):
            for path in getattr(self, name):
                if not posixpath.isabs(path) or any(c.isspace() for c in path):
                    raise ValueError(f"{name}: {path!r} must be absolute, without spaces")


def shipped_plan() -> UnitPlan:
    """The plan of ``packaging/systemd/llamad.service``: a virtual environment in
    ``/opt/llamad/.venv``, ``/etc/llamad/llamad.toml``, native builds in
    ``/var/cache/llamad``, the default timings."""
    from llamad.config import load_config  # noqa: PLC0415

    # As packaging/systemd/llamad.toml: the HTTP gateway off, so the unit keeps
    # its private network (`llamad install-unit --config` with [http] on
    # trades it for loopback-only IP).
    env = {
        **service_env(CACHE_DIR),
        "LLAMAD_DAEMON__SERVE_DEFAULT_MODEL": "false",
        "LLAMAD_HTTP__ENABLED": "false",
    }
    return UnitPlan(
        exec_start=(*SHIPPED_EXEC, "--config", SHIPPED_CONFIG),
        user=SERVICE_USER,
        cache_dir=CACHE_DIR,
        stop_timeout_s=stop_timeout_s(load_config(None, env=env)),
    )


def render_unit(plan: UnitPlan) -> str:
    """The unit file of ``plan`` (docs/internals/operations.md explains each line)."""
    home = "tmpfs" if plan.bind_read_only else "yes"
    lines = [
        "# llamad as a systemd service: `llamad install-unit` writes this file;",
        "# docs/internals/operations.md says why every line is here.",
        "[Unit]",
        "Description=llamad: llama.cpp models behind a token-exact KV cache",
        "After=network.target",
        "# The root restarts its own children; systemd restarts the root, at most",
        "# 5 times in 5 minutes.",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "# READY once every configured model has loaded or failed; only the root reports.",
        "Type=notify",
        "NotifyAccess=main",
        "ExecStart=" + shlex.join(plan.exec_start),
    ]
    if plan.user is None:
        lines += ["DynamicUser=yes"]
    else:
        lines += [f"User={plan.user}"]
        if plan.user == SERVICE_USER:
            lines += [f"Group={SERVICE_USER}"]
        lines += [
            "# ram_file rows in /dev/shm/llamad-<uid> outlive a restart: keep them.",
            "RemoveIPC=no",
        ]
    lines += [
        f"Environment=LLAMAD_RUNTIME_DIR={RUNTIME_DIR}",
        f"Environment=LLAMAD_CACHE_DIR={plan.cache_dir}",
        "SyslogIdentifier=llamad",
        "",
        "# Pinged every 30 s while the root's loop runs and every child heartbeats.",
        f"WatchdogSec={WATCHDOG_S}s",
        "# Model loads extend the start (EXTEND_TIMEOUT_USEC) beyond this.",
        f"TimeoutStartSec={START_TIMEOUT_S}s",
        "# Above the shutdown chain: front, workers' shutdown saves, cache-meta.",
        f"TimeoutStopSec={plan.stop_timeout_s}s",
        "# SIGTERM to the root only: it stops its children in order.",
        "KillMode=mixed",
        "Restart=on-failure",
        "RestartSec=5s",
        "# 78: a configuration refused at start; retrying cannot help.",
        "RestartPreventExitStatus=78",
        "LimitNOFILE=65536",
        "",
        "RuntimeDirectory=llamad",
        "RuntimeDirectoryMode=0700",
        "StateDirectory=llamad",
        "StateDirectoryMode=0700",
    ]
    if plan.cache_dir == CACHE_DIR:
        lines += [
            "CacheDirectory=llamad",
            "CacheDirectoryMode=0700",
            "# The native libraries and the default model: the service never writes them.",
            f"ReadOnlyPaths=-{CACHE_DIR}/llama.cpp -{CACHE_DIR}/models",
        ]
    if plan.read_only:
        lines += ["ReadOnlyPaths=" + " ".join(plan.read_only)]
    if plan.bind_read_only:
        lines += [
            "# In a home directory: bound read-only into an empty /home, /root.",
            "BindReadOnlyPaths=" + " ".join(plan.bind_read_only),
        ]
    lines += [
        "UMask=0077",
        "",
        "ProtectSystem=strict",
        f"ProtectHome={home}",
        "PrivateTmp=yes",
    ]
    if plan.gpu:
        lines += ["# A GPU build needs its devices.", "PrivateDevices=no"]
    else:
        lines += ["# /dev/shm (the ram and ram_file tiers) stays the host's.", "PrivateDevices=yes"]
    lines += [
        "PrivateIPC=yes",
        "PrivateUsers=yes",
        "PrivateMounts=yes",
    ]
    if plan.private_network:
        lines += [
            "# An ipc endpoint needs no network; a tcp one or the HTTP gateway turns these off.",
            "PrivateNetwork=yes",
            "IPAddressDeny=any",
        ]
    elif plan.loopback_only:
        lines += [
            "# Served on loopback only (tcp endpoint, HTTP gateway): the host's network,",
            "# loopback traffic alone.",
            "IPAddressDeny=any",
            "IPAddressAllow=localhost",
        ]
    lines += [
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "NoNewPrivileges=yes",
        "RestrictSUIDSGID=yes",
        "RestrictRealtime=yes",
        "RestrictNamespaces=yes",
        "LockPersonality=yes",
    ]
    if not plan.gpu:
        lines += [
            "# llama.cpp (CPU), cffi's compiled callbacks and Python run without W+X",
            "# memory: tests/integration/systemd/test_mdwe_llama.py.",
            "MemoryDenyWriteExecute=yes",
        ]
    lines += [
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallArchitectures=native",
        "# Every call the daemon makes: tests/integration/systemd/test_unit_syscalls.py.",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"
