"""The peers bench's drivers against the real peers: llama-server built from the pinned tree
and llama-cpp-python in its venv (each skipped, with the reason, where bench/peers_setup.py
has not set it up)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from llamad import paths

if TYPE_CHECKING:
    from bench.peers.lcpp_sys import LlamaCppPython
    from bench.peers.server_sys import LlamaServer

pytestmark = [pytest.mark.timeout(180), pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
setup = importlib.import_module("bench.peers_setup")
server_sys = importlib.import_module("bench.peers.server_sys")
lcpp_sys = importlib.import_module("bench.peers.lcpp_sys")

PROMPT = [1, *range(1000, 1100)]  # 101 token ids, the same for every peer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    binary = setup.llama_tools()["llama-server"]
    if not Path(binary).is_file():
        pytest.skip(f"llama-server not built at {binary} (python -m bench.peers_setup)")
    log = tmp_path_factory.mktemp("server") / "llama-server.log"
    s: LlamaServer = server_sys.LlamaServer(
        binary, str(paths.default_model_path()), n_ctx=1024, n_seq_max=2, threads=1, log=log
    )
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_a_streamed_completion_times_each_token_and_reads_the_servers_timings(
    server: LlamaServer,
) -> None:
    reply = server.complete(PROMPT, 4, ignore_eos=True)
    assert len(reply.arrivals) == 4
    assert reply.arrivals == sorted(reply.arrivals)
    assert reply.ttft_ms > 0
    assert reply.timings["prompt_n"] + reply.timings["cache_n"] == len(PROMPT)
    assert isinstance(reply.slot, int)


def test_the_same_prompt_again_is_reported_reused(server: LlamaServer) -> None:
    prompt = [1, *range(2000, 2100)]
    server.complete(prompt, 1)
    again = server.complete(prompt, 1)
    # The server re-evaluates the last prompt token, so at most all but one is reused.
    assert again.timings["cache_n"] == len(prompt) - 1


def test_a_chat_goes_through_the_template_and_reports_its_timings(
    server: LlamaServer,
) -> None:
    reply = server.chat([{"role": "user", "content": "Name one colour."}], 3)
    assert reply.arrivals
    assert reply.timings["prompt_n"] + reply.timings.get("cache_n", 0) > 5


def test_a_restart_is_a_new_process_and_stop_leaves_none(
    server: LlamaServer,
) -> None:
    before = server.pids()
    server.restart()
    after = server.pids()
    assert before and after and before != after
    assert not psutil.pid_exists(before[0]) or psutil.Process(before[0]).status() == "zombie"


def test_llama_cpp_python_reuses_its_ram_cache_after_the_context_is_forgotten(
    tmp_path: Path,
) -> None:
    py, why = setup.python_peer(build=False)
    if py is None:
        pytest.skip(f"llama-cpp-python: {why}")
    peer = lcpp_sys.LlamaCppPython(
        py,
        str(paths.default_model_path()),
        n_ctx=1024,
        threads=1,
        cache="ram",
        cache_dir=tmp_path / "cache",
        log=tmp_path / "child.log",
    )
    peer.start()
    try:
        assert peer.version == "0.3.36"
        cold = peer.complete(PROMPT, 2, forget=True)
        assert cold.reused == 0
        assert len(cold.arrivals) >= 1
        warm = peer.complete(PROMPT, 2, forget=True)
        assert warm.reused == len(PROMPT) - 1
    finally:
        peer.stop()


def test_llama_cpp_pythons_disk_cache_outlives_its_process(tmp_path: Path) -> None:
    py, why = setup.python_peer(build=False)
    if py is None:
        pytest.skip(f"llama-cpp-python: {why}")

    def peer() -> LlamaCppPython:
        made: LlamaCppPython = lcpp_sys.LlamaCppPython(
            py,
            str(paths.default_model_path()),
            n_ctx=1024,
            threads=1,
            cache="disk",
            cache_dir=tmp_path / "cache",
            log=tmp_path / "child.log",
        )
        return made

    first = peer()
    first.start()
    try:
        assert first.complete(PROMPT, 2, forget=True).reused == 0
    finally:
        first.stop()
    second = peer()
    second.start()
    try:
        assert second.complete(PROMPT, 2, forget=True).reused == len(PROMPT) - 1
    finally:
        second.stop()


def test_llama_cpp_pythons_disk_cache_gives_an_entry_once(tmp_path: Path) -> None:
    # Why bench/peers/scenarios.py fills and reads back each size across its own
    # restart: LlamaDiskCache (0.3.36) pops the entry a lookup finds, so the
    # second read of the same prompt (the context forgotten) finds nothing.
    py, why = setup.python_peer(build=False)
    if py is None:
        pytest.skip(f"llama-cpp-python: {why}")
    peer = lcpp_sys.LlamaCppPython(
        py,
        str(paths.default_model_path()),
        n_ctx=1024,
        threads=1,
        cache="disk",
        cache_dir=tmp_path / "cache",
        log=tmp_path / "child.log",
    )
    peer.start()
    try:
        other = [1, *range(3000, 3100)]
        peer.complete(PROMPT, 1, forget=True)  # saved
        assert peer.complete(other, 1, forget=True).reused == 1  # pops PROMPT's entry
        assert peer.complete(PROMPT, 1, forget=True).reused == 1  # gone: only token 1 shared
    finally:
        peer.stop()
