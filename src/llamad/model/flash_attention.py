"""What ``flash_attn = auto`` means for a model worker: :func:`serving_context`.

llama.cpp's ``auto`` turns flash attention on wherever the device supports
it, the CPU included. On the CPU that is the wrong choice for serving: one
row decoded over a long KV, which every warm hit's held-back token and every
generated token is, takes 2-5x as long with it, and a cold prefill gains
nothing measurable (``bench/worker_bench_attention.py``, recorded in
``bench/results/worker-attention-<date>.md``; ``docs/internals/model-worker.md``,
"Benchmark"). So a worker on a CPU build makes its context with flash
attention off when the spec says ``auto``; on a GPU build ``auto`` stays
llama.cpp's choice.

The context is made with the resolved value, so the cache namespace hashes
it (:mod:`llamad.model.identity` reads the live context's options): a CPU
worker's ``auto`` shares rows with an explicit ``off``.
"""

from __future__ import annotations

import dataclasses

from llamad.llama_ffi.options import ContextOptions, FlashAttn

__all__ = ["serving_context"]


def serving_context(options: ContextOptions, compute_backend: str) -> ContextOptions:
    """``options`` as the worker makes its context on ``compute_backend``
    (:func:`llamad.llama_ffi.build_info.compute_backend`): ``auto`` flash
    attention is off on ``"cpu"``, unless the V cache is quantised (llama.cpp
    reads a quantised V only through flash attention, so ``auto`` keeps it
    on); anything else is left as it is."""
    if (
        options.flash_attn is FlashAttn.AUTO
        and compute_backend == "cpu"
        and not options.type_v.quantized
    ):
        return dataclasses.replace(options, flash_attn=FlashAttn.OFF)
    return options
