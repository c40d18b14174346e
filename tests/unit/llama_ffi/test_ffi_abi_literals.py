"""The ABI values llamad writes as literals equal the pinned llama.cpp's.

The options' enums and limits (:mod:`llamad.llama_ffi.options`) and the GGUF
reader's types and ggml's type sizes (:mod:`llamad.llama_ffi.gguf_reader`)
are literals so that the root and the front never load libllama (SPEC P9).
Each is compared here with the binding, which takes its values from the
pinned headers and libraries: a pin bump that changes one fails here.
"""

from __future__ import annotations

import enum

import pytest

from llamad.llama_ffi import gguf_reader, options
from llamad.llama_ffi.native import lib

pytestmark = pytest.mark.timeout(30)

#: Each enum, the prefix of its constants in llama.h / ggml.h, and the members
#: whose llama.h names differ from theirs.
ENUMS: list[tuple[type[enum.IntEnum], str, dict[str, str]]] = [
    (options.LoadMode, "LLAMA_LOAD_MODE_", {}),
    (options.SplitMode, "LLAMA_SPLIT_MODE_", {}),
    (options.FlashAttn, "LLAMA_FLASH_ATTN_TYPE_", {"OFF": "DISABLED", "ON": "ENABLED"}),
    (options.PoolingType, "LLAMA_POOLING_TYPE_", {}),
    (options.RopeScaling, "LLAMA_ROPE_SCALING_TYPE_", {}),
    (options.KVType, "GGML_TYPE_", {}),
    (gguf_reader.GGUFType, "GGUF_TYPE_", {}),
]


@pytest.mark.parametrize(
    ("kind", "prefix", "renamed"), ENUMS, ids=[kind.__name__ for kind, _, _ in ENUMS]
)
def test_every_enum_literal_is_the_headers_value(
    kind: type[enum.IntEnum], prefix: str, renamed: dict[str, str]
) -> None:
    literal = {m.name: int(m) for m in kind}
    bound = {name: int(getattr(lib, prefix + renamed.get(name, name))) for name in literal}
    assert literal == bound


def test_the_option_limits_are_libllamas() -> None:
    assert int(lib.llama_max_devices()) == options.MAX_DEVICES
    assert int(lib.llama_max_parallel_sequences()) == options.MAX_PARALLEL_SEQUENCES


def test_the_gguf_readers_constants_are_ggmls() -> None:
    assert int(lib.GGUF_VERSION) == gguf_reader.GGUF_VERSION
    assert int(lib.GGUF_DEFAULT_ALIGNMENT) == gguf_reader.DEFAULT_ALIGNMENT
    assert int(lib.GGML_MAX_DIMS) == gguf_reader.MAX_DIMS
    assert int(lib.GGML_MAX_NAME) == gguf_reader.MAX_NAME
    assert len(gguf_reader.GGUFType) == int(lib.GGUF_TYPE_COUNT)
    assert int(lib.GGML_TYPE_COUNT) == gguf_reader.GGML_TYPE_COUNT


def test_every_ggml_types_block_and_size_are_ggmls() -> None:
    assert len(gguf_reader.GGML_TYPE_TRAITS) == int(lib.GGML_TYPE_COUNT)
    bound = tuple(
        (int(lib.ggml_blck_size(t)), int(lib.ggml_type_size(t)))
        for t in range(int(lib.GGML_TYPE_COUNT))
    )
    assert bound == gguf_reader.GGML_TYPE_TRAITS
