"""JSON Schema → GBNF grammar for llama.cpp's grammar sampler.

The converter is sound first: every string the grammar accepts parses as JSON
that validates against the schema. Where JSON Schema asks for something a
stateless grammar cannot express (``uniqueItems``, ``not``, ``pattern``, ...)
conversion fails with :class:`~llamad.errors.SchemaError` naming the keyword
and where it sits, rather than handing back a looser grammar.

The grammar is deliberately *narrower* than the schema in a few places; a
narrower grammar only takes freedom away from the model, a looser one would
hand the caller JSON that fails validation:

- An object schema that declares ``properties`` (or ``required``) and says
  nothing about ``additionalProperties`` gets no undeclared keys: models
  invent keys when allowed to. Say ``"additionalProperties": true`` to allow
  them. Declared properties appear in declaration order; undeclared keys
  follow them, never spell a declared name, and contain no escapes.
- Numbers have at most ``max_digits`` digits in each of the integral and the
  fractional part and a two-digit exponent; integers are written without a
  fraction or exponent, and never as ``-0``. A number with ``minimum``/``maximum`` bounds has no
  exponent and at most 15 significant digits, so the bound comparison cannot
  be flipped by binary floating-point rounding on the consumer's side.
- Whitespace is limited to one space, or a newline and up to ``max_indent``
  spaces or tabs, after ``{ [ , :`` and before ``} ]``; none before or after
  the root value, so the grammar ends exactly where the value does and the
  model stops.
- Strings never use ``\\u`` escapes of surrogate halves (characters outside
  the BMP are written as themselves), so ``minLength``/``maxLength`` count
  what JSON Schema counts: code points.
- ``enum``/``const`` values are written compactly, as listed (an integral
  float such as ``2.0`` as the equal integer ``2``).
- A schema without ``type`` produces values of the types its keywords
  describe (``properties`` → objects, ``minimum`` → numbers, ...), or any
  JSON value when it has none.
- A ``maxLength``/``maxItems`` above 2**20 is treated as no bound (no context
  window holds that much output); a ``minLength``/``minItems`` above 2**16 is
  refused.
- ``oneOf`` is accepted only when its branches provably exclude each other
  (different JSON types, disjoint constant sets, or objects told apart by a
  required discriminator property or by a closed property set); otherwise an
  instance could match two branches and fail ``oneOf``.

llama.cpp rewrites ``x{m,n}`` into ``n`` helper rules, refuses more than 2000
and silently drops an upper bound above 2000; long repetitions are therefore
built from chunks of at most :data:`REPEAT_CHUNK`.

Layout: :mod:`.convert` walks the schema; :mod:`.keywords` knows the
vocabulary and reads keyword values; :mod:`.numbers` builds bounded numbers
digit by digit; :mod:`.formats` the ``format`` strings; :mod:`.one_of` proves
``oneOf`` branches exclusive; :mod:`.json_rules` holds the rules for
unconstrained JSON; :mod:`.gbnf` and :mod:`.rules` are the grammar IR, its
rule table and the passes that finish a grammar. Only the names below are API
(``REPEAT_CHUNK`` here is a copy; the chunking reads :data:`.gbnf.REPEAT_CHUNK`).
"""

from __future__ import annotations

from llamad.errors import SchemaError
from llamad.llama_ffi.json_schema.convert import json_schema_to_gbnf
from llamad.llama_ffi.json_schema.gbnf import REPEAT_CHUNK
from llamad.llama_ffi.json_schema.options import GrammarOptions

__all__ = [
    "REPEAT_CHUNK",
    "GrammarOptions",
    "SchemaError",
    "json_schema_to_gbnf",
]
