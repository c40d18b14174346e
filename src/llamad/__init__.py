"""llamad: a supervised, multi-process llama.cpp daemon with a token-exact KV cache."""

from __future__ import annotations

__version__ = "0.1.0"
