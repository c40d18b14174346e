"""llama.cpp's built-in chat templates (``llama_chat_apply_template``).

These are the fallback of the sandboxed Jinja renderer
(:mod:`llamad.llama_ffi.chat_template`): llama.cpp recognises a fixed list of
well-known templates, either by name (``"chatml"``, ``"llama3"``, …) or by
spotting their markers in a Jinja source, and renders them natively. It knows
nothing about tools or ``enable_thinking``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import ChatTemplateError
from llamad.llama_ffi.inputs import c_string
from llamad.llama_ffi.native import ensure_backend, ffi, lib

__all__ = ["builtin_chat_template", "builtin_template_names"]


def builtin_template_names() -> list[str]:
    """Names of the templates llama.cpp can render without Jinja."""
    ensure_backend()
    n = int(lib.llama_chat_builtin_templates(ffi.NULL, 0))
    names = ffi.new("const char *[]", max(n, 1))
    n = int(lib.llama_chat_builtin_templates(names, n))
    return [ffi.string(names[i]).decode() for i in range(n)]


def builtin_chat_template(
    messages: Sequence[Mapping[str, str]],
    template: str | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """Render ``messages`` (each with ``role`` and ``content`` strings).

    ``template`` is a built-in name or a Jinja source that llama.cpp
    recognises; None means ``chatml``. Raises :class:`ChatTemplateError` when
    llama.cpp does not recognise the template.
    """
    ensure_backend()
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise BadRequest(f"messages must be a sequence of mappings, not {type(messages).__name__}")
    keep: list[object] = []
    chat = ffi.new("llama_chat_message[]", max(len(messages), 1))
    total = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise BadRequest(f"message {i} must be a mapping, not {type(msg).__name__}")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise BadRequest(f"message {i} needs string 'role' and 'content'")
        r = ffi.new("char[]", c_string(role, f"messages[{i}].role"))
        c = ffi.new("char[]", c_string(content, f"messages[{i}].content"))
        keep += (r, c)
        chat[i].role = r
        chat[i].content = c
        total += len(role) + len(content)
    tmpl = ffi.NULL if template is None else ffi.new("char[]", c_string(template, "template"))
    capacity = 2 * total + 1024
    while True:
        buf = ffi.new("char[]", capacity)
        n = int(
            lib.llama_chat_apply_template(
                tmpl, chat, len(messages), add_generation_prompt, buf, capacity
            )
        )
        if n < 0:
            name = "chatml" if template is None else template[:80]
            raise ChatTemplateError(
                f"llama.cpp has no built-in chat template matching {name!r}",
                details={"template": name},
            )
        if n < capacity:
            return bytes(ffi.buffer(buf, n)).decode("utf-8", "replace")
        capacity = n + 1
