"""Stop sequences and marked sections, however the text is split into tokens (SPEC M6)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.model.config import MarkerPair
from llamad.model.stops import Section, StopMatcher, TextStream, held_suffix

pytestmark = pytest.mark.timeout(120)

THINK = MarkerPair("<think>", "</think>")
TOOL = MarkerPair("<tool_call>", "</tool_call>")


def reference_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Character by character: the first prefix that contains a stop ends the text."""
    for end in range(1, len(text) + 1):
        head = text[:end]
        found = [(head.find(s), s) for s in stops if s and head.find(s) >= 0]
        if found:
            start, stop = min(found)
            return text[:start], stop
    return text, None


def split(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(text)]:
        pieces.append(text[last:p])
        last = p
    return pieces


def run_stops(pieces: Sequence[str], stops: Sequence[str]) -> tuple[str, str | None]:
    matcher = StopMatcher(stops)
    out = "".join(matcher.feed(p) for p in pieces) + matcher.flush()
    return out, matcher.matched


def test_a_stop_split_across_tokens_is_found_and_trimmed() -> None:
    out, stop = run_stops(["Hello wor", "ld\n", "\nUser:", " more"], ["\n\nUser:"])
    assert (out, stop) == ("Hello world", "\n\nUser:")


def test_text_that_might_start_a_stop_is_held_then_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("abcST") == "abc"
    assert matcher.feed("x") == "STx"
    assert matcher.flush() == ""


def test_the_stop_that_completes_first_wins() -> None:
    assert run_stops(["xabc"], ["abc", "b"]) == ("xa", "b")
    assert run_stops(["xab", "c"], ["abc", "b"]) == ("xa", "b")
    assert run_stops(["ab"], ["ab", "b"]) == ("", "ab")


def test_held_suffix_is_the_longest_proper_prefix_of_any_pattern() -> None:
    assert held_suffix("xx<thi", ["<think>"]) == 4
    assert held_suffix("xx<think>", ["<think>"]) == 0
    assert held_suffix("aab", ["aab!", "b?"]) == 3


stop_alphabet = st.sampled_from("ab\n:é")


@settings(max_examples=500, deadline=None)
@given(
    st.text(stop_alphabet, max_size=40),
    st.lists(st.text(stop_alphabet, min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.integers(0, 100), max_size=12),
)
def test_stop_matching_does_not_depend_on_how_text_is_split(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    assert run_stops(split(text, cuts), stops) == reference_stop(text, stops)


def sections(stream: TextStream, pieces: Sequence[bytes]) -> dict[Section, list[str]]:
    got: dict[Section, list[str]] = {s: [] for s in Section}
    for p in pieces:
        for seg in stream.feed(p):
            got[seg.section].append(seg.text)
    for seg in stream.finish():
        got[seg.section].append(seg.text)
    return got


def test_thinking_and_tool_calls_are_separated_and_markers_removed() -> None:
    stream = TextStream(thinking=THINK, tool_call=TOOL)
    text = '<think>plan it</think>Sure.<tool_call>{"f": 1}</tool_call> done'
    pieces = [text[i : i + 3].encode() for i in range(0, len(text), 3)]
    got = sections(stream, pieces)
    assert "".join(got[Section.THINKING]) == "plan it"
    assert "".join(got[Section.REPLY]) == "Sure. done"
    assert got[Section.TOOL_CALL] == ['{"f": 1}']


def test_an_unterminated_tool_call_is_released_at_the_end() -> None:
    stream = TextStream(tool_call=TOOL)
    assert stream.feed(b'x<tool_call>{"a"') == [(Section.REPLY, "x", False)]
    assert stream.finish() == [(Section.TOOL_CALL, '{"a"', False)]


def test_a_utf8_character_split_across_tokens_is_released_whole() -> None:
    stream = TextStream()
    data = "é€".encode()
    got = [seg.text for p in (data[:1], data[1:3], data[3:]) for seg in stream.feed(p)]
    assert "".join(got) == "é€"
    assert all("\ufffd" not in t for t in got)


def test_a_stop_inside_thinking_still_ends_the_text() -> None:
    stream = TextStream(["END"], thinking=THINK)
    got = sections(stream, [b"<think>ab", b"EN", b"D tail"])
    assert stream.stopped == "END"
    assert "".join(got[Section.THINKING]) == "ab"


marker_alphabet = st.sampled_from(
    ["a", "b", " ", "<think>", "</think>", "<tool_call>", "</tool_call>", "<", "/"]
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(marker_alphabet, max_size=30).map("".join),
    st.lists(st.integers(0, 400), max_size=15),
)
def test_sections_do_not_depend_on_how_text_is_split(text: str, cuts: list[int]) -> None:
    whole = sections(TextStream(thinking=THINK, tool_call=TOOL), [text.encode()])
    pieces = [p.encode() for p in split(text, cuts)]
    parts = sections(TextStream(thinking=THINK, tool_call=TOOL), pieces)
    assert {k: "".join(v) for k, v in parts.items() if k is not Section.TOOL_CALL} == {
        k: "".join(v) for k, v in whole.items() if k is not Section.TOOL_CALL
    }
    assert parts[Section.TOOL_CALL] == whole[Section.TOOL_CALL]


@settings(max_examples=300, deadline=None)
@given(
    st.text(stop_alphabet, max_size=30),
    st.lists(st.text(stop_alphabet, min_size=1, max_size=3), max_size=2),
    st.lists(st.integers(0, 200), max_size=10),
)
def test_byte_splits_through_the_whole_stream_match_the_reference(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    data = text.encode()
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    stream = TextStream(stops)
    got = sections(stream, pieces)
    expected, stop = reference_stop(text, stops)
    assert "".join(got[Section.REPLY]) == expected
    assert stream.stopped == stop


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(list(Section)), st.text(st.sampled_from("ab /"), max_size=6)),
        max_size=8,
    ),
    st.lists(st.integers(0, 400), max_size=15),
)
def test_rendered_sections_come_back_as_written(
    parts: list[tuple[Section, str]], cuts: list[int]
) -> None:
    markers = {Section.THINKING: THINK, Section.TOOL_CALL: TOOL}
    text = "".join(
        t if s is Section.REPLY else markers[s].open + t + markers[s].close for s, t in parts
    )
    pieces = [p.encode() for p in split(text, cuts)]
    got = sections(TextStream(thinking=THINK, tool_call=TOOL), pieces)
    assert "".join(got[Section.REPLY]) == "".join(t for s, t in parts if s is Section.REPLY)
    assert "".join(got[Section.THINKING]) == "".join(t for s, t in parts if s is Section.THINKING)
    assert got[Section.TOOL_CALL] == [t for s, t in parts if s is Section.TOOL_CALL]
