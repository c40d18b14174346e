"""A bad config is refused as a whole, every problem naming its key and what was expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config_helpers import Workspace, drop_key, write_config
from llamad.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(60)

M = ("models", "smol")

# (key path, bad value, words the problem must contain)
WRONG_TYPES = [
    (("daemon", "log_level"), 5, "one of debug"),
    (("daemon", "serve_default_model"), "yes", "true or false"),
    (("daemon", "threads", "cores"), 2.5, "an integer"),
    (("daemon", "endpoint"), 5555, "ipc://PATH"),
    (("daemon", "runtime_dir"), "relative/dir", "an absolute path"),
    (("cache", "ram", "quota"), True, "a number of bytes"),
    (("cache", "disk", "quota"), "lots", "a number of bytes"),
    (("cache", "disk", "prefetch"), -1, "a number of bytes"),
    (("cache", "policy", "min_tokens"), "512", "an integer"),
    (("cache", "reservation_ttl_s"), "soon", "a duration"),
    (("cache", "pressure", "evict_tiers"), "ram", "array of distinct names"),
    (("security", "model_dirs"), "/srv/models", "an array of absolute paths"),
    (("security", "model_dirs"), ["relative"], "an array of absolute paths"),
    (("security", "max_message_bytes"), [1], "a number of bytes"),
    ((*M, "n_ctx"), "4096", "an integer"),
    ((*M, "flash_attn"), True, "one of auto, off, on"),
    ((*M, "tensor_split"), "1,2", "an array of numbers"),
    ((*M, "keep_alive"), True, "a duration"),
    ((*M, "keep_alive"), "10 minutes", "a duration"),
    ((*M, "path"), 7, "an absolute path"),
    ((*M, "embeddings"), 1, "true or false"),
    ((*M, "rope_freq_base"), "x", "a number"),
    ((*M, "thinking"), "<think>", "expected a table"),
    ((*M, "cache", "restore_tiers"), ["ram", "ram"], "distinct names"),
    ((*M, "cache", "fingerprint"), "abc", "64 hex digits"),
    ((*M, "threads", "window"), 1.0, "an integer"),
    (("models",), "smol", "expected a table"),
    (("daemon",), 3, "expected a table"),
]

UNKNOWN_KEYS = [
    (("daemon", "endpiont"), "endpoint"),
    (("daemon", "threads", "core"), "cores"),
    (("cache", "ram", "qouta"), "quota"),
    (("cache", "policy", "min_token"), "min_tokens"),
    (("security", "model_dir"), "model_dirs"),
    (("modles",), "models"),
    ((*M, "n_ctxx"), "n_ctx"),
    ((*M, "cache", "policy", "cold_max"), "cold_max_tokens"),
    ((*M, "threads", "cores"), None),  # the budget is daemon-wide, not per model
    ((*M, "kv_unified"), None),  # always on: not a key
]

BAD_CHOICES = [
    (("daemon", "log_format"), "xml", "one of auto, json, console"),
    ((*M, "type_k"), "q9_0", "one of f32, f16"),
    ((*M, "pooling"), "max", "one of unspecified"),
    ((*M, "strategy"), "greedy", "one of decode_maximal"),
    ((*M, "load_mode"), "MMAP", "one of auto"),
    ((*M, "cache", "save_tier"), "ssd", "one of auto, ram, ram_file, disk"),
    ((*M, "cache", "fingerprint_mode"), "fast", "one of safe"),
    (("cache", "pressure", "source"), "callable", "one of system, nvidia_smi, noop"),
]

OUT_OF_RANGE = [
    ((*M, "n_ctx"), 0, ">= 1"),
    ((*M, "n_gpu_layers"), -2, ">= -1"),
    ((*M, "max_queue"), -1, ">= 0"),
    ((*M, "decode_timeout_ms"), 0, "> 0"),
    ((*M, "liveness_s"), -1, "a duration"),
    ((*M, "yarn_orig_ctx"), 2**32, "<= 4294967295"),
    ((*M, "cache", "writer_threads"), 65, "<= 64"),
    ((*M, "tensor_split"), [0.5, -1], "numbers >= 0"),
    (("cache", "save_permits"), 0, ">= 1"),
    (("cache", "save_permits"), 5000, "<= 1024"),
    (("cache", "lookup", "restore_cost"), 1.5, "<= 1"),
    (("cache", "pressure", "high_watermark"), 0, "> 0"),
    (("cache", "ram", "quota"), -1, "a number of bytes"),
    (("cache", "instance"), "a b", "[A-Za-z0-9_-]"),
    (("daemon", "threads", "probe_gain"), 1.5, "<= 1"),
    (("daemon", "threads", "collapse_factor"), 1, "> 1"),
    (("daemon", "threads", "cores"), 0, ">= 1"),
    (("security", "max_message_bytes"), 0, ">= 1B"),
]

# Rules between keys, applied by the classes the daemon builds from the config.
CROSS_FIELD = [
    ({(*M, "n_batch"): 256, (*M, "n_ubatch"): 512}, (*M, "n_ubatch"), "n_batch"),
    (
        {(*M, "n_batch"): 2, (*M, "n_ubatch"): 2, (*M, "n_seq_max"): 4},
        (*M, "n_seq_max"),
        "n_batch",
    ),
    ({(*M, "prefill_chunk_size"): 4096}, (*M, "prefill_chunk_size"), "n_batch"),
    ({(*M, "type_v"): "q8_0", (*M, "flash_attn"): "off"}, (*M, "type_v"), "flash_attn"),
    ({(*M, "n_ctx"): 2, (*M, "n_seq_max"): 4}, (*M, "n_ctx"), "n_seq_max"),
    (
        {("cache", "policy", "cold_min_tokens"): 40_000},
        ("cache", "policy", "cold_min_tokens"),
        "cold_max_tokens",
    ),
    (
        {(*M, "cache", "policy", "cold_min_tokens"): 40_000},
        (*M, "cache", "policy", "cold_min_tokens"),
        "cold_max_tokens",
    ),
    (
        {("cache", "pressure", "low_watermark"): 0.9},
        ("cache", "pressure", "low_watermark"),
        "high_watermark",
    ),
    (
        {("daemon", "threads", "min_samples"): 40},
        ("daemon", "threads", "min_samples"),
        "window",
    ),
    (
        {(*M, "threads", "cooldown_s"): 90},
        ("daemon", "threads", "cooldown_max_s"),
        "cooldown_s",
    ),
    (
        {(*M, "threads", "cooldown_max_s"): 1},
        (*M, "threads", "cooldown_max_s"),
        "cooldown_s",
    ),
    (
        {(*M, "cache", "save_tier"): "disk", ("cache", "disk", "quota"): 0},
        (*M, "cache", "save_tier"),
        "disk",
    ),
    ({(*M, "cache", "fingerprint_mode"): "fast_unsafe"}, (*M, "cache", "fingerprint"), "give"),
    (
        {
            (*M, "thinking"): {"open": "<x>", "close": "</x>"},
            (*M, "tool_call"): {"open": "<x>", "close": "</y>"},
        },
        (*M, "tool_call"),
        "open differently",
    ),
    (
        {("security", "max_header_bytes"): "2MiB", ("security", "max_message_bytes"): "1MiB"},
        ("security", "max_header_bytes"),
        "max_frame_bytes",
    ),
    (
        {
            ("cache", "disk", "root"): "/dev/shm/same",
            ("cache", "ram_file", "root"): "/dev/shm/same",
        },
        ("cache", "disk", "root"),
        "ram_file",
    ),
    (
        {
            ("cache", "ram", "quota"): 0,
            ("cache", "ram_file", "quota"): 0,
            ("cache", "disk", "quota"): 0,
        },
        ("cache",),
        "at least one",
    ),
]


def _key(path: tuple[str, ...]) -> str:
    return ".".join(path)


def test_the_base_config_loads(ws: Workspace) -> None:
    # Guards every refusal below: they change one key of a config that loads.
    config = ws.loaded(ws.base)
    assert list(config.models) == ["smol"]


@pytest.mark.parametrize(
    ("path", "value", "expected"), WRONG_TYPES, ids=[_key(c[0]) for c in WRONG_TYPES]
)
def test_a_wrong_type_is_refused_naming_the_key(
    ws: Workspace, path: tuple[str, ...], value: Any, expected: str
) -> None:
    problems = ws.refused(ws.data({path: value}))
    assert expected in problems[_key(path)]


@pytest.mark.parametrize(("path", "nearest"), UNKNOWN_KEYS, ids=[_key(c[0]) for c in UNKNOWN_KEYS])
def test_an_unknown_key_is_refused_by_name(
    ws: Workspace, path: tuple[str, ...], nearest: str | None
) -> None:
    problems = ws.refused(ws.data({path: 1}))
    assert problems[_key(path)].startswith("unknown key")
    if nearest is not None:
        assert repr(nearest) in problems[_key(path)]


@pytest.mark.parametrize(
    ("path", "value", "expected"), BAD_CHOICES, ids=[_key(c[0]) for c in BAD_CHOICES]
)
def test_a_bad_choice_is_refused_listing_the_choices(
    ws: Workspace, path: tuple[str, ...], value: Any, expected: str
) -> None:
    problems = ws.refused(ws.data({path: value}))
    assert expected in problems[_key(path)]
    assert repr(value).strip("'") in problems[_key(path)]


@pytest.mark.parametrize(
    ("path", "value", "expected"), OUT_OF_RANGE, ids=[f"{_key(c[0])}={c[1]}" for c in OUT_OF_RANGE]
)
def test_an_out_of_range_value_is_refused_with_its_bounds(
    ws: Workspace, path: tuple[str, ...], value: Any, expected: str
) -> None:
    problems = ws.refused(ws.data({path: value}))
    assert expected in problems[_key(path)]


@pytest.mark.parametrize(
    ("values", "path", "expected"), CROSS_FIELD, ids=[_key(c[1]) for c in CROSS_FIELD]
)
def test_a_rule_between_keys_is_refused_naming_the_key(
    ws: Workspace, values: dict[tuple[str, ...], Any], path: tuple[str, ...], expected: str
) -> None:
    problems = ws.refused(ws.data(values))
    assert expected in problems[_key(path)], problems


def test_a_model_without_a_path_is_refused(ws: Workspace) -> None:
    problems = ws.refused(drop_key(ws.data(), (*M, "path")))
    assert problems == {"models.smol.path": "missing (this key is required)"}


def test_markers_need_both_ends(ws: Workspace) -> None:
    problems = ws.refused(ws.data({(*M, "thinking"): {"open": "<think>"}}))
    assert problems == {"models.smol.thinking.close": "missing (this key is required)"}


def test_every_problem_is_reported_together(ws: Workspace) -> None:
    data = ws.data(
        {
            ("daemon", "log_fromat"): "json",
            ("cache", "disk", "quota"): "lots",
            (*M, "n_ctx"): -5,
            (*M, "n_batch"): 256,
            (*M, "n_ubatch"): 512,
            ("models", "big", "path"): str(ws.models_dir / "missing.gguf"),
            ("models", "big", "type_k"): "q9",
        },
    )
    with pytest.raises(ConfigError) as info:
        load_config(write_config(ws.dir, data), env=ws.env)
    problems = info.value.details["errors"]
    # The file's values in the file's order, then the model files, then the
    # rules between keys.
    assert [p["key"] for p in problems] == [
        "models.smol.n_ctx",
        "models.big.type_k",
        "daemon.log_fromat",
        "cache.disk.quota",
        "models.big.path",
        "models.smol.n_ubatch",
    ]
    message = info.value.message
    assert message.startswith(f"invalid configuration ({ws.dir / 'llamad.toml'}): 6 problems")
    for p in problems:
        assert f"  {p['key']}: {p['problem']}" in message
    assert info.value.details["field"] == "models.smol.n_ctx"
    assert info.value.code == "config_error"


def test_a_refused_value_does_not_hide_a_rule_between_other_keys(ws: Workspace) -> None:
    data = ws.data({(*M, "type_k"): "q9", (*M, "n_batch"): 256, (*M, "n_ubatch"): 512})
    problems = ws.refused(data)
    assert set(problems) == {"models.smol.type_k", "models.smol.n_ubatch"}


def test_a_file_that_is_not_toml_names_the_line(ws: Workspace) -> None:
    problems = ws.refused("[daemon]\nlog_level = \n")
    assert list(problems) == [""]  # the file as a whole
    assert "is not valid TOML" in problems[""]
    assert "line 2" in problems[""]


def test_a_missing_config_file_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml", env=env)
    assert "nope.toml does not exist" in info.value.message


def test_a_model_id_that_cannot_name_a_worker_is_refused(ws: Workspace) -> None:
    problems = ws.refused(ws.data({("models", "bad id!", "path"): str(ws.tiny)}))
    assert list(problems) == ['models."bad id!"']
    assert "not a model id" in problems['models."bad id!"']


def test_the_validated_config_is_frozen(ws: Workspace) -> None:
    config = ws.loaded(ws.base)
    with pytest.raises(AttributeError):
        config.daemon = config.daemon  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.models["smol"].n_ctx = 1  # type: ignore[misc]
