"""llama.cpp log lines reach structlog as llama.log events and never raise into C."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import structlog

from llamad.llama_ffi import LlamaError, Model, ModelOptions, ensure_backend, set_log_level
from llamad.llama_ffi.native import _llamad_log_cb, ffi, lib, llama_errors
from llamad.llama_ffi.sampling import grammar_problem
from llamad.paths import default_model_path

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


def _levels_while_loading() -> set[str]:
    """The structlog levels of the llama.log events a model load sends (the
    default model's vocabulary only: llama.cpp logs its loader at info and
    debug, and nothing above warn when all goes well)."""
    with (
        structlog.testing.capture_logs() as logs,
        Model(default_model_path(), ModelOptions(vocab_only=True)),
    ):
        pass
    return {e["log_level"] for e in logs if e["event"] == "llama.log"}


@pytest.mark.parametrize(
    ("name", "seen"),
    [
        ("debug", {"debug", "info"}),
        ("info", {"info"}),
        ("warn", set()),
        ("error", set()),
        ("off", set()),
    ],
)
def test_each_level_lets_through_what_it_names(name: str, seen: set[str]) -> None:
    ensure_backend()
    try:
        set_log_level(name)
        assert _levels_while_loading() == seen
    finally:
        set_log_level("warn")


def test_a_level_chosen_before_the_backend_starts_is_kept() -> None:
    """The backend starts at the first model load (once per process), so a
    fresh interpreter: the level set before it must survive its start."""
    program = (
        "import structlog\n"
        "from llamad.llama_ffi import Model, ModelOptions, set_log_level\n"
        "from llamad.paths import default_model_path\n"
        "set_log_level('info')\n"
        "with structlog.testing.capture_logs() as logs:\n"
        "    with Model(default_model_path(), ModelOptions(vocab_only=True)):\n"
        "        pass\n"
        "print(sum(e['event'] == 'llama.log' and e['log_level'] == 'info' for e in logs))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LLAMAD_LLAMA_LOG"}
    out = subprocess.run(
        [sys.executable, "-c", program],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 0


def _say(level: int, text: bytes) -> None:
    _llamad_log_cb(level, ffi.new("char[]", text), ffi.NULL)


def test_llama_errors_hands_this_threads_error_messages_to_the_caller() -> None:
    with llama_errors() as said:
        _say(lib.GGML_LOG_LEVEL_WARN, b"only a warning\n")
        _say(lib.GGML_LOG_LEVEL_ERROR, b"parse: error parsing grammar: x\n\nroot ::= x\n")
        other = threading.Thread(target=_say, args=(lib.GGML_LOG_LEVEL_ERROR, b"elsewhere"))
        other.start()
        other.join()
        with llama_errors() as inner:
            _say(lib.GGML_LOG_LEVEL_ERROR, b"nested")
        _say(lib.GGML_LOG_LEVEL_ERROR, b"after the nested block")
    _say(lib.GGML_LOG_LEVEL_ERROR, b"after the block")
    assert said == ["parse: error parsing grammar: x\n\nroot ::= x", "after the nested block"]
    assert inner == ["nested"]


def test_a_grammar_problem_is_one_short_line_without_the_grammar() -> None:
    tail = "x " * 500
    said = [
        f"parse: error parsing grammar: expecting ::= at is\nnot {tail}\n\nthe whole\ngrammar",
        "failed to parse grammar",
    ]
    reason = grammar_problem(said)
    assert reason.startswith("parse: error parsing grammar: expecting ::= at is not x x")
    assert "\n" not in reason and "the whole" not in reason
    assert len(reason) == 200 and reason.endswith("…")
    assert grammar_problem(["grammar does not contain a 'start' symbol"]) == (
        "grammar does not contain a 'start' symbol"
    )
    assert "log level" in grammar_problem(["failed to parse grammar"])
