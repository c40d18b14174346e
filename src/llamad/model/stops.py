"""From token pieces to reply text: stop sequences and marked sections (SPEC M6).

Tokens arrive one at a time as byte pieces; a character, a stop string or a
marker may be split across any number of them. :class:`TextStream` feeds the
pieces through three stages, each holding back only what it must:

1. an incremental UTF-8 decoder (a multi-byte character split across tokens
   is released once whole);
2. :class:`StopMatcher`, which releases text that can no longer be the start
   of a stop string, and on a match cuts the text at the stop's first
   character (the stop and anything after it are dropped);
3. :class:`MarkerSplitter`, which sorts the released text into reply,
   thinking and tool-call sections (markers removed).

When several stops could match, the one that completes first wins (ties: the
one that starts first); the result does not depend on how the text was split
into tokens, which the property tests check.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

from llamad.model.config import MarkerPair

__all__ = ["MarkerSplitter", "Section", "Segment", "StopMatcher", "TextStream", "held_suffix"]


def held_suffix(text: str, patterns: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a pattern.

    That suffix could still grow into a pattern, so it may not be released.
    """
    best = 0
    for p in patterns:
        for n in range(min(len(p) - 1, len(text)), best, -1):
            if text.endswith(p[:n]):
                best = n
                break
    return best


class StopMatcher:
    """Finds the first stop string in a stream of text."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Text now safe to release; after a match, the text before the stop."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text  # nothing can match, nothing is held (every token of most requests)
        buf = self._held + text
        best: tuple[int, int, str] | None = None
        for stop in self.stops:
            start = buf.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        if best is not None:
            self.matched = best[2]
            self._held = ""
            return buf[: best[1]]
        keep = held_suffix(buf, self.stops)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The end of the stream: what was held can no longer become a stop."""
        out, self._held = self._held, ""
        return "" if self.matched is not None else out


class Section(StrEnum):
    REPLY = "reply"
    THINKING = "thinking"
    TOOL_CALL = "tool_call"


class Segment(NamedTuple):
    section: Section
    text: str
    complete: bool = False
    """For a tool call: the closing marker arrived (its whole text is in ``text``)."""


class MarkerSplitter:
    """Sorts text into reply, thinking and tool-call sections.

    Reply and thinking text is released as it comes; a tool call is gathered
    and released whole when its closing marker arrives (a consumer acts on a
    complete call, never half of one).
    """

    def __init__(self, thinking: MarkerPair | None, tool_call: MarkerPair | None) -> None:
        self._opens: dict[str, tuple[Section, str]] = {}
        if thinking is not None:
            self._opens[thinking.open] = (Section.THINKING, thinking.close)
        if tool_call is not None:
            self._opens[tool_call.open] = (Section.TOOL_CALL, tool_call.close)
        self._section = Section.REPLY
        self._close = ""
        self._held = ""
        self._call: list[str] = []

    def _emit(self, text: str, out: list[Segment]) -> None:
        if not text:
            return
        if self._section is Section.TOOL_CALL:
            self._call.append(text)
        else:
            out.append(Segment(self._section, text))

    def feed(self, text: str) -> list[Segment]:
        if not self._opens:
            # No markers: the text stays in the reply and nothing is held
            # (every token of a model without thinking or tool-call markers).
            return [Segment(Section.REPLY, text)] if text else []
        out: list[Segment] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._section is Section.REPLY:
                hits = [(buf.find(m), m) for m in self._opens]
                hits = [(i, m) for i, m in hits if i >= 0]
                if not hits:
                    keep = held_suffix(buf, list(self._opens))
                    self._emit(buf[: len(buf) - keep], out)
                    self._held = buf[len(buf) - keep :]
                    return out
                i, marker = min(hits, key=lambda h: (h[0], -len(h[1])))
                self._emit(buf[:i], out)
                self._section, self._close = self._opens[marker]
                buf = buf[i + len(marker) :]
            else:
                i = buf.find(self._close)
                if i < 0:
                    keep = held_suffix(buf, (self._close,))
                    self._emit(buf[: len(buf) - keep], out)
                    self._held = buf[len(buf) - keep :]
                    return out
                self._emit(buf[:i], out)
                buf = buf[i + len(self._close) :]
                self._end_section(out)
        return out

    def _end_section(self, out: list[Segment], *, complete: bool = True) -> None:
        if self._section is Section.TOOL_CALL:
            out.append(Segment(Section.TOOL_CALL, "".join(self._call), complete))
            self._call = []
        self._section = Section.REPLY
        self._close = ""

    def flush(self) -> list[Segment]:
        """The end of the stream: held text is released in its section, and an
        unterminated tool call is released as it stands (``complete=False``)."""
        out: list[Segment] = []
        held, self._held = self._held, ""
        self._emit(held, out)
        if self._section is Section.TOOL_CALL:
            self._end_section(out, complete=False)
        return out


class TextStream:
    """Pieces in, segments out: decode, stop matching, sectioning."""

    def __init__(
        self,
        stops: Sequence[str] = (),
        *,
        thinking: MarkerPair | None = None,
        tool_call: MarkerPair | None = None,
    ) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(stops)
        self._splitter = MarkerSplitter(thinking, tool_call)

    @property
    def stopped(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stops.matched

    def feed(self, piece: bytes) -> list[Segment]:
        """One token's piece; returns the segments it released."""
        if self._stops.matched is not None:
            return []
        text = self._decoder.decode(piece)
        return self._splitter.feed(self._stops.feed(text)) if text else []

    def feed_text(self, text: str) -> list[Segment]:
        """Like :meth:`feed` for text already decoded (tests, non-UTF-8 callers)."""
        if self._stops.matched is not None:
            return []
        return self._splitter.feed(self._stops.feed(text))

    def finish(self) -> list[Segment]:
        """The end of generation: release everything still held."""
        out: list[Segment] = []
        if self._stops.matched is None:
            tail = self._decoder.decode(b"", final=True)
            out += self._splitter.feed(self._stops.feed(tail) + self._stops.flush())
        out += self._splitter.flush()
        return out
