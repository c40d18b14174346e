"""A ``tool_call`` event's text as a call (no I/O), for the protocols that return calls.

The worker releases the text between a template's tool-call markers
(:class:`~llamad.model.results.ToolCallEvent`); most templates put a JSON
object there: ``{"name": ..., "arguments": {...}}`` (Hermes, Qwen, Llama 3's
``parameters``). A text that is not such an object is not a call: the
protocol modules keep it as reply text rather than invent a call.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["parse_call"]


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` of the call ``text`` holds, else ``None``."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        # Some templates (and OpenAI's own shape) hold the arguments as JSON text.
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return value["name"], arguments
