"""Every problem of a configuration, gathered before any is reported.

A user fixing a config wants every mistake at once, so validation never stops
at the first: each check adds a :class:`Problem` (the key path it is about and
what was expected) to a :class:`Problems`, and :meth:`Problems.raise_if_any`
turns them into one :class:`~llamad.errors.ConfigError` whose message lists
them all, in the order they were found. ``details["errors"]`` keeps them
apart for a program (``key``, ``problem``, ``source``); ``details["field"]``
is the first key, as every other ``config_error`` names its field.

A key path is a tuple of segments (``("models", "smol", "n_ctx")``), shown
the way TOML writes it (``models.smol.n_ctx``; a segment that is not a bare
key is quoted: ``models."llama.3".n_ctx``). A value that came from an
environment variable says so (``(from LLAMAD_MODELS__SMOL__N_CTX)``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from llamad.errors import ConfigError

__all__ = ["KeyPath", "Problem", "Problems", "format_key"]

KeyPath = tuple[str, ...]

_BARE_KEY: Final = re.compile(r"^[A-Za-z0-9_-]+$")


def format_key(path: KeyPath) -> str:
    """``path`` as TOML writes a dotted key (``models."a.b".n_ctx``)."""
    return ".".join(p if _BARE_KEY.fullmatch(p) else json.dumps(p) for p in path)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the configuration.

    ``key``: the key path it is about (empty: the file as a whole).
    ``source``: where the value came from (``None``: the file or a default;
    else the environment variable's name).
    """

    key: KeyPath
    problem: str
    source: str | None = None

    def __str__(self) -> str:
        where = format_key(self.key) if self.key else "config"
        if self.source is not None:
            where = f"{where} (from {self.source})"
        return f"{where}: {self.problem}"


class Problems:
    """The problems found so far, with where each value came from.

    ``origins`` maps a key path to the environment variable that set it; a
    problem about that key, or about anything inside it, names the variable.
    """

    def __init__(self, origins: Mapping[KeyPath, str] | None = None) -> None:
        self.items: list[Problem] = []
        self.origins: dict[KeyPath, str] = dict(origins or {})

    def add(self, key: KeyPath, problem: str) -> None:
        self.items.append(Problem(key, problem, self.source_of(key)))

    def source_of(self, key: KeyPath) -> str | None:
        for n in range(len(key), 0, -1):
            found = self.origins.get(key[:n])
            if found is not None:
                return found
        return None

    def has(self, key: KeyPath) -> bool:
        """Whether a problem about exactly ``key`` was found."""
        return any(p.key == key for p in self.items)

    def about(self, prefix: KeyPath) -> bool:
        """Whether any problem so far is about ``prefix`` or a key inside it."""
        return any(p.key[: len(prefix)] == prefix for p in self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self, what: str) -> None:
        """Raise one :class:`ConfigError` listing every problem (``what``: the file)."""
        if not self.items:
            return
        count = len(self.items)
        lines = "\n".join(f"  {p}" for p in self.items)
        noun = "problem" if count == 1 else "problems"
        first = self.items[0]
        raise ConfigError(
            f"invalid configuration ({what}): {count} {noun}\n{lines}",
            details={
                "field": format_key(first.key) if first.key else "config",
                "errors": [
                    {"key": format_key(p.key), "problem": p.problem, "source": p.source}
                    for p in self.items
                ],
            },
        )
