"""Chat templates (SPEC L8): the GGUF's Jinja template, rendered in a sandbox.

A GGUF carries its chat template as Jinja source (``tokenizer.chat_template``).
Anyone can publish a GGUF, so the source is untrusted code: it runs in
Jinja's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment`, and any
attempt to reach Python internals (``__class__``, ``__globals__``,
``__subclasses__``, ``mro``, mutating methods of the data it is given) raises
:class:`~llamad.errors.TemplateSecurityError` at once instead of rendering an
empty string. The environment behaves like Hugging Face's
``apply_chat_template``: ``trim_blocks``/``lstrip_blocks``, loop controls, a
``tojson`` filter that does not HTML-escape, ``raise_exception``,
``strftime_now`` and the ``{% generation %}`` block; templates see
``messages``, ``tools``, ``add_generation_prompt``, ``bos_token``,
``eos_token`` and, when given, ``enable_thinking`` and extra variables.

Templates receive only plain data (dicts, lists, strings, numbers, booleans,
None) copied from the caller's messages. Rendering is bounded in output size
and in the arithmetic a template may ask for; a template can still spend CPU
in nested loops (each loop is capped at the sandbox's 100 000 iterations), so
the model worker's supervision is the backstop for a hostile one.

When the GGUF has no template, or its template does not compile, rendering
falls back to llama.cpp's built-in templates
(:func:`llamad.llama_ffi.builtin_template.builtin_chat_template`), which know
roles and text only.

Tools: a template that reads ``tools`` and writes ``tool_calls`` renders them
itself; for any other (SmolLM2's, the built-ins) :class:`ChatFormatter`
rewrites the chat first (:func:`llamad.llama_ffi.tool_calls.tools_in_messages`:
the tool list in the system message, calls and results as Hermes-format
text), and :attr:`ChatFormatter.tool_family` says which format the model was
asked to call in.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import jinja2
import jinja2.ext
import structlog
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamad.errors import BadRequest, LlamadError, TemplateError, TemplateSecurityError
from llamad.llama_ffi.tool_calls import (
    ToolFamily,
    family_of_template,
    renders_tools,
    tools_in_messages,
)

__all__ = [
    "BuiltinRenderer",
    "ChatFormatter",
    "ChatTemplate",
    "TemplateError",
    "TemplateSecurityError",
    "apply_chat_template",
    "chat_prompt",
    "validate_messages",
]

log = structlog.get_logger(__name__)

MAX_OUTPUT_CHARS: Final = 16 << 20
"""Default cap on a rendered prompt (characters); far beyond any context window."""

_MAX_DEPTH: Final = 64  # nesting of message data
_MAX_POWER_BITS: Final = 1 << 16  # largest integer a template may build with **
_MAX_INDENT: Final = 64  # tojson(indent=...)
_RESERVED: Final = frozenset(
    {
        "messages", "tools", "add_generation_prompt", "enable_thinking",
        "bos_token", "eos_token", "raise_exception", "strftime_now",
    }
)  # fmt: skip


class BuiltinRenderer(Protocol):
    """llama.cpp's built-in renderer: :func:`~llamad.llama_ffi.builtin_chat_template`."""

    def __call__(
        self,
        messages: Sequence[Mapping[str, str]],
        template: str | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str: ...


class ModelLike(Protocol):
    """What :meth:`ChatFormatter.for_model` needs from a :class:`~llamad.llama_ffi.Model`."""

    bos: int | None
    eos: int | None
    add_bos: bool

    def chat_template(self, name: str | None = None) -> str | None: ...

    def token_piece(self, token: int, *, special: bool = False) -> bytes: ...

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]: ...


# ------------------------------------------------------------ plain data


def _plain(value: Any, field: str, depth: int = 0) -> Any:
    """A copy of ``value`` made of JSON-like builtins only; BadRequest otherwise."""
    if depth > _MAX_DEPTH:
        raise BadRequest(f"{field}: nested deeper than {_MAX_DEPTH}", details={"field": field})
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadRequest(f"{field}: numbers must be finite", details={"field": field})
        return value
    if isinstance(value, list | tuple):
        return [_plain(v, f"{field}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadRequest(f"{field}: keys must be strings", details={"field": field})
            out[key] = _plain(item, f"{field}.{key}", depth + 1)
        return out
    raise BadRequest(f"{field}: {type(value).__name__} is not plain data", details={"field": field})


def _content_part(part: Any, field: str) -> dict[str, Any]:
    if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
        raise BadRequest(f"{field}: a content part needs a string 'type'", details={"field": field})
    if part["type"] == "text" and not isinstance(part.get("text"), str):
        raise BadRequest(f"{field}: a text part needs a string 'text'", details={"field": field})
    checked: dict[str, Any] = _plain(part, field)
    return checked


def validate_messages(messages: object) -> list[dict[str, Any]]:
    """Check a chat and return a plain copy of it.

    Each message is a mapping with a non-empty string ``role`` and a
    ``content`` that is a string or a list of parts (``{"type": "text",
    "text": ...}`` or other typed parts); an assistant message may have
    ``content`` None or absent when it carries ``tool_calls``. Other keys
    (``name``, ``tool_calls``, ``tool_call_id``, ``reasoning_content``, ...)
    pass through as plain data. Raises :class:`~llamad.errors.BadRequest`
    naming the offending field.
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise BadRequest("messages must be a list of messages", details={"field": "messages"})
    if not messages:
        raise BadRequest("messages must not be empty", details={"field": "messages"})
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise BadRequest(f"{field} must be an object", details={"field": field})
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise BadRequest(
                f"{field}.role must be a non-empty string", details={"field": f"{field}.role"}
            )
        copy: dict[str, Any] = _plain(message, field)
        content = message.get("content")
        if "tool_calls" in message and not isinstance(message["tool_calls"], list | tuple):
            raise BadRequest(
                f"{field}.tool_calls must be a list", details={"field": f"{field}.tool_calls"}
            )
        if isinstance(content, list | tuple):
            copy["content"] = [
                _content_part(p, f"{field}.content[{j}]") for j, p in enumerate(content)
            ]
        elif content is None and role == "assistant" and message.get("tool_calls"):
            copy["content"] = None
        elif not isinstance(content, str):
            raise BadRequest(
                f"{field}.content must be a string or a list of parts",
                details={"field": f"{field}.content"},
            )
        out.append(copy)
    return out


def _text_of(message: Mapping[str, Any], field: str) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part["type"] != "text":
            raise BadRequest(
                f"{field}.content[{j}]: the built-in template renders text parts only",
                details={"field": f"{field}.content[{j}]"},
            )
        texts.append(part["text"])
    return "\n".join(texts)


# -------------------------------------------------------------- sandbox


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, loud about escapes and bounded in arithmetic."""

    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # The stock sandbox returns an Undefined that prints as "" and only
        # fails when used further; a template probing for internals is hostile.
        raise TemplateSecurityError(
            f"chat template accessed unsafe attribute {attribute!r} of a {type(obj).__name__}",
            details={"attribute": attribute, "type": type(obj).__name__},
        )

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and ints and right > 0 and left.bit_length() * right > _MAX_POWER_BITS:
            raise TemplateError("chat template computed an oversized power")
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            sized = isinstance(seq, str | list | tuple) and isinstance(times, int)
            if sized and len(seq) * times > MAX_OUTPUT_CHARS:
                raise TemplateError("chat template built an oversized sequence")
        return super().call_binop(context, operator, left, right)


class _GenerationBlock(jinja2.ext.Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` (marks assistant text; renders its body)."""

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension API declares tags as a class set

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # HF's filter: no HTML escaping (Jinja's own tojson escapes <, >, &, ').
    if isinstance(indent, int) and indent > _MAX_INDENT:
        raise TemplateError(f"tojson indent above {_MAX_INDENT}")
    if isinstance(indent, str) and len(indent) > _MAX_INDENT:
        raise TemplateError(f"tojson indent above {_MAX_INDENT} characters")

    def refuse(obj: Any) -> Any:
        raise TemplateError(f"tojson cannot serialise {type(obj).__name__}")

    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=refuse,
    )


def _raise_exception(message: Any) -> None:
    raise TemplateError(str(message), details={"raised_by": "template"})


def _strftime_now(fmt: Any) -> str:
    if not isinstance(fmt, str):
        raise TemplateError("strftime_now expects a format string")
    return datetime.datetime.now().strftime(fmt)


@functools.cache
def _environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"chat template does not compile: {exc.message} (line {exc.lineno})",
            details={"line": exc.lineno},
        ) from exc


# ------------------------------------------------------------ templates


class ChatTemplate:
    """One Jinja chat template, compiled once (compilations are cached by source)."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        max_output_chars: int = MAX_OUTPUT_CHARS,
    ) -> None:
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("chat template source is empty")
        if not isinstance(bos_token, str) or not isinstance(eos_token, str):
            raise BadRequest("bos_token and eos_token must be strings")
        if max_output_chars <= 0:
            raise BadRequest(
                "max_output_chars must be positive", details={"field": "max_output_chars"}
            )
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.max_output_chars = max_output_chars
        self._template = _compile(source)

    def render(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        system: str | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render a chat into the model's prompt text.

        ``add_generation_prompt`` ends the text with the opening of an
        assistant turn; ``continue_final_message`` instead ends it right
        after the last message's text so the model continues that message.
        ``system``, when given, becomes a leading system message.
        ``enable_thinking`` is passed only when not None, because templates
        test it with ``is defined``. ``variables`` adds plain-data template
        variables (e.g. ``date_string``, ``reasoning_effort``).
        """
        chat = _prepare(messages, system, add_generation_prompt, continue_final_message)
        context: dict[str, Any] = _variables(variables)
        context.update(
            messages=chat,
            tools=_tools(tools),
            add_generation_prompt=bool(add_generation_prompt),
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        if enable_thinking is not None:
            if not isinstance(enable_thinking, bool):
                raise BadRequest(
                    "enable_thinking must be a boolean", details={"field": "enable_thinking"}
                )
            context["enable_thinking"] = enable_thinking
        text = self._generate(context)
        return _cut_after_final(text, chat[-1]) if continue_final_message else text

    def _generate(self, context: dict[str, Any]) -> str:
        chunks: list[str] = []
        total = 0
        try:
            for chunk in self._template.generate(context):
                total += len(chunk)
                if total > self.max_output_chars:
                    raise TemplateError(
                        f"rendered prompt exceeds {self.max_output_chars} characters",
                        details={"limit": self.max_output_chars},
                    )
                chunks.append(chunk)
        except LlamadError:
            raise
        except SecurityError as exc:
            raise TemplateSecurityError(f"chat template broke the sandbox rules: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
        except Exception as exc:  # a template is code: any failure is the template's
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        return "".join(chunks)


def _prepare(
    messages: object, system: str | None, add_generation_prompt: bool, continue_final: bool
) -> list[dict[str, Any]]:
    chat = validate_messages(messages)
    if system is not None:
        if not isinstance(system, str):
            raise BadRequest("system must be a string", details={"field": "system"})
        if chat[0]["role"] == "system":
            raise BadRequest(
                "system given both as an argument and as the first message",
                details={"field": "system"},
            )
        chat.insert(0, {"role": "system", "content": system})
    if add_generation_prompt and continue_final:
        raise BadRequest(
            "add_generation_prompt and continue_final_message exclude each other",
            details={"field": "continue_final_message"},
        )
    return chat


def _variables(variables: Mapping[str, Any] | None) -> dict[str, Any]:
    if variables is None:
        return {}
    if not isinstance(variables, Mapping):
        raise BadRequest("variables must be a mapping", details={"field": "variables"})
    out: dict[str, Any] = {}
    for name, value in variables.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise BadRequest(
                f"variables: {name!r} is not a usable name", details={"field": "variables"}
            )
        if name in _RESERVED:
            raise BadRequest(
                f"variables: {name!r} is set by llamad", details={"field": f"variables.{name}"}
            )
        out[name] = _plain(value, f"variables.{name}")
    return out


def _tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise BadRequest("tools must be a list of objects", details={"field": "tools"})
    checked: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise BadRequest(f"tools[{i}] must be an object", details={"field": f"tools[{i}]"})
        checked.append(_plain(tool, f"tools[{i}]"))
    return checked


def _cut_after_final(text: str, final: Mapping[str, Any]) -> str:
    content = final.get("content")
    if isinstance(content, list):
        texts = [p["text"] for p in content if p.get("type") == "text"]
        content = texts[-1] if texts else None
    needle = content.strip() if isinstance(content, str) else ""
    if not needle:
        raise BadRequest(
            "continue_final_message needs a final message with text",
            details={"field": "continue_final_message"},
        )
    at = text.rfind(needle)
    if at < 0:
        raise TemplateError("the chat template does not reproduce the final message's text")
    return text[: at + len(needle)]


class ChatFormatter:
    """Renders chats for one model: its Jinja template, else llama.cpp's built-ins.

    ``template`` is the GGUF's template source (None when it has none). When
    it is missing or does not compile, :meth:`render` uses ``builtin``
    (default :func:`~llamad.llama_ffi.builtin_chat_template`) with the source
    itself, which llama.cpp recognises by its markers, or with ``fallback``
    (a built-in name) when there is no source.
    """

    def __init__(
        self,
        template: str | None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        builtin: BuiltinRenderer | None = None,
        fallback: str = "chatml",
        max_output_chars: int = MAX_OUTPUT_CHARS,
    ) -> None:
        self._builtin = builtin
        self.jinja: ChatTemplate | None = None
        self.fallback_reason: str | None = None
        self._builtin_template: str = fallback
        if template is None or not template.strip():
            self.fallback_reason = "no chat template"
        else:
            self._builtin_template = template
            try:
                self.jinja = ChatTemplate(
                    template,
                    bos_token=bos_token,
                    eos_token=eos_token,
                    max_output_chars=max_output_chars,
                )
            except TemplateError as exc:
                self.fallback_reason = exc.message
        if self.fallback_reason is not None:
            log.warning("chat_template.fallback", reason=self.fallback_reason)

    @classmethod
    def for_model(
        cls,
        model: ModelLike,
        *,
        name: str | None = None,
        builtin: BuiltinRenderer | None = None,
        fallback: str = "chatml",
    ) -> ChatFormatter:
        """The formatter for ``model``'s template (``name`` picks a named variant)."""

        def piece(token: int | None) -> str:
            if token is None:
                return ""
            return model.token_piece(token, special=True).decode("utf-8", "replace")

        return cls(
            model.chat_template(name),
            bos_token=piece(model.bos),
            eos_token=piece(model.eos),
            builtin=builtin,
            fallback=fallback,
        )

    @property
    def uses_fallback(self) -> bool:
        return self.jinja is None

    @property
    def renders_tools(self) -> bool:
        """Whether the model's own template renders tools and tool calls;
        otherwise :meth:`render` writes them into the chat (Hermes format)."""
        return self.jinja is not None and renders_tools(self.jinja.source)

    @property
    def tool_family(self) -> ToolFamily:
        """The format the rendered prompt asks the model to call tools in."""
        source = self.jinja.source if self.jinja is not None else None
        return family_of_template(source)

    def render(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        system: str | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render like :meth:`ChatTemplate.render`; the fallback renders roles and text only.

        Tools, assistant ``tool_calls`` and ``tool`` messages reach a template
        that does not render them (and the built-in fallback) as text
        (:func:`~llamad.llama_ffi.tool_calls.tools_in_messages`).
        """
        if not self.renders_tools and _has_tool_parts(messages, tools):
            chat = _prepare(messages, system, add_generation_prompt, continue_final_message)
            messages, tools, system = tools_in_messages(chat, tools), None, None
        if self.jinja is not None:
            return self.jinja.render(
                messages,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                enable_thinking=enable_thinking,
                system=system,
                variables=variables,
            )
        chat = _prepare(messages, system, add_generation_prompt, continue_final_message)
        flat = [
            {"role": m["role"], "content": _text_of(m, f"messages[{i}]")}
            for i, m in enumerate(chat)
        ]
        text = self._render_builtin(flat, add_generation_prompt)
        return _cut_after_final(text, chat[-1]) if continue_final_message else text

    def _render_builtin(self, flat: list[dict[str, str]], add_generation_prompt: bool) -> str:
        builtin = self._builtin
        if builtin is None:
            from llamad.llama_ffi.builtin_template import builtin_chat_template  # noqa: PLC0415 - native code, loaded on first fallback

            builtin = builtin_chat_template
        return builtin(flat, self._builtin_template, add_generation_prompt=add_generation_prompt)


def _has_tool_parts(messages: object, tools: object) -> bool:
    if tools:
        return True
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        return False
    return any(
        isinstance(m, Mapping) and (m.get("tool_calls") or m.get("role") == "tool")
        for m in messages
    )


def apply_chat_template(
    model: ModelLike,
    messages: object,
    *,
    formatter: ChatFormatter | None = None,
    **options: Any,
) -> list[int]:
    """Render ``messages`` with ``model``'s template and tokenize the prompt.

    Special-token text in the prompt (``<|im_start|>``...) becomes the special
    tokens; BOS is added only when the model wants one and the template did
    not already write it. ``options`` are :meth:`ChatFormatter.render`'s.
    """
    text, add_bos = chat_prompt(model, messages, formatter=formatter, **options)
    return model.tokenize(text, add_special=add_bos, parse_special=True)


def chat_prompt(
    model: ModelLike,
    messages: object,
    *,
    formatter: ChatFormatter | None = None,
    **options: Any,
) -> tuple[str, bool]:
    """The prompt text :func:`apply_chat_template` tokenizes, and whether BOS
    is added to it (the model wants one and the template did not write it)."""
    formatter = formatter or ChatFormatter.for_model(model)
    text = formatter.render(messages, **options)
    bos_text = formatter.jinja.bos_token if formatter.jinja is not None else ""
    add_bos = model.add_bos and not (bos_text and text.startswith(bos_text))
    return text, add_bos
