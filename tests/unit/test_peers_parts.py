"""bench/peers: the peers' setup keys, the prompts, and the parsers of what peers answer."""

from __future__ import annotations

import importlib
import os
import platform
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
setup = importlib.import_module("bench.peers_setup")
workload = importlib.import_module("bench.peers.workload")
server_sys = importlib.import_module("bench.peers.server_sys")
lcpp_child = importlib.import_module("bench.peers.lcpp_child")
idle = importlib.import_module("bench.peers.idle")


def test_llama_cpp_python_is_built_with_llamads_flags_and_keyed_by_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("CMAKE_ARGS", "GGML_NATIVE", "CFLAGS", "CXXFLAGS"):
        monkeypatch.delenv(name, raising=False)
    native = setup.native()
    config = native.build_config("cpu", os.environ)
    venv, stamp, env = setup.python_peer_plan()
    args = shlex.split(env["CMAKE_ARGS"])
    assert "-DGGML_NATIVE=ON" in args
    # Only flags llama-cpp-python's own CMakeLists does not set itself.
    assert not any(a.startswith("-DLLAMA_BUILD_") for a in args)
    for name, value in config.env:  # e.g. -mno-amx-* on an AMX host
        assert env[name] == value
        assert f"{name}={value}" in stamp
    assert "llama-cpp-python==0.3.36" in stamp
    # Another configuration gets another folder, never a reused venv.
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_AVX512=OFF")
    other, other_stamp, _ = setup.python_peer_plan()
    assert other != venv
    assert "-DGGML_AVX512=OFF" in other_stamp


def test_a_venv_without_its_stamp_is_not_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLAMAD_CACHE_DIR", str(tmp_path))
    venv, stamp, _ = setup.python_peer_plan()
    assert tmp_path in venv.parents
    (venv / "bin").mkdir(parents=True)
    py, why = setup.python_peer(build=False)
    assert py is None and "not set up" in why
    (venv / setup.STAMP).write_text(stamp + "changed\n")
    assert setup.python_peer(build=False)[0] is None
    venv.with_name(venv.name + ".failed").write_text("pip install failed (exit 1)\n")
    assert "pip install failed (exit 1)" in setup.python_peer(build=False)[1]
    (venv / setup.STAMP).write_text(stamp)
    assert setup.python_peer(build=False)[0] == venv / "bin" / "python"


def test_prompts_have_exactly_the_asked_length_and_the_nonce_first() -> None:
    def tokenize(text: str) -> list[int]:
        return [hash(w) % 50_000 for w in text.split()]

    a = workload.exact_tokens(tokenize, "a", 300)
    b = workload.exact_tokens(tokenize, "b", 300)
    assert len(a) == len(b) == 300
    assert a[0] != b[0]  # no shared first token: no prefix cache finds one in the other
    assert len(workload.long_counting_tokens(tokenize, 1, 500)) >= 500


def test_server_events_are_read_as_tokens_only_when_they_carry_one() -> None:
    assert server_sys._piece({"content": "Hi", "stop": False}) == "Hi"
    assert server_sys._piece({"content": "", "stop": True, "timings": {}}) is None
    assert server_sys._piece({"choices": [{"delta": {"content": "x"}}]}) == "x"
    assert server_sys._piece({"choices": [{"delta": {"role": "assistant"}}]}) is None


class _Cache:
    def __init__(self, key: tuple[int, ...] | None) -> None:
        self.key = key

    def _find_longest_prefix_key(self, tokens: tuple[int, ...]) -> tuple[int, ...] | None:
        return self.key


class _Llm:
    def __init__(self, live: list[int], key: tuple[int, ...] | None) -> None:
        self.input_ids = live + [0] * 10
        self.n_tokens = len(live)
        self.cache = _Cache(key)


def test_llama_cpp_pythons_reuse_is_the_longer_of_live_context_and_cache() -> None:
    prompt = [1, 2, 3, 4, 5]
    assert lcpp_child._reusable(_Llm([1, 2, 9], (1, 2, 3, 4, 8)), prompt) == 4
    assert lcpp_child._reusable(_Llm([1, 2, 3], None), prompt) == 3
    # The whole prompt cached still evaluates its last token.
    assert lcpp_child._reusable(_Llm([], (1, 2, 3, 4, 5, 6)), prompt) == 4


def test_idle_overhead_subtracts_weights_and_kv_per_holder() -> None:
    mib = 1 << 20
    assert idle.overhead_mb(500 * mib, 1, 92.0, 90.0) == pytest.approx(318 * mib / 1e6)
    assert idle.overhead_mb(500 * mib, 2, 92.0, 90.0) == pytest.approx(136 * mib / 1e6)


def test_the_result_file_is_named_without_the_host_name() -> None:
    bench = importlib.import_module("bench.peers_bench")
    name = bench.machine_name()
    assert name.endswith(f"-{os.cpu_count()}c")
    host = platform.node().lower()
    assert not host or host not in name


def test_the_llama_cpp_python_key_names_this_cpus_flags() -> None:
    # -march=native builds for this CPU: another CPU's flags get another venv.
    _, stamp, _ = setup.python_peer_plan()
    assert f"cpu-flags-sha256={setup.cpu_flags_digest()}" in stamp
    assert len(setup.cpu_flags_digest()) == 16


def test_a_model_table_sets_only_its_context_and_a_policy_when_asked() -> None:
    llamad_sys = importlib.import_module("bench.peers.llamad_sys")
    table = llamad_sys.ModelTable("saves", 4096, 4, 2, {"continued_interval": 64})
    text = table.toml()
    assert "n_seq_max = 4" in text and "n_threads = 2" in text
    assert "[models.saves.cache.policy]\ncontinued_interval = 64" in text
    assert "[models.main.cache" not in llamad_sys.ModelTable("main", 4096, 4, 2).toml()


def test_removing_the_peers_daemon_removes_its_ram_file_rows_too() -> None:
    # The default ram_file root lies on /dev/shm, outside the daemon's directory.
    llamad_sys = importlib.import_module("bench.peers.llamad_sys")
    daemon = llamad_sys.LlamadDaemon("t", [llamad_sys.ModelTable("m", 4096, 1, 2)], 2)
    root = daemon.ram_file_root
    assert root.parent == Path(f"/dev/shm/llamad-{os.getuid()}")
    assert root.name == daemon.instance
    root.mkdir(parents=True)
    (root / "x.kvc").write_bytes(b"x")
    daemon.remove()
    assert not root.exists() and not daemon.base.exists()
