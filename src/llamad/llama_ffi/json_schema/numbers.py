"""Numbers within ``minimum``/``maximum`` bounds, as digit-string languages.

Bounds are read as exact decimals and the grammar is built digit by digit,
so a bound is never rounded. Bounded decimals carry no exponent and at most
:data:`FLOAT_DIGITS` significant digits, so the consumer's binary
floating-point parse cannot move a value across a bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from llamad.llama_ffi.json_schema.gbnf import (
    DIGIT,
    EMPTY,
    NONZERO,
    NOTHING,
    Expr,
    Lit,
    alt,
    digit_range,
    rep,
    seq,
)
from llamad.llama_ffi.json_schema.keywords import schema_error

FLOAT_DIGITS: Final = 15  # decimal digits that survive a round trip through a double


@dataclass(frozen=True)
class Bounds:
    """The numeric range a schema's bound keywords allow (``None``: unbounded)."""

    lo: Decimal | None
    lo_incl: bool
    hi: Decimal | None
    hi_incl: bool

    @property
    def unbounded(self) -> bool:
        """Whether neither side is bounded."""
        return self.lo is None and self.hi is None

    def integers(self) -> tuple[int | None, int | None]:
        """The smallest and largest integer within the bounds."""
        lo, hi = self.lo, self.hi
        ilo = None if lo is None else math.ceil(lo) if self.lo_incl else math.floor(lo) + 1
        ihi = None if hi is None else math.floor(hi) if self.hi_incl else math.ceil(hi) - 1
        return ilo, ihi


def read_bounds(schema: Mapping[str, Any], path: str) -> Bounds:
    """The bounds of ``minimum``/``maximum``/``exclusive*`` (draft 4 flags included)."""

    def number(keyword: str) -> Decimal | None:
        value = schema.get(keyword)
        if keyword not in schema:
            return None
        if isinstance(value, bool):
            raise schema_error(path, keyword, "must be a number")
        if not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise schema_error(path, keyword, "must be a finite number")
        try:
            return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        except InvalidOperation as exc:  # pragma: no cover - repr of a finite float parses
            raise schema_error(path, keyword, "must be a finite number") from exc

    lo, lo_incl = number("minimum"), True
    hi, hi_incl = number("maximum"), True
    for keyword, is_lower in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        if keyword not in schema:
            continue
        flag = schema[keyword]
        if isinstance(flag, bool):  # draft 4: a flag on minimum / maximum
            if is_lower:
                lo_incl = not flag or lo is None
            else:
                hi_incl = not flag or hi is None
            continue
        bound = number(keyword)
        if is_lower and bound is not None and (lo is None or bound >= lo):
            lo, lo_incl = bound, False
        elif not is_lower and bound is not None and (hi is None or bound <= hi):
            hi, hi_incl = bound, False
    return Bounds(lo, lo_incl, hi, hi_incl)


def decimal_range(bounds: Bounds) -> Expr:
    """Decimals (no exponent, <= 15 significant digits) within ``bounds``."""
    lo, lo_incl, hi, hi_incl = bounds.lo, bounds.lo_incl, bounds.hi, bounds.hi_incl
    options: list[Expr] = []
    if hi is None or hi > 0 or (hi == 0 and hi_incl):
        start, start_incl = (lo, lo_incl) if lo is not None and lo >= 0 else (Decimal(0), True)
        options.append(_magnitude(start, start_incl, hi, hi_incl))
    if lo is None or lo < 0:
        # -m with m above -hi (or above zero) and up to -lo
        m_lo, m_lo_incl = (-hi, hi_incl) if hi is not None and hi < 0 else (Decimal(0), False)
        m_hi = None if lo is None else -lo
        options.append(seq(Lit("-"), _magnitude(m_lo, m_lo_incl, m_hi, lo_incl)))
    return alt(*options)


def integer_range(lo: int | None, hi: int | None, max_digits: int) -> Expr:
    """Integers in ``[lo, hi]``; an unbounded side stops at ``max_digits`` digits."""

    def uint(a: int, b: int | None) -> Expr:
        cap = len(str(b)) if b is not None else max(len(str(a)), max_digits)
        return alt(*(e for _, e in _uint_by_length(a, b, cap)))

    options: list[Expr] = []
    if hi is None or hi >= 0:
        options.append(uint(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        options.append(seq(Lit("-"), uint(mag_lo, None if lo is None else -lo)))
    return alt(*options)


def _magnitude(lo: Decimal, lo_incl: bool, hi: Decimal | None, hi_incl: bool) -> Expr:
    """Non-negative decimals (no exponent, <= 15 digits) within the bounds."""
    if hi is not None and (hi < lo or (hi == lo and not (lo_incl and hi_incl))):
        return NOTHING
    whole_lo, frac_lo = _split_decimal(lo)
    whole_hi, frac_hi = _split_decimal(hi) if hi is not None else (None, None)

    def with_fraction(integral: Expr, width: int, digits: _Digits) -> Expr:
        budget = FLOAT_DIGITS - width
        if budget < 0:
            return NOTHING
        fraction = seq(Lit("."), digits.nonempty)
        return seq(integral, alt(EMPTY, fraction) if digits.empty else fraction)

    options: list[Expr] = []
    inner_hi = None if whole_hi is None else whole_hi - 1
    for width, integral in _uint_by_length(whole_lo + 1, inner_hi, FLOAT_DIGITS):
        options.append(with_fraction(integral, width, _any_digits(FLOAT_DIGITS - width)))
    width_lo = len(str(whole_lo))
    if whole_hi == whole_lo:
        digits = _fraction_between(frac_lo, lo_incl, frac_hi, hi_incl, FLOAT_DIGITS - width_lo)
        options.append(with_fraction(Lit(str(whole_lo)), width_lo, digits))
    else:
        digits = _fraction_between(frac_lo, lo_incl, None, True, FLOAT_DIGITS - width_lo)
        options.append(with_fraction(Lit(str(whole_lo)), width_lo, digits))
        if whole_hi is not None:
            width_hi = len(str(whole_hi))
            digits = _fraction_between(None, True, frac_hi, hi_incl, FLOAT_DIGITS - width_hi)
            options.append(with_fraction(Lit(str(whole_hi)), width_hi, digits))
    return alt(*options)


# ------------------------------------------------------------ digit languages


@dataclass(frozen=True)
class _Digits:
    """A set of digit strings: whether it holds "" and an expression for the rest."""

    empty: bool
    nonempty: Expr

    def anywhere(self) -> Expr:
        return alt(EMPTY, self.nonempty) if self.empty else self.nonempty


def _any_digits(budget: int) -> _Digits:
    return _Digits(True, rep(DIGIT, 1, budget) if budget > 0 else NOTHING)


def _fraction_between(
    lo: str | None, lo_incl: bool, hi: str | None, hi_incl: bool, budget: int
) -> _Digits:
    """Digit strings ``d`` (at most ``budget`` long) with ``0.d`` within the bounds.

    Bounds are digit strings without trailing zeros (``""`` is zero); ``None``
    means unbounded on that side.
    """
    if lo == "" and lo_incl:
        lo = None
    if hi == "" and not hi_incl:
        return _Digits(False, NOTHING)
    if lo is None and hi is None:
        return _any_digits(budget)
    if lo == "" and hi == "":
        return _Digits(False, NOTHING)
    if lo is None and hi == "":
        return _Digits(True, rep(Lit("0"), 1, budget) if budget > 0 else NOTHING)
    empty = lo is None and (hi is None or hi != "" or hi_incl)
    if budget <= 0:
        return _Digits(empty, NOTHING)
    if lo == "" and hi is None:
        return _Digits(False, _positive_digits(budget))
    first_lo = None if lo is None else int(lo[0]) if lo else 0
    first_hi = None if hi is None else int(hi[0]) if hi else 0
    free_lo = 0 if first_lo is None else first_lo + 1
    free_hi = 9 if first_hi is None else first_hi - 1
    options: list[Expr] = [seq(digit_range(free_lo, free_hi), _any_digits(budget - 1).anywhere())]
    for d in sorted({x for x in (first_lo, first_hi) if x is not None}):
        rest_lo = lo[1:] if lo is not None and first_lo == d else None
        rest_hi = hi[1:] if hi is not None and first_hi == d else None
        if (first_lo is not None and d < first_lo) or (first_hi is not None and d > first_hi):
            continue
        tail = _fraction_between(rest_lo, lo_incl, rest_hi, hi_incl, budget - 1)
        options.append(seq(Lit(str(d)), tail.anywhere()))
    return _Digits(empty, alt(*options))


def _positive_digits(budget: int) -> Expr:
    """Digit strings of at most ``budget`` digits, not all zero."""
    if budget <= 0:
        return NOTHING
    return alt(
        seq(NONZERO, rep(DIGIT, 0, budget - 1)),
        seq(Lit("0"), _positive_digits(budget - 1)),
    )


def _same_length_range(lo: str, hi: str) -> Expr:
    """Equal-length digit strings between ``lo`` and ``hi`` inclusive."""
    if lo == hi:
        return Lit(lo)
    if len(lo) == 1:
        return digit_range(int(lo), int(hi))
    if lo[0] == hi[0]:
        return seq(Lit(lo[0]), _same_length_range(lo[1:], hi[1:]))
    n = len(lo) - 1
    lo_full = lo[1:] == "0" * n
    hi_full = hi[1:] == "9" * n
    first = int(lo[0]) + (0 if lo_full else 1)
    last = int(hi[0]) - (0 if hi_full else 1)
    options = []
    if not lo_full:
        options.append(seq(Lit(lo[0]), _same_length_range(lo[1:], "9" * n)))
    options.append(seq(digit_range(first, last), rep(DIGIT, n, n)))
    if not hi_full:
        options.append(seq(Lit(hi[0]), _same_length_range("0" * n, hi[1:])))
    return alt(*options)


def _uint_by_length(lo: int, hi: int | None, max_len: int) -> Iterator[tuple[int, Expr]]:
    """(digit count, expression) for canonical decimals of the integers in [lo, hi]."""
    if hi is not None and hi < lo:
        return
    top = len(str(hi)) if hi is not None else max_len
    for length in range(len(str(lo)), min(top, max_len) + 1):
        first = max(lo, 10 ** (length - 1) if length > 1 else 0)
        last = 10**length - 1 if hi is None else min(hi, 10**length - 1)
        if first <= last:
            yield length, _same_length_range(str(first), str(last))


def _split_decimal(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal as (integral part, fraction digits without trailing zeros)."""
    whole = int(value)
    frac = value - whole
    digits = format(frac, "f").partition(".")[2].rstrip("0") if frac else ""
    return whole, digits
