"""Tiers (SPEC C3): naming, startup scan, reads into caller memory, corruption on load."""

from __future__ import annotations

import errno
import os
import uuid
from _posixshmem import shm_open  # the segment a ram tier names must exist
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache import tiers as tiers_module
from llamad.cache.checksum import BESIDE_CHUNK
from llamad.cache.counters import Counters
from llamad.cache.errors import InvalidCacheValue, KvcCorrupt, TierFull
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import HEADER_LEN, KvcSpec, SaveReason, encode_kvc, file_name
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import (
    SEGMENTS,
    RowMissing,
    SegmentMaps,
    Tier,
    TierConfig,
    TierStore,
    build_tiers,
    discard_damaged,
    load,
    load_mapped,
    load_mapped_row,
)

pytestmark = pytest.mark.timeout(60)

NS = Namespace(fingerprint=b"\x21" * 32, quant=3, ctx_hash=b"\x31" * 32)


def spec_for(tokens: list[int]) -> KvcSpec:
    return KvcSpec(NS, tokens_to_bytes(tokens), FingerprintMode.SAFE, SaveReason.COLD)


def put(tier: Tier, tokens: list[int], payload: bytes) -> KvcSpec:
    """Publish a row the simple way (the publish protocol has its own tests)."""
    spec = spec_for(tokens)
    tier.path_for(spec.key).write_bytes(encode_kvc(spec, payload))
    return spec


@pytest.fixture
def counters(tmp_path: Path) -> Iterator[Counters]:
    c = Counters.create(tmp_path / "counters")
    yield c
    c.close()


@pytest.fixture
def disk(tmp_path: Path) -> Tier:
    tier = Tier(TierConfig(TierKind.DISK, tmp_path / "disk", 1 << 30))
    tier.prepare()
    return tier


@pytest.fixture
def ram() -> Iterator[Tier]:
    tier = Tier(TierConfig(TierKind.RAM, Path("/dev/shm"), 1 << 30, f"t{uuid.uuid4().hex[:12]}"))
    yield tier
    tier.purge()


def test_read_into_returns_the_exact_payload(disk: Tier) -> None:
    payload = os.urandom(3 << 20)
    spec = put(disk, [1, 2, 3], payload)
    buf = bytearray(len(payload) + 7)
    assert disk.read_into(spec.key, buf) == len(payload)
    assert bytes(buf[: len(payload)]) == payload
    assert disk.read_into(disk.location_for(spec.key), buf) == len(payload)


def test_ram_rows_are_posix_shm_segments_read_back_exactly(ram: Tier) -> None:
    payload = os.urandom(1 << 20)
    spec = put(ram, [4, 5], payload)
    fd = shm_open(ram.segment_name(spec.key), os.O_RDONLY, 0)
    os.close(fd)
    buf = bytearray(len(payload))
    assert ram.read_into(spec.key, buf) == len(payload)
    assert buf == payload


def test_scan_adopts_valid_files_and_deletes_tmp_and_corrupt_ones(
    disk: Tier, counters: Counters
) -> None:
    good = put(disk, [1, 2, 3], b"good")
    bad = put(disk, [7, 8], b"bad payload header flipped")
    data = bytearray(disk.path_for(bad.key).read_bytes())
    data[20] ^= 4
    disk.path_for(bad.key).write_bytes(data)
    misnamed = spec_for([9])
    disk.path_for(misnamed.key).write_bytes(encode_kvc(spec_for([10]), b"x"))
    leftover = disk.tmp_path_for(good.key, "w-1")
    leftover.write_bytes(b"half a file")
    foreign = disk.root / "notes.txt"
    foreign.write_text("not ours")

    found = list(disk.scan(counters))

    assert [m.key for m in found] == [good.key]
    assert found[0].payload_len == 4
    assert not disk.path_for(bad.key).exists()
    assert not disk.path_for(misnamed.key).exists()
    assert not leftover.exists()
    assert foreign.exists()
    assert counters.get("corrupt_files") == 2


def test_ram_scan_purges_segments_of_a_previous_daemon(ram: Tier) -> None:
    spec = put(ram, [1], b"old daemon")
    other = Tier(TierConfig(TierKind.RAM, Path("/dev/shm"), 1 << 20, "someone-else"))
    assert list(ram.scan()) == []
    assert not ram.path_for(spec.key).exists()
    assert other.prefix != ram.prefix


def test_load_of_a_bit_flipped_row_is_a_miss_that_deletes_and_counts(
    disk: Tier, counters: Counters
) -> None:
    spec = put(disk, [1, 2, 3], os.urandom(100_000))
    path = disk.path_for(spec.key)
    data = bytearray(path.read_bytes())
    data[-500] ^= 0x10
    path.write_bytes(data)
    buf = bytearray(200_000)
    with pytest.raises(KvcCorrupt):
        disk.read_into(spec.key, buf)
    assert load(disk, spec.key, buf, counters) is None
    assert not path.exists()
    assert counters.get("corrupt_files") == 1
    assert counters.get("load_total_ns") == 0


@pytest.mark.parametrize("kind", [TierKind.DISK, TierKind.RAM])
def test_load_of_a_truncated_row_is_a_miss(
    kind: TierKind, disk: Tier, ram: Tier, counters: Counters
) -> None:
    tier = disk if kind is TierKind.DISK else ram
    spec = put(tier, [5, 6], os.urandom(50_000))
    path = tier.path_for(spec.key)
    os.truncate(path, path.stat().st_size - 1)
    assert load(tier, spec.key, bytearray(60_000), counters) is None
    assert counters.get("corrupt_files") == 1


def test_load_counts_time_and_missing_rows_are_misses(disk: Tier, counters: Counters) -> None:
    spec = put(disk, [1], b"abc")
    buf = bytearray(10)
    assert load(disk, spec.key, buf, counters) == 3
    assert counters.get("load_total_ns") > 0
    assert load(disk, spec_for([2]).key, buf, counters) is None
    with pytest.raises(RowMissing):
        disk.read_into(spec_for([2]).key, buf)


def test_locations_outside_the_tier_are_refused(disk: Tier, tmp_path: Path) -> None:
    spec = put(disk, [1], b"abc")
    outside = tmp_path / file_name(spec.key)
    outside.write_bytes(disk.path_for(spec.key).read_bytes())
    for location in (str(outside), "/etc/passwd", str(disk.root / "../x.kvc")):
        with pytest.raises(InvalidCacheValue):
            disk.read_into(location, bytearray(10))
        with pytest.raises(InvalidCacheValue):
            disk.delete(location)
    assert outside.exists()


def test_create_tmp_is_exclusive_and_sized(disk: Tier) -> None:
    key = spec_for([1]).key
    path, fd = disk.create_tmp(key, "w1", 8192)
    os.close(fd)
    assert path.name == f"{key.hex()}.kvc.w1.tmp"
    assert path.stat().st_size == 8192
    with pytest.raises(FileExistsError):
        disk.create_tmp(key, "w1", 10)
    with pytest.raises(InvalidCacheValue):
        disk.tmp_path_for(key, "../evil")


def test_create_tmp_on_a_full_filesystem_is_tier_full_and_leaves_nothing(
    disk: Tier, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(TierFull):
        disk.create_tmp(spec_for([1]).key, "w1", 1 << 20)
    assert list(disk.root.iterdir()) == []


def test_tier_store_adopts_valid_orphans_and_unlinks_junk(disk: Tier, counters: Counters) -> None:
    store = TierStore(build_tiers([disk.config]), counters)
    good = put(disk, [1, 2], b"orphan")
    adopted = store.adopt(TierKind.DISK, good.key, None)
    assert adopted is not None
    assert adopted.meta.key == good.key
    assert adopted.location == disk.location_for(good.key)
    junk_key = spec_for([3]).key
    disk.path_for(junk_key).write_bytes(b"\x00" * 100)
    assert store.adopt(TierKind.DISK, junk_key, disk.location_for(junk_key)) is None
    assert not disk.path_for(junk_key).exists()
    assert counters.get("corrupt_files") == 1
    assert store.adopt(TierKind.DISK, spec_for([4]).key, None) is None


def test_persist_stats_survives_a_rescan(disk: Tier) -> None:
    store = TierStore(build_tiers([disk.config]))
    spec = put(disk, [1, 2], b"popular")
    store.persist_stats(TierKind.DISK, disk.location_for(spec.key), 17, 12345)
    (meta,) = disk.scan()
    assert (meta.hit_count, meta.last_used_ns) == (17, 12345)
    assert disk.read_into(spec.key, bytearray(7)) == 7


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "tape", "root": Path("/x"), "quota": 1}, "kind"),
        ({"kind": "disk", "root": Path("rel"), "quota": 1}, "root"),
        ({"kind": "disk", "root": Path("/x"), "quota": -1}, "quota"),
        ({"kind": "ram", "root": Path("/dev/shm"), "quota": 1, "instance": "a/b"}, "instance"),
    ],
)
def test_tier_config_rejects_bad_fields(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        TierConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_a_tier_configured_twice_is_refused(tmp_path: Path) -> None:
    cfg = TierConfig(TierKind.DISK, tmp_path, 1)
    with pytest.raises(InvalidCacheValue):
        build_tiers([cfg, cfg])


def test_mapped_payload_is_the_validated_ram_row_in_place(ram: Tier, disk: Tier) -> None:
    payload = os.urandom(300_000)
    spec = put(ram, [8, 9], payload)
    with ram.mapped_payload(spec.key) as view:
        assert view.nbytes == len(payload)
        assert view == payload
    with pytest.raises(ValueError):
        view.tobytes()  # released at the end of the block
    with pytest.raises(InvalidCacheValue), disk.mapped_payload(put(disk, [1], b"x").key):
        pass


def test_mapped_payload_of_a_damaged_segment_is_refused(ram: Tier) -> None:
    spec = put(ram, [8, 9], os.urandom(100_000))
    path = ram.path_for(spec.key)
    with open(path, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-10, os.SEEK_END)
        f.write(bytes((byte ^ 0xFF,)))  # always a change (a fixed 0xff was none 1 time in 256)
    with pytest.raises(KvcCorrupt) as err, ram.mapped_payload(spec.key):
        pytest.fail("a corrupt row was handed out")
    assert err.value.reason == "payload_crc"


def test_create_tmp_refuses_a_row_larger_than_the_quota(tmp_path: Path) -> None:
    tier = Tier(TierConfig(TierKind.DISK, tmp_path / "small", 10_000))
    tier.prepare()
    with pytest.raises(TierFull):
        tier.create_tmp(spec_for([1]).key, "w1", 10_001)
    assert list(tier.root.iterdir()) == []


def test_ram_loads_reuse_one_mapping_until_the_segment_changes(ram: Tier) -> None:
    first = os.urandom(200_000)
    spec = put(ram, [3, 1, 4], first)
    path = ram.path_for(spec.key)
    buf = bytearray(len(first))
    assert ram.warm(spec.key)
    mapped = SEGMENTS.get(path, spec.key)
    assert ram.read_into(spec.key, buf) == len(first) and buf == first
    assert SEGMENTS.get(path, spec.key) is mapped

    # Evicted and saved again under the same name: a new inode, read afresh.
    ram.delete(spec.key)
    with pytest.raises(RowMissing):
        ram.read_into(spec.key, buf)
    second = os.urandom(200_000)
    put(ram, [3, 1, 4], second)
    assert ram.read_into(spec.key, buf) == len(second) and buf == second
    assert SEGMENTS.get(path, spec.key) is not mapped


def test_segment_maps_stay_within_their_byte_bound(ram: Tier) -> None:
    maps = SegmentMaps(max_bytes=100_000)
    specs = [put(ram, [i], os.urandom(30_000)) for i in range(5)]
    for spec in specs:
        maps.get(ram.path_for(spec.key), spec.key)
    paths = [ram.path_for(spec.key) for spec in specs]
    # Each mapping is 34 KiB (header page + payload): two fit, oldest out first.
    assert [p in maps for p in paths] == [False, False, False, True, True]
    ram.delete(specs[-1].key)
    maps.get(paths[0], specs[0].key)
    # The evicted segment's mapping is swept, not the older live one.
    assert [p in maps for p in paths] == [True, False, False, True, False]
    with pytest.raises(RowMissing):
        maps.get(paths[-1], specs[-1].key)


def test_warm_is_a_no_op_for_files_and_missing_rows(ram: Tier, disk: Tier) -> None:
    spec = put(disk, [1], b"abc")
    assert not disk.warm(spec.key)
    assert not ram.warm(spec_for([77]).key)


def test_a_restarted_meta_can_adopt_this_runs_ram_segments(ram: Tier, counters: Counters) -> None:
    keep = put(ram, [1, 2], b"still ours")
    bad = put(ram, [3], b"damaged")
    with open(ram.path_for(bad.key), "r+b") as f:
        f.write(b"X")
    leftover = ram.tmp_path_for(keep.key, "w9")
    leftover.write_bytes(b"half")
    assert [m.key for m in ram.scan(counters, adopt_ram=True)] == [keep.key]
    assert ram.path_for(keep.key).exists()
    assert not ram.path_for(bad.key).exists()
    assert not leftover.exists()
    assert counters.get("corrupt_files") == 1


def test_scan_skips_an_unreadable_file_and_leaves_it(
    disk: Tier, counters: Counters, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = put(disk, [1, 2], b"fine")
    stuck = put(disk, [3, 4], b"unreadable")
    real_read_meta = tiers_module.read_meta

    def flaky(fd: int, *, expected_key: bytes | None = None) -> object:
        if expected_key == stuck.key:
            raise OSError(errno.EIO, "Input/output error")
        return real_read_meta(fd, expected_key=expected_key)

    monkeypatch.setattr(tiers_module, "read_meta", flaky)
    assert [m.key for m in disk.scan(counters)] == [good.key]
    # Not judged corrupt: left for a later scan, not deleted or counted.
    assert disk.path_for(stuck.key).exists()
    assert counters.get("corrupt_files") == 0


def _flip(path: Path, offset: int) -> None:
    """Damage one byte in place (visible through a process's existing mapping)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 0x20]), offset)
    finally:
        os.close(fd)


# Where damage to a mapped row used to go unnoticed in the process that kept
# it mapped: everything before the payload.
_PREFIX_DAMAGE = {
    "magic": 0,
    "token_count": 12,
    "context_size": 20,
    "created": 24,
    "payload_len": 48,
    "tlv_crc": 60,
    "payload_crc": 64,
    "header_crc": 70,
    "hit_count": 16,
    "first_tlv_record": HEADER_LEN,
    "token_ids": HEADER_LEN + 150,
}


@pytest.mark.parametrize("where", [*_PREFIX_DAMAGE, "padding"])
def test_a_mapped_ram_row_damaged_before_its_payload_is_a_miss_counted_once(
    ram: Tier, counters: Counters, where: str
) -> None:
    payload = os.urandom(100_000)
    spec = put(ram, [7, *range(40)], payload)
    path = ram.path_for(spec.key)
    buf = bytearray(len(payload))
    assert load(ram, spec.key, buf, counters) == len(payload)  # now mapped in this process
    assert path in SEGMENTS
    meta = ram.read_meta(spec.key)
    _flip(path, meta.payload_offset - 1 if where == "padding" else _PREFIX_DAMAGE[where])

    sentinel = bytes(range(1, 251)) * (len(buf) // 250 + 1)
    buf[:] = sentinel[: len(buf)]
    assert load(ram, spec.key, buf, counters) is None
    assert buf == sentinel[: len(buf)], "damage before the payload reached the buffer"
    assert not path.exists()
    assert path not in SEGMENTS
    assert counters.get("corrupt_files") == 1
    # Found again (another loader, a later scan): still counted once.
    assert load(ram, spec.key, buf, counters) is None
    assert list(ram.scan(counters, adopt_ram=True)) == []
    assert counters.get("corrupt_files") == 1


def test_a_mapped_ram_row_damaged_before_its_payload_is_refused_in_place(
    ram: Tier, counters: Counters
) -> None:
    payload = os.urandom(50_000)
    spec = put(ram, [8, *range(40)], payload)
    with load_mapped(ram, spec.key, counters) as view:
        assert view is not None and view == payload
    _flip(ram.path_for(spec.key), HEADER_LEN + 150)
    with load_mapped(ram, spec.key, counters) as view:
        assert view is None
    assert counters.get("corrupt_files") == 1
    assert not ram.path_for(spec.key).exists()


def test_a_mapped_ram_row_stays_a_hit_after_cache_meta_persists_its_hit_count(
    ram: Tier, counters: Counters
) -> None:
    # cache-meta rewrites hit count and last use in the header of unpinned
    # rows; a mapping that checks its prefix must not take that for damage.
    payload = os.urandom(60_000)
    spec = put(ram, [9, 9], payload)
    buf = bytearray(len(payload))
    assert load(ram, spec.key, buf, counters) == len(payload)
    ram.persist_stats(spec.key, hits=41, last_used_ns=1_800_000_000_000_000_000)
    buf[:] = bytes(len(buf))
    assert load(ram, spec.key, buf, counters) == len(payload) and buf == payload
    with load_mapped(ram, spec.key, counters) as view:
        assert view is not None and view == payload
    assert ram.read_meta(spec.key).hit_count == 41
    assert counters.get("corrupt_files") == 0


def test_a_damaged_row_found_by_two_loaders_is_counted_once(disk: Tier, counters: Counters) -> None:
    # Two loaders (or a loader and a scan) that both found the damage each
    # try to remove the file; only the removal counts.
    spec = put(disk, [4, 4], os.urandom(10_000))
    _flip(disk.path_for(spec.key), HEADER_LEN + 5)
    assert discard_damaged(disk, spec.key, counters) is True
    assert discard_damaged(disk, spec.key, counters) is False
    assert counters.get("corrupt_files") == 1


@pytest.mark.timeout(10)
def test_prepare_makes_the_tier_root_and_every_missing_parent_private(tmp_path: Path) -> None:
    # /dev/shm/llamad-<uid>/<instance>: the parent made by prepare() must not
    # list the instances to other users.
    os.chmod(tmp_path, 0o755)
    root = tmp_path / "llamad-uid" / "instance" / "ram_file"
    Tier(TierConfig(TierKind.RAM_FILE, root, 1 << 20)).prepare()
    for made in (tmp_path / "llamad-uid", tmp_path / "llamad-uid" / "instance", root):
        assert made.stat().st_mode & 0o077 == 0, f"{made} is {made.stat().st_mode & 0o777:o}"
    assert tmp_path.stat().st_mode & 0o777 == 0o755  # an existing parent is left as it is


# -- a mapped row whose checksum runs beside its use (check_beside) ------------------------

BESIDE_PAYLOAD = 3 * BESIDE_CHUNK + 17  # the helper takes several steps


def _beside_row(ram: Tier, tokens: list[int]) -> tuple[KvcSpec, bytes]:
    payload = os.urandom(BESIDE_PAYLOAD)
    return put(ram, tokens, payload), payload


def _damaged_past_mapping(ram: Tier, counters: Counters, tokens: list[int], back: int) -> KvcSpec:
    """A row mapped once (its segment then cached, as a worker's save leaves
    it), then one payload byte ``back`` bytes from its end flipped: damage
    the mapping's own validation cannot see."""
    spec, _ = _beside_row(ram, tokens)
    with load_mapped_row(ram, spec.key, counters) as row:
        assert row is not None
    path = ram.path_for(spec.key)
    _flip(path, path.stat().st_size - back)
    return spec


def test_a_row_checked_beside_its_use_reads_whole_and_its_check_passes(
    ram: Tier, counters: Counters
) -> None:
    spec, payload = _beside_row(ram, [11, *range(30)])
    with load_mapped_row(ram, spec.key, counters, check_beside=True) as row:
        assert row is not None and bytes(row.payload) == payload
        row.check()
        row.check()  # asked again: the same verdict
    assert counters.get("corrupt_files") == 0
    assert ram.path_for(spec.key).exists()


def test_a_row_damaged_past_its_mapping_fails_its_check_and_is_discarded_once(
    ram: Tier, counters: Counters
) -> None:
    # The mapping's validation checks the header and records; the payload's
    # CRC is what runs beside the use.
    spec = _damaged_past_mapping(ram, counters, [12, *range(30)], 1000)
    path = ram.path_for(spec.key)
    used = b""
    with (
        pytest.raises(KvcCorrupt) as raised,
        load_mapped_row(ram, spec.key, counters, check_beside=True) as row,
    ):
        assert row is not None  # handed over before its checksum is known
        used = bytes(row.payload)
        row.check()
        pytest.fail("a damaged payload passed its check")
    assert raised.value.reason == "payload_crc"
    assert len(used) == BESIDE_PAYLOAD  # the block had the bytes: the check is what says no
    assert counters.get("corrupt_files") == 1
    assert not path.exists() and path not in SEGMENTS
    with load_mapped_row(ram, spec.key, counters, check_beside=True) as row:
        assert row is None  # gone: a miss from now on
    assert counters.get("corrupt_files") == 1


def test_a_block_that_never_checks_a_damaged_row_still_raises_on_its_way_out(
    ram: Tier, counters: Counters
) -> None:
    spec = _damaged_past_mapping(ram, counters, [13, *range(30)], 1)
    with (
        pytest.raises(KvcCorrupt, match="checksum"),
        load_mapped_row(ram, spec.key, counters, check_beside=True) as row,
    ):
        assert row is not None
    assert counters.get("corrupt_files") == 1


def test_a_block_that_fails_on_a_damaged_row_says_the_row_was_damaged(
    ram: Tier, counters: Counters
) -> None:
    # llama.cpp refusing a damaged state raises in the block before the
    # check: the damage is still found, counted, and named, the block's own
    # error chained to it.
    spec = _damaged_past_mapping(ram, counters, [14, *range(30)], 2)
    with (
        pytest.raises(KvcCorrupt) as raised,
        load_mapped_row(ram, spec.key, counters, check_beside=True),
    ):
        raise RuntimeError("the unpack refused it")
    assert isinstance(raised.value.__context__, RuntimeError)
    assert counters.get("corrupt_files") == 1


def test_a_block_that_fails_on_a_whole_row_raises_its_own_error_and_keeps_the_row(
    ram: Tier, counters: Counters
) -> None:
    spec, _ = _beside_row(ram, [15, *range(30)])
    with (
        pytest.raises(RuntimeError, match="elsewhere"),
        load_mapped_row(ram, spec.key, counters, check_beside=True) as row,
    ):
        assert row is not None
        raise RuntimeError("elsewhere")
    assert counters.get("corrupt_files") == 0
    assert ram.path_for(spec.key).exists()
