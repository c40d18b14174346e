"""`make run` (``python -m llamad.cli.demo``): the daemon serves the default model cold,
then warm at once, then again after a restart.

The demo starts a real daemon with no configuration file, talks to it through
the public client, restarts it, and stops it. These tests check what it
prints against what must hold (an exact hit on the live KV for the repeat
sent back to back, an exact hit from a tier after the restart, both with the
cold reply), and check on their own that it left nothing behind: no process
of the daemon's tree, no private directory, also when it is interrupted with
Ctrl-C mid-request.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from llamad.testing import scrubbed_env

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

# A shorter prompt than the default (~650 tokens, still above the save
# policy's 512-token minimum) and one thread: the machine is shared.
DEMO = [
    sys.executable,
    "-m",
    "llamad.cli.demo",
    "--facts",
    "24",
    "--max-tokens",
    "8",
    "--threads",
    "1",
]


def _private_dir(out: str) -> Path:
    found = re.search(r"private directory (/tmp/llamad-run-\S+)\)", out)
    assert found is not None, out
    return Path(found.group(1))


def _processes_of(base: Path) -> list[psutil.Process]:
    """Live processes whose environment places them in the demo daemon's tree
    (the daemon exports its runtime directory to every child)."""
    runtime = str(base / "run")
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("LLAMAD_RUNTIME_DIR") == runtime:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _check_run(proc: subprocess.CompletedProcess[str]) -> None:
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    base = _private_dir(out)
    assert re.search(
        r"daemon   pid \d+, serving smollm2 \(n_ctx \d+\) on ipc:///tmp/llamad-run-", out
    )
    cold = re.search(r"^cold +cache_hit_kind=cold .* prompt tokens: computed (\d+);", out, re.M)
    # Back to back: the live KV the cold request left, the first token sampled
    # from the logits it kept; nothing prefilled, nothing restored.
    warm = re.search(r"^warm +cache_hit_kind=exact .* prompt tokens: live (\d+);", out, re.M)
    # After SIGTERM and a start with no configuration: the row the cache kept
    # across the restart, restored whole.
    again = re.search(
        r"^restart +cache_hit_kind=exact .* prompt tokens: (ram|ram_file|disk) (\d+);", out, re.M
    )
    assert cold is not None and int(cold.group(1)) > 512, out
    assert warm is not None and warm.group(1) == cold.group(1), out
    assert again is not None and again.group(2) == cold.group(1), out
    assert re.search(r"^speed-up to the first token through the client: \d+x warm", out, re.M)
    assert "warm reply identical to the cold one; warm hit exact" in out
    assert "restart reply identical to the cold one; restart hit exact" in out
    assert "daemon   stopped with SIGTERM: exit 0, no llamad process left" in out
    assert not base.exists(), "the private directory is removed"
    assert _processes_of(base) == []


@pytest.mark.timeout(600)
def test_make_run_replies_the_same_with_every_core_busy() -> None:
    """``make run`` itself (default prompt, tokens and threads) beside a CPU hog
    per core: the governor moves the worker between thread counts, and the warm
    and restart replies must still be the cold one's. With the build before
    llama.cpp patch 0003 this fails ("warm reply DIFFERS from the cold one"):
    a decode's sums depended on its thread count (issue 16).

    Every check of a run (:func:`_check_run`: cold, an exact live hit, an exact
    hit from a tier after the restart, a clean stop, nothing left behind) is
    made here, on the run that is hardest to pass. A second, quiet run of the
    shorter ``DEMO`` made the same checks and nothing else (~30 s of the suite
    on a loaded machine); ``DEMO``'s options are still run by the Ctrl-C test."""
    command = [sys.executable, "-m", "llamad.cli.demo"]  # `make run` itself
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(len(psutil.Process().cpu_affinity() or [0]))
    ]
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=580, check=False, env=scrubbed_env()
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)
    _check_run(proc)


def test_make_run_interrupted_mid_request_still_stops_the_daemon() -> None:
    proc = subprocess.Popen(
        DEMO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=scrubbed_env()
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 200
        # Ctrl-C once the cold request is on its way.
        while not lines or not lines[-1].startswith("prompt "):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        base = _private_dir("".join(lines))
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted: stopping the daemon" in err
    assert "daemon   stopped with SIGTERM: exit 0, no llamad process left" in rest, rest + err
    assert not base.exists()
    assert _processes_of(base) == []
