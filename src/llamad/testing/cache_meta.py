"""cache-meta for tests and benchmarks: a private cache, and cache-meta in a process of its own.

::

    from llamad.testing import MetaProcess, discard_scratch, scratch_settings

    settings = scratch_settings(prefix="lmy", ram_quota=1 << 20)  # a private cache
    with MetaProcess(settings) as meta:        # python -m llamad.cache.meta_proc
        ...                                    # meta.endpoint, meta.pid, meta.stop()
    discard_scratch(settings)                  # its directories, counters, permits

:func:`scratch_settings` lays out the three tiers under unique names (one
``ram`` instance, a private ``ram_file`` directory in /dev/shm, ``disk`` and
the registry in a short /tmp directory), so tests running side by side never
share a row, a counter or an actor name. :class:`MetaProcess` runs the server
the daemon supervises (:class:`~llamad.cache.meta_proc.MetaServer`) as a plain
child process, outside any supervisor.

The daemon's code never imports this module (``tests/unit/test_layers.py``):
its caches are laid out by the config (:func:`llamad.config.convert.cache_settings`)
or :meth:`~llamad.cache.settings.CacheSettings.defaults`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from llamad.cache.ram_purge import purge_ram
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import SHM_ROOT, TierConfig

__all__ = ["MetaProcess", "discard_scratch", "scratch_settings"]


def scratch_settings(
    *,
    prefix: str = "llamad-scratch",
    ram_quota: int = 64 << 20,
    ram_file_quota: int = 64 << 20,
    disk_quota: int = 256 << 20,
    **overrides: Any,
) -> CacheSettings:
    """Settings for a self-contained scratch cache (tests, benchmarks).

    ``ram`` segments under a unique instance, ``ram_file`` in a private
    /dev/shm directory, ``disk`` and the actor registry in a short /tmp
    directory (ipc paths must fit in 107 bytes). ``overrides`` are other
    :class:`~llamad.cache.settings.CacheSettings` fields.
    :func:`discard_scratch` removes all of it.
    """
    instance = f"{prefix}-{uuid.uuid4().hex[:12]}"
    base = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    shm = SHM_ROOT
    tiers = (
        TierConfig(TierKind.RAM, shm, ram_quota, instance),
        TierConfig(TierKind.RAM_FILE, shm / instance, ram_file_quota, instance),
        TierConfig(TierKind.DISK, base / "disk", disk_quota, instance),
    )
    fields: dict[str, Any] = {
        "counters_path": shm / f"{instance}.counters",
        "permits_path": shm / f"{instance}.permits",
        "registry_root": base / "reg",
        **overrides,
    }
    return CacheSettings(tiers=tiers, **fields)


def discard_scratch(settings: CacheSettings) -> None:
    """Remove everything a :func:`scratch_settings` cache created.

    Only for scratch caches: it deletes the tiers' directories, the registry,
    the counters file, the writer permits and the copy-activity board.
    """
    purge_ram(settings)
    dirs = [cfg.root for cfg in settings.tiers if cfg.kind is not TierKind.RAM]
    if settings.registry_root is not None:
        dirs.append(settings.registry_root)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    settings.counters_path.unlink(missing_ok=True)
    settings.permits_file().unlink(missing_ok=True)
    settings.copies_file().unlink(missing_ok=True)
    for parent in {path.parent for path in dirs}:
        with contextlib.suppress(OSError):
            parent.rmdir()  # the scratch base, once empty; never a non-empty dir


class MetaProcess:
    """cache-meta in a child process of its own, outside any supervisor.

    For tests and benchmarks: starts ``python -m llamad.cache.meta_proc`` with
    ``settings``, waits for it to serve, and stops it (SIGTERM, then SIGKILL)
    on :meth:`stop` or at the end of a ``with`` block. In the daemon,
    :func:`llamad.cache.sup.cache_sup_spec` runs cache-meta under a supervisor
    instead.
    """

    def __init__(self, settings: CacheSettings, *, ready_timeout: float = 60.0) -> None:
        self.settings = settings
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self._settings_file: Path | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> MetaProcess:
        fd, name = tempfile.mkstemp(prefix="llamad-cache-settings-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(self.settings.to_wire(), f)
        self._settings_file = Path(name)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llamad.cache.meta_proc", name],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout
        line = ""
        while not line.startswith("READY "):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            line = self.proc.stdout.readline() if ready else ""
            if not ready or not line:
                self.stop()
                raise RuntimeError("cache-meta exited or timed out before serving")
        self.endpoint = line.split()[1]
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        if self._settings_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self._settings_file.unlink()
            self._settings_file = None
        return code

    def __enter__(self) -> MetaProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
