"""The package exports its public API lazily, and the lazy table matches __all__."""

from __future__ import annotations

import subprocess
import sys

import pytest

import llamad.llama_ffi as ffi_pkg
from llamad._lazy import exports

pytestmark = pytest.mark.timeout(60)


def test_every_name_in_all_resolves() -> None:
    assert sorted(ffi_pkg.__all__) == sorted(exports("llamad.llama_ffi"))
    for name in ffi_pkg.__all__:
        assert getattr(ffi_pkg, name) is not None


def test_unknown_name_is_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = ffi_pkg.NoSuchThing


def test_pure_python_parts_do_not_load_libllama() -> None:
    code = (
        "import sys\n"
        "from llamad.llama_ffi import json_schema_to_gbnf, ChatTemplate\n"
        "assert 'llamad.llama_ffi._llama' not in sys.modules\n"
        "from llamad.llama_ffi import Model\n"
        "assert 'llamad.llama_ffi._llama' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=50)
