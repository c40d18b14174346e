"""A bad configuration is refused before anything starts, naming the key (SPEC D1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamad import paths
from llamad.daemon.main import EXIT_CONFIG

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
    keep = ("LLAMAD_CACHE_DIR", "LLAMAD_DEFAULT_MODEL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_") or k in keep}
    return subprocess.run(
        [sys.executable, "-m", "llamad.daemon", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
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
