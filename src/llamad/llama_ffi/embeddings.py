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
from collections.abc import Sequence

__all__ = ["l2_normalize", "plan_groups"]


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
