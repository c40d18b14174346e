"""String ``format`` values as grammars: RFC 3339 ``date``/``time``/``date-time`` and ``uuid``.

Dates are calendar-exact (month lengths, leap years, no year zero) so every
generated date parses with :mod:`datetime`.
"""

from __future__ import annotations

from typing import Final

from llamad.llama_ffi.json_schema.gbnf import (
    DIGIT,
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
from llamad.llama_ffi.json_schema.rules import Rules

FORMATS: Final = ("date", "time", "date-time", "uuid")


def format_rule(rules: Rules, fmt: str) -> Ref:
    """The helper rule for the string contents of format ``fmt`` (one of :data:`FORMATS`)."""
    two = rep(DIGIT, 2, 2)
    day28 = alt(seq(Lit("0"), NONZERO), seq(Lit("1"), DIGIT), seq(Lit("2"), digit_range(0, 8)))
    day30 = alt(day28, Lit("29"), Lit("30"))
    day31 = alt(day30, Lit("31"))
    by4 = alt(
        seq(Lit("0"), chars("48")),
        seq(chars("2468"), chars("048")),
        seq(chars("13579"), chars("26")),
    )

    def date() -> Expr:
        year = alt(  # 0001..9999: Python's date and RFC 3339 have no year zero
            seq(Lit("000"), NONZERO),
            seq(Lit("00"), NONZERO, DIGIT),
            seq(Lit("0"), NONZERO, two),
            seq(NONZERO, rep(DIGIT, 3, 3)),
        )
        leap_year = alt(seq(two, by4), seq(by4, Lit("00")))
        month_day = alt(
            seq(
                alt(seq(Lit("0"), chars("13578")), seq(Lit("1"), chars("02"))),
                Lit("-"),
                day31,
            ),
            seq(alt(seq(Lit("0"), chars("469")), Lit("11")), Lit("-"), day30),
            seq(Lit("02-"), day28),
        )
        return alt(seq(year, Lit("-"), month_day), seq(leap_year, Lit("-02-29")))

    def time() -> Expr:
        hour = alt(seq(chars("01"), DIGIT), seq(Lit("2"), digit_range(0, 3)))
        sixty = seq(digit_range(0, 5), DIGIT)
        offset = alt(Lit("Z"), seq(chars("+-"), hour, Lit(":"), sixty))
        fraction = opt(seq(Lit("."), rep(DIGIT, 1, 9)))
        return seq(hour, Lit(":"), sixty, Lit(":"), sixty, fraction, offset)

    def uuid() -> Expr:
        groups = [rep(HEX, n, n) for n in (8, 4, 4, 4, 12)]
        return seq(groups[0], *(seq(Lit("-"), g) for g in groups[1:]))

    builders = {
        "date": date,
        "time": time,
        "uuid": uuid,
        "date-time": lambda: seq(format_rule(rules, "date"), Lit("T"), format_rule(rules, "time")),
    }
    return rules.builtin(f"{fmt}-format", builders[fmt])
