"""The example config and the key reference, both written from the schema.

:func:`example` is what ``llamad config example`` prints and what
``packaging/llamad.example.toml`` holds: every table and key, each key's
meaning as a comment and its default as a commented line, with a few keys
set so that the file serves the default model as it is (it passes
``llamad config check``). :func:`reference_markdown` is the table of every
key in ``docs/internals/config.md``. Tests hold both files to these
functions; ``python -m llamad.config.reference --write`` rewrites them.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from llamad.config.env import env_name
from llamad.config.keys import FieldInfo, Key, Section, Tables, fields_of
from llamad.config.model_schema import DEFAULT_MODEL_PATH, ModelPolicy, ModelThreads
from llamad.config.problems import KeyPath, format_key
from llamad.config.schema import DEFAULT_MODEL_ID, LlamadConfig, PolicySection, ThreadsSection

__all__ = ["DOC_PATH", "EXAMPLE_PATH", "example", "main", "reference_markdown", "sections"]

REPO: Final = Path(__file__).resolve().parents[3]
EXAMPLE_PATH: Final = REPO / "packaging" / "llamad.example.toml"
DOC_PATH: Final = REPO / "docs" / "internals" / "config.md"
BEGIN: Final = "<!-- BEGIN GENERATED REFERENCE (python -m llamad.config.reference --write) -->"
END: Final = "<!-- END GENERATED REFERENCE -->"

# Tables whose unset keys take another table's value.
_INHERITS: Final[dict[type[msgspec.Struct], tuple[type[msgspec.Struct], str]]] = {
    ModelPolicy: (PolicySection, "cache.policy"),
    ModelThreads: (ThreadsSection, "daemon.threads"),
}

# What the example sets: enough to serve the default model and show a few keys.
_SET: Final[dict[KeyPath, Any]] = {
    ("models", DEFAULT_MODEL_ID, "path"): DEFAULT_MODEL_PATH,
    ("models", DEFAULT_MODEL_ID, "n_ctx"): 4096,
    ("models", DEFAULT_MODEL_ID, "n_seq_max"): 4,
    ("models", DEFAULT_MODEL_ID, "keep_alive"): "30m",
}
# Values the example shows for keys that have no default to show.
_SHOWN: Final[dict[str, Any]] = {
    "thinking.open": "<think>",
    "thinking.close": "</think>",
    "tool_call.open": "<tool_call>",
    "tool_call.close": "</tool_call>",
    "laptop.sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
}


class Table(msgspec.Struct, frozen=True):
    """One table of the schema, where it sits and what it holds."""

    path: KeyPath
    struct: type[msgspec.Struct]
    doc: str
    optional: bool


def sections(name: str = "<id>") -> Iterator[Table]:
    """Every table, depth first (``name``: the id shown for ``[models.<id>]``)."""

    def walk(cls: type[msgspec.Struct], path: KeyPath, doc: str, optional: bool) -> Iterator[Table]:
        yield Table(path, cls, doc, optional)
        for f in fields_of(cls):
            if isinstance(f.marker, Section):
                assert f.struct is not None
                yield from walk(f.struct, (*path, f.name), f.marker.doc, f.marker.optional)
            elif isinstance(f.marker, Tables):
                assert f.struct is not None
                label = name
                if f.marker.example_name is not None:
                    label = f.marker.name_hint if name == "<id>" else f.marker.example_name
                yield from walk(f.struct, (*path, f.name, label), f.marker.doc, f.marker.optional)

    for table in walk(LlamadConfig, (), "", False):
        if table.path:
            yield table


def _keys(cls: type[msgspec.Struct]) -> list[FieldInfo]:
    return [f for f in fields_of(cls) if isinstance(f.marker, Key)]


def _inherited(cls: type[msgspec.Struct], name: str) -> tuple[Any, str] | None:
    found = _INHERITS.get(cls)
    if found is None:
        return None
    parent, where = found
    info = next(f for f in fields_of(parent) if f.name == name)
    return info.default_value(), f"{where}.{name}"


def _shown(table: Table, f: FieldInfo) -> tuple[str, bool]:
    """The value line of ``f`` in the example and whether it is set (uncommented)."""
    key, path = f.key, (*table.path, f.name)
    if path in _SET:
        return key.kind.render(_SET[path]), True
    shown = _SHOWN.get(f"{table.path[-1]}.{f.name}")
    if shown is not None:
        return key.kind.render(shown), False
    inherited = _inherited(table.struct, f.name)
    if inherited is not None:
        return key.kind.render(inherited[0]), False
    if key.default_text is not None:
        return key.kind.render(key.example), False
    return key.kind.render(f.default_value()), False


def _meaning(table: Table, f: FieldInfo) -> str:
    inherited = _inherited(table.struct, f.name)
    if inherited is not None:
        return f"Overrides `{inherited[1]}` for this model."
    return f.key.doc


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, 78, initial_indent="# ", subsequent_indent="# ")


_PREAMBLE: Final = """\
# llamad configuration: every table and key, with its meaning and default.
# Written by `llamad config example`; the reference is docs/internals/config.md.
#
# A commented key shows its default: uncomment it to change it. Every key is
# optional except a model's `path`. Durations take a number in the key's unit
# (seconds, or milliseconds for *_ms keys) or "500ms", "30s", "10m", "1h";
# sizes take a number of bytes or "512MiB", "2GiB", "500MB".
#
# Environment variables override any key: LLAMAD_ and the key path in capitals,
# its parts joined by a double underscore, e.g.
#   LLAMAD_DAEMON__LOG_LEVEL=debug
#   LLAMAD_MODELS__SMOLLM2__N_CTX=8192
#   LLAMAD_CACHE__DISK__QUOTA=10GiB
#
# Check a file without starting anything: llamad config check FILE
"""


def example() -> str:
    """The commented example config (it passes ``llamad config check``)."""
    out = [_PREAMBLE]
    for table in sections(DEFAULT_MODEL_ID):
        header = f"[{format_key(table.path)}]"
        out.append("")
        out.extend(_comment(table.doc))
        out.append(f"# {header}" if table.optional else header)
        for f in _keys(table.struct):
            value, is_set = _shown(table, f)
            out.append("#" if table.optional else "")
            out.extend(_comment(_meaning(table, f)))
            if f.key.default_text is not None:
                out.extend(_comment(f"Default: {f.key.default_text}."))
            out.append(f"{f.name} = {value}" if is_set else f"# {f.name} = {value}")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_cell(table: Table, f: FieldInfo) -> str:
    inherited = _inherited(table.struct, f.name)
    if inherited is not None:
        return f"`{inherited[1]}`"
    if f.key.required:
        return "required"
    text = f.key.default_text
    if text is not None:
        # Placeholders like <runtime_dir> would read as HTML tags outside code.
        return f"`{text}`" if "<" in text or "$" in text else text
    return f"`{f.key.kind.render(f.default_value())}`"


def reference_markdown() -> str:
    """The reference of every table and key, as Markdown."""
    out: list[str] = []
    for table in sections():
        out.append(f"### `[{'.'.join(table.path)}]`")
        out.append("")
        note = " Optional: absent unless written." if table.optional else ""
        out.append(f"{table.doc}{note}")
        keys = _keys(table.struct)
        if keys:
            out.append("")
            out.append("| key | type | default | meaning | environment |")
            out.append("|---|---|---|---|---|")
            for f in keys:
                env = env_name((*table.path, f.name)).replace("_ID_", "<ID>")
                out.append(
                    f"| `{f.name}` | {_cell(f.key.kind.type_text())} | "
                    f"{_cell(_default_cell(table, f))} | {_cell(_meaning(table, f))} | "
                    f"`{env}` |"
                )
        out.append("")
    return "\n".join(out)


def doc_with_reference(doc: str) -> str:
    """``doc`` with the text between its markers replaced by the reference."""
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:start] + "\n\n" + reference_markdown() + "\n" + doc[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the example, or (``--write``) rewrite the example file and the doc's reference."""
    parser = argparse.ArgumentParser(prog="python -m llamad.config.reference")
    parser.add_argument("--write", action="store_true", help="rewrite both files in place")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(example())
        return 0
    EXAMPLE_PATH.parent.mkdir(parents=True, exist_ok=True)
    EXAMPLE_PATH.write_text(example())
    DOC_PATH.write_text(doc_with_reference(DOC_PATH.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
