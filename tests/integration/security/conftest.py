"""The security tests share the daemon tests' harness (a real daemon subprocess)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
