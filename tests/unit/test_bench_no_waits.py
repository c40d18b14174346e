"""The user-facing benches send requests as users do (STYLE.md's "not again": a
benchmark that waits between requests where a user would not).

The peers bench, the daemon bench and the soak never wait for a save to be
published, never read the finish-save counter to pace themselves, and run
llamad's cache as configured by default: no ``save_tier`` / ``restore_tiers``
and no tier turned off. A scenario that needs a row in a tier gets there as
traffic does (see bench/peers/scenarios.py and bench/daemon_bench.py).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]

USER_FACING = sorted(
    [
        *(ROOT / "bench" / "peers").glob("*.py"),
        ROOT / "bench" / "peers_bench.py",
        ROOT / "bench" / "daemon_bench.py",
        *(ROOT / "bench").glob("soak*.py"),
    ]
)

# A name that waits for a save, or paces requests by the saves published.
WAITS = ("wait_saved", "lookup_exact_or_wait", "saves_finish", "wait_prefetched")
# What turns the cache's own choice of tiers into a hand-made one.
TIER_CHOICES = ("save_tier", "restore_tiers")


def _names(path: Path) -> set[str]:
    """Every identifier, attribute and string constant of a module."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.FunctionDef):
            out.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.update(w.strip("\"'[]=.,:") for w in node.value.split())
    return out


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: p.name)
def test_no_user_facing_bench_waits_for_a_save(path: Path) -> None:
    found = sorted(_names(path) & set(WAITS))
    assert not found, f"{path.relative_to(ROOT)} waits for saves: {found}"


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: p.name)
def test_no_user_facing_bench_chooses_llamads_tiers(path: Path) -> None:
    found = sorted(_names(path) & set(TIER_CHOICES))
    assert not found, f"{path.relative_to(ROOT)} configures tiers by hand: {found}"


def test_the_peers_daemon_runs_the_default_cache_configuration() -> None:
    llamad_sys = importlib.import_module("bench.peers.llamad_sys")
    table = llamad_sys.ModelTable("main", 4096, 4, 2)
    daemon = llamad_sys.LlamadDaemon("t", [table], 2)
    try:
        config = (daemon.base / "llamad.toml").read_text()
        env = daemon.env
    finally:
        daemon.remove()
    # No tier sized, chosen or moved: the cache's defaults (ram_file on /dev/shm).
    assert "[cache" not in config and "[models.main.cache" not in config
    assert not any(k.startswith("LLAMAD_CACHE__RAM_FILE") for k in env)
    assert "keep_alive" not in config


def test_the_daemon_bench_runs_the_default_cache_configuration() -> None:
    daemon_bench = importlib.import_module("bench.daemon_bench")
    d = daemon_bench.Daemon()
    try:
        config = d.config.read_text()
    finally:
        d.close()
    cache_tables = [line for line in config.splitlines() if line.startswith("[cache")]
    # Only the instance name (this daemon's rows apart from any other's).
    assert cache_tables == ["[cache]"]
    assert "quota" not in config and ".cache]" not in config


def test_the_soak_sizes_every_tier_small_and_turns_none_off() -> None:
    # Its scenario is load with rows evicted all along: every tier is sized
    # small (stated in its doc), none is turned off, and the daemon waits for
    # an in-flight save no longer than by default.
    soak = importlib.import_module("bench.soak")
    d = soak.SoakDaemon("32MiB", "32MiB", "64MiB")
    try:
        config = d.config.read_text()
    finally:
        d.remove()
    assert "quota = 0" not in config
    assert '[cache.ram_file]\nquota = "32MiB"' in config
    assert "session_resume_wait_ms" not in config
    assert not d.base.exists() and not d.ram_file_root.exists()
