"""Which vocabularies get the longest-token bound on a text's tokens (issue 17):
only tokenizers of llama.cpp that put every byte of a text in one token."""

from __future__ import annotations

import pytest

from llamad.llama_ffi.vocab import pieces_cover_text

pytestmark = pytest.mark.timeout(30)

SMOLLM2 = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "smollm",
    "general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2",
    "general.architecture": "llama",
}


def test_spm_and_byte_level_bpe_cover_every_byte() -> None:
    assert pieces_cover_text(SMOLLM2)
    assert pieces_cover_text({**SMOLLM2, "tokenizer.ggml.model": "llama", "general.name": "x"})


@pytest.mark.parametrize(
    "change",
    [
        {"tokenizer.ggml.model": "bert"},  # WPM drops control characters
        {"tokenizer.ggml.model": "t5"},  # UGM normalizes and collapses whitespace
        {"tokenizer.ggml.model": "rwkv"},
        {"tokenizer.ggml.model": "whitespace"},
        {"tokenizer.ggml.pre": "jina-v2-code"},  # <mask> strips the whitespace before it
        {"tokenizer.ggml.pre": "whitespace"},
        {"general.architecture": "jina-bert-v3"},
        {"general.name": "Phi-3 Mini 4k Instruct"},  # its specials strip the whitespace after
        {"general.name": "modern-bert-base"},
    ],
)
def test_vocabularies_that_drop_or_merge_text_get_no_bound(change: dict[str, str]) -> None:
    assert not pieces_cover_text({**SMOLLM2, **change})


def test_a_vocabulary_without_a_tokenizer_model_gets_no_bound() -> None:
    assert not pieces_cover_text({})
