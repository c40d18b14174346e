"""``python -m llamad.cli``: the ``llamad`` command."""

from __future__ import annotations

import sys

from llamad.cli.main import main

sys.exit(main())
