"""The ``llamad`` command line: global options anywhere, KEY=VALUE options, cache keys."""

from __future__ import annotations

import pytest
import structlog

from llamad.cli.connect import UsageError, parse_key, parse_options
from llamad.cli.main import build_parser, main

pytestmark = pytest.mark.timeout(30)


def test_global_options_work_before_and_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["--endpoint", "ipc:///a", "--timeout", "5", "models"])
    after = parser.parse_args(["models", "--endpoint", "ipc:///a", "--timeout", "5"])
    for args in (before, after):
        assert args.endpoint == "ipc:///a"
        assert args.timeout == 5.0
        assert args.client is True
    # An option given before the command is not reset by the command's parser.
    mixed = parser.parse_args(["--config", "a.toml", "status", "--json"])
    assert mixed.config == "a.toml" and mixed.json is True


def test_daemon_takes_the_config_before_or_after() -> None:
    parser = build_parser()
    assert parser.parse_args(["--config", "x.toml", "daemon"]).config == "x.toml"
    assert parser.parse_args(["daemon", "--config", "y.toml"]).config == "y.toml"
    assert parser.parse_args(["daemon"]).client is False


def test_options_read_toml_values_else_strings() -> None:
    assert parse_options(["n_ctx=8192", "flash-attn=off", 'stop=["a", "b"]', "x=0.5"]) == {
        "n_ctx": 8192,
        "flash_attn": "off",
        "stop": ["a", "b"],
        "x": 0.5,
    }
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_options(["n_ctx"])


def test_a_cache_key_is_64_hex_digits() -> None:
    assert parse_key("ab" * 32) == b"\xab" * 32
    for bad in ("ab" * 31, "zz" * 32):
        with pytest.raises(UsageError, match="64 hex digits"):
            parse_key(bad)


def test_a_usage_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["cache", "evict", "lots", "--endpoint", "ipc:///tmp/none-llamad/x.sock"])
    finally:
        structlog.reset_defaults()  # the command configured this process's logs
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("llamad: usage: BYTES: ") and err.count("\n") == 1
