"""llamad.cache.checksum: the crc32c package's C function, loaded without its package face."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

import crc32c as package
import pytest

from llamad.cache import checksum
from llamad.cache.checksum import (
    BESIDE_CHUNK,
    HARDWARE_BASED,
    SPLIT_MIN_BYTES,
    CrcBeside,
    crc32c,
    crc32c_combine,
    crc32c_split,
)


@pytest.mark.parametrize("data", [b"", b"123456789", bytes(range(256)) * 300])
def test_it_is_the_packages_crc32c(data: bytes) -> None:
    assert crc32c(data) == package.crc32c(data)
    half = len(data) // 2
    assert crc32c(data[half:], crc32c(data[:half])) == crc32c(data)


def test_the_check_value_of_the_standard() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # RFC 3720's CRC32C check value


def test_it_uses_the_cpus_crc_instructions_where_the_package_does() -> None:
    assert HARDWARE_BASED is package.hardware_based


def test_loading_it_reads_no_package_metadata() -> None:
    code = (
        "import sys; from llamad.cache.checksum import crc32c; crc32c(b'x'); "
        "print(sorted(m for m in sys.modules"
        " if m.startswith(('importlib.metadata', 'email', 'crc32c'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['crc32c._crc32c']"


# -- combining, and the split check -------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 7, 64, 4097, 1 << 20, 3_000_001])
def test_two_parts_crcs_combine_into_the_wholes(n: int) -> None:
    data = os.urandom(n)
    for cut in {0, 1, n // 3, n // 2, n - 1, n}:
        if 0 <= cut <= n:
            head, tail = data[:cut], data[cut:]
            assert crc32c_combine(crc32c(head), crc32c(tail), len(tail)) == crc32c(data)


def test_a_combine_of_a_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match="length"):
        crc32c_combine(0, 0, -1)


@pytest.mark.parametrize(
    "n", [0, 1, SPLIT_MIN_BYTES - 1, SPLIT_MIN_BYTES, SPLIT_MIN_BYTES + 1, 3 * SPLIT_MIN_BYTES + 7]
)
def test_a_split_check_is_the_crc_of_the_whole(n: int) -> None:
    data = os.urandom(n)
    assert crc32c_split(data) == crc32c(data)
    assert crc32c_split(memoryview(data)) == crc32c(data)


def test_a_split_check_sees_one_flipped_bit_in_either_half() -> None:
    data = bytearray(os.urandom(2 * SPLIT_MIN_BYTES))
    good = crc32c(data)
    for at in (0, SPLIT_MIN_BYTES - 1, SPLIT_MIN_BYTES, len(data) - 1):
        data[at] ^= 0x10
        assert crc32c_split(data) != good
        data[at] ^= 0x10
    assert crc32c_split(data) == good


@pytest.fixture
def no_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    """No helper is started and its jobs go to a queue nobody reads (a helper
    already running waits on the old one)."""
    monkeypatch.setattr(checksum, "_ensure_helper", lambda: None)
    monkeypatch.setattr(checksum, "_halves", queue.SimpleQueue())


@pytest.mark.usefixtures("no_helper")
def test_a_helper_that_never_comes_leaves_the_caller_both_halves() -> None:
    # The caller takes the second half back once its own is done, and the
    # answer is the same.
    data = os.urandom(2 * SPLIT_MIN_BYTES + 3)
    assert crc32c_split(data) == crc32c(data)


def test_a_split_check_keeps_no_export_of_the_buffer() -> None:
    data = bytearray(os.urandom(SPLIT_MIN_BYTES + 1))
    crc32c_split(data)
    data.extend(b"x")  # a bytearray with a live export cannot resize (BufferError)


# -- CrcBeside: a CRC run beside the caller's own use of the bytes -------------------------


@pytest.mark.parametrize(
    "n", [0, 1, BESIDE_CHUNK - 1, BESIDE_CHUNK, BESIDE_CHUNK + 1, 5 * BESIDE_CHUNK + 3]
)
@pytest.mark.parametrize("after_s", [0.0, 0.001, 0.05])
def test_a_crc_beside_is_the_crc_of_the_whole(n: int, after_s: float) -> None:
    # Asked at once, with the helper part-way, or with it long done.
    data = os.urandom(n)
    with memoryview(data) as view:
        beside = CrcBeside(view)
        time.sleep(after_s)
        assert beside.value() == crc32c(data)
        assert beside.value() == crc32c(data)  # asked again: the same answer
        beside.close()


def test_a_crc_beside_sees_one_flipped_bit_anywhere() -> None:
    data = bytearray(os.urandom(4 * BESIDE_CHUNK + 1))
    good = crc32c(data)
    for at in (0, BESIDE_CHUNK, 2 * BESIDE_CHUNK + 5, len(data) - 1):
        data[at] ^= 0x04
        for after_s in (0.0, 0.002):
            with memoryview(data) as view:
                beside = CrcBeside(view)
                time.sleep(after_s)
                assert beside.value() != good
                beside.close()
        data[at] ^= 0x04


def test_the_helper_stops_at_the_callers_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    # The helper has claimed the job but not begun when the caller asks: the
    # caller takes the back half and waits; the helper, run now, must stop
    # at the cut (running on to the end would make the combined CRC wrong).
    jobs: queue.SimpleQueue[CrcBeside] = queue.SimpleQueue()
    monkeypatch.setattr(checksum, "_ensure_helper", lambda: None)
    monkeypatch.setattr(checksum, "_halves", jobs)
    data = os.urandom(6 * BESIDE_CHUNK + 11)
    with memoryview(data) as view:
        beside = CrcBeside(view)
        job = jobs.get_nowait()
        assert job is beside and job.take()
        answer: list[int] = []
        caller = threading.Thread(target=lambda: answer.append(beside.value()))
        caller.start()
        time.sleep(0.05)  # the caller has cut and waits for the helper
        assert answer == []
        job.run()
        caller.join(5)
        assert answer == [crc32c(data)]
        beside.close()


@pytest.mark.usefixtures("no_helper")
def test_a_helper_that_never_comes_leaves_the_caller_the_whole() -> None:
    data = os.urandom(3 * BESIDE_CHUNK + 1)
    with memoryview(data) as view:
        beside = CrcBeside(view)
        assert beside.value() == crc32c(data)  # returns: it waits for no helper
        beside.close()


def test_a_closed_crc_beside_no_longer_reads_the_buffer_and_has_no_value() -> None:
    data = bytearray(os.urandom(8 * BESIDE_CHUNK))
    view = memoryview(data)
    beside = CrcBeside(view)
    time.sleep(0.001)
    beside.close()
    beside.close()  # idempotent
    view.release()  # no part of it is exported by a helper still reading
    data.extend(b"x")  # a bytearray with a live export cannot resize (BufferError)
    with pytest.raises(RuntimeError, match="after close"):
        beside.value()
