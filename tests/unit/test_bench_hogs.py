"""bench/hogs.py: the one way a bench runs busy loops beside what it measures.

A hog that outlives its bench loads every later measurement on the machine
(cancel_bench's ``timeout 600 sh -c 'while :; ...'`` hogs did: killing the
``timeout`` left its ``sh`` spinning, with nothing to stop it).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bench.hogs import Hogs

from llamad.testing.launcher import wait_until

ROOT = Path(__file__).resolve().parents[2]


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_the_hogs_are_killed_when_the_block_raises() -> None:
    hogs = Hogs(2)
    with pytest.raises(RuntimeError, match="boom"), hogs:
        pids = hogs.pids
        assert len(pids) == 2 and hogs.running()
        raise RuntimeError("boom")
    assert all(gone(p) for p in pids) and hogs.procs == []


def test_the_hogs_are_killed_on_ctrl_c() -> None:
    hogs = Hogs(1)
    with pytest.raises(KeyboardInterrupt), hogs:
        pids = hogs.pids
        raise KeyboardInterrupt
    assert all(gone(p) for p in pids)


def test_a_hog_ends_by_itself_when_the_bench_is_killed() -> None:
    code = (
        "import sys, time\n"
        "from bench.hogs import Hogs\n"
        "h = Hogs(1); h.start()\n"
        "print(h.pids[0], flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    bench = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        assert bench.stdout is not None
        hog = int(bench.stdout.readline())
        assert not gone(hog)
        bench.send_signal(signal.SIGKILL)  # no finally runs: the hog must notice
        bench.wait(10)
        wait_until(lambda: gone(hog), "the orphaned hog to exit", timeout=20)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()


# A busy loop written inline: shell (`while :; do :; done`, `while true`) or
# Python (`while True: pass`, `while 1: pass`).
_INLINE_LOOP = re.compile(r"while\s+(:|true)\s*;\s*do|while\s+(True|1)\s*:\s*pass")


def test_no_bench_spins_a_loop_of_its_own() -> None:
    """Every bench that measures beside busy loops takes them from bench.hogs."""
    own = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "bench").rglob("*.py"))
        if path.name != "hogs.py" and _INLINE_LOOP.search(path.read_text())
    ]
    assert own == []
