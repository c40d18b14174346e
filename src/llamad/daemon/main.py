"""``llamad daemon [--config FILE]`` (also ``python -m llamad.daemon``): the daemon's root process.

In order, before any child starts:

1. the configuration is loaded and validated as a whole
   (:func:`llamad.config.load_config`: the file, ``LLAMAD_*`` overrides, every
   model file's header); a bad one exits with :data:`EXIT_CONFIG` and every
   problem on stderr, each naming its key;
2. the runtime and state directories are created private (0700); a runtime
   directory another user owns is refused;
3. the environment every child inherits is set: ``LLAMAD_RUNTIME_DIR`` (so
   every process finds the same registry), ``LLAMAD_LOG_FORMAT`` and
   ``LLAMAD_LOG_LEVEL`` (``auto`` is json unless stderr is a terminal);
4. the daemon claims its places (:mod:`llamad.daemon.claim`): a lock on its
   runtime directory and on every tier it uses, held until it exits. Another
   daemon holding any of them: exit :data:`EXIT_IN_USE`, one log line naming
   each place held and its holder, and nothing there read, written or
   deleted;
5. the HTTP gateway's port is checked free (:mod:`llamad.daemon.http_port`):
   held by another program, exit :data:`EXIT_IN_USE` naming ``http.port``;
   with ``port = 0`` the free port found is the gateway's;
6. the ``ram`` tier's segments of a previous run, the front's table file and
   the gateway's address file are removed (they describe one run).

Then the root supervisor (:func:`llamad.daemon.tree.daemon_spec`) runs in the
main thread: ``cache_sup``, ``model_sup``, ``front``, ``gateway`` in that order; the front
loads the configured models. The root serves its own ``which_children`` as
actor ``llamad.root`` (for ``status``). SIGTERM or SIGINT stops the tree in
reverse order (the front, then every worker's shutdown saves, then
cache-meta) and exits 0; an escalation exits non-zero for systemd to act.
Every child dies with the root (``PR_SET_PDEATHSIG``), SIGKILL included.

Under systemd (``Type=notify``: ``$NOTIFY_SOCKET``, taken out of the
environment before any child starts) the root reports its start, its
readiness once the configured models have loaded, its status and its stop,
and pings the watchdog from its supervisor loop
(:mod:`llamad.daemon.readiness`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import structlog

from llamad import logs
from llamad._heap import release_free_heap
from llamad.actors import Registry
from llamad.cache.errors import TierLocked
from llamad.cache.ram_purge import purge_ram
from llamad.config import LlamadConfig, load_config
from llamad.daemon.claim import DaemonClaim, daemon_places
from llamad.daemon.http_port import check_http_port
from llamad.daemon.notify import Notifier
from llamad.daemon.readiness import SystemdReporter, Watchdog
from llamad.daemon.tree import ROOT_SERVICE, daemon_spec
from llamad.errors import ConfigError, DaemonInUse
from llamad.front.persist import table_path
from llamad.paths import HTTP_ADDRESS_FILE
from llamad.supervisor.service import SupervisorService
from llamad.supervisor.supervisor_proc import Supervisor

__all__ = ["EXIT_CONFIG", "EXIT_IN_USE", "main", "make_private", "prepare_dirs"]

log = structlog.get_logger("llamad.daemon")

EXIT_CONFIG: Final = 78
"""A configuration refused before anything started (sysexits' ``EX_CONFIG``:
``RestartPreventExitStatus=78`` keeps systemd from retrying it)."""
EXIT_IN_USE: Final = 75
"""Another daemon holds the runtime directory or a tier this one would use
(sysexits' ``EX_TEMPFAIL``: it may start once the other has stopped)."""


def _dirs(config: LlamadConfig) -> tuple[tuple[Path, str], ...]:
    return (
        (config.runtime_dir, "daemon.runtime_dir"),
        (config.state_dir, "daemon.state_dir"),
    )


def prepare_dirs(config: LlamadConfig) -> None:
    """Create the runtime and state directories (0700) and refuse one another
    user owns. A directory that exists keeps its mode here: :func:`make_private`
    fixes it once the daemon holds its places (it may be another daemon's)."""
    for path, name in _dirs(config):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
        if st.st_uid != os.getuid():
            raise ConfigError(
                f"{name}: {path} belongs to another user (uid {st.st_uid})",
                details={"field": name},
            )


def make_private(config: LlamadConfig) -> None:
    """Make the runtime and state directories private to this user (0700)."""
    for path, _ in _dirs(config):
        if stat.S_IMODE(path.stat().st_mode) != 0o700:
            path.chmod(0o700)


def _log_setting(name: str, configured: str) -> str:
    # LLAMAD_LOG_FORMAT / LLAMAD_LOG_LEVEL win, as in every llamad process.
    value = os.environ.get(name) or configured
    if name == "LLAMAD_LOG_FORMAT" and value == "auto":
        value = "console" if sys.stderr.isatty() else "json"
    os.environ[name] = value
    return value


def _forget_run(config: LlamadConfig) -> None:
    # The front's table and the gateway's address describe one run (a
    # SIGKILLed daemon leaves them behind).
    for path in (table_path(config.runtime_dir), config.runtime_dir / HTTP_ADDRESS_FILE):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon until it is stopped; its exit status."""
    parser = argparse.ArgumentParser(prog="llamad daemon", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--config", metavar="FILE", help="TOML configuration (default: $LLAMAD_CONFIG, else none)"
    )
    args = parser.parse_args(argv)
    # First: no child may inherit systemd's socket and report as the service.
    notifier = Notifier.from_environ()
    try:
        return _run(args.config, notifier)
    finally:
        notifier.close()


def _run(config_path: str | None, notifier: Notifier) -> int:
    try:
        config = load_config(config_path)
        prepare_dirs(config)
    except ConfigError as exc:
        sys.stderr.write(exc.message + "\n")
        notifier.status("Configuration refused: " + exc.message.splitlines()[0])
        return EXIT_CONFIG
    os.environ["LLAMAD_RUNTIME_DIR"] = str(config.runtime_dir)
    fmt = _log_setting("LLAMAD_LOG_FORMAT", config.daemon.log_format)
    level = _log_setting("LLAMAD_LOG_LEVEL", config.daemon.log_level)
    logs.configure(level, fmt)
    # First of all, before a file of a previous run (or of another daemon)
    # is read, written, truncated or deleted.
    try:
        claim = DaemonClaim.take(daemon_places(config))
    except DaemonInUse as exc:
        log.error("daemon.in_use", error=exc.message, held=exc.details.get("held"))
        notifier.status("Refused: " + exc.message)
        return EXIT_IN_USE
    except ConfigError as exc:
        sys.stderr.write(exc.message + "\n")
        notifier.status("Configuration refused: " + exc.message)
        return EXIT_CONFIG
    with claim:
        make_private(config)
        try:
            http_port = check_http_port(config)
        except DaemonInUse as exc:
            log.error("daemon.http_port_in_use", error=exc.message, field="http.port")
            notifier.status("Refused: " + exc.message)
            return EXIT_IN_USE
        except ConfigError as exc:
            sys.stderr.write(exc.message + "\n")
            notifier.status("Configuration refused: " + exc.message)
            return EXIT_CONFIG
        return _serve(config, notifier, http_port)


def _serve(config: LlamadConfig, notifier: Notifier, http_port: int | None) -> int:
    settings = config.cache_settings()
    try:
        purge_ram(settings)
    except TierLocked as exc:
        # This daemon holds the tiers' places, so the owner is a cache-meta
        # of no daemon (run on its own), or one outliving a killed daemon
        # for the moment its parent-death signal takes.
        log.error("daemon.cache_in_use", error=exc.message)
        notifier.status("Refused: " + exc.message)
        return EXIT_IN_USE
    _forget_run(config)
    started_at = time.time()
    watchdog = None if notifier.watchdog_s is None else Watchdog(notifier, notifier.watchdog_s)
    spec = daemon_spec(config, started_at=started_at, http_port=http_port)
    supervisor = Supervisor(spec, own_beat=watchdog)
    service: SupervisorService | None = None
    reporter: SystemdReporter | None = None
    if notifier.enabled:
        reporter = SystemdReporter(
            notifier,
            supervisor.events,
            configured=sorted(config.models),
            runtime_dir=config.runtime_dir,
            registry_root=config.registry_root,
        )
        reporter.start()

    def on_ready() -> None:
        nonlocal service
        service = SupervisorService(
            supervisor, ROOT_SERVICE, registry=Registry(config.registry_root)
        )
        service.start()
        log.info(
            "daemon.started",
            endpoint=config.endpoint,
            models=sorted(config.models),
            config=config.source,
            pid=os.getpid(),
        )
        # The tree is up: what loading the config and starting it freed goes
        # back to the system instead of staying resident (SPEC P9).
        release_free_heap()

    log.info("daemon.starting", config=config.source, runtime_dir=str(config.runtime_dir))
    try:
        code = supervisor.run(install_signal_handlers=True, on_ready=on_ready)
    finally:
        if service is not None:
            service.stop()
        if reporter is not None:
            reporter.stop()
        with contextlib.suppress(TierLocked):
            purge_ram(settings)
        _forget_run(config)
    log.info("daemon.stopped", exit_code=code, uptime_s=round(time.time() - started_at, 3))
    return code
