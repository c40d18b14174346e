"""``llamad complete | chat | embed | tokenize`` against a real daemon, and their errors."""

from __future__ import annotations

import json
import math
import os
import re
import select
import signal
import subprocess
import time

import pytest

from cli_run import llamad, llamad_command
from daemon_proc import DaemonProc
from llamad import Client
from llamad.cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
)
from llamad.testing import scrubbed_env

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

COUNTING = "Count from 1 to 60, separated by commas: 1, 2, 3, 4,"
ENDLESS = ("--grammar", "root ::= [a-z ] root")  # no end of generation: max_tokens ends it


def test_complete_streams_the_reply_while_the_request_runs(daemon: DaemonProc) -> None:
    proc = subprocess.Popen(
        llamad_command(
            daemon.endpoint, "complete", COUNTING, "--max-tokens", "48", "--temperature", "0"
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=scrubbed_env(),
    )
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + 120
        first = b""
        while not first:
            assert time.monotonic() < deadline, "no reply text within 120 s"
            if select.select([fd], [], [], 0.5)[0]:
                first = os.read(fd, 4096)
                assert first, f"stdout closed before any text: {proc.stderr.read()!r}"  # type: ignore[union-attr]
        # The first text is out while the worker still holds the request:
        # tokens are printed as they arrive, not once the reply is complete.
        board = daemon.board()
        assert board is not None and board.status.pending_len == 1, board
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    reply = (first + rest).decode()
    assert re.search(r"\d+, \d+", reply), reply
    summary = err.decode()
    assert "[cold: " in summary and "48 generated" in summary, summary


def test_ctrl_c_during_complete_cancels_the_request_and_exits_130(daemon: DaemonProc) -> None:
    proc = subprocess.Popen(
        llamad_command(daemon.endpoint, "complete", "Say", "--max-tokens", "1000", *ENDLESS),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=scrubbed_env(),
    )
    try:
        assert proc.stdout is not None
        assert select.select([proc.stdout.fileno()], [], [], 120)[0], "no reply text in 120 s"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert err.decode().endswith("llamad: interrupted\n"), err
    # 1,000 tokens (the grammar never lets the model stop) take far longer:
    # the worker is free because the request was cancelled.
    daemon.wait_idle(timeout=10)


def test_complete_json_is_the_final_completion_and_a_repeat_hits_exact(
    daemon: DaemonProc,
) -> None:
    prompt = "Write one sentence about a lighthouse keeper who collects old maps."
    args = ("complete", prompt, "--max-tokens", "8", "-t", "0", "--json")
    cold = llamad(daemon.endpoint, *args)
    assert cold.returncode == 0, cold.stderr
    first = json.loads(cold.stdout)
    assert first["cache_hit_kind"] == "cold"
    assert first["finish_reason"] in ("length", "stop")
    assert len(first["generated"]) == first["stats"]["completion_tokens"] > 0
    assert re.fullmatch(r"[0-9a-f]{64}", first["finish_key"]), first["finish_key"]
    daemon.wait_saved(bytes.fromhex(first["finish_key"]))
    warm = llamad(daemon.endpoint, *args)
    assert warm.returncode == 0, warm.stderr
    second = json.loads(warm.stdout)
    assert second["cache_hit_kind"] == "exact"
    assert second["reply"] == first["reply"]
    assert second["cache_delta"]["read"] == second["stats"]["prompt_tokens"]


def _hits(daemon: DaemonProc) -> tuple[int, int]:
    """(turns found whole: by key or from a live entry, turns found by a prefix walk)."""
    with Client(daemon.endpoint) as client:
        counters = client.counters()
    whole = counters["hits_exact"] + counters["hits_resume"] + counters["hits_live"]
    return whole, counters["hits_longest_prefix"]


def test_chat_over_a_pipe_resumes_the_second_turn_from_the_first(daemon: DaemonProc) -> None:
    turns = "Hello! Name three colours of the sea.\nNow name three colours of the sky.\n"
    whole_before, walked_before = _hits(daemon)
    run = llamad(daemon.endpoint, "chat", "--max-tokens", "24", "-t", "0", input=turns)
    assert run.returncode == 0, run.stderr
    summaries = [line for line in run.stderr.splitlines() if line.startswith("[turn ")]
    assert len(summaries) == 2, run.stderr
    pattern = (
        r"\[turn (\d): cache (\w+), (\d+) of (\d+) prompt tokens reused .*"
        r"\| (\d+) tokens generated\]"
    )
    first, second = (re.fullmatch(pattern, line) for line in summaries)
    assert first is not None and second is not None, summaries
    assert first.group(2) == "cold", summaries[0]
    prompt1, generated1 = int(first.group(4)), int(first.group(5))
    kind, reused, prompt2 = second.group(2), int(second.group(3)), int(second.group(4))
    assert kind in ("exact", "partial"), summaries[1]
    # Turn 2 sends the whole chat (turn 1's prompt and reply, then the new
    # message) and restores turn 1's state for all of turn 1's prompt at least.
    assert prompt2 > prompt1 + generated1, summaries
    assert reused >= prompt1, summaries
    # ... found through turn 1's finish_key (parent_key), or, when turn 2
    # arrives before that row is published (a loaded machine), from turn 1's
    # live entry: never by a prefix walk.
    whole, walked = _hits(daemon)
    assert whole > whole_before and walked == walked_before, (whole_before, whole, walked)
    assert run.stdout.strip(), "the replies go to stdout"
    assert "[turn" not in run.stdout


def test_tokenize_json_matches_the_client(daemon: DaemonProc) -> None:
    text = "The quick brown fox"
    run = llamad(daemon.endpoint, "tokenize", text, "--json")
    assert run.returncode == 0, run.stderr
    body = json.loads(run.stdout)
    with Client(daemon.endpoint) as client:
        expected = client.tokenize(daemon.model_id, text)
    assert body["tokens"] == expected
    assert body["count"] == len(expected)
    plain = llamad(daemon.endpoint, "tokenize", text)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == [str(t) for t in expected]


def test_logs_go_to_stderr_and_stdout_holds_only_the_result(daemon: DaemonProc) -> None:
    run = llamad(daemon.endpoint, "tokenize", "hello", env={"LLAMAD_LOG_LEVEL": "debug"})
    assert run.returncode == 0, run.stderr
    assert "actor.client.connected" in run.stderr, run.stderr
    assert re.fullmatch(r"\d+( \d+)*\n", run.stdout), run.stdout


def test_embed_json_is_a_normalised_vector(daemon: DaemonProc) -> None:
    run = llamad(daemon.endpoint, "embed", "a quiet harbour at dawn", "--json")
    assert run.returncode == 0, run.stderr
    body = json.loads(run.stdout)
    vector = body["embedding"]
    assert body["dimensions"] == len(vector) > 100
    assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, abs_tol=1e-3)


def test_a_refused_request_exits_with_its_code(daemon: DaemonProc) -> None:
    bad = llamad(daemon.endpoint, "complete", "hi", "--max-tokens", "-1")
    assert bad.returncode == EXIT_REFUSED, bad.stderr
    assert bad.stderr.startswith("llamad: bad_request: "), bad.stderr
    assert "max_tokens" in bad.stderr
    assert bad.stdout == ""
    long_prompt = " ".join(["river stone lamp"] * 1200)  # past n_ctx 2048
    overflow = llamad(daemon.endpoint, "complete", long_prompt, "--max-tokens", "4")
    assert overflow.returncode == EXIT_REFUSED, overflow.stderr
    assert overflow.stderr.startswith("llamad: context_overflow: "), overflow.stderr
    grammar = llamad(daemon.endpoint, "complete", "hi", "--grammar", "root ::= (")
    assert grammar.returncode == EXIT_REFUSED, grammar.stderr
    assert grammar.stderr.splitlines() == [
        "llamad: invalid_grammar: the grammar is invalid: "
        "parse: error parsing grammar: expecting ')' at"
    ]
    # Megabytes on stdin: refused by the vocabulary's bound, never tokenized.
    huge = llamad(daemon.endpoint, "complete", "--max-tokens", "4", input="river " * (1 << 20))
    assert huge.returncode == EXIT_REFUSED, huge.stderr
    lines = huge.stderr.strip().splitlines()
    assert len(lines) == 1, huge.stderr
    assert lines[0].startswith("llamad: context_overflow: the prompt cannot fit"), lines[0]
    assert huge.stdout == ""


def test_bytes_that_are_not_utf8_are_refused_in_one_line(daemon: DaemonProc) -> None:
    """From the command line and from a pipe: Python reads such bytes as lone
    surrogates, which the request may not carry (actors.wire refuses them)."""
    argv = llamad_command(daemon.endpoint, "complete", "caf\udce9 \udcff", "--max-tokens", "2")
    piped = llamad_command(daemon.endpoint, "complete", "--max-tokens", "2")
    for run in (
        subprocess.run(argv, capture_output=True, env=scrubbed_env(), timeout=120, check=False),
        subprocess.run(
            piped,
            input=b"caf\xe9 \xff\n",
            capture_output=True,
            env=scrubbed_env(),
            timeout=120,
            check=False,
        ),
    ):
        err = run.stderr.decode(errors="replace")
        assert run.returncode == EXIT_REFUSED, err
        assert err.startswith("llamad: bad_request: "), err
        assert "not valid Unicode" in err
        assert len(err.strip().splitlines()) == 1, err
        assert run.stdout == b""


def test_an_unknown_model_exits_not_found(daemon: DaemonProc) -> None:
    run = llamad(daemon.endpoint, "complete", "-m", "nosuch", "hi")
    assert run.returncode == EXIT_NOT_FOUND, run.stderr
    assert run.stderr.startswith("llamad: model_not_found: "), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_no_daemon_gives_the_hint_to_start_one() -> None:
    endpoint = f"ipc:///tmp/llamad-cli-none-{os.getpid()}/llamad.sock"
    started = time.monotonic()
    run = llamad(endpoint, "models", timeout=60)
    assert run.returncode == EXIT_UNAVAILABLE, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("llamad: unavailable: "), lines[0]
    assert endpoint in lines[0] and "start it with `llamad daemon`" in lines[0]
    assert time.monotonic() - started < 30
