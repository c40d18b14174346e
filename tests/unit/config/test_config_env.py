"""LLAMAD_<SECTION>__<KEY> variables override the file, checked by the same rules."""

from __future__ import annotations

from typing import Any

import pytest

from config_helpers import Workspace, write_config
from llamad.config import ConfigError, load_config
from llamad.config.env import env_name, parse_env_value

pytestmark = pytest.mark.timeout(60)


def _load(ws: Workspace, data: Any, **overrides: str) -> Any:
    return load_config(write_config(ws.dir, data), env={**ws.env, **overrides})


def _refused(ws: Workspace, data: Any, **overrides: str) -> list[dict[str, Any]]:
    with pytest.raises(ConfigError) as info:
        _load(ws, data, **overrides)
    errors: list[dict[str, Any]] = info.value.details["errors"]
    return errors


def test_an_override_wins_over_the_file(ws: Workspace) -> None:
    data = ws.data({("models", "smol", "n_ctx"): 1024, ("daemon", "log_level"): "info"})
    config = _load(ws, data, LLAMAD_MODELS__SMOL__N_CTX="2048", LLAMAD_DAEMON__LOG_LEVEL="debug")
    assert config.models["smol"].n_ctx == 2048
    assert config.daemon.log_level == "debug"
    assert config.overrides == ("LLAMAD_DAEMON__LOG_LEVEL", "LLAMAD_MODELS__SMOL__N_CTX")
    assert config.worker_spec("smol").context.n_ctx == 2048


def test_an_override_sets_a_key_the_file_does_not_have(ws: Workspace) -> None:
    config = _load(ws, ws.data(), LLAMAD_CACHE__DISK__QUOTA="10GiB", LLAMAD_CACHE__INSTANCE="b")
    assert config.cache.disk.quota == 10 << 30
    assert config.cache.instance == "b"


def test_an_override_is_type_checked_naming_the_variable(ws: Workspace) -> None:
    errors = _refused(ws, ws.data(), LLAMAD_MODELS__SMOL__N_CTX="many")
    assert errors == [
        {
            "key": "models.smol.n_ctx",
            "problem": 'expected an integer >= 1, got "many"',
            "source": "LLAMAD_MODELS__SMOL__N_CTX",
        }
    ]


def test_an_override_of_an_unknown_key_is_refused_naming_the_variable(ws: Workspace) -> None:
    errors = _refused(ws, ws.data(), LLAMAD_DAEMON__ENDPIONT="ipc:///tmp/x.sock")
    assert len(errors) == 1
    assert errors[0]["key"] == "daemon.endpiont"
    assert errors[0]["source"] == "LLAMAD_DAEMON__ENDPIONT"
    assert "did you mean 'endpoint'" in errors[0]["problem"]


def test_the_message_names_the_variable(ws: Workspace) -> None:
    with pytest.raises(ConfigError) as info:
        _load(ws, ws.data(), LLAMAD_CACHE__SAVE_PERMITS="0")
    assert "cache.save_permits (from LLAMAD_CACHE__SAVE_PERMITS): expected" in info.value.message


def test_plain_strings_need_no_quotes(ws: Workspace) -> None:
    config = _load(
        ws,
        ws.data(),
        LLAMAD_DAEMON__ENDPOINT="tcp://127.0.0.1:7777",
        LLAMAD_MODELS__SMOL__KEEP_ALIVE="10m",
        LLAMAD_MODELS__SMOL__TYPE_K="q8_0",
    )
    assert config.endpoint == "tcp://127.0.0.1:7777"
    assert config.models["smol"].keep_alive == 600.0
    assert config.models["smol"].type_k == "q8_0"


def test_arrays_and_tables_are_read_as_toml(ws: Workspace) -> None:
    other = ws.dir / "other"
    other.mkdir()
    config = _load(
        ws,
        ws.data(),
        LLAMAD_SECURITY__MODEL_DIRS=f'["{ws.models_dir}", "{other}"]',
        LLAMAD_CACHE__POLICY="{min_tokens = 64, cold_min_tokens = 64}",
        LLAMAD_CACHE__POLICY__COLD_MAX_TOKENS="128",
    )
    assert config.security.model_dirs == (str(ws.models_dir), str(other))
    policy = config.worker_spec("smol").worker.policy
    assert (policy.min_tokens, policy.cold_min_tokens, policy.cold_max_tokens) == (64, 64, 128)


def test_a_model_id_with_punctuation_is_matched_by_its_normal_form(ws: Workspace) -> None:
    data = ws.data({("models", "llama-3.b", "path"): str(ws.tiny)})
    config = _load(ws, data, LLAMAD_MODELS__LLAMA_3_B__N_CTX="512")
    assert config.models["llama-3.b"].n_ctx == 512
    assert "llama_3_b" not in config.models


def test_an_override_can_add_a_model(ws: Workspace) -> None:
    config = _load(ws, ws.data(), LLAMAD_MODELS__EXTRA__PATH=str(ws.tiny))
    assert set(config.models) == {"smol", "extra"}
    assert config.worker_spec("extra").model_path == str(ws.tiny)


def test_a_model_added_without_a_path_names_the_variable(ws: Workspace) -> None:
    errors = _refused(ws, ws.data(), LLAMAD_MODELS__EXTRA__N_CTX="512")
    assert errors == [
        {
            "key": "models.extra.path",
            "problem": "missing (this key is required)",
            "source": "LLAMAD_MODELS__EXTRA__N_CTX",
        }
    ]


def test_an_override_matching_two_models_is_refused(ws: Workspace) -> None:
    data = ws.data(
        {("models", "a-b", "path"): str(ws.tiny), ("models", "a.b", "path"): str(ws.tiny)}
    )
    errors = _refused(ws, data, LLAMAD_MODELS__A_B__N_CTX="512")
    assert errors[0]["source"] == "LLAMAD_MODELS__A_B__N_CTX"
    assert "matches models a-b, a.b" in errors[0]["problem"]


def test_variables_without_a_double_underscore_are_not_overrides(ws: Workspace) -> None:
    # llamad's own variables (and anyone else's) are left alone.
    config = _load(ws, ws.data(), LLAMAD_LOG_LEVEL="bogus", LLAMAD_X="1", OTHER__KEY="1")
    assert config.overrides == ()
    assert config.daemon.log_level == "info"


def test_a_malformed_override_name_is_refused(ws: Workspace) -> None:
    errors = _refused(ws, ws.data(), LLAMAD_DAEMON____LOG_LEVEL="debug")
    assert errors[0]["source"] == "LLAMAD_DAEMON____LOG_LEVEL"
    assert "not an override name" in errors[0]["problem"]


def test_an_empty_override_is_ignored(ws: Workspace) -> None:
    config = _load(ws, ws.data(), LLAMAD_DAEMON__LOG_LEVEL="")
    assert config.daemon.log_level == "info"
    assert config.overrides == ()


def test_an_override_inside_a_value_that_is_not_a_table_is_refused(ws: Workspace) -> None:
    data = ws.data()
    data["daemon"] = 5
    errors = _refused(ws, data, LLAMAD_DAEMON__LOG_LEVEL="debug")
    assert {"key": "daemon", "problem": "is not a table", "source": "LLAMAD_DAEMON__LOG_LEVEL"} in (
        errors
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        ("1.5", 1.5),
        ("true", True),
        ('"quoted"', "quoted"),
        ("info", "info"),
        ("/srv/models/a.gguf", "/srv/models/a.gguf"),
        ("10m", "10m"),
        ('["a", "b"]', ["a", "b"]),
        ("{a = 1}", {"a": 1}),
        ("1\nb = 2", "1\nb = 2"),  # another key smuggled after a newline stays a string
        ("[1, 2", "[1, 2"),
    ],
)
def test_an_env_value_is_toml_when_it_is_toml(text: str, value: Any) -> None:
    assert parse_env_value(text) == value


def test_env_name_spells_the_variable_of_a_key() -> None:
    assert env_name(("models", "llama-3.b", "n_ctx")) == "LLAMAD_MODELS__LLAMA_3_B__N_CTX"
    assert env_name(("daemon", "threads", "cores")) == "LLAMAD_DAEMON__THREADS__CORES"
