"""Shared helpers for benchmarks: machine description, stats, recording results."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem = f"{mem_kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        mem = "unknown"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        rev = ""
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "python": platform.python_version(),
        "commit": rev or "unknown",
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    lines = [fmt.format(*cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt.format(*r) for r in cells[1:]]
    return "\n".join(lines)


def record(name: str, title: str, body: str) -> Path:
    """Write ``bench/results/<name>-<date>.md`` with the machine header; return its path."""
    info = machine()
    RESULTS.mkdir(parents=True, exist_ok=True)
    day = info["date"][:10]
    path = RESULTS / f"{name}-{day}.md"
    header = "\n".join(f"- {k}: {v}" for k, v in info.items())
    path.write_text(f"# {title}\n\n## Machine\n\n{header}\n\n## Results\n\n{body.rstrip()}\n")
    return path
