"""With no config at all the daemon serves the default model as "smollm2" on the default
ipc endpoint; directories follow the environment the daemon runs in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config_helpers import Workspace, write_config
from llamad.config import (
    CONFIG_ENV,
    DEFAULT_MODEL_ID,
    ConfigError,
    client_endpoint,
    load_config,
)
from llamad.paths import AssetMissing, default_model_path

pytestmark = pytest.mark.timeout(60)


def test_no_config_serves_the_default_model_on_the_default_endpoint(
    ws: Workspace, default_model: Path
) -> None:
    config = load_config(None, env=ws.env)
    run = ws.env["LLAMAD_RUNTIME_DIR"]
    assert config.source is None
    assert list(config.models) == [DEFAULT_MODEL_ID] == ["smollm2"]
    assert config.models["smollm2"].path == str(default_model)
    assert config.endpoint == f"ipc://{run}/llamad.sock"
    assert config.runtime_dir == Path(run)
    assert config.state_dir == Path(ws.env["XDG_STATE_HOME"]) / "llamad"
    spec = config.worker_spec("smollm2")
    assert spec.model_path == str(default_model)
    assert spec.context.kv_unified is True
    assert [t.root for t in config.cache_settings().tiers][2] == config.state_dir / "kvc"


def test_a_config_without_models_still_serves_the_default_model(ws: Workspace) -> None:
    config = ws.loaded({"daemon": {"log_level": "debug"}})
    assert list(config.models) == ["smollm2"]


def test_serve_default_model_false_starts_with_no_model(ws: Workspace) -> None:
    config = ws.loaded({"daemon": {"serve_default_model": False}})
    assert config.models == {}


def test_configured_models_replace_the_default_model(ws: Workspace) -> None:
    assert list(ws.loaded(ws.data()).models) == ["smol"]


def test_path_default_names_the_default_model(ws: Workspace, default_model: Path) -> None:
    config = ws.loaded({"models": {"chat": {"path": "default"}}})
    assert config.models["chat"].path == str(default_model)


def test_overriding_one_key_of_the_default_model_keeps_its_file(
    ws: Workspace, default_model: Path
) -> None:
    # The README's example: LLAMAD_MODELS__SMOLLM2__N_CTX=8192 llamad daemon.
    config = load_config(None, env={**ws.env, "LLAMAD_MODELS__SMOLLM2__N_CTX": "8192"})
    assert list(config.models) == ["smollm2"]
    assert config.models["smollm2"].n_ctx == 8192
    assert config.models["smollm2"].path == str(default_model)
    # The same in a file's table.
    table = ws.loaded({"models": {"smollm2": {"n_ctx": 4096}}}).models["smollm2"]
    assert (table.n_ctx, table.path) == (4096, str(default_model))


def test_another_model_without_a_path_is_refused_naming_the_key(ws: Workspace) -> None:
    problems = ws.refused({"models": {"chat": {"n_ctx": 4096}}})
    assert problems == {"models.chat.path": "missing (this key is required)"}


def test_a_missing_default_model_is_refused_naming_the_key(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLAMAD_DEFAULT_MODEL", str(tmp_path / "not-fetched.gguf"))
    with pytest.raises(ConfigError) as info:
        load_config(None, env=ws.env)
    (error,) = info.value.details["errors"]
    assert error["key"] == "models.smollm2.path"
    assert "make setup" in error["problem"]


def test_the_config_file_can_come_from_llamad_config(ws: Workspace) -> None:
    path = write_config(ws.dir, ws.data())
    config = load_config(None, env={**ws.env, CONFIG_ENV: str(path)})
    assert config.source == str(path)
    assert list(config.models) == ["smol"]


@pytest.mark.parametrize(
    ("env", "runtime", "state"),
    [
        (
            {"XDG_RUNTIME_DIR": "/run/user/7", "XDG_STATE_HOME": "/home/u/.st"},
            "/run/user/7/llamad",
            "/home/u/.st/llamad",
        ),
        (
            {"LLAMAD_RUNTIME_DIR": "/run/llamad", "STATE_DIRECTORY": "/var/lib/llamad:/var/x"},
            "/run/llamad",
            "/var/lib/llamad",
        ),
        ({"HOME": "/home/u"}, f"/tmp/llamad-{os.getuid()}", "/home/u/.local/state/llamad"),
    ],
)
def test_default_directories_follow_the_environment(
    default_model: Path, env: dict[str, str], runtime: str, state: str
) -> None:
    config = load_config(None, env=env)
    assert (str(config.runtime_dir), str(config.state_dir)) == (runtime, state)
    assert config.endpoint == f"ipc://{runtime}/llamad.sock"


def test_client_endpoint_reads_only_the_daemon_table(ws: Workspace) -> None:
    # A client needs the endpoint, not the models: a bad model does not stop it.
    data = ws.data({("daemon", "endpoint"): "tcp://127.0.0.1:9999"})
    data["models"]["smol"]["n_ctx"] = "bad"
    path = write_config(ws.dir, data)
    assert client_endpoint(path, env=ws.env) == "tcp://127.0.0.1:9999"
    env = {**ws.env, "LLAMAD_DAEMON__ENDPOINT": "tcp://127.0.0.1:1234"}
    assert client_endpoint(path, env=env) == "tcp://127.0.0.1:1234"
    assert client_endpoint(None, env=ws.env) == f"ipc://{ws.env['LLAMAD_RUNTIME_DIR']}/llamad.sock"


def test_client_endpoint_refuses_a_bad_endpoint(ws: Workspace) -> None:
    with pytest.raises(ConfigError, match=r"daemon\.endpoint"):
        client_endpoint(None, env={**ws.env, "LLAMAD_DAEMON__ENDPOINT": "tcp://0.0.0.0:1"})


@pytest.mark.model
def test_the_real_default_model_is_served_with_no_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LLAMAD_DEFAULT_MODEL", raising=False)
    try:
        real = default_model_path()
    except AssetMissing:
        pytest.skip("default model not fetched (make setup)")
    config = load_config(None, env={"HOME": str(tmp_path), "LLAMAD_RUNTIME_DIR": "/tmp/lcfg-real"})
    assert config.models["smollm2"].path == str(real.resolve())
    assert config.worker_spec("smollm2").model_path == str(real.resolve())


def test_importing_the_config_never_loads_libllama() -> None:
    # A client reads the endpoint from the config; it must not need libllama.
    code = (
        "import sys, llamad.config, llamad.cli.config\n"
        "from llamad.config.model_schema import ModelConfig\n"
        "from llamad.config.keys import fields_of\n"
        "fields_of(ModelConfig)\n"
        "loaded = [m for m in sys.modules if m.startswith('llamad.llama_ffi.')]\n"
        # The error classes at most (plain Python); never the binding.
        "assert set(loaded) <= {'llamad.llama_ffi.errors'}, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.model
def test_loading_a_config_and_building_its_workers_specs_never_loads_libllama(
    tmp_path: Path,
) -> None:
    # The root loads the config (checking every model file's GGUF header and
    # building each worker's context and load options) and never loads a
    # model: libllama would cost it several MB resident for good (SPEC P9).
    code = (
        "import sys\n"
        "from llamad.config import load_config\n"
        "env = {'HOME': sys.argv[1], 'LLAMAD_RUNTIME_DIR': sys.argv[1] + '/run'}\n"
        "config = load_config(None, env=env)\n"
        "spec = config.worker_spec('smollm2')\n"
        "assert spec.context.n_seq_max >= 1 and spec.model_path\n"
        "print(sorted(m for m in sys.modules\n"
        "      if m in ('llamad.llama_ffi._llama', 'llamad.llama_ffi.native', '_cffi_backend')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "[]"
