"""populate_read: a read-only mapping's pages faulted in without MAP_POPULATE (and the GIL)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache import populate
from llamad.cache.populate import populate_read

pytestmark = pytest.mark.timeout(60)

SIZE = 8 << 20


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[Path]:
    # /dev/shm where it exists: the ram tier's own filesystem.
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = base / f"llamad-populate-test-{os.getpid()}-{os.urandom(4).hex()}"
    path.write_bytes(bytes(range(256)) * (SIZE // 256))
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _mapped(path: Path) -> mmap.mmap:
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, SIZE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def _resident_kb(path: Path) -> int:
    """Rss of this process's mapping of ``path``: the pages its page tables map."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            for field in lines[i + 1 :]:
                if field.startswith("Rss:"):
                    return int(field.split()[1])
    raise AssertionError(f"no mapping of {path}")


def test_the_kernel_faults_the_mapping_in(segment: Path) -> None:
    m = _mapped(segment)
    try:
        before = _resident_kb(segment)
        assert populate_read(m) is True  # MADV_POPULATE_READ (Linux 5.14 and later)
        assert before < SIZE // 1024 // 4
        assert _resident_kb(segment) >= SIZE // 1024
        assert m[:256] == bytes(range(256))  # the mapping is untouched and readable
    finally:
        m.close()


def test_without_madvise_the_pages_are_read_in(
    segment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(populate, "_madvise", lambda: None)
    m = _mapped(segment)
    try:
        assert populate_read(m) is False
        assert _resident_kb(segment) >= SIZE // 1024
        m.close()  # no buffer export left behind: the mapping closes
    finally:
        if not m.closed:
            m.close()


def test_the_handle_on_madvise_parses_no_c_declaration() -> None:
    # cffi's ABI mode loaded pycparser to parse one: ~11 ms and 0.7 MB in the
    # first process that mapped a row, a worker's first restore after a start
    # (SPEC P2). A fresh interpreter: this one may have loaded either already.
    code = (
        "import sys\n"
        "from llamad.cache.populate import prepare_populate\n"
        "assert prepare_populate()\n"
        "print('pycparser' in sys.modules, 'cffi' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False"]
