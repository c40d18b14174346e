"""What tests, benches and the demo use to run llamad's parts as processes
(``docs/internals/testing.md``).

- :mod:`~llamad.testing.launcher`: the one daemon harness. :class:`Launcher`
  (a private directory, the environment scrub :func:`scrubbed_env`, start,
  readiness, stop, leftovers) and one :func:`wait_until`::

      d = Launcher(prefix="lmy-")                # a private 0700 directory under /tmp
      d.write_config(text)                       # naming d.runtime, d.state, d.instance; or none
      d.start().wait_routed(["smol"])            # until the front routes the model
      assert d.stop() == 0                       # SIGTERM, exit status, no process left
      d.close()                                  # whatever is left: directory, ram rows

- :mod:`~llamad.testing.cache_meta`: a private cache
  (:func:`scratch_settings`, :func:`discard_scratch`) and cache-meta in a
  process of its own (:class:`MetaProcess`);
- :mod:`~llamad.testing.toy_actor`: a toy actor serving every style of op
  (``python -m llamad.testing.toy_actor``; :func:`spawn_toy`,
  :func:`build_toy`).

Public because the benches (outside ``tests/``) use them too. Nothing a
daemon or a client runs imports this package: the layering test puts it
above every package of the daemon, and it starts a daemon as a program
(``python -m llamad.daemon``), never by importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

if TYPE_CHECKING:
    from llamad.testing.cache_meta import MetaProcess, discard_scratch, scratch_settings
    from llamad.testing.launcher import (
        EVENTUALLY,
        KEPT,
        DaemonFailed,
        Launcher,
        Stopped,
        WaitTimeout,
        daemon_command,
        descendants,
        private_dir,
        scrubbed_env,
        still_running,
        wait_gone,
        wait_until,
    )
    from llamad.testing.toy_actor import ToyProcess, build_toy, client_workload, spawn_toy

# Lazy like the other faces: a toy actor's process loads no launcher, and a
# test of the launcher no cache.
__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.testing.cache_meta": ("MetaProcess", "discard_scratch", "scratch_settings"),
        "llamad.testing.launcher": (
            "EVENTUALLY",
            "KEPT",
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
        ),
        "llamad.testing.toy_actor": ("ToyProcess", "build_toy", "client_workload", "spawn_toy"),
    },
)

__all__ = [
    "EVENTUALLY",
    "KEPT",
    "DaemonFailed",
    "Launcher",
    "MetaProcess",
    "Stopped",
    "ToyProcess",
    "WaitTimeout",
    "build_toy",
    "client_workload",
    "daemon_command",
    "descendants",
    "discard_scratch",
    "private_dir",
    "scratch_settings",
    "scrubbed_env",
    "spawn_toy",
    "still_running",
    "wait_gone",
    "wait_until",
]
