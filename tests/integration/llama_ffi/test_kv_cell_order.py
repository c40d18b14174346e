"""A sequence's new cells go above the cells it holds (llamad's llama.cpp patch 0001).

llama.cpp hands a batch's tokens the next free cells from its ring buffer's
head, and ``seq_rm`` moves the head back to the lowest cell it frees. Without
the patch, a sequence that decodes after another sequence let go of cells
below it gets its new tokens there, below its earlier ones; the attention
then sums its terms in another order and, on this CPU, the next token's
logits moved by up to 0.41 and the greedy token changed
(scripts/patches/llama.cpp/0001-*.patch). With it, the scenarios below give
the cold run's logits bit for bit on one thread; each of them fails on the
unpatched library.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

import tolerances
from ffi_decode import decode_rows
from llamad.llama_ffi import Context, Model

pytestmark = pytest.mark.timeout(120)

HEAD = "In a quiet harbour town of grey stone houses, this is a short story about the "
FIRST = HEAD + "old lighthouse keeper who loved the winter storms."
SECOND = HEAD + "young baker who feared the long dark nights."
OTHER = "<|im_start|>user\nIs the sky green? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def unified(make_ctx: Callable[..., Context]) -> Context:
    return make_ctx(n_seq_max=4, kv_unified=True, n_batch=64, n_ubatch=64)


def _tokens(model: Model, text: str) -> list[int]:
    return model.tokenize(text, parse_special=True)


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)


def _check(got: list[float], cold: list[float]) -> None:
    if tolerances.exact():
        assert got == cold
    else:
        assert max(abs(x - y) for x, y in zip(got, cold, strict=True)) < 0.05


def test_a_shared_prefix_continued_after_cells_below_were_freed_is_the_cold_run(
    model: Model, unified: Context
) -> None:
    second, first, other = _tokens(model, SECOND), _tokens(model, FIRST), _tokens(model, OTHER)
    shared = _shared(first, second)
    cold = decode_rows(unified, 0, second, 0)
    unified.clear()
    decode_rows(unified, 0, other, 0)  # sequence 0 takes the lowest cells...
    decode_rows(unified, 3, first, 0)  # ... sequence 3 the ones above
    unified.seq_remove(0)  # cells freed below sequence 3's
    unified.seq_copy(3, 0, 0, shared)  # sequence 0 shares 3's prefix
    _check(decode_rows(unified, 0, second[shared:], shared), cold)


def test_a_sequence_decoding_beside_a_finished_one_is_the_cold_run(
    model: Model, unified: Context
) -> None:
    first, second = _tokens(model, FIRST), _tokens(model, SECOND)
    cold = decode_rows(unified, 1, second, 0)
    unified.clear()
    # Sequence 0 prefills below sequence 1's first half, then ends; sequence 1
    # goes on past the cells it left.
    half = len(second) // 2
    decode_rows(unified, 0, first, 0)
    decode_rows(unified, 1, second[:half], 0)
    unified.seq_remove(0)
    _check(decode_rows(unified, 1, second[half:], half), cold)
