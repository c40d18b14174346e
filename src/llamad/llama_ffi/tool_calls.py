"""Tool calls: asking a model for them, constraining them, reading them back.

OpenAI-style function tools (``{"type": "function", "function": {"name",
"description", "parameters"}}``) reach a model through its chat template
(:mod:`llamad.llama_ffi.chat_template`). Three concerns live here, all pure
Python (no libllama):

- **The format a model calls tools in** (:class:`ToolFamily`), read from its
  template: Hermes / Qwen (``<tool_call>{"name", "arguments"}</tool_call>``),
  Llama 3.x (a bare ``{"name", "parameters"}`` object, ``<|python_tag|>``
  optional), Mistral (``[TOOL_CALLS][{"name", "arguments"}, ...]``), and
  ``generic`` (a bare ``{"name", "arguments"}`` object) for a tool-aware
  template of no known family.
- **The fallback for templates that know no tools** (SmolLM2's, and
  llama.cpp's built-ins): :func:`tools_in_messages` rewrites the chat so any
  template renders it, in the Hermes format: the tool list goes into the
  system message with the instructions Qwen 2.5 uses, earlier assistant calls
  become ``<tool_call>`` text, and tool results become user messages wrapped
  in ``<tool_response>``.
- **``tool_choice``** ``required`` or a named function:
  :func:`tool_call_grammar` builds a GBNF grammar that admits exactly one call
  in the family's format, whose ``arguments`` satisfy the function's
  JSON-schema ``parameters`` (through :func:`~llamad.llama_ffi.json_schema_to_gbnf`),
  so even a 135M model emits a call that parses and validates.
- **Reading calls back** (:func:`parse_tool_calls`): every family's format is
  recognised whatever the template, since models stray; a call is only taken
  when its JSON parses and, when the tools are known, it names one of them.
  Text that is not a call stays content.
"""

from __future__ import annotations

import enum
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from llamad.errors import BadRequest
from llamad.llama_ffi.json_schema import json_schema_to_gbnf

__all__ = [
    "ParsedReply",
    "ToolCall",
    "ToolFamily",
    "check_tool_choice",
    "chosen_function",
    "family_of_template",
    "function_of",
    "parse_tool_calls",
    "renders_tools",
    "tool_call_grammar",
    "tools_in_messages",
]

_TOOLS_WORD: Final = re.compile(r"\btools\b")


class ToolFamily(enum.StrEnum):
    """How a model writes a tool call (the grammar's shape for it)."""

    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    GENERIC = "generic"


@dataclass(frozen=True, slots=True)
class _Shape:
    prefix: str
    suffix: str
    arguments_key: str


_SHAPES: Final = {
    ToolFamily.HERMES: _Shape("<tool_call>\n", "\n</tool_call>", "arguments"),
    ToolFamily.LLAMA3: _Shape("", "", "parameters"),
    ToolFamily.MISTRAL: _Shape("[TOOL_CALLS][", "]", "arguments"),
    ToolFamily.GENERIC: _Shape("", "", "arguments"),
}


def renders_tools(source: str | None) -> bool:
    """Whether a Jinja template renders tools itself: it reads ``tools`` and
    writes assistant ``tool_calls``. Otherwise :func:`tools_in_messages`
    does it for the template."""
    return source is not None and bool(_TOOLS_WORD.search(source)) and "tool_calls" in source


def family_of_template(source: str | None) -> ToolFamily:
    """The format ``source`` teaches its model to call tools in; HERMES for a
    template that renders no tools (the fallback teaches that format)."""
    if not renders_tools(source):
        return ToolFamily.HERMES
    assert source is not None
    if "[TOOL_CALLS]" in source:
        return ToolFamily.MISTRAL
    if "<tool_call>" in source:
        return ToolFamily.HERMES
    if "<|python_tag|>" in source or "<|start_header_id|>" in source:
        return ToolFamily.LLAMA3
    return ToolFamily.GENERIC


# ---------------------------------------------------------------- tools


def function_of(tool: object, field: str = "tools") -> Mapping[str, Any]:
    """The function definition of one tool: OpenAI's chat shape
    ``{"type": "function", "function": {...}}`` or the flat one of the
    Responses API ``{"type": "function", "name": ...}``."""
    if not isinstance(tool, Mapping):
        raise BadRequest(f"{field} must be an object", details={"field": field})
    kind = tool.get("type", "function")
    if kind != "function":
        raise BadRequest(
            f"{field}.type: only function tools are supported, not {kind!r}",
            details={"field": f"{field}.type"},
        )
    function = tool.get("function", tool)
    if not isinstance(function, Mapping):
        raise BadRequest(f"{field}.function must be an object", details={"field": field})
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"{field}.function.name must be a non-empty string",
            details={"field": f"{field}.function.name"},
        )
    params = function.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise BadRequest(
            f"{field}.function.parameters must be a JSON schema object",
            details={"field": f"{field}.function.parameters"},
        )
    return function


def _functions(tools: Sequence[object] | None) -> list[Mapping[str, Any]]:
    return [function_of(t, f"tools[{i}]") for i, t in enumerate(tools or ())]


def chosen_function(tool_choice: object) -> str | None:
    """The function a named ``tool_choice`` names (chat shape
    ``{"type": "function", "function": {"name"}}`` or flat ``{"type":
    "function", "name"}``); None for the string choices."""
    if not isinstance(tool_choice, Mapping):
        return None
    function = tool_choice.get("function", tool_choice)
    name = function.get("name") if isinstance(function, Mapping) else None
    return name if isinstance(name, str) else None


def check_tool_choice(tool_choice: object, tools: Sequence[object] | None) -> None:
    """Refuse a ``tool_choice`` that is not ``none``/``auto``/``required``
    or a function of ``tools``, and ``required`` or named without tools."""
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    names = [f["name"] for f in _functions(tools)]
    if tool_choice == "required":
        if not names:
            raise BadRequest("tool_choice 'required' needs tools", details={"field": "tool_choice"})
        return
    name = chosen_function(tool_choice)
    if name is None:
        raise BadRequest(
            "tool_choice must be 'none', 'auto', 'required' or"
            ' {"type": "function", "function": {"name": ...}}',
            details={"field": "tool_choice"},
        )
    if name not in names:
        raise BadRequest(
            f"tool_choice names {name!r}, which is not among the tools",
            details={"field": "tool_choice"},
        )


# ---------------------------------------------------------------- fallback prompt

_FALLBACK_HEAD: Final = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_FALLBACK_TAIL: Final = (
    "</tools>\n\nFor each function call, return a json object with function name and"
    " arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _tools_block(functions: list[Mapping[str, Any]]) -> str:
    lines = [
        json.dumps({"type": "function", "function": dict(f)}, ensure_ascii=False) for f in functions
    ]
    return "\n".join([_FALLBACK_HEAD, *lines, _FALLBACK_TAIL])


def _arguments_value(arguments: object) -> object:
    # OpenAI sends arguments as JSON text; the prompt shows the object.
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return {} if arguments is None else arguments


def _calls_text(calls: Sequence[Any], field: str) -> str:
    out = []
    for j, call in enumerate(calls):
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise BadRequest(
                f"{field}.tool_calls[{j}] needs a function name",
                details={"field": f"{field}.tool_calls[{j}]"},
            )
        body = {"name": function["name"], "arguments": _arguments_value(function.get("arguments"))}
        out.append(f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>")
    return "\n".join(out)


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"] for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return str(content)


def tools_in_messages(
    messages: list[dict[str, Any]], tools: Sequence[object] | None
) -> list[dict[str, Any]]:
    """``messages`` rewritten for a template that knows no tools (Hermes format).

    The tool list and its instructions are appended to the leading system
    message (or make one); an assistant message's ``tool_calls`` become
    ``<tool_call>`` blocks after its text; each run of ``tool`` messages
    becomes one user message of ``<tool_response>`` blocks. Messages are the
    validated plain copies :func:`~llamad.llama_ffi.chat_template.validate_messages`
    makes; the result holds only ``role`` and string ``content``.
    """
    functions = _functions(tools)
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message["role"]
        field = f"messages[{i}]"
        if role == "tool":
            block = f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
            continue
        copy = {"role": role, "content": _text(message.get("content"))}
        if role == "assistant" and message.get("tool_calls"):
            calls = _calls_text(message["tool_calls"], field)
            copy["content"] = f"{copy['content']}\n{calls}" if copy["content"] else calls
        out.append(copy)
    for message in out:
        message.pop("_tool_results", None)
    if functions:
        block = _tools_block(functions)
        if out and out[0]["role"] == "system":
            head = out[0]["content"]
            out[0]["content"] = f"{head}\n\n{block}" if head else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


# ---------------------------------------------------------------- grammar


def _rebased(schema: Any, base: str) -> Any:
    """``schema`` with its local ``$ref`` pointers moved under ``base``
    (the place it gets inside the call's schema)."""
    if isinstance(schema, Mapping):
        out = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = base + value[1:]
            else:
                out[key] = _rebased(value, base)
        return out
    if isinstance(schema, list):
        return [_rebased(v, base) for v in schema]
    return schema


def tool_call_grammar(
    tools: Sequence[object] | None, tool_choice: object, family: ToolFamily
) -> str | None:
    """The GBNF grammar for ``tool_choice`` (None when it constrains nothing:
    ``none``, ``auto``, absent): one call, in ``family``'s format, to the
    named function or (``required``) any of ``tools``, its arguments valid
    against the function's ``parameters`` (any object when it has none).

    Raises :class:`~llamad.errors.BadRequest` for a choice that does not
    fit the tools and :class:`~llamad.errors.SchemaError` (``bad_schema``)
    for parameters the JSON-schema grammar cannot express.
    """
    check_tool_choice(tool_choice, tools)
    if tool_choice is None or tool_choice in ("none", "auto"):
        return None
    functions = _functions(tools)
    name = chosen_function(tool_choice)
    if name is not None:
        functions = [f for f in functions if f["name"] == name][:1]
    shape = _SHAPES[family]
    defs: dict[str, Any] = {}
    branches = []
    for i, function in enumerate(functions):
        params = function.get("parameters") or {"type": "object"}
        defs[f"p{i}"] = _rebased(params, f"#/$defs/p{i}")
        branches.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function["name"]},
                    shape.arguments_key: {"$ref": f"#/$defs/p{i}"},
                },
                "required": ["name", shape.arguments_key],
            }
        )
    schema: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    schema = {**schema, "$defs": defs}
    return json_schema_to_gbnf(schema, prefix=shape.prefix, suffix=shape.suffix)


# ---------------------------------------------------------------- parsing


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call read from a reply: OpenAI's ``{"id", "type": "function",
    "function": {"name", "arguments"}}`` with ``arguments`` as JSON text."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A reply split into its text (None when only calls remain) and its calls."""

    content: str | None
    calls: list[ToolCall]


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


_HERMES: Final = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_MISTRAL: Final = "[TOOL_CALLS]"
_PYTHON_TAG: Final = "<|python_tag|>"
_DECODER: Final = json.JSONDecoder()


def _call_from(obj: object, names: set[str] | None) -> ToolCall | None:
    if not isinstance(obj, Mapping):
        return None
    function = obj.get("function") if isinstance(obj.get("function"), Mapping) else obj
    assert isinstance(function, Mapping)
    name = function.get("name")
    if not isinstance(name, str) or not name or (names is not None and name not in names):
        return None
    args: object = None
    for key in ("arguments", "parameters"):
        if key in function:
            args = function[key]
            break
    else:
        return None
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        text = args
    elif isinstance(args, Mapping):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return ToolCall(new_call_id(), name, text)


def _json_values(text: str) -> list[object] | None:
    """The JSON values ``text`` is made of (separated by whitespace, ``;``
    or ``,``), or None when it is anything else."""
    values: list[object] = []
    at, end = 0, len(text)
    while True:
        while at < end and text[at] in " \t\r\n;,":
            at += 1
        if at == end:
            return values
        try:
            value, at = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)


def _calls_of(values: list[object], names: set[str] | None) -> list[ToolCall] | None:
    flat: list[object] = []
    for value in values:
        flat.extend(value if isinstance(value, list) else [value])
    calls = [_call_from(v, names) for v in flat]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _mistral(text: str, names: set[str] | None) -> tuple[str, list[ToolCall]] | None:
    at = text.find(_MISTRAL)
    if at < 0:
        return None
    head, rest = text[:at], text[at + len(_MISTRAL) :].strip()
    if "[ARGS]" in rest and not rest.startswith("["):
        # v11 and later: [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}
        calls = []
        for part in rest.split(_MISTRAL):
            name, sep, args = part.strip().partition("[ARGS]")
            values = _json_values(args) if sep else None
            call = _call_from({"name": name, "arguments": values[0]}, names) if values else None
            if call is None:
                return None
            calls.append(call)
        return head, calls
    values = _json_values(rest)
    found = _calls_of(values, names) if values else None
    return None if found is None else (head, found)


def parse_tool_calls(text: str, tools: Sequence[object] | None = None) -> ParsedReply:
    """Split a generated ``text`` into content and tool calls.

    Recognised, in this order: Mistral's ``[TOOL_CALLS]`` (a JSON list, or
    ``name[ARGS]{...}``); Hermes / Qwen ``<tool_call>{...}</tool_call>``
    blocks (an unclosed last block counts: generation may stop at its end);
    Llama 3's ``<|python_tag|>`` followed by calls; and a reply that is
    nothing but JSON call objects (Llama 3's ``{"name", "parameters"}``, the
    generic ``{"name", "arguments"}``, a list of them). A call is
    ``{"name", "arguments" | "parameters"}`` (or nested under ``function``)
    whose arguments are a JSON object or JSON text, and, given ``tools``, its
    name is one of theirs. Anything else is left as content.
    """
    names = {f["name"] for f in _functions(tools)} if tools else None
    found = _mistral(text, names)
    if found is not None:
        head, calls = found
        return ParsedReply(head.strip() or None, calls)
    if "<tool_call>" in text:
        calls = []
        kept: list[str] = []
        last = 0
        for match in _HERMES.finditer(text):
            values = _json_values(match.group(1))
            got = _calls_of(values, names) if values else None
            if got is None:
                continue  # not a call after all: stays in the text
            kept.append(text[last : match.start()])
            last = match.end()
            calls.extend(got)
        if calls:
            kept.append(text[last:])
            return ParsedReply("".join(kept).strip() or None, calls)
    body = text
    head = ""
    if _PYTHON_TAG in text:
        head, _, body = text.partition(_PYTHON_TAG)
    stripped = body.strip()
    if stripped[:1] in ("{", "["):
        values = _json_values(stripped)
        got = _calls_of(values, names) if values else None
        if got is not None:
            return ParsedReply(head.strip() or None, got)
    return ParsedReply(text, [])
