"""Tokenize / detokenize / token pieces (SPEC L4)."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llamad.errors import BadRequest
from llamad.llama_ffi import InvalidToken, Model

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

VARIED = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n",
    "Ünïcödé àccents, ß, ø, Å",
    "漢字かなカナ 한국어 العربية עברית",
    "emoji 🦙🔥👩‍👩‍👧 and flags 🇫🇷",
    "def f(x):\n    return {'a': [1, 2.5e-3, None]}  # code\n",
    "<|im_start|>user\nspecial markers as plain text<|im_end|>",
    "1234567890 3.14159 -42 0xDEADBEEF",
    "a" * 5000,
]


@pytest.mark.parametrize("text", VARIED)
def test_tokenize_detokenize_round_trip_is_exact(model: Model, text: str) -> None:
    tokens = model.tokenize(text)
    assert model.detokenize(tokens) == text


def _representable(model: Model, ch: str, cache: dict[str, bool] = {}) -> bool:  # noqa: B006
    if ch not in cache:
        cache[ch] = model.detokenize(model.tokenize(ch)) == ch
    return cache[ch]


def test_a_few_control_bytes_are_not_in_the_vocabulary(model: Model) -> None:
    # SmolLM2's byte-level vocabulary lacks a handful of ASCII control bytes;
    # they are dropped, which is why the property below is stated over
    # representable characters (SPEC L4: exact for text the model can represent).
    assert not _representable(model, "\x06")
    assert _representable(model, "\x00")


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_text_of_representable_characters_round_trips(model: Model, text: str) -> None:
    assume(all(_representable(model, ch) for ch in set(text)))
    assert model.detokenize(model.tokenize(text)) == text


def test_parse_special_turns_markers_into_single_tokens(model: Model) -> None:
    marker = "<|im_start|>"
    special = model.tokenize(marker, parse_special=True)
    assert special == [model.bos]
    plain = model.tokenize(marker, parse_special=False)
    assert len(plain) > 1
    assert model.bos not in plain


def test_unparse_special_controls_whether_markers_render(model: Model) -> None:
    tokens = model.tokenize("<|im_start|>hi", parse_special=True)
    assert model.detokenize(tokens, unparse_special=True) == "<|im_start|>hi"
    assert model.detokenize(tokens, unparse_special=False) == "hi"


def test_token_pieces_concatenate_to_the_detokenized_bytes(model: Model) -> None:
    text = "Pieces: ñ 🦙 漢字 done."
    tokens = model.tokenize(text)
    joined = b"".join(model.token_piece(t) for t in tokens)
    assert joined == model.detokenize_bytes(tokens) == text.encode("utf-8")


def test_detokenize_accepts_an_int32_buffer(model: Model) -> None:
    tokens = model.tokenize("buffer input")
    assert model.detokenize(array("i", tokens)) == "buffer input"


@pytest.mark.parametrize("bad", [-1, 49152, 2**31 - 1])
def test_out_of_range_ids_are_invalid_token(model: Model, bad: int) -> None:
    with pytest.raises(InvalidToken):
        model.detokenize([1, bad])
    with pytest.raises(InvalidToken):
        model.token_piece(bad)
    with pytest.raises(InvalidToken):
        model.is_eog(bad)


def test_non_text_input_is_bad_request(model: Model) -> None:
    with pytest.raises(BadRequest):
        model.tokenize(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        model.tokenize("lone surrogate \ud800")


def test_the_longest_token_bounds_the_tokens_of_any_text(model: Model) -> None:
    """The bound the worker refuses unfittable prompts by (issue 17): no token
    stands for more bytes than the longest piece, so a text of ``B`` bytes
    makes at least ``ceil(B / L)`` tokens, special-token text included."""
    bound = model.max_token_bytes
    assert bound == max(len(model.token_piece(t, special=True)) for t in range(model.n_vocab))
    whitespace = ["\n" + " " * 80, " " * 5000, "\n" * 300, "\t \n" * 700]
    for text in [*VARIED, *whitespace, "<|im_start|>" * 50]:
        n_bytes = len(text.encode())
        for add_special in (False, True):
            tokens = model.tokenize(text, add_special=add_special, parse_special=True)
            assert len(tokens) >= -(-n_bytes // bound), (text[:40], len(tokens))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.sampled_from([" ", "\n", "\t", "a", "é", "🦙", "<|im_end|>"]), max_size=400).map(
        "".join
    )
)
def test_the_bound_holds_for_runs_of_whitespace_and_specials(model: Model, text: str) -> None:
    bound = model.max_token_bytes
    assert bound is not None
    tokens = model.tokenize(text, add_special=False, parse_special=True)
    assert len(tokens) >= -(-len(text.encode()) // bound)
