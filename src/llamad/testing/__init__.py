"""The one daemon harness tests, benches and ``make run`` share (``docs/internals/testing.md``).

::

    from llamad.testing import Launcher

    d = Launcher(prefix="lmy-")                # a private 0700 directory under /tmp
    d.write_config(text)                       # naming d.runtime, d.state, d.instance; or none
    d.start().wait_routed(["smol"])            # until the front routes the model
    ...                                        # d.endpoint, d.registry_root, d.log_tail()
    assert d.stop() == 0                       # SIGTERM, exit status, no process left
    d.close()                                  # whatever is left: directory, ram rows

:mod:`~llamad.testing.launcher` holds it all: :class:`Launcher` (start with or
without a config file, readiness, stop, kill, leftovers), the environment
scrub (:func:`scrubbed_env`) and one :func:`wait_until`.

Nothing a daemon or a client runs imports this package: it starts the daemon
as a program (``python -m llamad.daemon``), never by importing it.
"""

from __future__ import annotations

# The face is the launcher module's own list (its ``__all__``): one list of
# names, not three. Eager, unlike the other faces: only tests, benches and
# the demo import it, never a daemon's or a client's process.
from llamad.testing.launcher import *  # noqa: F403
from llamad.testing.launcher import __all__ as __all__
