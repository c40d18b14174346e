"""StateBuffer: page-rounded, pre-faulted, growable; prefault keeps contents."""

from __future__ import annotations

import pytest

from llamad.errors import BadRequest
from llamad.llama_ffi import PAGE_SIZE, Closed, StateBuffer, prefault
from llamad.llama_ffi.native import lib
from llamad.llama_ffi.state import HostBufferType, host_buffer_type

pytestmark = pytest.mark.timeout(30)


def test_capacity_rounds_up_to_whole_pages() -> None:
    with StateBuffer(PAGE_SIZE + 1) as buf:
        assert buf.capacity == 2 * PAGE_SIZE
        assert len(buf.memory) == buf.capacity


def test_memory_is_writable_and_view_is_a_prefix() -> None:
    with StateBuffer(100) as buf:
        buf.memory[:5] = b"hello"
        view = buf.view(5)
        assert bytes(view) == b"hello"
        view.release()


def test_ensure_grows_only_when_needed() -> None:
    with StateBuffer(PAGE_SIZE) as buf:
        buf.ensure(10)
        assert buf.capacity == PAGE_SIZE
        buf.ensure(3 * PAGE_SIZE)
        assert buf.capacity >= 3 * PAGE_SIZE


def test_view_past_capacity_is_rejected() -> None:
    with StateBuffer(PAGE_SIZE) as buf, pytest.raises(BadRequest):
        buf.view(buf.capacity + 1)


def test_closing_with_a_live_view_is_refused() -> None:
    buf = StateBuffer(PAGE_SIZE)
    view = buf.view(10)
    with pytest.raises(BadRequest):
        buf.close()
    view.release()
    buf.close()
    with pytest.raises(Closed):
        _ = buf.memory


def test_prefault_preserves_contents() -> None:
    data = bytearray(range(256)) * (3 * PAGE_SIZE // 256 + 1)
    before = bytes(data)
    prefault(data)
    assert bytes(data) == before


def test_prefault_needs_writable_memory() -> None:
    with pytest.raises(BadRequest):
        prefault(b"read only")


# -- host buffers of a device (issue 21) ------------------------------------------------------


def test_a_cpu_build_has_no_host_buffer_type_so_buffers_stay_plain_mappings() -> None:
    # The CPU device has no host buffer type: every StateBuffer is the
    # anonymous pre-faulted mapping, as before host buffers existed.
    assert host_buffer_type(offloaded=True) is None
    assert host_buffer_type(offloaded=False) is None
    with StateBuffer(PAGE_SIZE) as buf:
        assert buf.kind == "mmap"


def test_a_buffer_from_a_host_buffer_type_is_usable_and_grows_and_frees() -> None:
    # The same calls a CUDA host buffer type (pinned memory) goes through,
    # with ggml's plain CPU buffer type, the one this build has.
    host = HostBufferType(lib.ggml_backend_cpu_buffer_type())
    buf = StateBuffer(PAGE_SIZE + 1, host=host)
    assert buf.kind == host.name == "CPU"
    assert buf.capacity >= 2 * PAGE_SIZE and len(buf.memory) == buf.capacity
    buf.memory[:5] = b"hello"
    view = buf.view(5)
    assert bytes(view) == b"hello"
    view.release()
    assert buf.grows == 0
    buf.ensure(buf.capacity)
    assert buf.grows == 0
    buf.ensure(10 * PAGE_SIZE)
    assert buf.grows == 1 and buf.capacity >= 10 * PAGE_SIZE
    buf.memory[-1:] = b"x"
    buf.close()
    assert buf.capacity == 0
    with pytest.raises(Closed):
        _ = buf.memory


# -- pre-faulting without the GIL (issue 21) ---------------------------------------------------


def _resident_bytes(address: int) -> int:
    """Rss of the mapping holding ``address``, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_buffer_is_resident_in_full_when_made() -> None:
    from llamad.llama_ffi.native import ffi  # noqa: PLC0415

    with StateBuffer(64 * PAGE_SIZE) as buf:
        address = int(ffi.cast("uintptr_t", ffi.from_buffer(buf.memory)))
        assert _resident_bytes(address) >= buf.capacity


def test_a_buffer_is_not_populated_by_mmap_which_holds_the_gil(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CPython calls mmap(MAP_POPULATE) holding the GIL: 60 MB stalled every
    # other thread of the worker ~20 ms (measured), while the read buffer is
    # prepared on a helper thread beside the loop. llamad_prefault faults the
    # pages in from a cffi call, which releases it.
    import mmap  # noqa: PLC0415

    flags_seen: list[int] = []
    real = mmap.mmap

    def recording(*args: object, **kwargs: object) -> mmap.mmap:
        flags_seen.append(int(kwargs.get("flags", 0)))  # type: ignore[call-overload]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mmap, "mmap", recording)
    with StateBuffer(8 * PAGE_SIZE) as buf:
        assert buf.capacity == 8 * PAGE_SIZE
    assert flags_seen and not any(f & getattr(mmap, "MAP_POPULATE", 0) for f in flags_seen)
