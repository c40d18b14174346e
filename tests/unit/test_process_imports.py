"""What each daemon process's entry module imports before it runs (SPEC P9).

Every daemon process is its own interpreter and keeps what it imports for its
whole life. These run each entry module as its process does (``asyncio``
deferred, as ``llamad.supervisor.run_child`` and the root do) in a fresh
interpreter and fail if a module comes in eagerly that the process only needs
later or never: OpenSSL's libcrypto through ``hashlib``/``secrets`` (~4 MB
resident), cache-meta's index (~2 MB), the binding (libllama). What a running
daemon imports, late imports included, is checked against a real daemon in
tests/integration/daemon/test_daemon_process_imports.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

#: Each daemon process's entry but cache-meta's own, and whether it may hash:
#: the root and the front never do (the gateway's HTTP stack brings ssl and
#: secrets for itself; a worker hashes keys).
ENTRIES = {
    "llamad.daemon.main": False,
    "llamad.front.front_proc": False,
    "llamad.gateway.proc": True,
    "llamad.model.worker_proc": True,
}
OPENSSL_HASHING = frozenset({"hashlib", "_hashlib", "secrets", "hmac"})
#: The binding and with it libllama and libggml (several MB resident): only a
#: model worker loads a model; the others read GGUF headers and build the
#: options in Python.
BINDING = frozenset({"llamad.llama_ffi._llama", "llamad.llama_ffi.native", "_cffi_backend"})
#: Imported by the first request that needs them (a chat, a JSON schema, a
#: pressure sample), never by an entry module.
ON_FIRST_USE = frozenset(
    {
        "jinja2",
        "llamad.llama_ffi.chat_template",
        "llamad.llama_ffi.tool_calls",
        "llamad.llama_ffi.json_schema",
        "psutil",
    }
)


def _imports(entry: str) -> set[str]:
    code = (
        "import sys\n"
        "from llamad._lazy import defer_module\n"
        "defer_module('asyncio')\n"
        "import llamad.supervisor.child\n"
        f"import {entry}\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return set(out.stdout.split())


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_an_entry_imports_neither_cache_metas_index_nor_hashing_it_does_not_do(
    entry: str,
) -> None:
    loaded = _imports(entry)
    assert entry in loaded
    assert "llamad.cache.meta" not in loaded
    assert ON_FIRST_USE & loaded == set()
    if not ENTRIES[entry]:
        assert OPENSSL_HASHING & loaded == set()
    if entry != "llamad.model.worker_proc":
        assert BINDING & loaded == set()
