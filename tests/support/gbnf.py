"""A small GBNF reader, recognizer and sampler, for the JSON Schema tests.

The JSON Schema tests check generated grammars with this module rather than
trusting the converter's own data structures: ``parse_gbnf`` reads the text
the way llama.cpp's ``llama-grammar.cpp`` does (same escapes, same rewriting
of ``x{m,n}`` into helper rules, same repetition limits, which it reports as
errors instead of llama.cpp's silent clamping), ``Grammar.accepts`` runs
Earley's algorithm over code points, and ``Grammar.sample`` draws random
strings from the language. ``tests/unit/llama_ffi/test_json_schema_gbnf.py`` keeps it honest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

Terminal = tuple[tuple[tuple[int, int], ...], bool]  # (ranges, negated)
Symbol = str | Terminal  # a rule name or a terminal

LLAMA_REPETITION_LIMIT = 2000  # MAX_REPETITION_THRESHOLD in llama-grammar.cpp


class GbnfError(ValueError):
    """The text is not a grammar llama.cpp would accept with this meaning."""


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0
        self.rules: dict[str, list[tuple[Symbol, ...]]] = {}
        self.referenced: set[str] = set()
        self._fresh = 0

    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.src[i] if i < len(self.src) else ""

    def space(self, newline_ok: bool) -> None:
        while self.peek() and (self.peek() in " \t#" or (newline_ok and self.peek() in "\r\n")):
            if self.peek() == "#":
                while self.peek() and self.peek() not in "\r\n":
                    self.pos += 1
            else:
                self.pos += 1

    def name(self) -> str:
        start = self.pos
        while self.peek() and _is_word(self.peek()):
            self.pos += 1
        if start == self.pos:
            raise GbnfError(f"expecting name at {self.src[start : start + 20]!r}")
        return self.src[start : self.pos]

    def char(self) -> int:
        c = self.peek()
        if not c:
            raise GbnfError("unexpected end of input")
        if c != "\\":
            self.pos += 1
            return ord(c)
        kind = self.peek(1)
        widths = {"x": 2, "u": 4, "U": 8}
        if kind in widths:
            digits = self.src[self.pos + 2 : self.pos + 2 + widths[kind]]
            if len(digits) != widths[kind] or any(
                d not in "0123456789abcdefABCDEF" for d in digits
            ):
                raise GbnfError(f"bad \\{kind} escape")
            self.pos += 2 + widths[kind]
            return int(digits, 16)
        simple = {
            "t": "\t",
            "r": "\r",
            "n": "\n",
            "\\": "\\",
            '"': '"',
            "[": "[",
            "]": "]",
            "-": "-",
        }
        if kind not in simple:
            raise GbnfError(f"unknown escape \\{kind}")
        self.pos += 2
        return ord(simple[kind])

    def fresh(self, base: str) -> str:
        self._fresh += 1
        return f"{base}#{self._fresh}"  # '#' cannot occur in a GBNF name

    def parse(self) -> dict[str, list[tuple[Symbol, ...]]]:
        self.space(True)
        while self.peek():
            name = self.name()
            self.space(False)
            if self.src[self.pos : self.pos + 3] != "::=":
                raise GbnfError(f"expecting ::= after {name!r}")
            self.pos += 3
            self.space(True)
            if name in self.rules:
                raise GbnfError(f"rule {name!r} defined twice")
            self.rules[name] = self.alternates(name, nested=False)
            if self.peek() == "\r":
                self.pos += 2 if self.peek(1) == "\n" else 1
            elif self.peek() == "\n":
                self.pos += 1
            elif self.peek():
                raise GbnfError(
                    f"expecting newline or end at {self.src[self.pos : self.pos + 20]!r}"
                )
            self.space(True)
        missing = self.referenced - self.rules.keys()
        if missing:
            raise GbnfError(f"undefined rules: {sorted(missing)}")
        if "root" not in self.rules:
            raise GbnfError("no root rule")
        return self.rules

    def alternates(self, rule: str, *, nested: bool) -> list[tuple[Symbol, ...]]:
        alts = [self.sequence(rule, nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            alts.append(self.sequence(rule, nested))
        return alts

    def sequence(self, rule: str, nested: bool) -> tuple[Symbol, ...]:
        seq: list[Symbol] = []
        last = 0
        n_prev_rules = 1
        while self.peek():
            c = self.peek()
            if c == '"':
                self.pos += 1
                last = len(seq)
                while self.peek() != '"':
                    cp = self.char()
                    seq.append((((cp, cp),), False))
                self.pos += 1
            elif c == "[":
                self.pos += 1
                last = len(seq)
                negated = self.peek() == "^"
                self.pos += negated
                ranges = []
                while self.peek() != "]":
                    lo = self.char()
                    hi = lo
                    if self.peek() == "-" and self.peek(1) != "]":
                        self.pos += 1
                        hi = self.char()
                    ranges.append((lo, hi))
                self.pos += 1
                seq.append((tuple(ranges), negated))
            elif c == ".":
                self.pos += 1
                last = len(seq)
                seq.append(((), True))
            elif _is_word(c):
                last = len(seq)
                ref = self.name()
                self.referenced.add(ref)
                seq.append(ref)
            elif c == "(":
                self.pos += 1
                self.space(True)
                last = len(seq)
                sub = self.fresh(rule)
                self.rules[sub] = self.alternates(rule, nested=True)
                if self.peek() != ")":
                    raise GbnfError("expecting ')'")
                self.pos += 1
                seq.append(sub)
            elif c in "*+?{":
                lo, hi = self.repetition()
                if last == len(seq):
                    raise GbnfError("repetition without a preceding item")
                total = hi if hi is not None and hi > 0 else (lo if lo > 0 else 1)
                if n_prev_rules * total > LLAMA_REPETITION_LIMIT:
                    raise GbnfError("repetitions in one sequence exceed llama.cpp's limit")
                seq[last:] = self.expand(rule, tuple(seq[last:]), lo, hi)
                n_prev_rules *= total
            else:
                break
            self.space(nested)
        return tuple(seq)

    def repetition(self) -> tuple[int, int | None]:
        c = self.peek()
        self.pos += 1
        if c in "*+?":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        self.space(False)
        lo = self.integer()
        hi: int | None = lo
        self.space(False)
        if self.peek() == ",":
            self.pos += 1
            self.space(False)
            hi = self.integer() if self.peek().isdigit() else None
            self.space(False)
        if self.peek() != "}":
            raise GbnfError("expecting '}'")
        self.pos += 1
        if lo > LLAMA_REPETITION_LIMIT or (hi is not None and hi > LLAMA_REPETITION_LIMIT):
            # llama.cpp refuses the first and silently drops the second bound
            raise GbnfError(f"repetition {{{lo},{hi}}} beyond llama.cpp's limit")
        return lo, hi

    def integer(self) -> int:
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise GbnfError("expecting an integer")
        return int(self.src[start : self.pos])

    def expand(self, rule: str, item: tuple[Symbol, ...], lo: int, hi: int | None) -> list[Symbol]:
        out: list[Symbol] = list(item * lo)
        if hi is None:
            rec = self.fresh(rule)
            self.rules[rec] = [(*item, rec), ()]
            out.append(rec)
            return out
        last: str | None = None
        for _ in range(hi - lo):
            rec = self.fresh(rule)
            self.rules[rec] = [(*item, last) if last else item, ()]
            last = rec
        if last:
            out.append(last)
        return out


def _matches(term: Terminal, cp: int) -> bool:
    ranges, negated = term
    return any(lo <= cp <= hi for lo, hi in ranges) != negated


_POOL = [
    *range(0x20, 0x7F),
    0x09,
    0x0A,
    0x0D,
    0x00,
    0x1F,
    0x7F,
    0x85,
    0xE9,
    0xDF,
    0x4E2D,
    0x2028,
    0x1F600,
]


@dataclass
class Grammar:
    rules: dict[str, list[tuple[Symbol, ...]]]
    nullable: set[str] = field(default_factory=set)
    height: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        changed = True
        while changed:
            changed = False
            for name, alts in self.rules.items():
                if name not in self.nullable and any(
                    all(isinstance(s, str) and s in self.nullable for s in alt) for alt in alts
                ):
                    self.nullable.add(name)
                    changed = True
        changed = True
        while changed:
            changed = False
            for name, alts in self.rules.items():
                best = min((h for h in map(self._alt_height, alts) if h is not None), default=None)
                if best is not None and best + 1 < self.height.get(name, 1 << 30):
                    self.height[name] = best + 1
                    changed = True

    def _alt_height(self, alt: tuple[Symbol, ...]) -> int | None:
        heights = [0 if not isinstance(s, str) else self.height.get(s) for s in alt]
        return None if None in heights else max((h for h in heights if h is not None), default=0)

    def accepts(self, text: str, start: str = "root") -> bool:
        """Earley recognition with the Aycock-Horspool treatment of nullable rules."""
        n = len(text)
        chart: list[set[tuple[str, int, int, int]]] = [set() for _ in range(n + 1)]
        waiting: list[dict[str, list[tuple[str, int, int, int]]]] = [{} for _ in range(n + 1)]
        for k in range(len(self.rules[start])):
            chart[0].add((start, k, 0, 0))
        for i in range(n + 1):
            agenda = list(chart[i])
            cp = ord(text[i]) if i < n else -1

            def add(
                item: tuple[str, int, int, int],
                i: int = i,
                agenda: list[tuple[str, int, int, int]] = agenda,
            ) -> None:
                if item not in chart[i]:
                    chart[i].add(item)
                    agenda.append(item)

            while agenda:
                item = agenda.pop()
                name, k, dot, origin = item
                body = self.rules[name][k]
                if dot < len(body):
                    sym = body[dot]
                    if isinstance(sym, str):
                        waiting[i].setdefault(sym, []).append(item)
                        for k2 in range(len(self.rules[sym])):
                            add((sym, k2, 0, i))
                        if sym in self.nullable:
                            # a completion at this position came from an empty derivation
                            add((name, k, dot + 1, origin))
                    elif i < n and _matches(sym, cp):
                        chart[i + 1].add((name, k, dot + 1, origin))
                else:
                    for parent in list(waiting[origin].get(name, ())):
                        add((parent[0], parent[1], parent[2] + 1, parent[3]))
            if i < n and not chart[i + 1]:
                return False
        return any(
            it[0] == start and it[3] == 0 and it[2] == len(self.rules[start][it[1]])
            for it in chart[n]
        )

    def sample(self, rng: random.Random, start: str = "root", max_depth: int = 40) -> str:
        """A random string of the language; past ``max_depth`` it heads for the shortest exit."""
        if start not in self.height:
            raise GbnfError(f"{start!r} derives no finite string")
        out: list[str] = []
        stack: list[tuple[Symbol, int]] = [(start, 0)]
        while stack:
            sym, depth = stack.pop()
            if not isinstance(sym, str):
                out.append(chr(self._pick(sym, rng)))
                continue
            alts = [a for a in self.rules[sym] if self._alt_height(a) is not None]
            if depth > max_depth:
                alt = min(alts, key=lambda a: self._alt_height(a) or 0)
            else:
                alt = rng.choice(alts)
            stack.extend((s, depth + 1) for s in reversed(alt))
        return "".join(out)

    @staticmethod
    def _pick(term: Terminal, rng: random.Random) -> int:
        ranges, negated = term
        if not negated:
            lo, hi = rng.choice(ranges)
            inside = [cp for cp in _POOL if lo <= cp <= hi]
            return rng.choice(inside) if inside and rng.random() < 0.5 else rng.randint(lo, hi)
        choices = [cp for cp in _POOL if _matches(term, cp)]
        if not choices:
            raise GbnfError("negated class excludes the whole sample pool")
        return rng.choice(choices)


def parse_gbnf(text: str) -> Grammar:
    """Read GBNF as llama.cpp would; raise :class:`GbnfError` where it would not."""
    grammar = Grammar(_Parser(text).parse())
    _check_left_recursion(grammar)
    return grammar


def _check_left_recursion(grammar: Grammar) -> None:
    leading: dict[str, set[str]] = {}
    for name, alts in grammar.rules.items():
        firsts: set[str] = set()
        for alt in alts:
            for sym in alt:
                if not isinstance(sym, str):
                    break
                firsts.add(sym)
                if sym not in grammar.nullable:
                    break
        leading[name] = firsts
    for start in grammar.rules:
        stack, seen = list(leading[start]), set()
        while stack:
            name = stack.pop()
            if name == start:
                raise GbnfError(f"left recursion through {start!r}")
            if name not in seen:
                seen.add(name)
                stack.extend(leading[name])
