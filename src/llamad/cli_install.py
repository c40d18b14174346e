"""``llamad install-unit``: the systemd unit that runs this installation as a service.

::

    llamad install-unit [--config FILE] [--user NAME | --dynamic-user]
                        [--model-dir DIR ...] [--dir DIR | --stdout] [--force]

writes ``llamad.service`` (to ``/etc/systemd/system`` by default) with
``ExecStart`` naming this interpreter (``<python> -m llamad.daemon``) and
prints what to run next. The unit is :func:`render_unit` of a
:class:`UnitPlan`; ``packaging/systemd/llamad.service`` is the same function
applied to :func:`shipped_plan` (a test keeps them equal), and
``docs/internals/operations.md`` says why each line is there.

For this machine (:func:`local_plan`) it loads the configuration as the
service will see it, refuses one the daemon would refuse or that writes
where the unit cannot (exit 78), sizes ``TimeoutStopSec`` by its shutdown
chain, binds the paths it must read from home directories read-only,
refuses paths in a private ``/tmp``, keeps the network for a tcp endpoint
and the devices for a GPU build (without ``MemoryDenyWriteExecute``, tested
on the CPU build only).
"""

from __future__ import annotations

import argparse
import math
import os
import posixpath
import pwd
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from llamad.cli_errors import EXIT_CONFIG, EXIT_ERROR, EXIT_OK

if TYPE_CHECKING:
    from llamad.config import LlamadConfig

__all__ = [
    "RUNTIME_DIR",
    "WATCHDOG_S",
    "Refused",
    "UnitPlan",
    "add_commands",
    "install",
    "local_plan",
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

_HIDDEN: Final = ("/home", "/root", "/run/user")  # ProtectHome
_PRIVATE: Final = ("/tmp", "/var/tmp")  # PrivateTmp
_WRITABLE: Final = (RUNTIME_DIR, STATE_DIR, CACHE_DIR, "/dev/shm")


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


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
    cache-meta), each bounded by its shutdown policy, plus :data:`STOP_MARGIN_S`."""
    from llamad.cache.sup import meta_child_spec  # noqa: PLC0415 (loads the cache)
    from llamad.daemon_tree import FRONT_SHUTDOWN_S, template_limits  # noqa: PLC0415

    chain = [FRONT_SHUTDOWN_S, template_limits(config).shutdown_s]
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
    """False for a tcp endpoint: clients must reach it."""
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

    env = {**service_env(CACHE_DIR), "LLAMAD_DAEMON__SERVE_DEFAULT_MODEL": "false"}
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
            "# An ipc endpoint needs no network; a tcp one turns these two off.",
            "PrivateNetwork=yes",
            "IPAddressDeny=any",
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


# -- this installation -------------------------------------------------------------------


class Refused(Exception):
    """A unit for this installation would not run (the message says why)."""


def _native() -> tuple[str | None, str]:
    """The native library folder and backend of the compiled extension, from the
    record ``build_ffi.py`` wrote beside it (read without loading libllama)."""
    import json  # noqa: PLC0415

    import llamad.llama_ffi  # noqa: PLC0415 (its names load lazily)

    for stamp in Path(llamad.llama_ffi.__file__).parent.glob("_llama*.so.build.json"):
        try:
            record = json.loads(stamp.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            lib = record.get("lib_dir")
            return (lib if isinstance(lib, str) else None), str(record.get("backend", "cpu"))
    return None, "cpu"


def _exposure(paths: Iterable[str], model_dirs: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(read_only, bind_read_only)`` for paths the service must read: a path in
    a home directory is bound (``ProtectHome`` hides the rest); a model directory
    elsewhere is made read-only explicitly; one in a private ``/tmp`` is refused."""
    models = {os.path.realpath(d) for d in model_dirs}
    wanted = sorted({os.path.realpath(p) for p in paths} | models)
    # Drop a path inside another one kept (binding a folder binds what it holds).
    kept: list[str] = []
    for path in wanted:
        if _under(path, _PRIVATE):
            raise Refused(
                f"{path} lies in a temporary directory, which the service sees empty "
                "(PrivateTmp=yes): install llamad, its models and its configuration elsewhere"
            )
        if not any(_under(path, [k]) for k in kept):
            kept.append(path)
    bind = [p for p in kept if _under(p, _HIDDEN)]
    read_only = [p for p in kept if p in models and p not in bind]
    return read_only, bind


def _writable_problems(config: LlamadConfig) -> list[str]:
    """Directories the daemon writes that the unit would leave read-only."""
    dirs = [
        ("daemon.runtime_dir", str(config.runtime_dir)),
        ("daemon.state_dir", str(config.state_dir)),
    ]
    for name, tier in (("ram_file", config.cache.ram_file), ("disk", config.cache.disk)):
        if tier.quota and tier.root is not None:
            dirs.append((f"cache.{name}.root", str(tier.root)))
    return [
        f"{key}: {path} is not writable under ProtectSystem=strict "
        f"(the unit writes only in {', '.join(_WRITABLE)})"
        for key, path in dirs
        if not _under(posixpath.normpath(path), _WRITABLE)
    ]


def local_plan(
    *,
    config_path: str | None,
    user: str | None,
    model_dirs: Sequence[str] = (),
    python: str = sys.executable,
) -> UnitPlan:
    """The plan for this machine: this interpreter, this installation's native
    builds, the configuration at ``config_path`` as the service will load it.
    Raises :class:`Refused` or :class:`~llamad.errors.ConfigError`."""
    import llamad  # noqa: PLC0415
    from llamad import paths  # noqa: PLC0415
    from llamad.config import load_config  # noqa: PLC0415

    if not posixpath.isabs(python):
        raise Refused(f"the interpreter's path {python!r} is not absolute")
    cache_dir = str(paths.cache_root())
    config = load_config(config_path, env=service_env(cache_dir))
    problems = _writable_problems(config)
    if problems:
        raise Refused("\n".join(problems))
    lib_dir, backend = _native()
    # What the interpreter, its packages and llamad's libraries are read from.
    needed = [sys.prefix, sys.base_prefix, str(Path(llamad.__file__).resolve().parents[1])]
    needed += [cache_dir] if cache_dir != CACHE_DIR else []
    needed += [lib_dir] if lib_dir else []
    needed += [config_path] if config_path else []
    dirs = [str(d) for d in config.model_dirs] + list(model_dirs)
    read_only, bind = _exposure(needed, dirs)
    exec_start = [python, "-m", "llamad.daemon"]
    if config_path is not None:
        exec_start += ["--config", os.path.realpath(config_path)]
    return UnitPlan(
        exec_start=tuple(exec_start),
        user=user,
        cache_dir=cache_dir,
        stop_timeout_s=stop_timeout_s(config),
        private_network=config.endpoint.startswith("ipc://"),
        gpu=backend != "cpu",
        read_only=tuple(read_only),
        bind_read_only=tuple(bind),
    )


def _next_steps(plan: UnitPlan, written: Path | None) -> str:
    lines = [f"wrote {written}"] if written is not None else []
    lines += ["next:"]
    if plan.user is not None:
        try:
            pwd.getpwnam(plan.user)
        except KeyError:
            lines += [
                f"  useradd --system --home-dir {STATE_DIR} --shell /usr/sbin/nologin {plan.user}"
                "   # or systemd-sysusers with packaging/systemd/llamad.sysusers.conf"
            ]
    script = Path(plan.exec_start[0]).with_name("llamad")  # the console script beside it
    client = str(script) if script.is_file() else f"{plan.exec_start[0]} -m llamad.cli"
    as_user = f"sudo -u {plan.user} " if plan.user is not None else "sudo "
    lines += [
        "  systemctl daemon-reload",
        f"  systemctl enable --now {UNIT_NAME}",
        f"  systemctl status {UNIT_NAME}        # STATUS= says what it is doing",
        "  journalctl -u llamad -f              # its json log lines",
        f"  {as_user}{client} --endpoint ipc://{RUNTIME_DIR}/llamad.sock status",
    ]
    return "\n".join(lines) + "\n"


def install(args: argparse.Namespace) -> int:
    """``llamad install-unit``: write the unit (or print it) and say what comes next."""
    from llamad.errors import ConfigError  # noqa: PLC0415

    config_path: str | None = getattr(args, "config", None)
    try:
        plan = local_plan(
            config_path=config_path,
            user=None if args.dynamic_user else args.user,
            model_dirs=[str(Path(d).expanduser()) for d in args.model_dir],
        )
    except ConfigError as exc:
        sys.stderr.write(exc.message + "\n")
        return EXIT_CONFIG
    except Refused as exc:
        sys.stderr.write(f"llamad: install-unit: {exc}\n")
        return EXIT_CONFIG
    text = render_unit(plan)
    if args.stdout:
        sys.stdout.write(text)
        sys.stderr.write(_next_steps(plan, None))
        return EXIT_OK
    target = Path(args.dir).expanduser() / UNIT_NAME
    if target.exists() and not args.force:
        sys.stderr.write(f"llamad: install-unit: {target} exists; --force replaces it\n")
        return EXIT_ERROR
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{UNIT_NAME}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o644)
        tmp.replace(target)
    except OSError as exc:
        sys.stderr.write(f"llamad: install-unit: {exc} (run it as root, or use --stdout)\n")
        return EXIT_ERROR
    sys.stdout.write(_next_steps(plan, target))
    return EXIT_OK


def add_commands(commands: Any) -> None:
    """Register ``install-unit`` on the ``llamad`` command's subparsers."""
    cmd = commands.add_parser(
        "install-unit", help="write the systemd unit that runs this installation as a service"
    )
    cmd.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="the configuration the service runs (default: none, the daemon's defaults)",
    )
    who = cmd.add_mutually_exclusive_group()
    who.add_argument(
        "--user",
        default=SERVICE_USER,
        metavar="NAME",
        help=f"the system user it runs as (default: {SERVICE_USER})",
    )
    who.add_argument(
        "--dynamic-user",
        action="store_true",
        help="DynamicUser=yes instead (the ram_file tier then does not outlive a stop)",
    )
    cmd.add_argument(
        "--model-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="another directory of models the service reads (read-only; repeatable)",
    )
    where = cmd.add_mutually_exclusive_group()
    where.add_argument(
        "--dir",
        default="/etc/systemd/system",
        help="where to write llamad.service (default: /etc/systemd/system)",
    )
    where.add_argument("--stdout", action="store_true", help="print the unit instead")
    cmd.add_argument("--force", action="store_true", help="replace an existing unit file")
    cmd.set_defaults(run=install)
