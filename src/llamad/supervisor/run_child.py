"""``python -m llamad.supervisor.run_child``: the command every supervised child execs.

Kept apart from :mod:`llamad.supervisor.child` so that module is imported
under its own name (entry functions import its helpers by that name, and the
state they use must be the runner's) instead of running as ``__main__``.
"""

from __future__ import annotations

from llamad._lazy import defer_module

# No daemon process runs an event loop: structlog's asyncio import is deferred.
defer_module("asyncio")

from llamad.supervisor.child import main  # noqa: E402  (after the deferral)

if __name__ == "__main__":
    main()
