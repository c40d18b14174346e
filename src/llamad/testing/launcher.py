"""One real daemon (``python -m llamad.daemon``) for a test, a bench or ``make run``.

A :class:`Launcher` owns what every driver of a real daemon needs and used to
write for itself:

- **a private directory**: a fresh 0700 directory directly under ``/tmp``
  (short, because an ipc socket's path must fit in 107 bytes) holding the
  runtime directory (the endpoint, the actor registry), the state directory
  (the disk tier), the config file if there is one, and the daemon's log;
- **a cache instance of its own**, so its ``ram`` segments
  (``/dev/shm/llamad-ram.<instance>.*``) and its default ``ram_file``
  directory (:func:`llamad.config.dirs.default_ram_file_root`) are nobody
  else's;
- **the environment**: the caller's ``LLAMAD_*`` settings are not passed on
  (a daemon under test must never reach nor disturb a user's), but for
  where the default model lives (:data:`KEPT`); :func:`scrubbed_env`;
- **the start**: ``python -m llamad.daemon --config FILE`` when the caller
  wrote a config (:meth:`Launcher.write_config`), else with **no config
  file** and its places given through the environment
  (``LLAMAD_RUNTIME_DIR``, ``STATE_DIRECTORY``, ``LLAMAD_CACHE__INSTANCE``),
  as ``make run`` and a service manager start it;
- **readiness**: until the front routes the given models
  (:meth:`Launcher.wait_routed`), failing at once, with the log's tail, if
  the daemon exits;
- **the stop**: SIGTERM, wait, then every process of its tree gone
  (:meth:`Launcher.terminate`, :meth:`Launcher.stop`), or SIGKILL
  (:meth:`Launcher.kill`);
- **what it leaves**: the directory, the ``ram`` segments and the default
  ``ram_file`` directory (:meth:`Launcher.leftovers`, :meth:`Launcher.remove`).

Each driver keeps what is its own: its config text, its clients, what it
measures. The failures here are the driver's, not the daemon's: they are not
:class:`~llamad.errors.LlamadError` (those travel between processes, with a
wire code a client may have to import); errors the daemon itself sends
(``ModelFailed``, ``ModelNotFound``) reach the caller as they were raised.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

import psutil

from llamad.actors import Client as ActorClient
from llamad.config.dirs import default_endpoint, default_ram_file_root
from llamad.errors import LlamadError
from llamad.front.wire import Route
from llamad.paths import http_address

__all__ = [
    "EVENTUALLY",
    "KEPT",
    "TEST_SETTINGS",
    "DaemonFailed",
    "Launcher",
    "Stopped",
    "WaitTimeout",
    "daemon_command",
    "descendants",
    "private_dir",
    "scrubbed_env",
    "still_running",
    "wait_gone",
    "wait_until",
]

T = TypeVar("T")

#: "Eventually" on a 2-core machine shared with other test runs.
EVENTUALLY: Final = 90.0
#: How long a start may take to route its models (a model loads in seconds
#: alone; a shared machine makes it minutes).
READY_S: Final = 180.0
#: How long a SIGTERMed root may take to stop (its workers' shutdown saves).
STOP_S: Final = 60.0
#: How long the root's descendants may outlive it (they die with it, but a
#: signal takes a moment to land on a loaded machine).
GONE_S: Final = 10.0

#: The ``LLAMAD_*`` settings a daemon under test keeps: where the default
#: model lives (``make setup`` may have put it elsewhere than the default).
KEPT: Final = ("LLAMAD_CACHE_DIR", "LLAMAD_DEFAULT_MODEL")

#: What every daemon under test runs with: its HTTP gateway on a free port
#: (published in ``<runtime_dir>/http.json``), so daemons started at once
#: never collide on the default port (``extra`` may say otherwise).
TEST_SETTINGS: Final = {"LLAMAD_HTTP__PORT": "0"}

# The front answers these while the daemon starts or a part restarts: no front
# listening yet, a front restarted under the caller, a route deferred past the
# call's timeout. Anything else (ModelFailed, ModelNotFound) is the answer.
_STARTING: Final = frozenset({"unavailable", "worker_crashed", "timeout"})
_PR_SET_PDEATHSIG: Final = 1


class DaemonFailed(RuntimeError):
    """The daemon did not do what its driver needed: it exited before it was
    ready, was not ready in time, did not stop on SIGTERM, or left a process
    of its tree behind. The message carries the log's tail where it helps."""


class WaitTimeout(AssertionError):
    """A condition :func:`wait_until` polled for never held: a failed check
    (an ``AssertionError``, so pytest reports a failure, not an error)."""


@dataclass(frozen=True)
class Stopped:
    """How a stop went."""

    code: int | None
    """The root's exit status; ``None``: it outlived the timeout and was killed."""
    left: tuple[int, ...]
    """Pids of its tree still running after the root was gone."""

    @property
    def clean(self) -> bool:
        """Exit 0 and nothing left."""
        return self.code == 0 and not self.left


def scrubbed_env(
    extra: Mapping[str, str] | None = None, *, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``environ`` (default ``os.environ``) without its ``LLAMAD_*`` settings
    but :data:`KEPT`, then :data:`TEST_SETTINGS`, then ``extra`` on top."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if not k.startswith("LLAMAD_") or k in KEPT}
    env.update(TEST_SETTINGS)
    env.update(extra or {})
    return env


def private_dir(prefix: str) -> Path:
    """A new 0700 directory directly under ``/tmp`` (``tempfile``'s default may
    be long, and an ipc path must fit in 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def daemon_command(config: Path | None = None) -> list[str]:
    """``python -m llamad.daemon [--config FILE]`` with this interpreter."""
    command = [sys.executable, "-m", "llamad.daemon"]
    return [*command, "--config", str(config)] if config is not None else command


def wait_until(
    predicate: Callable[[], T | None],
    what: str,
    timeout: float = EVENTUALLY,
    interval: float = 0.02,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that;
    :class:`WaitTimeout` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def still_running(procs: Iterable[psutil.Process]) -> list[int]:
    """The pids of ``procs`` that still run. A dead orphan is a zombie until
    the container's init reaps it, which is not ours to wait for."""
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[int]:
    """Poll until none of ``procs`` runs; those still running after ``timeout``."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while (left := still_running(procs)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


def descendants(pid: int) -> list[psutil.Process]:
    """Every process under ``pid`` (none once it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


class Launcher:
    """One daemon over a private directory; started, stopped and started again
    over the same directory (a restart keeps its state); see the module doc.

    ``prefix``: the directory's name under ``/tmp``; ``base``: an existing
    directory instead (a second daemon over another's state). ``instance``:
    the cache instance (default: a fresh one). ``env``: more environment on
    top of the scrubbed one (kept in :attr:`env`, read at each start).
    ``own_session``: the daemon runs in a session of its own, so a Ctrl-C
    at the driver's terminal reaches the driver only (which stops the daemon
    with SIGTERM, the one shutdown path), and gets SIGTERM if the driver dies
    outright.
    """

    def __init__(
        self,
        *,
        prefix: str = "lld-",
        base: Path | None = None,
        instance: str | None = None,
        env: Mapping[str, str] | None = None,
        own_session: bool = False,
    ) -> None:
        self.base = base if base is not None else private_dir(prefix)
        self.runtime = self.base / "run"
        self.state = self.base / "state"
        self.log_path = self.base / "daemon.log"
        self.instance = instance if instance is not None else f"t{uuid.uuid4().hex[:10]}"
        self.endpoint = default_endpoint(str(self.runtime))
        self.registry_root = self.runtime / "actors"
        self.env: dict[str, str] = dict(env or {})
        self.own_session = own_session
        self.config: Path | None = None
        """The file passed as ``--config``; ``None``: no config file."""
        self.proc: subprocess.Popen[bytes] | None = None
        # The tree as seen at readiness and at each stop, for the check that
        # nothing outlives a stop: a process whose parent died is no longer
        # under the root, and a look at the root's children alone would miss it.
        self._tree: dict[int, psutil.Process] = {}

    # -- start -----------------------------------------------------------------------

    def write_config(self, text: str) -> Path:
        """Write ``llamad.toml`` into the directory; later starts pass it as ``--config``."""
        self.config = self.base / "llamad.toml"
        self.config.write_text(text)
        return self.config

    def command(self) -> list[str]:
        """The command a start runs."""
        return daemon_command(self.config)

    def environment(self) -> dict[str, str]:
        """The daemon's environment: the scrubbed one; with no config file the
        places (runtime and state directories, cache instance); then :attr:`env`."""
        places = {}
        if self.config is None:
            places = {
                "LLAMAD_RUNTIME_DIR": str(self.runtime),
                "STATE_DIRECTORY": str(self.state),
                "LLAMAD_CACHE__INSTANCE": self.instance,
            }
        return scrubbed_env({**places, **self.env})

    def start(self, *, preexec_fn: Callable[[], object] | None = None) -> Launcher:
        """Start the daemon (its output appended to :attr:`log_path`); return at
        once (:meth:`wait_routed` waits for it). ``preexec_fn`` runs in the child
        before exec (it must be safe in a child forked from a threaded process)."""
        if self.proc is not None and self.proc.poll() is None:
            raise DaemonFailed(f"the daemon {self.proc.pid} is running already")
        hook = preexec_fn
        if self.own_session:
            hook = _with_parent_death_signal(preexec_fn)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.environment(),
                start_new_session=self.own_session,
                preexec_fn=hook,  # noqa: PLW1509  (see start's doc)
            )
        return self

    @property
    def pid(self) -> int:
        """The root's pid."""
        if self.proc is None:
            raise DaemonFailed("the daemon was never started")
        return self.proc.pid

    def check_running(self) -> None:
        """:class:`DaemonFailed`, with its exit status and log tail, if the daemon exited."""
        code = self.proc.poll() if self.proc is not None else None
        if self.proc is None or code is not None:
            status = "was never started" if self.proc is None else f"exited with status {code}"
            raise DaemonFailed(f"the daemon {status}:\n{self.log_tail()}")

    # -- readiness -------------------------------------------------------------------

    def route(
        self, model_id: str, *, front: ActorClient | None = None, timeout: float = READY_S
    ) -> Route:
        """The front's route to ``model_id`` (the front answers once the model is
        ready), asked again while the daemon starts. ``front``: the caller's own
        client of the front (a CURVE one, say); else one for this call.
        :class:`DaemonFailed` if the daemon exits or no route comes within
        ``timeout``; the front's refusals (``ModelFailed``, ``ModelNotFound``)
        as it raised them."""
        if front is None:
            with self._front(timeout) as own:
                return self.route(model_id, front=own, timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            left = max(deadline - time.monotonic(), 0.1)
            try:
                route: Route = front.call(
                    "route", {"model_id": model_id}, reply_type=Route, timeout=left
                )
                return route
            except LlamadError as exc:
                if exc.code not in _STARTING:
                    raise
                if time.monotonic() >= deadline:
                    raise DaemonFailed(
                        f"no route to {model_id!r} within {timeout:.0f} s ({exc}):\n"
                        f"{self.log_tail()}"
                    ) from exc
            time.sleep(0.1)

    def wait_routed(
        self,
        model_ids: Iterable[str],
        *,
        front: ActorClient | None = None,
        timeout: float = READY_S,
    ) -> dict[str, Route]:
        """Until the front routes every one of ``model_ids`` (see :meth:`route`),
        all within ``timeout``; their routes."""
        deadline = time.monotonic() + timeout
        if front is None:
            with self._front(timeout) as own:
                return self.wait_routed(model_ids, front=own, timeout=timeout)
        routes = {
            m: self.route(m, front=front, timeout=max(deadline - time.monotonic(), 0.0))
            for m in model_ids
        }
        self._remember_tree()
        return routes

    def http_url(self, timeout: float = READY_S) -> str:
        """The HTTP gateway's base URL (``http://host:port``) once it serves."""

        def published() -> str | None:
            self.check_running()
            found = http_address(self.runtime)
            return None if found is None else str(found["url"])

        return wait_until(published, "the HTTP gateway published its address", timeout)

    def _front(self, timeout: float) -> ActorClient:
        return ActorClient(self.endpoint, timeout=timeout, connect_timeout=5.0)

    # -- the tree --------------------------------------------------------------------

    def tree(self) -> list[psutil.Process]:
        """Every process under the root now."""
        return descendants(self.pid) if self.proc is not None else []

    def pids(self) -> list[int]:
        """The root and every process under it (none once it is gone)."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.Error:
            return []

    def _remember_tree(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            self._tree.setdefault(root.pid, root)
            for p in root.children(recursive=True):
                self._tree.setdefault(p.pid, p)

    # -- stop ------------------------------------------------------------------------

    def terminate(self, timeout: float = STOP_S) -> Stopped:
        """SIGTERM the root (its clean stop: shutdown saves, demotions, the ``ram``
        purge) and wait ``timeout`` for it, SIGKILL past that; then wait for every
        process of its tree to be gone. Never raises: :meth:`stop` does."""
        if self.proc is None:
            return Stopped(0, ())
        self._remember_tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code: int | None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
            self._kill_root()
        left = wait_gone(self._tree.values(), GONE_S)
        self._tree.clear()
        return Stopped(code, tuple(left))

    def stop(self, timeout: float = STOP_S) -> int:
        """:meth:`terminate`; the root's exit status, or :class:`DaemonFailed` if
        it had to be killed or left a process of its tree running."""
        stopped = self.terminate(timeout)
        if stopped.code is None:
            raise DaemonFailed(
                f"the daemon did not stop within {timeout:.0f} s of SIGTERM (killed):\n"
                f"{self.log_tail()}"
            )
        if stopped.left:
            raise DaemonFailed(f"left behind after the root exited: {list(stopped.left)}")
        return stopped.code

    def kill(self) -> None:
        """SIGKILL the root (its children die with it: ``PR_SET_PDEATHSIG``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _kill_root(self) -> None:
        assert self.proc is not None
        if self.own_session:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        else:
            self.proc.kill()
        self.proc.wait()

    # -- what it leaves --------------------------------------------------------------

    @property
    def ram_file_root(self) -> Path:
        """This instance's default ``ram_file`` directory (on /dev/shm, outside
        :attr:`base`; ``cache.ram_file.root``'s default)."""
        return Path(default_ram_file_root(self.instance))

    def ram_segments(self) -> list[Path]:
        """This instance's ``ram`` segments (and its tier lock) in /dev/shm."""
        return sorted(Path("/dev/shm").glob(f"llamad-ram.{self.instance}.*"))

    def leftovers(self) -> list[Path]:
        """What of this daemon is still on disk: its directory, its default
        ``ram_file`` directory, its ``ram`` segments."""
        dirs = [d for d in (self.base, self.ram_file_root) if d.exists()]
        return [*dirs, *self.ram_segments()]

    def remove(self) -> None:
        """Remove every one of :meth:`leftovers` (stop the daemon first). The
        instance is this launcher's own, so its ``ram_file`` directory and
        segments can be nobody else's; a daemon SIGKILLed never purged its
        segments, and no later daemon of this instance will."""
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.ram_file_root, ignore_errors=True)
        for segment in self.ram_segments():
            segment.unlink(missing_ok=True)

    def close(self, timeout: float = STOP_S) -> None:
        """However the driver ends: stop a daemon still running
        (:meth:`terminate`), then :meth:`remove`."""
        if self.proc is not None and self.proc.poll() is None:
            self.terminate(timeout)
        self.remove()

    # -- the log ---------------------------------------------------------------------

    def log_lines(self) -> list[str]:
        """The daemon's log, every start's, as lines."""
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(errors="replace").splitlines()

    def log_tail(self, lines: int = 30) -> str:
        """The log's last ``lines`` lines."""
        return "\n".join(self.log_lines()[-lines:])


def _with_parent_death_signal(
    then: Callable[[], object] | None,
) -> Callable[[], None]:
    # Resolved here, in the parent: the hook runs in a child forked from a
    # process that may have threads, where loading a library could deadlock.
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        # A driver killed outright (SIGKILL) still stops its daemon cleanly.
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if then is not None:
            then()

    return hook
