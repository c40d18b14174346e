"""Fault tests of the model worker reuse the integration tests' tree helper."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "model"))
