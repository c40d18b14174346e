"""What ``flash_attn = auto`` means for a worker's context (issue 8): off on a
CPU build, llama.cpp's choice on a GPU build."""

from __future__ import annotations

import pytest

from llamad.llama_ffi.options import ContextOptions, FlashAttn, KVType
from llamad.model.flash_attention import serving_context

pytestmark = pytest.mark.timeout(30)


def test_auto_is_off_on_the_cpu() -> None:
    ctx = ContextOptions(n_ctx=512, flash_attn=FlashAttn.AUTO)
    assert serving_context(ctx, "cpu") == ContextOptions(n_ctx=512, flash_attn=FlashAttn.OFF)


@pytest.mark.parametrize("backend", ["cuda", "metal", "vulkan"])
def test_auto_stays_llamas_choice_on_a_gpu(backend: str) -> None:
    ctx = ContextOptions(flash_attn=FlashAttn.AUTO)
    assert serving_context(ctx, backend) is ctx


@pytest.mark.parametrize("fa", [FlashAttn.ON, FlashAttn.OFF])
def test_an_explicit_choice_is_kept_on_the_cpu(fa: FlashAttn) -> None:
    ctx = ContextOptions(flash_attn=fa)
    assert serving_context(ctx, "cpu") is ctx


def test_a_quantised_v_cache_keeps_auto_which_it_needs() -> None:
    ctx = ContextOptions(flash_attn=FlashAttn.AUTO, type_k=KVType.Q8_0, type_v=KVType.Q8_0)
    assert serving_context(ctx, "cpu") is ctx
