"""Model files only from the allowed directories (symlinks and .. resolved); loopback TCP only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from config_helpers import Workspace, write_gguf
from llamad.config import ConfigError, check_endpoint, resolve_model_path

pytestmark = pytest.mark.timeout(60)

PATH = ("models", "smol", "path")


def test_a_missing_model_file_is_refused_naming_the_key(ws: Workspace) -> None:
    missing = ws.models_dir / "missing.gguf"
    problems = ws.refused(ws.data({PATH: str(missing)}))
    assert problems == {"models.smol.path": f"{missing} does not exist"}


def test_a_symlink_out_of_the_allowed_directories_is_refused(ws: Workspace) -> None:
    outside = write_gguf(ws.dir / "elsewhere" / "secret.gguf")
    link = ws.models_dir / "innocent.gguf"
    link.symlink_to(outside)
    problems = ws.refused(ws.data({PATH: str(link)}))
    assert f"(which resolves to {outside}) is outside" in problems["models.smol.path"]


def test_a_dotdot_escape_is_refused(ws: Workspace) -> None:
    write_gguf(ws.dir / "elsewhere" / "secret.gguf")
    escape = f"{ws.models_dir}/../elsewhere/secret.gguf"
    problems = ws.refused(ws.data({PATH: escape}))
    assert "is outside the allowed model directories" in problems["models.smol.path"]


def test_a_directory_that_only_shares_a_prefix_is_not_inside(ws: Workspace) -> None:
    evil = write_gguf(Path(f"{ws.models_dir}-evil") / "x.gguf")
    problems = ws.refused(ws.data({PATH: str(evil)}))
    assert "is outside the allowed model directories" in problems["models.smol.path"]


def test_a_symlink_inside_the_allowed_directories_is_loaded_by_its_real_path(
    ws: Workspace,
) -> None:
    link = ws.models_dir / "current.gguf"
    link.symlink_to(ws.tiny)
    config = ws.loaded(ws.data({PATH: str(link)}))
    assert config.models["smol"].path == str(ws.tiny)
    assert config.worker_spec("smol").model_path == str(ws.tiny)


def test_an_allowed_directory_reached_through_a_symlink_allows_its_files(ws: Workspace) -> None:
    alias = ws.dir / "alias"
    alias.symlink_to(ws.models_dir)
    config = ws.loaded(
        ws.data({("security", "model_dirs"): [str(alias)], PATH: str(alias / "tiny.gguf")})
    )
    assert config.models["smol"].path == str(ws.tiny)


def test_a_file_that_is_not_gguf_is_refused_naming_the_key(ws: Workspace) -> None:
    text = ws.models_dir / "notes.gguf"
    text.write_text("not a model at all")
    problems = ws.refused(ws.data({PATH: str(text)}))
    assert "GGUF" in problems["models.smol.path"]


def test_a_directory_is_not_a_model_file(ws: Workspace) -> None:
    sub = ws.models_dir / "sub"
    sub.mkdir()
    problems = ws.refused(ws.data({PATH: str(sub)}))
    assert problems == {"models.smol.path": f"{sub} is not a regular file"}


def test_a_model_directory_that_does_not_exist_is_refused(ws: Workspace) -> None:
    gone = ws.dir / "gone"
    data = ws.data({("security", "model_dirs"): [str(ws.models_dir), str(gone)]})
    problems = ws.refused(data)
    assert problems == {"security.model_dirs": f"{gone} is not a directory"}


def test_containment_is_checked_before_existence() -> None:
    # A refusal must not tell a client whether a file outside the allowed
    # directories exists.
    with pytest.raises(ConfigError) as info:
        resolve_model_path("/etc/no-such-model.gguf", ["/srv/models"])
    assert "outside the allowed model directories" in info.value.message
    assert info.value.details["field"] == "path"


def test_resolve_model_path_refuses_a_relative_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an absolute path"):
        resolve_model_path("models/x.gguf", [str(tmp_path)])


def test_resolve_model_path_answers_the_real_path(tmp_path: Path) -> None:
    real = write_gguf(tmp_path / "m" / "a.gguf")
    link = tmp_path / "m" / "b.gguf"
    link.symlink_to(real)
    assert resolve_model_path(link, [tmp_path / "m"]) == real


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://0.0.0.0:7777",
        "tcp://*:7777",
        "tcp://192.168.1.4:7777",
        "tcp://example.org:7777",
        "tcp://[::]:7777",
    ],
)
def test_tcp_beyond_loopback_is_refused(ws: Workspace, endpoint: str) -> None:
    problems = ws.refused(ws.data({("daemon", "endpoint"): endpoint}))
    assert "not on a loopback address" in problems["daemon.endpoint"]


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:7777", "tcp://localhost:7777", "tcp://[::1]:7777"]
)
def test_tcp_on_loopback_is_accepted(endpoint: str) -> None:
    assert check_endpoint(endpoint) == endpoint


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://127.0.0.1:80", "neither ipc:// nor tcp://"),
        ("tcp://127.0.0.1", "tcp://HOST:PORT"),
        ("ipc://" + "/x" * 60, "longer than 107 bytes"),
    ],
)
def test_an_unusable_endpoint_is_refused(ws: Workspace, endpoint: str, expected: str) -> None:
    problems = ws.refused(ws.data({("daemon", "endpoint"): endpoint}))
    assert expected in problems["daemon.endpoint"]


def test_a_runtime_dir_too_long_for_the_sockets_is_refused(ws: Workspace) -> None:
    long_dir = "/tmp/" + "d" * 100
    problems = ws.refused(ws.data({("daemon", "runtime_dir"): long_dir}))
    assert "daemon.runtime_dir" in problems
    assert "models.smol" in problems  # its worker's socket would not fit either


def test_the_default_endpoint_is_an_ipc_socket_in_the_runtime_dir(ws: Workspace) -> None:
    config = ws.loaded(ws.data())
    assert config.endpoint == f"ipc://{ws.env['LLAMAD_RUNTIME_DIR']}/llamad.sock"
    assert os.path.isabs(config.endpoint.removeprefix("ipc://"))


def test_dotdot_after_a_symlink_is_resolved_as_the_kernel_does(ws: Workspace) -> None:
    # models/link/.. is the link target's parent, not models/: a string
    # normalisation would have allowed this path.
    write_gguf(ws.dir / "elsewhere" / "secret.gguf")
    deep = ws.dir / "elsewhere" / "deep"
    deep.mkdir()
    (ws.models_dir / "link").symlink_to(deep)
    write_gguf(ws.models_dir / "secret.gguf")
    problems = ws.refused(ws.data({PATH: f"{ws.models_dir}/link/../secret.gguf"}))
    assert "resolves to" in problems["models.smol.path"]
    assert str(ws.dir / "elsewhere" / "secret.gguf") in problems["models.smol.path"]


def test_a_file_name_too_long_for_the_file_system_is_refused_naming_the_key(
    ws: Workspace,
) -> None:
    long = ws.models_dir / ("m" * 300 + ".gguf")  # a name over NAME_MAX (255 bytes)
    problems = ws.refused(ws.data({PATH: str(long)}))
    assert problems == {
        "models.smol.path": f"{long} is too long a path (or one of its names is "
        "longer than the file system allows)"
    }


def test_a_loop_of_symbolic_links_is_refused_naming_the_key(ws: Workspace) -> None:
    a, b = ws.models_dir / "a.gguf", ws.models_dir / "b.gguf"
    a.symlink_to(b)
    b.symlink_to(a)
    problems = ws.refused(ws.data({PATH: str(a)}))
    assert problems == {"models.smol.path": f"{a} runs into a loop of symbolic links"}


def test_a_model_the_daemon_cannot_reach_is_refused_naming_the_key(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The suite runs as root, which no file mode stops: the kernel's answer
    # for a directory the daemon's user may not search is what is stubbed.
    denied = ws.models_dir / "private" / "m.gguf"

    def stat(self: Path, *, follow_symlinks: bool = True) -> os.stat_result:
        if self == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, follow_symlinks=follow_symlinks)

    real_stat = Path.stat
    monkeypatch.setattr(Path, "stat", stat)
    with pytest.raises(ConfigError) as info:
        resolve_model_path(denied, [ws.models_dir], "models.smol.path")
    assert info.value.details == {
        "field": "models.smol.path",
        "problem": f"{denied} cannot be reached by the daemon's user (permission denied)",
    }
