"""``python -m llamad.supervisor.run_child``: the command every supervised child execs.

Kept apart from :mod:`llamad.supervisor.child` so that module is imported
under its own name (entry functions import its helpers by that name, and the
state they use must be the runner's) instead of running as ``__main__``.
"""

from __future__ import annotations

from llamad.supervisor.child import main

if __name__ == "__main__":
    main()
