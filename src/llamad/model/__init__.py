"""The model layer: where a loaded model and its contexts meet the cache.

Today this holds :mod:`.identity`, the one place a live model, context and
adapter set become a cache :class:`~llamad.cache.key.Namespace`. The
per-model worker (admission, cache resolution, the batch scheduler, saves)
is built here next, on top of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

if TYPE_CHECKING:
    from llamad.model.identity import (
        EXCLUDED_CONTEXT_FIELDS,
        EXCLUDED_MODEL_FIELDS,
        HASHED_CONTEXT_FIELDS,
        base_fingerprint,
        namespace,
    )

__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.model.identity": (
            "EXCLUDED_CONTEXT_FIELDS",
            "EXCLUDED_MODEL_FIELDS",
            "HASHED_CONTEXT_FIELDS",
            "base_fingerprint",
            "namespace",
        ),
    },
)

__all__ = [
    "EXCLUDED_CONTEXT_FIELDS",
    "EXCLUDED_MODEL_FIELDS",
    "HASHED_CONTEXT_FIELDS",
    "base_fingerprint",
    "namespace",
]
