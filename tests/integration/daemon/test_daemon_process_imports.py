"""Which processes a real daemon runs and what each imports: its idle memory is
mostly interpreters and their imports (SPEC P9).

Every supervised child is a fresh interpreter, so a module it imports stays
resident for its whole life (a few MB for the cache package with psutil, the
config loader, libllama's binding). The supervisors in the middle of the tree
(``cache_sup``, ``model_sup``) are threads of the root
(:mod:`llamad.supervisor.hosted`), so the daemon runs four interpreters for
one model; cache-meta runs the cache's meta side. These tests run a real
daemon under a ``sitecustomize`` that writes each process's ``sys.modules`` at
interpreter exit (so what a process imports late, even while stopping, is
counted too) and fail if an eager import pulls a heavy package in. The same
dump records the ``GLIBC_TUNABLES`` each process started with.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_harness import GREEDY, Daemon, prompt_text
from llamad.model.worker_spec import NT_THRESHOLD

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

_SITECUSTOMIZE = """
import atexit, os, sys

def _dump():
    path = os.path.join(os.environ["IMPORTS_DUMP_DIR"], f"{os.getpid()}.txt")
    with open(path, "w") as f:
        f.write("\\0".join(sys.argv) + "\\n" + "\\n".join(sorted(sys.modules)) + "\\n")
    with open("/proc/self/maps") as m:
        fields = [line.split(None, 5) for line in m]
    mapped = sorted({f[5].strip() for f in fields if len(f) == 6 and f[5].startswith("/")})
    with open(path[:-4] + ".maps", "w") as f:
        f.write("\\n".join(mapped) + "\\n")
    with open(path[:-4] + ".env", "w") as f:
        f.write(os.environ.get("GLIBC_TUNABLES", ""))

if os.environ.get("IMPORTS_DUMP_DIR"):
    atexit.register(_dump)
"""

#: Packages cache-meta does not need besides psutil and the cache: the config
#: loader, the binding (libllama), the model worker's and the front's code.
NOT_IN_A_SUPERVISOR = frozenset(
    {
        "llamad.cache",
        "llamad.config",
        "llamad.llama_ffi",
        "llamad.model",
        "llamad.front",
        "_cffi_backend",
        "numpy",
        "jinja2",
        "psutil",
        "crc32c",
    }
)
#: cache-meta needs the cache (and psutil for the pressure poller), nothing of a model.
NOT_IN_CACHE_META = NOT_IN_A_SUPERVISOR - {"llamad.cache", "psutil", "crc32c"}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """What every supervised process of a daemon that served one request
    wrote at exit: its ``sys.modules`` and the files it had mapped."""
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    dumps = tmp_path_factory.mktemp("imports")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "IMPORTS_DUMP_DIR")}
    old_path = saved["PYTHONPATH"]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *([old_path] if old_path else [])])
    os.environ["IMPORTS_DUMP_DIR"] = str(dumps)
    d = Daemon({"m": {}})
    try:
        d.start(wait_for=["m"])
        d.worker("m").complete(prompt_text(0), max_tokens=2, **GREEDY)
        assert d.stop() == 0
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        d.cleanup()
    yield dumps


@pytest.fixture(scope="module")
def imports_by_process(dumps: Path) -> dict[str, set[str]]:
    """``{child id: modules}`` of every supervised process."""
    return _read(dumps, "txt")


@pytest.fixture(scope="module")
def mapped_by_process(dumps: Path) -> dict[str, set[str]]:
    """``{child id: paths of the files it had mapped}`` of every supervised process."""
    return _read(dumps, "maps")


def _read(dumps: Path, kind: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in dumps.glob("*.txt"):
        argv_line, _, rest = path.read_text().partition("\n")
        if kind != "txt":
            rest = path.with_suffix(f".{kind}").read_text()
        argv = argv_line.split("\0")
        if kind == "env":
            items = set(rest.split(":")) - {""}
        else:
            items = set(rest.split("\n") if kind == "maps" else rest.split()) - {""}
        if "--id" in argv[:-1]:
            found[argv[argv.index("--id") + 1]] = items
        elif argv[0].endswith("/llamad/daemon/__main__.py"):
            found["root"] = items
    return found


def test_only_the_worker_stores_its_large_copies_past_the_cache(dumps: Path) -> None:
    # A restore copies a row into the KV a layer at a time; glibc's own
    # threshold (from the last-level cache's size) would store those copies
    # through the cache at half their speed (llamad.model.worker_spec.NT_THRESHOLD).
    tunables = _read(dumps, "env")
    ours = f"glibc.cpu.x86_non_temporal_threshold={NT_THRESHOLD:#x}"
    assert ours in tunables.pop("model.m"), tunables
    assert all(ours not in t for t in tunables.values()), tunables


def _heavy(modules: set[str], banned: frozenset[str]) -> list[str]:
    return sorted(m for m in modules if any(m == b or m.startswith(b + ".") for b in banned))


def test_the_daemon_runs_the_root_cache_meta_the_front_the_gateway_and_a_worker_per_model(
    imports_by_process: dict[str, set[str]],
) -> None:
    # cache_sup and model_sup are threads of the root: no interpreter of their own.
    assert set(imports_by_process) == {"root", "cache-meta", "front", "gateway", "model.m"}


#: The shared libraries of llama.cpp: libllama, libggml and its backends.
LLAMA_CPP_LIBRARY = re.compile(r"/lib(llama|ggml)[\w.-]*\.so")


def test_only_the_worker_maps_llama_cpp(mapped_by_process: dict[str, set[str]]) -> None:
    # The root, the front, cache-meta and the gateway read GGUF headers and
    # build options in Python and never load a model: llama.cpp's libraries
    # and the binding would cost each several MB resident (SPEC P9).
    assert set(mapped_by_process) == {"root", "cache-meta", "front", "gateway", "model.m"}
    libs = {
        p: sorted(Path(f).name for f in files if LLAMA_CPP_LIBRARY.search(f))
        for p, files in mapped_by_process.items()
    }
    assert any(name.startswith("libllama") for name in libs.pop("model.m")), mapped_by_process
    assert libs == {p: [] for p in libs}


def test_no_process_but_the_worker_imports_the_binding(
    imports_by_process: dict[str, set[str]],
) -> None:
    binding = {"llamad.llama_ffi._llama", "llamad.llama_ffi.native", "_cffi_backend"}
    others = sorted(set(imports_by_process) - {"model.m"})
    loaded = {p: sorted(imports_by_process[p] & binding) for p in others}
    assert loaded == {p: [] for p in others}
    assert binding <= imports_by_process["model.m"]


#: The HTTP gateway is a client of the daemon: what a client program loads
#: (tests/unit/client/test_client_imports.py) and the HTTP stack, nothing of
#: the cache, the binding, the config loader or a worker.
NOT_IN_THE_GATEWAY = frozenset(
    {
        "llamad.cache",
        "llamad.llama_ffi._llama",
        "llamad.llama_ffi.model",
        "llamad.llama_ffi.context",
        "llamad.config.schema",
        "llamad.config.load",
        "llamad.config.convert",
        "llamad.model.core",
        "llamad.model.worker_proc",
        "llamad.front.front_proc",
        "llamad.daemon",
        "_cffi_backend",
        "numpy",
        "jinja2",
        "psutil",
        "crc32c",
    }
)


def test_the_gateway_imports_a_client_and_the_http_stack_only(
    imports_by_process: dict[str, set[str]],
) -> None:
    assert "gateway" in imports_by_process, sorted(imports_by_process)
    modules = imports_by_process["gateway"]
    assert _heavy(modules, NOT_IN_THE_GATEWAY) == []
    assert {"uvicorn", "uvloop", "httptools", "starlette", "llamad.client.aio"} <= modules


#: What an idle gateway (no HTTP request yet: this daemon is asked through its
#: ipc endpoint only) does not import (SPEC P9, docs/internals/gateway.md
#: "Memory"): each protocol's module with what it brings (the tool-call
#: parsers, the JSON-schema converter, the Prometheus exposition) is imported
#: on the protocol's first request; uvicorn's command line (click, watchfiles,
#: multiprocessing) never.
LAZY_IN_THE_GATEWAY = frozenset(
    {
        "llamad.gateway.openai",
        "llamad.gateway.responses",
        "llamad.gateway.anthropic",
        "llamad.gateway.ollama",
        "llamad.gateway.metrics",
        "llamad.gateway.tools",
        "llamad.llama_ffi.tool_calls",
        "llamad.llama_ffi.json_schema",
        "llamad.client.prometheus",
        "uvicorn.main",
        "click",
        "watchfiles",
        "multiprocessing",
    }
)


def test_an_idle_gateway_has_imported_no_protocol(
    imports_by_process: dict[str, set[str]],
) -> None:
    assert _heavy(imports_by_process["gateway"], LAZY_IN_THE_GATEWAY) == []


def test_cache_meta_imports_no_config_binding_model_or_front(
    imports_by_process: dict[str, set[str]],
) -> None:
    assert "cache-meta" in imports_by_process, sorted(imports_by_process)
    assert _heavy(imports_by_process["cache-meta"], NOT_IN_CACHE_META) == []


#: What an event loop brings (asyncio's machinery, and ssl with it): no daemon
#: process runs one, and structlog's import of asyncio is deferred at each
#: process's entry point (``llamad._lazy.defer_module``): ~3 MB resident each.
EVENT_LOOP = frozenset({"ssl", "asyncio.base_events", "asyncio.events"})


def test_no_daemon_process_loads_an_event_loop(imports_by_process: dict[str, set[str]]) -> None:
    # The gateway's one job is an event loop (uvloop, for HTTP).
    expected = {"root", "cache-meta", "front", "model.m"}
    assert expected <= set(imports_by_process), sorted(imports_by_process)
    loaded = {p: _heavy(imports_by_process[p], EVENT_LOOP) for p in sorted(expected)}
    assert loaded == {p: [] for p in sorted(expected)}


#: What ``import crc32c`` brings for its ``__version__`` (importlib.metadata,
#: and email, zipfile, csv with it): ~3.5 MB in each process that checks a
#: row. :mod:`llamad.cache.checksum` loads the C function alone.
PACKAGE_METADATA = frozenset({"importlib.metadata", "email", "zipfile"})


def test_no_daemon_process_reads_package_metadata(
    imports_by_process: dict[str, set[str]],
) -> None:
    expected = {"root", "cache-meta", "front", "model.m"}
    assert expected <= set(imports_by_process), sorted(imports_by_process)
    loaded = {p: _heavy(imports_by_process[p], PACKAGE_METADATA) for p in sorted(expected)}
    assert loaded == {p: [] for p in sorted(expected)}


#: OpenSSL's hashing (libcrypto, ~4 MB resident): ``secrets`` and ``hmac``
#: bring it with ``hashlib``. The root and the front never hash (the cache's
#: keys and fingerprints are the workers' and cache-meta's), so neither loads
#: it, even while serving and stopping.
OPENSSL_HASHING = frozenset({"hashlib", "_hashlib", "secrets", "hmac"})


def test_the_root_and_the_front_load_no_openssl_hashing(
    imports_by_process: dict[str, set[str]],
) -> None:
    expected = {"root", "front"}
    assert expected <= set(imports_by_process), sorted(imports_by_process)
    loaded = {p: _heavy(imports_by_process[p], OPENSSL_HASHING) for p in sorted(expected)}
    assert loaded == {p: [] for p in sorted(expected)}


def test_only_cache_meta_imports_cache_metas_index(
    imports_by_process: dict[str, set[str]],
) -> None:
    assert "llamad.cache.meta" in imports_by_process["cache-meta"]
    others = sorted(set(imports_by_process) - {"cache-meta"})
    assert {p: "llamad.cache.meta" in imports_by_process[p] for p in others} == dict.fromkeys(
        others, False
    )


#: What a worker imports on its first request that needs it, not before
#: (SPEC P9): this daemon's worker served one text completion. The chat
#: modules (jinja2's sandbox, the tool-call parsers) come with the first chat
#: request, the JSON-schema converter with the first schema, psutil with the
#: pressure poller's first sample (cache-meta's, off by default).
LAZY_IN_A_WORKER = frozenset(
    {
        "jinja2",
        "llamad.llama_ffi.chat_template",
        "llamad.llama_ffi.tool_calls",
        "llamad.llama_ffi.json_schema",
        "psutil",
    }
)


def test_a_worker_asked_for_text_only_has_imported_no_chat_schema_or_psutil(
    imports_by_process: dict[str, set[str]],
) -> None:
    assert _heavy(imports_by_process["model.m"], LAZY_IN_A_WORKER) == []
