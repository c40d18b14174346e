"""bench/peers/idle.py's PSS: a shared file's pages are split among the processes mapping them.

Real files and real processes: this test maps a file, and a second process
maps the same file, as the llama-server probe maps the GGUF a llamad worker
maps while P9 is measured.
"""

from __future__ import annotations

import importlib
import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
idle = importlib.import_module("bench.peers.idle")

SIZE = 4 << 20
PAGE = mmap.PAGESIZE

# Maps the file read-only, reads every page, says so, then waits for stdin to close.
_MAPPER = """
import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
total = sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))
print("mapped", total, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def weights(tmp_path: Path) -> Iterator[mmap.mmap]:
    """A 4 MiB file standing for the weights, mapped here with every page read."""
    path = tmp_path / "weights.gguf"
    path.write_bytes(os.urandom(SIZE))
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    sum(mapped[i] for i in range(0, SIZE, PAGE))
    yield mapped
    mapped.close()


def test_a_file_mapped_by_one_process_counts_whole_in_its_pss(
    weights: mmap.mmap, tmp_path: Path
) -> None:
    got = idle.mapped_pss_bytes(os.getpid(), tmp_path / "weights.gguf")
    assert SIZE - 4 * PAGE <= got <= SIZE


def test_a_file_mapped_by_two_processes_counts_half_in_each_pss(
    weights: mmap.mmap, tmp_path: Path
) -> None:
    path = tmp_path / "weights.gguf"
    other = subprocess.Popen(
        [sys.executable, "-c", _MAPPER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline().startswith("mapped")
        mine = idle.mapped_pss_bytes(os.getpid(), path)
        theirs = idle.mapped_pss_bytes(other.pid, path)
        assert SIZE // 2 - 4 * PAGE <= mine <= SIZE // 2 + 4 * PAGE
        assert SIZE - 8 * PAGE <= mine + theirs <= SIZE
        # The overhead on PSS takes away only what the holder's mapping weighs.
        pss = idle.pss_bytes([os.getpid()])
        assert idle.pss_overhead_mb([os.getpid()], [os.getpid()], path, 0.0) == pytest.approx(
            (pss - mine) / idle.MB, abs=0.5
        )
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(30)


def test_pss_is_at_most_rss_and_a_gone_process_counts_zero() -> None:
    me = os.getpid()
    assert 0 < idle.pss_bytes([me]) <= idle.rss_bytes([me])
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(gone.stdout)
    assert idle.pss_bytes([pid]) == 0
    assert idle.mapped_pss_bytes(pid, "/nonexistent") == 0
