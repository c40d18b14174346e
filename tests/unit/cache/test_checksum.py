"""llamad.cache.checksum: the crc32c package's C function, loaded without its package face."""

from __future__ import annotations

import subprocess
import sys

import crc32c as package
import pytest

from llamad.cache.checksum import HARDWARE_BASED, crc32c


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
