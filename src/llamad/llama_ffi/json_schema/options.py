"""Options for :func:`~llamad.llama_ffi.json_schema.json_schema_to_gbnf`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from llamad.errors import BadRequest

Whitespace: TypeAlias = Literal["limited", "none"]


@dataclass(frozen=True)
class GrammarOptions:
    """How the generated grammar spends the model's freedom.

    ``whitespace="none"`` forces compact JSON (fewest tokens); ``"limited"``
    allows the readable forms models like to write, bounded by
    ``max_indent`` so a model cannot loop on whitespace. ``max_digits`` bounds
    the integral and fractional digits of unbounded numbers.
    """

    whitespace: Whitespace = "limited"
    max_indent: int = 20
    max_digits: int = 16

    def __post_init__(self) -> None:
        if self.whitespace not in ("limited", "none"):
            raise BadRequest(
                f"whitespace: must be 'limited' or 'none', not {self.whitespace!r}",
                details={"field": "whitespace"},
            )
        if not isinstance(self.max_indent, int) or not 0 <= self.max_indent <= 200:
            raise BadRequest(
                f"max_indent: must be an int in [0, 200], not {self.max_indent!r}",
                details={"field": "max_indent"},
            )
        if not isinstance(self.max_digits, int) or not 1 <= self.max_digits <= 100:
            raise BadRequest(
                f"max_digits: must be an int in [1, 100], not {self.max_digits!r}",
                details={"field": "max_digits"},
            )
