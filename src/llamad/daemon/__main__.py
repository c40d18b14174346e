"""``python -m llamad.daemon``: the daemon's root process."""

from __future__ import annotations

import sys

from llamad._lazy import defer_module

# The root runs no event loop: structlog's asyncio import is deferred.
defer_module("asyncio")

from llamad.daemon.main import main  # noqa: E402  (after the deferral)

sys.exit(main())
