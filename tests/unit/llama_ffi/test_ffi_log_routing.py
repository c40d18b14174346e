"""llama.cpp log lines reach structlog as llama.log events and never raise into C."""

from __future__ import annotations

import pytest
import structlog

from llamad.llama_ffi import LlamaError, set_log_level
from llamad.llama_ffi.native import _llamad_log_cb, ffi, lib

pytestmark = pytest.mark.timeout(30)


def test_levels_map_to_structlog_levels() -> None:
    with structlog.testing.capture_logs() as logs:
        _llamad_log_cb(lib.GGML_LOG_LEVEL_WARN, ffi.new("char[]", b"careful\n"), ffi.NULL)
        _llamad_log_cb(lib.GGML_LOG_LEVEL_ERROR, ffi.new("char[]", b"broken\n"), ffi.NULL)
        _llamad_log_cb(lib.GGML_LOG_LEVEL_DEBUG, ffi.new("char[]", b"chatter"), ffi.NULL)
    assert [(e["event"], e["log_level"], e["message"]) for e in logs] == [
        ("llama.log", "warning", "careful"),
        ("llama.log", "error", "broken"),
        ("llama.log", "debug", "chatter"),
    ]


def test_progress_dots_and_blank_lines_are_dropped() -> None:
    with structlog.testing.capture_logs() as logs:
        for text in (b".", b"....\n", b"\n", b"   "):
            _llamad_log_cb(lib.GGML_LOG_LEVEL_INFO, ffi.new("char[]", text), ffi.NULL)
    assert logs == []


def test_callback_swallows_undecodable_text_and_bad_pointers() -> None:
    with structlog.testing.capture_logs() as logs:
        _llamad_log_cb(lib.GGML_LOG_LEVEL_WARN, ffi.new("char[]", b"\xff\xfe oops"), ffi.NULL)
        # A NULL text pointer would make ffi.string raise; the callback must not.
        _llamad_log_cb(lib.GGML_LOG_LEVEL_WARN, ffi.NULL, ffi.NULL)
    assert len(logs) == 1
    assert "oops" in logs[0]["message"]


def test_unknown_level_name_is_refused() -> None:
    with pytest.raises(LlamaError):
        set_log_level("chatty")


def test_known_level_names_are_accepted() -> None:
    for name in ("debug", "info", "warn", "error", "off"):
        set_log_level(name)
    set_log_level("warn")
