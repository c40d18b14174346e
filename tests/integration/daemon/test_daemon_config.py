"""A bad configuration is refused before anything starts, naming the key (SPEC D1)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llamad import paths
from llamad.daemon.main import EXIT_CONFIG
from llamad.testing import daemon_command, scrubbed_env

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


def _run_daemon(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "llamad.toml"
    config.write_text(
        f"""
[daemon]
runtime_dir = "{tmp_path / "run"}"
state_dir = "{tmp_path / "state"}"
{toml}
"""
    )
    return subprocess.run(
        daemon_command(config),
        capture_output=True,
        text=True,
        timeout=100,
        env=scrubbed_env(),
        check=False,
    )


def _refused(tmp_path: Path, toml: str) -> str:
    proc = _run_daemon(tmp_path, toml)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    # Refused before anything started: no runtime directory, no socket, no child.
    assert not (tmp_path / "run").exists()
    return proc.stderr


def test_a_wrong_type_is_refused_at_start_naming_the_key(tmp_path: Path) -> None:
    err = _refused(tmp_path, '[models.smol]\npath = "default"\nn_ctx = "big"\n')
    assert "models.smol.n_ctx" in err
    assert "expected an integer" in err


def test_an_unknown_key_is_refused_at_start_naming_the_key(tmp_path: Path) -> None:
    err = _refused(tmp_path, '[models.smol]\npath = "default"\nn_ctxx = 512\n')
    assert "models.smol.n_ctxx" in err
    assert "did you mean 'n_ctx'" in err


def test_a_missing_model_file_is_refused_at_start_naming_the_key(tmp_path: Path) -> None:
    missing = paths.default_model_path().parent / "no-such-model.gguf"
    err = _refused(tmp_path, f'[models.smol]\npath = "{missing}"\n')
    assert "models.smol.path" in err
    assert "does not exist" in err
