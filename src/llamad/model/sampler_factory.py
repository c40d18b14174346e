"""From a request's sampling fields to the binding's sampler chain (SPEC M6, L6).

:func:`sampler_params` is the one mapping from :class:`RequestParams` to
:class:`llamad.llama_ffi.SamplerParams`: pure, so a unit test checks it field
by field. A ``json_schema`` becomes a GBNF grammar here, so a schema the
converter refuses is a ``bad_schema`` refusal at submission; a GBNF text
llama.cpp cannot parse is refused when the chain is built (``invalid_grammar``,
:meth:`llamad.model.llama_backend.LlamaBackend.open_sampler`).

Choices where the request says nothing:

- ``temperature == 0`` is greedy: the most likely token after penalties and
  the grammar; ``top_k``/``top_p``/``min_p`` and the seed then play no part.
- ``typical_p`` is off (1.0) and ``logit_bias`` empty: the request has neither.
- Penalties see only the tokens this request generates, never the prompt: the
  chain is built before the request holds a sequence, and a prompt restored
  from the cache would otherwise penalise differently from one prefilled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from llamad.errors import BadRequest, ConfigError, SchemaError
from llamad.llama_ffi.sampling import SamplerParams
from llamad.model.requests import RequestParams

__all__ = ["SCHEMA_ROOT", "sampler_params"]

SCHEMA_ROOT: Final = "root"
"""The start rule of every grammar :func:`json_schema_to_gbnf` writes."""

# SamplerParams field -> RequestParams field, where the names differ; a refusal
# from the binding names the request's field, as every other refusal does.
_REQUEST_FIELD: Final[Mapping[str, str]] = {"repeat_penalty": "repetition_penalty"}

SchemaConverter = Callable[[Mapping[str, Any]], str]


def _schema_grammar(schema: Mapping[str, Any], convert: SchemaConverter) -> str:
    try:
        return convert(schema)
    except RecursionError:
        # A schema nested deeper than the converter recurses is refused as a
        # schema, not as an internal error.
        raise SchemaError(
            "json_schema: nested too deeply to convert", details={"field": "json_schema"}
        ) from None


def _json_schema_to_gbnf(schema: Mapping[str, Any]) -> str:
    # The converter is imported by the first request with a schema: a worker
    # that is never asked for one does not keep it resident (SPEC P9).
    from llamad.llama_ffi.json_schema import json_schema_to_gbnf  # noqa: PLC0415

    return json_schema_to_gbnf(schema)


def sampler_params(
    params: RequestParams, *, convert_schema: SchemaConverter = _json_schema_to_gbnf
) -> SamplerParams:
    """The sampler chain ``params`` asks for.

    Raises :class:`~llamad.errors.SchemaError` (``bad_schema``) for a JSON
    Schema the converter refuses, and :class:`~llamad.errors.BadRequest`
    naming the request's field for a value the binding refuses.
    """
    grammar = params.grammar
    if params.json_schema is not None:
        grammar = _schema_grammar(params.json_schema, convert_schema)
    try:
        return SamplerParams(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=params.min_p,
            repeat_penalty=params.repetition_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            penalty_last_n=params.penalty_last_n,
            seed=params.seed,
            greedy=params.temperature == 0.0,
            grammar=grammar,
            grammar_root=SCHEMA_ROOT,
        )
    except ConfigError as exc:
        # RequestParams checks the same bounds, so this is a mismatch between
        # the two validators; the caller still gets a refusal naming a field.
        name = exc.message.split(":", 1)[0].strip()
        field = _REQUEST_FIELD.get(name, name)
        raise BadRequest(f"{field}: {exc.message}", details={"field": field}) from None
