"""``llamad install-unit``: the systemd unit that runs this installation as a service.

::

    llamad install-unit [--config FILE] [--user NAME | --dynamic-user]
                        [--model-dir DIR ...] [--dir DIR | --stdout] [--force]

writes ``llamad.service`` (to ``/etc/systemd/system`` by default) with
``ExecStart`` naming this interpreter (``<python> -m llamad.daemon``) and
prints what to run next. The unit itself is :mod:`llamad.daemon.unit`
(``render_unit`` of a ``UnitPlan``, the same function that renders
``packaging/systemd/llamad.service``); this module makes the plan for this
machine and writes it.

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
import os
import posixpath
import pwd
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from llamad.cli.errors import EXIT_CONFIG, EXIT_ERROR, EXIT_OK
from llamad.daemon.unit import (
    CACHE_DIR,
    RUNTIME_DIR,
    SERVICE_USER,
    STATE_DIR,
    UNIT_NAME,
    UnitPlan,
    render_unit,
    service_env,
    stop_timeout_s,
)

if TYPE_CHECKING:
    from llamad.config import LlamadConfig

__all__ = ["Refused", "add_commands", "install", "local_plan"]


_HIDDEN: Final = ("/home", "/root", "/run/user")  # ProtectHome
_PRIVATE: Final = ("/tmp", "/var/tmp")  # PrivateTmp
_WRITABLE: Final = (RUNTIME_DIR, STATE_DIR, CACHE_DIR, "/dev/shm")


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


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
    from llamad import paths  # noqa: PLC0415
    from llamad.config import load_config  # noqa: PLC0415
    from llamad.config.security import is_loopback  # noqa: PLC0415

    if not posixpath.isabs(python):
        raise Refused(f"the interpreter's path {python!r} is not absolute")
    cache_dir = str(paths.cache_root())
    config = load_config(config_path, env=service_env(cache_dir))
    problems = _writable_problems(config)
    if problems:
        raise Refused("\n".join(problems))
    lib_dir, backend = _native()
    # What the interpreter, its packages and llamad's libraries are read from.
    needed = [sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[2])]
    needed += [cache_dir] if cache_dir != CACHE_DIR else []
    needed += [lib_dir] if lib_dir else []
    needed += [config_path] if config_path else []
    dirs = [str(d) for d in config.model_dirs] + list(model_dirs)
    read_only, bind = _exposure(needed, dirs)
    ipc, http = config.endpoint.startswith("ipc://"), config.http
    exec_start = [python, "-m", "llamad.daemon"]
    if config_path is not None:
        exec_start += ["--config", os.path.realpath(config_path)]
    return UnitPlan(
        exec_start=tuple(exec_start),
        user=user,
        cache_dir=cache_dir,
        stop_timeout_s=stop_timeout_s(config),
        private_network=ipc and not http.enabled,
        loopback_only=(ipc or is_loopback(config.tcp_host or ""))
        and (not http.enabled or is_loopback(http.host)),
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
