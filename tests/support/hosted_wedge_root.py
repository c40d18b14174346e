"""A root supervisor whose hosted child's loop wedges (test_sup_hosted.py).

Run as a script: ``hosted_wedge_root.py EVENTS``. The hosted supervisor
``inner`` runs one sleeper ``w``; once ``w`` has started, ``inner``'s loop
blocks for good on its next turn. The root finds it silent past its 1 s
liveness window and kills it; the kill cannot end a blocked thread, so after
the (shortened) grace the process must exit with EXIT_CRASHED, and ``w``
must die by its parent-death signal.
"""

from __future__ import annotations

import sys
import threading

from llamad.supervisor import Supervisor, SupervisorSpec, SupFlags, hosted, supervisor_child
from llamad.supervisor.spec import ChildSpec, Restart, Start

hosted.KILL_GRACE_S = 1.0  # type: ignore[misc]

_forever = threading.Event()
_original = Supervisor._check_liveness
_events = sys.argv[1]


def _check(self: Supervisor) -> None:
    if self.name == "inner":
        with open(_events) as f:
            if '"start"' in f.read():
                _forever.wait()
    _original(self)


Supervisor._check_liveness = _check  # type: ignore[method-assign]

worker = ChildSpec("w", Start("sup_toys:sleeper", (_events, "w")), restart=Restart.PERMANENT)
inner = SupervisorSpec("inner", SupFlags(), (worker,))
root = SupervisorSpec(
    "root", SupFlags(), (supervisor_child(inner, liveness_timeout=1.0, hosted=True),)
)
sys.exit(Supervisor(root).run(install_signal_handlers=True))
