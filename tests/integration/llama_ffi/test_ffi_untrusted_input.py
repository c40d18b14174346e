"""Paths and text from callers never leak a bare Python exception (issue 7, defect 4).

Every public entry point that takes a path or text refuses a NUL (which would
cut a C string short, or fail untyped in ``open``), a lone surrogate (which
cannot be encoded for C, the filesystem or msgpack) and a value of the wrong
type with a typed :class:`LlamadError` that survives the wire. One
parametrized test covers the binding and the other packages' entry points.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from llamad.actors.errors import ActorConfigError
from llamad.actors.registry import Registry, check_name
from llamad.actors.sockets import validate_endpoint
from llamad.cache.errors import InvalidCacheValue
from llamad.cache.settings import CacheSettings
from llamad.cache.tiers import TierConfig
from llamad.errors import BadRequest, ConfigError, LlamadError, SchemaError
from llamad.llama_ffi import (
    LlamaError,
    Model,
    ModelFileError,
    ModelOptions,
    SamplerParams,
    builtin_chat_template,
    check_gguf,
    json_schema_to_gbnf,
    set_log_level,
)
from llamad.supervisor.errors import InvalidSpec
from llamad.supervisor.spec import ChildSpec, Start

pytestmark = pytest.mark.timeout(120)

NUL = "a\0b"
SURROGATE = "a\ud800b"
MODEL = pytest.mark.model


class Env:
    """What a case may need: a scratch directory and (lazily) the real model."""

    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        self._request = request
        self.tmp = tmp

    @property
    def model(self) -> Model:
        model: Model = self._request.getfixturevalue("model")
        return model

    @property
    def model_path(self) -> Path:
        path: Path = self._request.getfixturevalue("model_path")
        return path


def _in(env: Env, value: Any) -> Any:
    """``value`` as the last component of a path in the scratch directory (non-str as is)."""
    return f"{env.tmp}/{value}" if isinstance(value, str) else value


def _tier(env: Env) -> TierConfig:
    return TierConfig("disk", env.tmp / "kvc", 0)  # type: ignore[arg-type]


Case = Callable[[Env, Any], object]

# (id, entry point, bad values, expected error class, needs the model)
CASES: list[tuple[str, Case, tuple[Any, ...], type[LlamadError], bool]] = [
    (
        "Model.path",
        lambda e, v: Model(_in(e, v)),
        (NUL, SURROGATE, 7, b"/m"),
        ModelFileError,
        False,
    ),
    (
        "check_gguf.path",
        lambda e, v: check_gguf(_in(e, v)),
        (NUL, SURROGATE, None),
        ModelFileError,
        False,
    ),
    (
        "check_gguf.keys",
        lambda e, v: check_gguf(e.model_path, keys=[v]),
        (NUL, SURROGATE, 7),
        BadRequest,
        True,
    ),
    (
        "Model.load_adapter",
        lambda e, v: e.model.load_adapter(_in(e, v)),
        (NUL, SURROGATE, 7),
        ModelFileError,
        True,
    ),
    ("Model.tokenize", lambda e, v: e.model.tokenize(v), (SURROGATE, 7, b"x"), BadRequest, True),
    (
        "Model.chat_template",
        lambda e, v: e.model.chat_template(v),
        (NUL, SURROGATE, 7),
        BadRequest,
        True,
    ),
    ("Model.detokenize", lambda e, v: e.model.detokenize(v), ("ab", None, [1.5]), BadRequest, True),
    ("Model.token_piece", lambda e, v: e.model.token_piece(v), ("a", None), BadRequest, True),
    (
        "builtin_chat_template.template",
        lambda e, v: builtin_chat_template([{"role": "user", "content": "hi"}], v),
        (NUL, SURROGATE, 7),
        BadRequest,
        False,
    ),
    (
        "builtin_chat_template.content",
        lambda e, v: builtin_chat_template([{"role": "user", "content": v}]),
        (NUL, SURROGATE, 7),
        BadRequest,
        False,
    ),
    (
        "builtin_chat_template.role",
        lambda e, v: builtin_chat_template([{"role": v, "content": "hi"}]),
        (NUL, SURROGATE, 7),
        BadRequest,
        False,
    ),
    (
        "builtin_chat_template.messages",
        lambda e, v: builtin_chat_template(v),
        ("hi", [7]),
        BadRequest,
        False,
    ),
    (
        "SamplerParams.grammar",
        lambda e, v: SamplerParams(grammar=f'root ::= "a" {v}' if isinstance(v, str) else v),
        (NUL, SURROGATE, 7),
        ConfigError,
        False,
    ),
    (
        "SamplerParams.grammar_root",
        lambda e, v: SamplerParams(grammar='root ::= "a"', grammar_root=v),
        (NUL, SURROGATE, 7),
        ConfigError,
        False,
    ),
    (
        "json_schema_to_gbnf.value",
        lambda e, v: json_schema_to_gbnf({"enum": ["ok", v]}),
        (SURROGATE,),
        SchemaError,
        False,
    ),
    (
        "json_schema_to_gbnf.text",
        lambda e, v: json_schema_to_gbnf(v),
        ('{"const": "\\ud800"}', '{"properties": {"\\udfff": {}}}'),
        SchemaError,
        False,
    ),
    (
        "json_schema_to_gbnf.property",
        lambda e, v: json_schema_to_gbnf({"properties": {v: {}}, "required": [v]}),
        (SURROGATE,),
        SchemaError,
        False,
    ),
    ("set_log_level", lambda e, v: set_log_level(v), (None, 7), LlamaError, False),
    (
        "ModelOptions.tensor_split",
        lambda e, v: ModelOptions(tensor_split=v),
        (7, b"ab"),
        ConfigError,
        False,
    ),
    (
        "actors.check_name",
        lambda e, v: check_name(v),
        (NUL, SURROGATE, 7, "name\n"),
        ActorConfigError,
        False,
    ),
    (
        "actors.endpoint",
        lambda e, v: validate_endpoint(v),
        (f"ipc:///tmp/{NUL}", f"ipc:///tmp/{SURROGATE}", f"tcp://{NUL}:5", f"tcp://{SURROGATE}:5"),
        ActorConfigError,
        False,
    ),
    (
        "actors.Registry.root",
        lambda e, v: Registry(_in(e, v)),
        (NUL, SURROGATE, 7),
        ActorConfigError,
        False,
    ),
    (
        "cache.TierConfig.root",
        lambda e, v: TierConfig("disk", _in(e, v), 0),  # type: ignore[arg-type]
        (NUL, SURROGATE, 7),
        InvalidCacheValue,
        False,
    ),
    (
        "cache.CacheSettings.counters_path",
        lambda e, v: CacheSettings((_tier(e),), _in(e, v)),
        (NUL, SURROGATE, 7, None),
        InvalidCacheValue,
        False,
    ),
    (
        "cache.CacheSettings.permits_path",
        lambda e, v: CacheSettings((_tier(e),), e.tmp / "c", permits_path=_in(e, v)),
        (NUL, SURROGATE, 7),
        InvalidCacheValue,
        False,
    ),
    (
        "cache.CacheSettings.registry_root",
        lambda e, v: CacheSettings((_tier(e),), e.tmp / "c", registry_root=_in(e, v)),
        (NUL, SURROGATE, 7),
        InvalidCacheValue,
        False,
    ),
    (
        "supervisor.ChildSpec.id",
        lambda e, v: ChildSpec(id=v, start=Start("os:getpid")),
        (NUL, SURROGATE, 7),
        InvalidSpec,
        False,
    ),
    (
        "supervisor.ChildSpec.env",
        lambda e, v: ChildSpec(id="c", start=Start("os:getpid"), env={"X": v}),
        (NUL, SURROGATE, 7),
        InvalidSpec,
        False,
    ),
    (
        "supervisor.ChildSpec.cwd",
        lambda e, v: ChildSpec(id="c", start=Start("os:getpid"), cwd=_in(e, v)),
        (NUL, SURROGATE, 7),
        InvalidSpec,
        False,
    ),
    ("supervisor.Start.target", lambda e, v: Start(v), (NUL, SURROGATE, 7), InvalidSpec, False),
]


def _kind(value: Any) -> str:
    if isinstance(value, str) and "\0" in value:
        return "nul"
    if isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value):
        return "surrogate"
    return type(value).__name__ if not isinstance(value, str) else repr(value)[:12]


PARAMS = [
    pytest.param(call, value, expected, id=f"{name}-{_kind(value)}", marks=[MODEL] if model else [])
    for name, call, values, expected, model in CASES
    for value in values
]


@pytest.mark.parametrize(("call", "value", "expected"), PARAMS)
def test_bad_path_or_text_raises_a_typed_error_that_survives_the_wire(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    call: Case,
    value: Any,
    expected: type[LlamadError],
) -> None:
    with pytest.raises(LlamadError) as err:
        call(Env(request, tmp_path), value)
    assert isinstance(err.value, expected), repr(err.value)
    # The message and details travel as msgpack (strict UTF-8): the offending
    # text must be quoted, never embedded raw.
    msgpack.packb(err.value.to_wire())


@pytest.mark.model
@pytest.mark.parametrize("text", [NUL, "\0", "tail after a NUL\0 is kept"])
def test_tokenize_keeps_text_after_a_nul(request: pytest.FixtureRequest, text: str) -> None:
    """llama_tokenize takes a length, so a NUL is text there, never an end."""
    model: Model = request.getfixturevalue("model")
    assert model.detokenize(model.tokenize(text, add_special=False)) == text
