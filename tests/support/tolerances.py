"""What llamad guarantees about numerics on each backend: the tests' one place for it.

On the CPU (llama.cpp patches 0001 and 0003) a decode's logits do not depend
on the thread count, on what shares its batch, or on where its cells sit in
the KV pool: every attention row is summed in groups of 256 of its own cells,
taken in position order, whatever the split (measured before the patch: 2
threads against 1 moved the logits by up to 0.96 after a 700-token prompt).
A restored sequence therefore continues with bit-identical logits wherever it
is restored, and batched embeddings match one-at-a-time ones to 1e-4
(measured: 2e-8). Prompt steps of 64 rows or more take ggml's tiled
attention, which sums by 64-cell tiles of the whole KV view: a prompt
prefilled in 64-row chunks ends 0.6-0.8 logits away from the same prompt in
smaller chunks, and from itself above another sequence's cells. The model
option ``deterministic`` (``GGML_CPU_FA_TILED=0``) turns that path off, and
then a prompt's logits are the same however it was chunked or placed. The
exact-hit guarantee depends on none of this: a restore and the cold path
both decode the last prompt token alone. On a GPU
the kernels are picked by batch shape and KV layout (different matmul and
flash-attention kernels, f16 accumulation), so only the
same computation path is bit-identical (the same batch shapes over the same
layout: the model worker's cold path decodes the last prompt token alone, as
a restore is primed, so that an exact hit reproduces the cold reply); across
shapes results agree within the tolerances below. Issue 7 measured 8e-3
between batched and one-at-a-time embeddings on an H200.

The GPU tolerances still fail the defects they guard against (numbers from
the default model on the CPU): pooling only part of an input moves its
embedding by 2.7e-2, and continuing a sequence restored from a state one
token short puts its first next-token distribution KL 0.79 nats away (0.51
on the H200).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llamad.llama_ffi.build_info import compute_backend

# Largest element-wise difference between an input's batched and alone embedding.
EMBEDDING_CPU = 1e-4
EMBEDDING_GPU = 1.5e-2

# Largest KL divergence (nats) between the next-token distributions of a
# sequence restored into another KV layout and of its reference, fed the same
# tokens, at any step. Measured on an H200 (CUDA, sm_90) over 32 fed steps of
# the default model: the same path is bit-identical (0); restored into slot 2
# of a 4-sequence unified context, identical for 9 steps, then at most 0.037;
# the same prompt prefilled in chunks of 7, at most 0.087. Raw logits move by
# up to 4.3 under that noise, as much as a real defect moves them after a few
# steps, so the bound is on the distribution, not on single logits. The defect
# it guards against, a state one token short, is 0.51 at the first step there
# (0.29 and 0.19 later).
LOGITS_KL_GPU = 0.15


def kl_divergence(want: Sequence[float], got: Sequence[float]) -> float:
    """KL(softmax(want) || softmax(got)) in nats, computed in float64."""
    w = np.asarray(want, dtype=np.float64)
    g = np.asarray(got, dtype=np.float64)
    log_p = w - w.max()
    log_p -= np.log(np.exp(log_p).sum())
    log_q = g - g.max()
    log_q -= np.log(np.exp(log_q).sum())
    return float((np.exp(log_p) * (log_p - log_q)).sum())


def exact() -> bool:
    """Whether this process computes on the CPU, where the exact guarantees hold."""
    return compute_backend() == "cpu"


def embedding_tolerance() -> float:
    return EMBEDDING_CPU if exact() else EMBEDDING_GPU
