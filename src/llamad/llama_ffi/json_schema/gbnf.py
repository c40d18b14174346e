"""GBNF expressions: a small grammar IR, its smart constructors and its text.

The constructors keep expressions normal (adjacent literals merged, nested
alternatives flattened, ``x{0,1}`` of an optional left alone) so identical
languages tend to get identical expressions and :class:`~.rules.Rules` can
share one rule between them. :data:`EMPTY` and :data:`NOTHING` propagate:
a sequence with an impossible part is impossible, an optional impossible
part is empty.

llama.cpp rewrites ``x{m,n}`` into ``n`` helper rules, refuses more than 2000
and silently drops an upper bound above 2000; :func:`rep` therefore builds
long repetitions from chunks of at most :data:`REPEAT_CHUNK`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

REPEAT_CHUNK: Final = 1000
"""Largest repetition count written into a grammar (llama.cpp's limit is 2000)."""


@dataclass(frozen=True)
class Lit:
    """A literal string."""

    text: str


@dataclass(frozen=True)
class Chars:
    """One code point from (or, negated, outside) inclusive ranges."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class Ref:
    """A reference to a named rule."""

    name: str


@dataclass(frozen=True)
class Seq:
    """The concatenation of its items."""

    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Alt:
    """Any one of its options."""

    options: tuple[Expr, ...]


@dataclass(frozen=True)
class Rep:
    """``item`` repeated ``lo`` to ``hi`` times (``None``: unbounded)."""

    item: Expr
    lo: int
    hi: int | None


Expr: TypeAlias = Lit | Chars | Ref | Seq | Alt | Rep

EMPTY: Final[Expr] = Seq(())  # matches the empty string
NOTHING: Final[Expr] = Alt(())  # matches no string at all


# ------------------------------------------------------------- constructors


def seq(*items: Expr) -> Expr:
    """The concatenation of ``items``."""
    out: list[Expr] = []
    for item in items:
        if item == NOTHING:
            return NOTHING
        for part in item.items if isinstance(item, Seq) else (item,):
            if isinstance(part, Lit) and out and isinstance(out[-1], Lit):
                out[-1] = Lit(out[-1].text + part.text)
            else:
                out.append(part)
    return out[0] if len(out) == 1 else Seq(tuple(out))


def alt(*options: Expr) -> Expr:
    """Any one of ``options`` (an empty option makes the rest optional)."""
    out: list[Expr] = []
    nullable = False
    for option in options:
        for part in option.options if isinstance(option, Alt) else (option,):
            if part == EMPTY:
                nullable = True
            elif part not in out:
                out.append(part)
    body = out[0] if len(out) == 1 else Alt(tuple(out))
    if nullable:
        return rep(body, 0, 1) if out else EMPTY
    return body


def rep(item: Expr, lo: int, hi: int | None) -> Expr:
    """``item`` ``lo`` to ``hi`` times, chunked to stay within llama.cpp's limits."""
    if hi is not None and hi < lo:
        return NOTHING
    if item == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    if item == EMPTY or hi == 0:
        return EMPTY
    if lo == 1 and hi == 1:
        return item
    if isinstance(item, Rep) and item.lo == 0 and item.hi == 1 and lo == 0 and hi == 1:
        return item
    chunk = Rep(item, REPEAT_CHUNK, REPEAT_CHUNK)
    if lo > REPEAT_CHUNK:
        blocks, rest = divmod(lo, REPEAT_CHUNK)
        tail_hi = None if hi is None else hi - blocks * REPEAT_CHUNK
        return seq(rep(chunk, blocks, blocks), rep(item, rest, tail_hi))
    if hi is not None and hi > REPEAT_CHUNK:
        if lo > 0:
            return seq(rep(item, lo, lo), rep(item, 0, hi - lo))
        # Up to (blocks - 1) chunks and at most one chunk more, or exactly
        # `blocks` chunks and the remainder: together 0..hi, nested to a
        # depth that does not grow with hi.
        blocks, rest = divmod(hi, REPEAT_CHUNK)
        return alt(
            seq(rep(chunk, 0, blocks - 1), Rep(item, 0, REPEAT_CHUNK)),
            seq(rep(chunk, blocks, blocks), rep(item, 0, rest)),
        )
    return Rep(item, lo, hi)


def opt(item: Expr) -> Expr:
    """``item`` or nothing."""
    return rep(item, 0, 1)


def chars(spec: str | Sequence[tuple[int, int]], *, negated: bool = False) -> Expr:
    """A character class from the characters of ``spec`` or from code-point ranges."""
    ranges = [(ord(c), ord(c)) for c in spec] if isinstance(spec, str) else list(spec)
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] <= r[1]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    if not merged and not negated:
        return NOTHING
    return Chars(tuple(merged), negated)


def digit_range(lo: int, hi: int) -> Expr:
    """One decimal digit from ``lo`` to ``hi``."""
    return chars([(ord("0") + lo, ord("0") + hi)]) if lo <= hi else NOTHING


DIGIT: Final = digit_range(0, 9)
NONZERO: Final = digit_range(1, 9)
HEX: Final = chars([(ord("0"), ord("9")), (ord("a"), ord("f")), (ord("A"), ord("F"))])


# ---------------------------------------------------------------- rendering


def render(expr: Expr) -> str:
    """``expr`` as the right-hand side of a GBNF rule."""
    if isinstance(expr, Lit):
        return '"' + "".join(_escape_char(ord(c), in_class=False) for c in expr.text) + '"'
    if isinstance(expr, Chars):
        body = "".join(
            _escape_char(lo, in_class=True)
            if lo == hi
            else f"{_escape_char(lo, in_class=True)}-{_escape_char(hi, in_class=True)}"
            for lo, hi in expr.ranges
        )
        return f"[{'^' if expr.negated else ''}{body}]"
    if isinstance(expr, Ref):
        return expr.name
    if isinstance(expr, Alt):
        return " | ".join(render(o) for o in expr.options)
    if isinstance(expr, Rep):
        return _render_atom(expr.item) + _repeat_suffix(expr.lo, expr.hi)
    if not expr.items:
        return '""'
    return " ".join(_render_in_seq(i) for i in expr.items)


def _escape_char(cp: int, *, in_class: bool) -> str:
    special = {ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
    if cp in special:
        return special[cp]
    if in_class and chr(cp) in "[]-^":
        # llama.cpp has no escape for '^'; the others it does, but one hex form is simplest.
        return f"\\x{cp:02X}"
    if not in_class and cp == ord('"'):
        return '\\"'
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}"
    if 0xD800 <= cp <= 0xDFFF or not chr(cp).isprintable():
        return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"
    return chr(cp)


def _render_in_seq(item: Expr) -> str:
    # llama.cpp multiplies the helper-rule counts of all repetitions in one
    # sequence; a group is its own sequence, so counted repetitions get one.
    if isinstance(item, Alt) or (
        isinstance(item, Rep) and _repeat_suffix(item.lo, item.hi)[0] == "{"
    ):
        return f"({render(item)})"
    return render(item)


def _render_atom(item: Expr) -> str:
    simple = isinstance(item, Ref | Chars) or (isinstance(item, Lit) and len(item.text) == 1)
    return render(item) if simple else f"({render(item)})"


def _repeat_suffix(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, 1):
        return "?"
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if hi is None:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"
