"""The rules for JSON that no schema narrows: any value, string, number, ...

Each is a helper rule defined once per grammar, on first use, so a grammar
only carries the generic rules its schema needs.
"""

from __future__ import annotations

from typing import Final

from llamad.llama_ffi.json_schema.gbnf import (
    DIGIT,
    EMPTY,
    HEX,
    NONZERO,
    Expr,
    Lit,
    Ref,
    alt,
    chars,
    digit_range,
    opt,
    rep,
    seq,
)
from llamad.llama_ffi.json_schema.options import GrammarOptions
from llamad.llama_ffi.json_schema.rules import Rules

# Code-point ranges a JSON string must escape.
STRING_EXCLUDED: Final = ((0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\")))


def unescaped(c: str) -> bool:
    """Whether a JSON string may hold ``c`` as itself."""
    cp = ord(c)
    return not any(lo <= cp <= hi for lo, hi in STRING_EXCLUDED)


class JsonRules:
    """Generic JSON rules in ``rules``, shaped by ``options``."""

    def __init__(self, rules: Rules, options: GrammarOptions) -> None:
        self._rules = rules
        self._opts = options

    def ws(self) -> Expr:
        """Whitespace allowed after ``{ [ , :`` and before ``} ]``."""
        if self._opts.whitespace == "none":
            return EMPTY
        indent = rep(chars(" \t"), 0, self._opts.max_indent)
        return self._rules.builtin("ws", lambda: opt(alt(Lit(" "), seq(Lit("\n"), indent))))

    def char(self) -> Ref:
        """One character of a JSON string (no ``\\u`` escape of a surrogate half)."""

        def build() -> Expr:
            not_surrogate = alt(
                seq(chars("0123456789abcABCefEF"), rep(HEX, 3, 3)),
                seq(chars("dD"), digit_range(0, 7), rep(HEX, 2, 2)),
            )
            escape = alt(chars('"\\/bfnrt'), seq(Lit("u"), not_surrogate))
            return alt(chars(STRING_EXCLUDED, negated=True), seq(Lit("\\"), escape))

        return self._rules.builtin("char", build)

    def string(self) -> Ref:
        """Any JSON string."""
        return self._rules.builtin(
            "string", lambda: seq(Lit('"'), rep(self.char(), 0, None), Lit('"'))
        )

    def integer(self) -> Ref:
        """An integer of at most ``max_digits`` digits, never ``-0``."""
        digits = self._opts.max_digits
        magnitude = seq(NONZERO, rep(DIGIT, 0, digits - 1))
        return self._rules.builtin("integer", lambda: alt(Lit("0"), seq(opt(Lit("-")), magnitude)))

    def number(self) -> Ref:
        """A JSON number with bounded digits and a two-digit exponent."""

        def build() -> Expr:
            digits = self._opts.max_digits
            integral = alt(Lit("0"), seq(NONZERO, rep(DIGIT, 0, digits - 1)))
            fraction = seq(Lit("."), rep(DIGIT, 1, digits))
            exponent = seq(chars("eE"), opt(chars("+-")), rep(DIGIT, 1, 2))
            return seq(opt(Lit("-")), integral, opt(fraction), opt(exponent))

        return self._rules.builtin("number", build)

    def value(self) -> Ref:
        """Any JSON value."""

        def build() -> Expr:
            return alt(
                self.object(), self.array(), self.string(), self.number(),
                Lit("true"), Lit("false"), Lit("null"),
            )  # fmt: skip

        return self._rules.builtin("value", build)

    def object(self) -> Ref:
        """Any JSON object."""

        def build() -> Expr:
            member = seq(self.string(), Lit(":"), self.ws(), self.value())
            return self.container("{", member, "}")

        return self._rules.builtin("object", build)

    def array(self) -> Ref:
        """Any JSON array."""
        return self._rules.builtin("array", lambda: self.container("[", self.value(), "]"))

    def container(self, open_: str, item: Expr, close: str) -> Expr:
        """``open (item (, item)*)? close`` with bounded whitespace."""
        items = seq(item, rep(seq(Lit(","), self.ws(), item), 0, None))
        return self.wrap(open_, items, True, close)

    def wrap(self, open_: str, body: Expr, allows_empty: bool, close: str) -> Expr:
        """``open body close`` (``body`` optional if ``allows_empty``) with bounded whitespace."""
        ws = self.ws()
        inner = seq(body, ws)
        return seq(Lit(open_), ws, alt(inner, EMPTY) if allows_empty else inner, Lit(close))
