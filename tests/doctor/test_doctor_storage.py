from __future__ import annotations

import os

import pytest

from pitstop.doctor import storage, storage_devices, storage_read
from pitstop.findings import Severity

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 8:2 / / rw,relatime - ext4 /dev/sda2 rw
30 27 0:45 / /mnt/nfs rw,relatime - nfs4 server:/export rw,vers=4.2
31 27 253:0 / /data rw,relatime - xfs /dev/mapper/vg-data rw
32 27 0:50 / /scratch\\040space rw - tmpfs tmpfs rw,size=1024k
33 27 0:60 / /work rw - overlay overlay rw,lowerdir=/l,upperdir=/u
34 27 7:0 / /img rw - squashfs /dev/loop0 ro
"""


def _sys(tree, root):
    """A fake /sys: sda (HDD) with partition sda2; dm-0 (LVM) over nvme0n1p1; loop0 over a file."""
    disk = "devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda"
    nvme = "devices/pci0000:00/0000:00:1d.0/nvme/nvme0/nvme0n1"
    tree(root, {
        f"{disk}/queue/rotational": "1\n",
        f"{disk}/device/model": "WDC WD40EFRX\n",
        f"{disk}/sda2/partition": "2\n",
        f"{nvme}/queue/rotational": "0\n",
        f"{nvme}/nvme0n1p1/partition": "1\n",
        "devices/virtual/block/dm-0/queue/rotational": "0\n",
        "devices/virtual/block/dm-0/dm/name": "vg-data\n",
        "devices/virtual/block/loop0/queue/rotational": "0\n",
        "devices/virtual/block/loop0/loop/backing_file": "/images/x.sqfs\n",
    })  # fmt: skip
    (root / "dev/block").mkdir(parents=True)
    os.symlink(root / disk / "sda2", root / "dev/block/8:2")
    os.symlink(root / "devices/virtual/block/dm-0", root / "dev/block/253:0")
    os.symlink(root / "devices/virtual/block/loop0", root / "dev/block/7:0")
    (root / "devices/virtual/block/dm-0/slaves").mkdir()
    os.symlink(root / nvme / "nvme0n1p1", root / "devices/virtual/block/dm-0/slaves/nvme0n1p1")


def test_parse_and_find_mount():
    mounts = storage_devices.parse_mountinfo(MOUNTINFO + "garbage line\n")
    assert len(mounts) == 7
    assert storage_devices.find_mount("/mnt/nfs/imagenet", mounts).fstype == "nfs4"
    assert storage_devices.find_mount("/mnt/nfsx", mounts).mount_point == "/"
    assert storage_devices.find_mount("/scratch space/a", mounts).fstype == "tmpfs"  # \040 unescaped


def test_block_device_walk(tree, tmp_path):
    _sys(tree, tmp_path)
    hdd = storage_devices.block_device("8:2", tmp_path)
    assert hdd.name == "sda" and hdd.kind == "hdd" and hdd.rotational is True and hdd.chain == ["sda2", "sda"]
    assert hdd.model == "WDC WD40EFRX"
    lvm = storage_devices.block_device("253:0", tmp_path)
    assert lvm.kind == "nvme" and lvm.rotational is False and "nvme0n1" in lvm.name and "vg-data" in lvm.name
    loop = storage_devices.block_device("7:0", tmp_path)
    assert loop.kind == "loop" and "backing file /images/x.sqfs" in loop.chain
    assert storage_devices.block_device("9:9", tmp_path) is None


@pytest.mark.parametrize(
    ("path", "fs_sev", "dev_sev", "dev_title"),
    [
        ("/home/u/data", Severity.PASS, Severity.WARN, "spinning disk"),
        ("/data/train", Severity.PASS, Severity.PASS, "NVMe"),
        ("/mnt/nfs/x", Severity.WARN, Severity.INFO, "unknown"),
        ("/work/d", Severity.INFO, Severity.INFO, "unknown"),
        ("/scratch space/d", Severity.PASS, Severity.INFO, "unknown"),
    ],
)
def test_check_device(tree, tmp_path, path, fs_sev, dev_sev, dev_title):
    _sys(tree, tmp_path)
    f = {x.id: x for x in storage.check_device(path, MOUNTINFO, tmp_path)}
    assert f["storage.filesystem"].severity is fs_sev
    assert f["storage.device"].severity is dev_sev and dev_title in f["storage.device"].title
    assert f["storage.device"].evidence


def test_virtio_rotational_flag_not_trusted(tree, tmp_path):
    tree(tmp_path, {"devices/pci0000:00/virtio1/block/vda/queue/rotational": "1"})
    (tmp_path / "dev/block").mkdir(parents=True)
    os.symlink(tmp_path / "devices/pci0000:00/virtio1/block/vda", tmp_path / "dev/block/254:0")
    mi = "27 1 254:0 / / rw - ext4 /dev/vda rw\n"
    f = {x.id: x for x in storage.check_device("/x", mi, tmp_path)}
    assert f["storage.device"].severity is Severity.INFO and "virtual disk" in f["storage.device"].title


def test_no_mountinfo():
    assert storage.check_device("/x", "", "/nonexistent")[0].severity is Severity.INFO


def test_missing_and_unreadable_path(tmp_path):
    f = storage.check_path(tmp_path / "nope")[0]
    assert f.severity is Severity.ERROR and "does not exist" in f.title and "--data" in f.fix
    assert storage.check_path(tmp_path)[0].severity is Severity.PASS


def test_largest_file_is_bounded(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"x" * 100)
    assert storage_read.largest_file(tmp_path) == (tmp_path / "sub" / "b", 100)
    path, _ = storage_read.largest_file(tmp_path, max_entries=1)
    assert path is None or path.name == "a"  # stopped after one entry


def test_measure_existing_file(tmp_path):
    (tmp_path / "shard.bin").write_bytes(os.urandom(3 * 2**20))
    r = storage_read.measure_read(tmp_path, max_bytes=2**30, max_seconds=5, min_file=2**20, allow_write=False)
    assert r.path.endswith("shard.bin") and not r.temp_file
    assert r.bytes_read == 3 * 2**20 and r.seconds > 0 and r.mb_per_s > 0
    assert r.method in ("O_DIRECT", "fadvise(DONTNEED)", "buffered")


def test_measure_writes_and_removes_temp_file(tmp_path):
    r = storage_read.measure_read(tmp_path, max_bytes=8 * 2**20, max_seconds=5, min_file=4 * 2**20)
    assert r.temp_file and r.bytes_read == 8 * 2**20
    assert list(tmp_path.iterdir()) == []  # the test file is gone


def _synced(path, data: bytes):
    """Write and flush, so the pages are clean and fadvise(DONTNEED) can drop them."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def test_cache_drop_verified_with_mincore(tmp_path):
    f = _synced(tmp_path / "f", os.urandom(2**20))
    f.read_bytes()  # now cached
    assert storage_read.resident_fraction(f) == 1.0
    assert storage_read.drop_cache(f) and storage_read.resident_fraction(f) == 0.0
    assert storage_read.resident_fraction(tmp_path / "missing") is None
    assert storage_read.resident_fraction(_synced(tmp_path / "empty", b"")) is None


def test_default_read_is_verified_cold_buffered(tmp_path):
    f = _synced(tmp_path / "f", b"y" * 2**20)
    f.read_bytes()
    r = storage_read.measure_read(tmp_path, min_file=2**20, allow_write=False)
    assert r.method == "fadvise(DONTNEED)" and not r.cached_possible and r.bytes_read == 2**20
    assert "0% of the range was cached" in r.note
    assert storage_read.resident_fraction(f) == 0.0  # the read left the page cache as it found it


def test_cache_drop_that_does_not_take_falls_back_to_o_direct(tmp_path, monkeypatch):
    _synced(tmp_path / "f", b"y" * 2**20)
    monkeypatch.setattr(storage_read, "resident_fraction", lambda path, length=None: 0.9)  # e.g. mapped elsewhere
    r = storage_read.measure_read(tmp_path, min_file=2**20, allow_write=False)
    assert "did not take (90% still cached)" in r.note
    assert r.method in ("O_DIRECT", "buffered")  # a filesystem may refuse O_DIRECT; then: may be cached
    assert r.cached_possible is (r.method == "buffered")
    r = storage_read.measure_read(tmp_path, min_file=2**20, allow_write=False, direct=False)
    assert r.method == "buffered" and r.cached_possible


def test_unverifiable_drop_is_said(tmp_path, monkeypatch):
    _synced(tmp_path / "f", b"y" * 2**20)
    monkeypatch.setattr(storage_read, "resident_fraction", lambda path, length=None: None)  # no mincore
    r = storage_read.measure_read(tmp_path, min_file=2**20, allow_write=False, direct=False)
    assert r.method == "fadvise(DONTNEED), unverified" and "not verified" in r.note


def test_read_speed_finding_when_nothing_to_read(tmp_path):
    f = storage.check_read_speed(tmp_path, allow_write=False)[0]
    assert f.id == "storage.read_speed" and f.severity is Severity.WARN and "not measured" in f.title


def test_read_speed_finding(tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(2**20))
    f = storage.check_read_speed(tmp_path, allow_write=False, min_file=2**20)[0]
    assert f.data["mb_per_s"] > 0 and "MB/s" in f.evidence and f.data["bytes_read"] == 2**20


def test_free_space(tmp_path):
    f = storage.check_free_space(tmp_path)[0]
    assert f.data["total_bytes"] > 0 and "free of" in f.evidence
    assert storage.check_free_space(tmp_path / "nope")[0].severity is Severity.INFO


def _many_files(root, n=30, size=8192):
    for i in range(n):
        d = root / f"class{i % 3}"
        d.mkdir(exist_ok=True)
        (d / f"img{i}.jpg").write_bytes(os.urandom(size))


def test_scan_collects_sample_sized_files(tmp_path):
    _many_files(tmp_path)
    (tmp_path / "big.bin").write_bytes(b"\0" * (storage_read.SMALL_FILE + 1))
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "huge").write_bytes(b"\0" * (storage_read.SMALL_FILE + 2))  # hidden folder skipped
    sc = storage_read.scan(tmp_path)
    assert sc.complete and sc.files == 31 and len(sc.small_files) == 30
    assert sc.largest == tmp_path / "big.bin"
    assert not storage_read.scan(tmp_path, max_entries=5).complete


@pytest.mark.parametrize("direct", [True, False])
def test_measure_small_files(tmp_path, direct):
    _many_files(tmp_path, n=25, size=5000)  # not a multiple of the block size: O_DIRECT's short last read
    r = storage_read.measure_small_files(storage_read.scan(tmp_path).small_files, max_seconds=30, direct=direct)
    assert r.files == 25 and r.bytes_read == 25 * 5000 and r.files_per_s > 0
    if not direct:
        assert r.method == "fadvise(DONTNEED)"  # with direct=True a filesystem may refuse O_DIRECT: either


def test_small_files_finding(tmp_path):
    f = storage.check_small_files(tmp_path)[0]
    assert f.severity is Severity.PASS and f.data["small_files"] == 0 and "need 20" in f.evidence
    _many_files(tmp_path)
    f = storage.check_small_files(tmp_path, max_seconds=30)[0]
    assert f.data["files_read"] == 30 and f.data["files_per_s"] > 0 and "files/s" in f.evidence
    assert f.data["avg_kib"] == 8.0


def test_data_path_may_be_one_file(tmp_path):
    shard = tmp_path / "train.bin"
    shard.write_bytes(os.urandom(2 * 2**20))
    r = storage_read.measure_read(shard, min_file=2**20, allow_write=False)
    assert r.path == str(shard) and r.bytes_read == 2 * 2**20
    assert storage_read.scan(shard).largest == shard
    assert storage.check_small_files(shard)[0].data["small_files"] == 1


def test_small_file_gives_rough_info_not_a_warning(tmp_path):
    (tmp_path / "tiny").write_bytes(b"t" * 4096)
    f = storage.check_read_speed(tmp_path, allow_write=False)[0]
    assert f.severity is Severity.INFO and "not measured reliably" in f.title and "4.0 KiB" in f.title


def test_no_cache_control_says_number_may_be_cached(tmp_path, monkeypatch):
    def refuse(*a):
        raise OSError(22, "fadvise not supported")

    monkeypatch.setattr(storage_read.os, "posix_fadvise", refuse)
    (tmp_path / "f").write_bytes(b"c" * 2**20)
    f = storage.check_read_speed(tmp_path, allow_write=False, min_file=2**20, direct=False)[0]
    assert f.severity is Severity.INFO and f.data["may_be_cached"] is True and f.data["method"] == "buffered"
    assert "may be cached" in f.evidence


def test_no_test_file_next_to_a_single_file_path(tmp_path):
    one = tmp_path / "labels.csv"
    one.write_bytes(b"a,b\n" * 100)
    r = storage_read.measure_read(one)  # writing allowed, but the path names a file: measure it, write nothing
    assert not r.temp_file and r.rough and sorted(p.name for p in tmp_path.iterdir()) == ["labels.csv"]


def test_free_space_on_pseudo_filesystem():
    f = storage.check_free_space("/proc")[0]
    assert f.severity is Severity.INFO and f.data["total_bytes"] == 0
