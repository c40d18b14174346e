"""``python -m llamad.daemon``: the daemon's root process."""

from __future__ import annotations

import sys

from llamad.daemon.main import main

sys.exit(main())
