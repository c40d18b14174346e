"""How often a thread or a process woke up: its voluntary context switches.

A thread that waits (a poll, a sleep, a lock) counts one voluntary switch
each time it goes back to waiting, so a timer that wakes it ten times a second
adds ten a second. Being taken off a CPU by the scheduler counts as a
*non*voluntary switch instead, which a loaded machine adds at random: those
are left out, so a count does not grow with the load beside the test.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["voluntary_switches"]


def voluntary_switches(pid: int | str = "self", tid: int | None = None) -> int:
    """Voluntary context switches of thread ``tid`` of ``pid``, or of all its threads."""
    base = Path(f"/proc/{pid}/task")
    tasks = [base / str(tid)] if tid is not None else list(base.iterdir())
    total = 0
    for task in tasks:
        try:
            text = (task / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total
