"""What a client program loads: the public client never pulls in the daemon.

``from llamad import Client`` runs in users' programs, notebooks and short
CLI calls; everything it imports is paid at every start and stays resident.
A client needs the actor protocol, its wire types and the error classes, and
nothing of the cache, the model worker, the supervisor, libllama or the
daemon's own packages (psutil, crc32c). This test runs a fresh interpreter
that imports both clients, builds every kind of request body and reads the
config's endpoint, and pins the llamad modules it may hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

#: Every llamad module a client process may hold. A new one needs a reason.
ALLOWED = frozenset(
    {
        "llamad",
        "llamad._lazy",
        "llamad._pins",
        "llamad.errors",
        "llamad.logs",
        "llamad.paths",
        "llamad.tiers",  # the tier names the front's wire speaks
        "llamad.actors",
        "llamad.actors.aio_client",
        "llamad.actors.aio_link",
        "llamad.actors.client",
        # Both actors clients' connection state, apart from the waiting.
        "llamad.actors.connection",
        "llamad.actors.curve",
        "llamad.actors.errors",
        "llamad.actors.monitor",
        "llamad.actors.ops",
        "llamad.actors.registry",
        "llamad.actors.sockets",
        "llamad.actors.wire",
        "llamad.client",
        "llamad.client.aio",
        "llamad.client.aio_stream",
        # Both public clients' requests as data, and their shared state.
        "llamad.client.asks",
        "llamad.client.base",
        "llamad.client.bodies",
        "llamad.client.affinity",  # several daemons: their KV events, prompts as blocks
        "llamad.client.router",  # which of several daemons (no I/O)
        "llamad.client.routes",
        "llamad.client.stream",
        "llamad.client.sync",
        # The endpoint and CURVE keys of [daemon] and [client]; not the schema.
        "llamad.config",
        "llamad.config.client",
        "llamad.config.dirs",
        "llamad.config.env",
        "llamad.config.keys",
        "llamad.config.kinds",
        "llamad.config.problems",
        "llamad.config.reader",
        "llamad.config.sections",
        "llamad.config.security",
        "llamad.config.units",
        "llamad.front",
        "llamad.front.wire",
        # The worker's wire vocabulary and results, not the worker.
        "llamad.model",
        "llamad.model.requests",
        "llamad.model.results",
        "llamad.model.wire",
        # The KV event stream's block hashes, messages and index (issue 20):
        # pure, msgspec only, for routing by cached prefix.
        "llamad.kv_events",
        "llamad.kv_events.blocks",
        "llamad.kv_events.index",
        "llamad.kv_events.wire",
        # Error classes and an enum: no libllama.
        "llamad.llama_ffi",
        "llamad.llama_ffi.errors",
        "llamad.llama_ffi.spin",
    }
)

#: Packages a client never loads, whatever else changes.
NEVER = ("psutil", "crc32c", "_cffi_backend", "numpy", "jinja2")

_CLIENT_PROGRAM = """
import json, sys
from llamad import AsyncClient, Client, Completion, TokenEvent, StickyBusy
from llamad.client import bodies
from llamad.config import client_endpoint

endpoint = client_endpoint(env={"LLAMAD_RUNTIME_DIR": sys.argv[1]})
client = Client(endpoint)
aclient = AsyncClient(endpoint)
common = dict(request_id="r", add_special=True, chat=None)
bodies.infer_body("hello", messages=None, options={"max_tokens": 2, "seed": 1}, **common)
bodies.infer_body([1, 2, 3], messages=None, options={}, **common)
bodies.infer_body(None, messages=[{"role": "user", "content": "hi"}], options={}, **common)
bodies.chat_body([{"role": "user", "content": "hi"}], {})
client.close()
json.dump(sorted(sys.modules), sys.stdout)
"""


def test_a_client_program_loads_no_cache_worker_or_daemon_module(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT_PROGRAM, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    modules = set(json.loads(out))
    ours = {m for m in modules if m == "llamad" or m.startswith("llamad.")}
    assert ours - ALLOWED == set(), "a client now loads these too"
    assert not [m for m in NEVER if m in modules]
    # The budget is live: the client's own modules are among those loaded.
    assert {"llamad.client.sync", "llamad.client.aio", "llamad.model.results"} <= ours
