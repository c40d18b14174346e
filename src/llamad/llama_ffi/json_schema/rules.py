"""The rule table of a grammar under construction, and the passes that finish it.

Rules are named on demand (identical expressions share one name). Once the
schema walk is done, :meth:`Rules.prune` drops what derives no string or is
unreachable, :meth:`Rules.left_recursive` finds a cycle llama.cpp would loop
on, :meth:`Rules.inline_aliases` removes single-use ``a ::= b`` indirection
and :meth:`Rules.render` writes the GBNF text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

from llamad.llama_ffi.json_schema.gbnf import (
    EMPTY,
    NOTHING,
    Alt,
    Chars,
    Expr,
    Lit,
    Ref,
    Rep,
    Seq,
    alt,
    render,
    rep,
    seq,
)


class Rules:
    """Named rules; identical expressions share one name."""

    def __init__(self) -> None:
        self.defs: dict[str, Expr] = {}
        self._reserved: set[str] = set()
        self._builtins: dict[str, str] = {}
        self._by_expr: dict[Expr, str] = {}

    def reserve(self, hint: str) -> str:
        """A fresh rule name derived from ``hint``."""
        base = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-") or "r"
        name, n = base, 1
        while name in self._reserved:
            n += 1
            name = f"{base}-{n}"
        self._reserved.add(name)
        return name

    def define(self, name: str, expr: Expr) -> None:
        """Give the reserved rule ``name`` its body."""
        self.defs[name] = expr
        self._by_expr.setdefault(expr, name)

    def named(self, hint: str, expr: Expr) -> Expr:
        """A reference to a rule for ``expr`` (small expressions stay inline)."""
        if isinstance(expr, Ref | Lit | Chars) or expr in (EMPTY, NOTHING):
            return expr
        existing = self._by_expr.get(expr)
        if existing is None:
            existing = self.reserve(hint)
            self.define(existing, expr)
        return Ref(existing)

    def builtin(self, key: str, build: Callable[[], Expr]) -> Ref:
        """The helper rule ``key`` (named so unless a schema name took it), built once."""
        name = self._builtins.get(key)
        if name is None:
            # Reserve before building: the generic rules are mutually recursive.
            name = self._builtins[key] = self.reserve(key)
            self.define(name, build())
        return Ref(name)

    # -- finishing passes

    def prune(self, root: str) -> None:
        """Drop rules that derive no finite string, then unreachable ones.

        ``root`` is always kept; it is :data:`~.gbnf.NOTHING` when it derives nothing.
        """
        productive = _deriving(self.defs, empty=False)
        defs = {n: _substitute_dead(e, productive) for n, e in self.defs.items() if n in productive}
        defs.setdefault(root, NOTHING)
        reachable: list[str] = [root]
        seen = {root}
        while reachable:
            for ref in _refs(defs[reachable.pop()]):
                if ref not in seen:
                    seen.add(ref)
                    reachable.append(ref)
        self.defs = {n: e for n, e in defs.items() if n in seen}

    def left_recursive(self) -> str | None:
        """A rule that can reach itself without consuming input, if any."""
        nullable = _deriving(self.defs, empty=True)
        leading = {n: _leading_refs(e, nullable) for n, e in self.defs.items()}
        for start in self.defs:
            stack, seen = list(leading[start]), set()
            while stack:
                name = stack.pop()
                if name == start:
                    return start
                if name not in seen:
                    seen.add(name)
                    stack.extend(leading.get(name, ()))
        return None

    def inline_aliases(self) -> None:
        """``a ::= b`` where nothing else uses ``b``: give ``a`` the body of ``b``."""
        defs = self.defs
        uses: dict[str, int] = {}
        for expr in defs.values():
            for ref in _refs(expr):
                uses[ref] = uses.get(ref, 0) + 1
        for name in list(defs):
            target = defs.get(name)
            while isinstance(target, Ref) and target.name != name and uses.get(target.name) == 1:
                defs[name] = target = defs.pop(target.name)

    def render(self, root: str) -> str:
        """The GBNF text, ``root`` first."""
        order = [root] + [n for n in self.defs if n != root]
        return "".join(f"{n} ::= {render(self.defs[n])}\n" for n in order)


# ----------------------------------------------------------------- analyses


def _deriving(defs: Mapping[str, Expr], *, empty: bool) -> set[str]:
    """The rules that derive some finite string (``empty``: the empty string)."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, expr in defs.items():
            if name not in found and _derives(expr, found, empty=empty):
                found.add(name)
                changed = True
    return found


def _derives(expr: Expr, deriving: set[str], *, empty: bool) -> bool:
    """Whether ``expr`` derives some finite string (``empty``: the empty string),
    given the rules known to."""
    if isinstance(expr, Lit):
        return not (empty and expr.text)
    if isinstance(expr, Chars):
        return not empty
    if isinstance(expr, Ref):
        return expr.name in deriving
    if isinstance(expr, Seq):
        return all(_derives(i, deriving, empty=empty) for i in expr.items)
    if isinstance(expr, Alt):
        return any(_derives(o, deriving, empty=empty) for o in expr.options)
    return expr.lo == 0 or _derives(expr.item, deriving, empty=empty)


def _substitute_dead(expr: Expr, productive: set[str]) -> Expr:
    if isinstance(expr, Ref):
        return expr if expr.name in productive else NOTHING
    if isinstance(expr, Seq):
        return seq(*(_substitute_dead(i, productive) for i in expr.items))
    if isinstance(expr, Alt):
        return alt(*(_substitute_dead(o, productive) for o in expr.options))
    if isinstance(expr, Rep):
        return rep(_substitute_dead(expr.item, productive), expr.lo, expr.hi)
    return expr


def _refs(expr: Expr) -> Iterator[str]:
    if isinstance(expr, Ref):
        yield expr.name
    elif isinstance(expr, Seq):
        for i in expr.items:
            yield from _refs(i)
    elif isinstance(expr, Alt):
        for o in expr.options:
            yield from _refs(o)
    elif isinstance(expr, Rep):
        yield from _refs(expr.item)


def _leading_refs(expr: Expr, nullable: set[str]) -> set[str]:
    """Rules that can be entered before ``expr`` consumes a character."""
    if isinstance(expr, Ref):
        return {expr.name}
    if isinstance(expr, Seq):
        out: set[str] = set()
        for item in expr.items:
            out |= _leading_refs(item, nullable)
            if not _derives(item, nullable, empty=True):
                break
        return out
    if isinstance(expr, Alt):
        return set().union(*(_leading_refs(o, nullable) for o in expr.options))
    if isinstance(expr, Rep):
        return _leading_refs(expr.item, nullable)
    return set()
