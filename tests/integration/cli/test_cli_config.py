"""``llamad config check | example``: validation without starting anything, and its exit codes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cli_run import llamad
from llamad import paths
from llamad.cli.errors import EXIT_CONFIG

pytestmark = [pytest.mark.model, pytest.mark.timeout(60)]


def _config(tmp_path: Path, model_table: str) -> Path:
    path = tmp_path / "llamad.toml"
    path.write_text(
        f"""
[daemon]
runtime_dir = "{tmp_path / "run"}"
state_dir = "{tmp_path / "state"}"

[models.m]
path = "{paths.default_model_path()}"
{model_table}
"""
    )
    return path


def test_config_check_accepts_a_good_file_and_starts_nothing(tmp_path: Path) -> None:
    run = llamad(None, "config", "check", str(_config(tmp_path, "n_ctx = 1024")))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("configuration ok: "), run.stdout
    assert "model m: " in run.stdout and "n_ctx 1024" in run.stdout
    assert not (tmp_path / "run").exists(), "check must not create the runtime directory"


def test_config_check_refuses_a_wrong_type_naming_the_key(tmp_path: Path) -> None:
    run = llamad(None, "config", "check", str(_config(tmp_path, 'n_ctx = "big"')))
    assert run.returncode == EXIT_CONFIG, run.stderr
    assert "models.m.n_ctx" in run.stderr
    assert run.stdout == ""


def test_config_check_refuses_an_unknown_key_naming_it(tmp_path: Path) -> None:
    run = llamad(None, "config", "check", str(_config(tmp_path, "n_cxt = 1024")))
    assert run.returncode == EXIT_CONFIG, run.stderr
    assert "models.m.n_cxt" in run.stderr


def test_the_global_config_option_is_the_file_to_check(tmp_path: Path) -> None:
    bad = _config(tmp_path, "n_seq_max = 0")
    run = llamad(None, "--config", str(bad), "config", "check")
    assert run.returncode == EXIT_CONFIG, run.stderr
    assert "models.m.n_seq_max" in run.stderr


def test_config_example_is_valid_toml() -> None:
    run = llamad(None, "config", "example")
    assert run.returncode == 0, run.stderr
    tomllib.loads(run.stdout)
    assert "[cache.policy]" in run.stdout
