"""The name registry: one live holder per name, stale records ignored, private dirs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from llamad.actors.errors import ActorConfigError, NameTaken
from llamad.actors.registry import Registry, RegistryEntry, check_name, runtime_dir

pytestmark = pytest.mark.timeout(60)


def test_published_entry_is_found_by_lookup(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    claim = reg.claim("cache-meta")
    entry = claim.publish("ipc:///x.sock", "abc")
    assert reg.lookup("cache-meta") == entry
    assert entry.pid == os.getpid() and entry.alive()
    assert reg.names() == ["cache-meta"]
    claim.release()


def test_second_claim_on_a_live_name_raises_name_taken(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    first = reg.claim("toy")
    first.publish("ipc:///x.sock", "abc")
    with pytest.raises(NameTaken) as info:
        Registry(tmp_path).claim("toy")
    assert info.value.details["pid"] == os.getpid()
    first.release()


def test_release_frees_the_name_and_removes_the_record(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    claim = reg.claim("toy")
    claim.publish("ipc:///x.sock", "abc")
    claim.release()
    claim.release()  # idempotent
    assert reg.read("toy") is None
    reg.claim("toy").release()


def test_death_of_the_holder_frees_the_name(tmp_path: Path) -> None:
    code = (
        "import sys, os; from llamad.actors.registry import Registry;"
        "c = Registry(sys.argv[1]).claim('toy'); c.publish('ipc:///x', 'i');"
        "os.kill(os.getpid(), 9)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, timeout=60)
    reg = Registry(tmp_path)
    stale = reg.read("toy")
    assert stale is not None and not stale.alive()
    assert reg.lookup("toy") is None
    assert reg.names() == []
    claim = reg.claim("toy")
    claim.publish("ipc:///y", "j")
    assert reg.lookup("toy") is not None
    claim.release()


def test_release_keeps_a_record_written_by_a_newer_holder(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    claim = reg.claim("toy")
    claim.publish("ipc:///x", "old")
    newer = RegistryEntry("toy", "ipc:///y", 1, 1, "b", 1, "new", 0.0)
    (tmp_path / "toy.json").write_bytes(msgspec.json.encode(newer))
    claim.release()
    assert reg.read("toy") == newer


def test_corrupt_record_reads_as_absent(tmp_path: Path) -> None:
    (tmp_path / "toy.json").write_bytes(b"{not json")
    assert Registry(tmp_path).read("toy") is None


def test_ipc_endpoint_is_deterministic_under_the_root(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    assert reg.ipc_endpoint("toy") == f"ipc://{tmp_path}/toy.sock"
    assert Registry(tmp_path).ipc_endpoint("toy") == reg.ipc_endpoint("toy")


def test_ipc_path_longer_than_sun_path_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    with pytest.raises(ActorConfigError) as info:
        Registry(deep).ipc_endpoint("toy")
    assert info.value.field == "endpoint"


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "a/b", "a b", "x" * 65, "ü"])
def test_invalid_actor_names_are_refused(name: str) -> None:
    with pytest.raises(ActorConfigError):
        check_name(name)


def test_runtime_dir_is_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "run"
    monkeypatch.setenv("LLAMAD_RUNTIME_DIR", str(target))
    assert runtime_dir() == target
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_runtime_dir_with_open_permissions_is_tightened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "run"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    monkeypatch.setenv("LLAMAD_RUNTIME_DIR", str(target))
    runtime_dir()
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
