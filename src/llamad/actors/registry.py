"""The name registry: actor names to endpoints, following restarts.

The registry is a directory (by default ``<runtime dir>/actors``, mode 0700)
shared by every process of one daemon; no process owns it, so it works before,
during and after any single process's life. For an actor named ``cache-meta``:

- ``cache-meta.lock`` is ``flock``-ed exclusively by the live actor for its
  whole life. The kernel drops the lock when the process dies, however it
  dies, so a restarted actor can always claim the name and two live actors
  never can.
- ``cache-meta.json`` records where it listens and which process it is
  (pid + start ticks + instance), written atomically after the socket is bound
  and removed on a clean stop. A record whose process is gone is stale and
  ignored by :meth:`Registry.lookup`.
- ``cache-meta.sock`` is the default ``ipc://`` endpoint. The path is
  deterministic, so a restarted actor binds the same path and clients that
  kept the endpoint reconnect to it; actors on ``tcp://`` (possibly an
  ephemeral port) are found through the record instead. An actor that also
  listens on tcp for other hosts (``Actor(tcp_host=...)``) records that
  endpoint as ``tcp_endpoint``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from pathlib import Path
from typing import Final

import msgspec

from llamad.actors.errors import ActorConfigError, NameTaken
from llamad.actors.monitor import ProcessRef

__all__ = ["Registration", "Registry", "RegistryEntry", "check_name", "runtime_dir"]

NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SUN_PATH_MAX: Final = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


def check_name(name: str, field: str = "name") -> str:
    """Return ``name`` if it is a valid actor name, else raise naming ``field``."""
    if not isinstance(name, str) or not NAME.fullmatch(name):  # match lets "name\n" through
        raise ActorConfigError(
            field, f"{name!r} is not an actor name (letter or digit, then [A-Za-z0-9_.-], ≤ 64)"
        )
    return name


def runtime_dir() -> Path:
    """llamad's private runtime directory, created 0700 if missing.

    ``LLAMAD_RUNTIME_DIR`` if set, else ``$XDG_RUNTIME_DIR/llamad``, else
    ``/tmp/llamad-<uid>``. A directory owned by another user is refused: its
    owner could intercept every ipc endpoint in it.
    """
    env = os.environ.get("LLAMAD_RUNTIME_DIR")
    if env:
        path = Path(env).expanduser()
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "llamad"
    else:
        path = Path(f"/tmp/llamad-{os.getuid()}")
    return _private_dir(path, "runtime_dir")


def _private_dir(path: Path, field: str) -> Path:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (ValueError, UnicodeEncodeError):  # a NUL, or a name the filesystem cannot encode
        raise ActorConfigError(field, f"{str(path)!r} is not a usable directory name") from None
    st = path.stat()
    if st.st_uid != os.getuid():
        raise ActorConfigError(field, f"{path} is owned by uid {st.st_uid}, not us")
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


class RegistryEntry(msgspec.Struct, frozen=True):
    """Where a registered actor listens and which process serves it."""

    name: str
    endpoint: str
    pid: int
    start_ticks: int
    boot_id: str
    pidns: int
    instance: str
    started_at: float
    tcp_endpoint: str = ""

    @property
    def process(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_ticks, self.boot_id, self.pidns)

    def alive(self) -> bool:
        """Whether the process that wrote this entry still runs."""
        return self.process.alive()


_ENTRY_DECODER: Final = msgspec.json.Decoder(RegistryEntry)


class Registration:
    """A held claim on a name; :meth:`release` on clean stop (death releases too)."""

    def __init__(self, registry: Registry, name: str, lock_fd: int) -> None:
        self.registry = registry
        self.name = name
        self._lock_fd: int | None = lock_fd
        self.entry: RegistryEntry | None = None

    def publish(self, endpoint: str, instance: str, tcp_endpoint: str = "") -> RegistryEntry:
        """Record where the actor listens; call after the socket is bound."""
        me = ProcessRef.current()
        entry = RegistryEntry(
            name=self.name,
            endpoint=endpoint,
            pid=me.pid,
            start_ticks=me.start_ticks,
            boot_id=me.boot_id,
            pidns=me.pidns,
            instance=instance,
            started_at=time.time(),
            tcp_endpoint=tcp_endpoint,
        )
        final = self.registry.root / f"{self.name}.json"
        tmp = final.with_name(f".{self.name}.json.{me.pid}.tmp")
        # 0600 from creation, like every file of the runtime dir: the record
        # names the actor's pid and endpoints, nobody else's business.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(msgspec.json.encode(entry))
        os.replace(tmp, final)
        self.entry = entry
        return entry

    def release(self) -> None:
        """Remove the record (if still ours) and drop the lock. Idempotent."""
        if self._lock_fd is None:
            return
        try:
            current = self.registry.read(self.name)
            if current is not None and self.entry is not None and current == self.entry:
                with contextlib.suppress(FileNotFoundError):
                    (self.registry.root / f"{self.name}.json").unlink()
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def held(self) -> bool:
        return self._lock_fd is not None


class Registry:
    """Names to endpoints for every actor of one daemon (see module doc)."""

    def __init__(self, root: Path | str | None = None) -> None:
        if root is not None and not isinstance(root, str | os.PathLike):
            raise ActorConfigError("registry root", f"expected a path, not {type(root).__name__}")
        base = Path(root) if root is not None else runtime_dir() / "actors"
        self.root = _private_dir(base, "registry root")

    def ipc_endpoint(self, name: str) -> str:
        """The deterministic ``ipc://`` endpoint of ``name`` under this registry."""
        path = self.root / f"{check_name(name)}.sock"
        if len(os.fsencode(path)) > _SUN_PATH_MAX:
            raise ActorConfigError(
                "endpoint", f"ipc path {path} is longer than {_SUN_PATH_MAX} bytes"
            )
        return f"ipc://{path}"

    def claim(self, name: str) -> Registration:
        """Take the name for this process, or raise :class:`NameTaken`."""
        check_name(name)
        fd = os.open(self.root / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.lookup(name)
            raise NameTaken(
                f"actor name {name!r} is served by another live process",
                details={"name": name, "pid": holder.pid if holder else None},
            ) from None
        return Registration(self, name, fd)

    def read(self, name: str) -> RegistryEntry | None:
        """The recorded entry for ``name``, live or stale, or ``None``."""
        try:
            data = (self.root / f"{check_name(name)}.json").read_bytes()
        except FileNotFoundError:
            return None
        try:
            return _ENTRY_DECODER.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError, ValueError):
            return None

    def lookup(self, name: str) -> RegistryEntry | None:
        """The entry for ``name`` if its process is alive, else ``None``."""
        entry = self.read(name)
        return entry if entry is not None and entry.alive() else None

    def names(self) -> list[str]:
        """Names with a live entry, sorted."""
        out = []
        for path in sorted(self.root.glob("*.json")):
            if NAME.match(path.stem) and self.lookup(path.stem) is not None:
                out.append(path.stem)
        return out
