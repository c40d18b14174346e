"""How a set of inputs is split into decodes for pooled embeddings (SPEC L9).

llama.cpp pools per ubatch: a sequence split across two ubatches gets the
pooled embedding of its last part only. So every input must land whole in
one ubatch. With separate KV streams per sequence (``kv_unified=False`` and
several sequences) llama.cpp also splits a batch into ubatches holding the
same number of tokens from each sequence, so a decode may only group inputs
of equal length there. :func:`plan_groups` packs inputs into as few decodes
as those rules allow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from llamad.errors import ConfigError
from llamad.llama_ffi.options import PoolingType

__all__ = ["check_mean_pooling_layout", "effective_pooling", "l2_normalize", "plan_groups"]


def plan_groups(lengths: Sequence[int], n_ubatch: int, *, equal_lengths: bool) -> list[list[int]]:
    """Indices of ``lengths`` grouped into decodes of at most ``n_ubatch``
    tokens each (and of one length each when ``equal_lengths``), keeping the
    input order within a group. Every length must be in ``[1, n_ubatch]``."""
    groups: list[list[int]] = []
    open_group: dict[int | None, tuple[list[int], int]] = {}
    for i, n in enumerate(lengths):
        if not 1 <= n <= n_ubatch:
            raise ValueError(f"input {i} has {n} tokens, outside [1, {n_ubatch}]")
        bucket = n if equal_lengths else None
        current = open_group.get(bucket)
        if current is not None and current[1] + n <= n_ubatch:
            current[0].append(i)
            open_group[bucket] = (current[0], current[1] + n)
            continue
        group = [i]
        groups.append(group)
        open_group[bucket] = (group, n)
    return groups


def l2_normalize(vec: list[float]) -> list[float]:
    """``vec`` scaled to unit length (unchanged if it is all zeros)."""
    norm = math.sqrt(math.fsum(x * x for x in vec))
    return [x / norm for x in vec] if norm > 0 else vec


def effective_pooling(metadata: Mapping[str, str], requested: PoolingType) -> PoolingType:
    """The pooling llama.cpp will use: the requested one, else the model's."""
    if requested is not PoolingType.UNSPECIFIED:
        return requested
    arch = metadata.get("general.architecture", "")
    raw = metadata.get(f"{arch}.pooling_type")
    try:
        return PoolingType(int(raw)) if raw is not None else PoolingType.NONE
    except ValueError:
        return PoolingType.NONE


def check_mean_pooling_layout(n_ctx: int, n_ubatch: int, n_seq_max: int) -> None:
    # At this pin, reserving the worst-case graph with mean pooling rounds the
    # ubatch (min(n_ctx, n_ubatch) tokens) up to a multiple of n_seq_max but
    # not the pooling matrix, and ggml asserts (aborts the process) on the
    # mismatched matmul. n_ctx is padded by llama.cpp, so before creation the
    # rule is stated conservatively on n_ubatch alone.
    if n_seq_max > 1 and (n_ubatch > n_ctx or n_ubatch % n_seq_max != 0):
        raise ConfigError(
            f"n_ubatch: mean-pooled embeddings with n_seq_max={n_seq_max} need n_ubatch "
            f"to be a multiple of n_seq_max and at most n_ctx (got {n_ubatch})"
        )
