"""``llamad keys generate``: a keypair on disk, the secret private, nothing replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamad.actors.curve import CurveClient, read_key_file
from llamad.cli.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from llamad.cli.main import main

pytestmark = pytest.mark.timeout(30)


def test_keys_generate_writes_a_private_secret_and_its_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "keys"
    assert main(["keys", "generate", "server", "--dir", str(folder)]) == EXIT_OK
    secret, public = folder / "server.key", folder / "server.pub"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    key = read_key_file(public, "public")
    assert CurveClient(read_key_file(secret, "secret", secret=True), key).public_key == key
    out = capsys.readouterr().out
    assert f"{public}  {key}" in out
    assert "curve_secret_key" in out and "curve_client_keys" in out


def test_keys_generate_never_replaces_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "generate", "alice", "--dir", str(tmp_path)]) == EXIT_OK
    before = (tmp_path / "alice.key").read_bytes()
    capsys.readouterr()
    assert main(["keys", "generate", "alice", "--dir", str(tmp_path)]) == EXIT_ERROR
    assert "exists" in capsys.readouterr().err
    assert (tmp_path / "alice.key").read_bytes() == before


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "-dash"])
def test_keys_generate_refuses_a_name_that_is_not_a_file_name(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "generate", "--dir", str(tmp_path), "--", name]) == EXIT_USAGE
    assert list(tmp_path.iterdir()) == []
