"""Storage probes for the training data path: the device behind it (storage_devices), its filesystem, and a
*measured* sequential read throughput (storage_read), each turned into Findings."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pitstop import units
from pitstop.doctor.storage_devices import (
    MEMORY_FS,
    NETWORK_FS,
    PARALLEL_FS,
    VIRTUAL_DISKS,
    Mount,
    block_device,
    find_mount,
    parse_mountinfo,
)
from pitstop.doctor.storage_read import SMALL_FILE, Scan, measure_read, measure_small_files, scan
from pitstop.findings import Finding, Severity
from pitstop.host.sysfs import read_text
from pitstop.units import GiB, MiB


# --- the probes -------------------------------------------------------------------------------------------
def check_path(path: str | os.PathLike[str]) -> list[Finding]:
    p = Path(path)
    if not p.exists():
        return [
            Finding(
                "storage.path",
                Severity.ERROR,
                f"Data path {p} does not exist",
                f"stat({p}): no such file or directory",
                {"path": str(p)},
                fix="Pass the directory that holds your training data: pitstop doctor --data /path/to/dataset",
            )
        ]
    if not os.access(p, os.R_OK):
        return [
            Finding(
                "storage.path",
                Severity.ERROR,
                f"Data path {p} is not readable",
                f"access({p}, R_OK) failed for uid {os.getuid()}",
                {"path": str(p)},
                fix="Fix the permissions, or run as the user that trains.",
            )
        ]
    return [
        Finding(
            "storage.path",
            Severity.PASS,
            f"Data path {p}",
            f"{p} exists and is readable",
            {"path": str(p.resolve())},
        )
    ]


def check_device(
    path: str | os.PathLike[str],
    mountinfo: str | None = None,
    sys_root: str | os.PathLike[str] = "/sys",
) -> list[Finding]:
    """Filesystem type (network, overlay, tmpfs) and the block device behind the path (HDD, NVMe ...)."""
    text = mountinfo if mountinfo is not None else (read_text("/proc/self/mountinfo") or "")
    m = find_mount(path, parse_mountinfo(text))
    if m is None:
        return [
            Finding(
                "storage.filesystem",
                Severity.INFO,
                "Filesystem unknown",
                "/proc/self/mountinfo unreadable or has no mount for this path",
                {"path": str(path)},
            )
        ]
    return [filesystem_finding(path, m), device_finding(m, sys_root)]


def filesystem_finding(path: str | os.PathLike[str], m: Mount) -> Finding:
    """What the filesystem type of ``path``'s mount means for reading training data from it."""
    fs = m.fstype
    fdata = {"fstype": fs, "mount_point": m.mount_point, "source": m.source, "dev": m.dev}
    fev = f"{path} is on {m.mount_point} ({fs}, source {m.source}, device {m.dev})"
    if fs in NETWORK_FS:
        return Finding(
            "storage.filesystem",
            Severity.WARN,
            f"Training data on network storage ({fs})",
            fev,
            fdata,
            fix="Copy the dataset to local SSD/NVMe before training (or use a streaming format with large "
            "sequential reads and more DataLoader workers).",
        )
    elif fs in PARALLEL_FS:
        return Finding(
            "storage.filesystem",
            Severity.INFO,
            f"Training data on a parallel filesystem ({fs})",
            fev,
            fdata,
            fix="Fast for large sequential files, slow for many small ones: pack samples into shards "
            "(WebDataset/tar, or a few large files).",
        )
    elif fs == "overlay":
        return Finding(
            "storage.filesystem",
            Severity.INFO,
            "Data path on the container's overlay filesystem",
            fev,
            fdata,
            fix="Mount the dataset as a volume (docker -v /data:/data) so reads go straight to the disk.",
        )
    elif fs in MEMORY_FS:
        return Finding("storage.filesystem", Severity.PASS, f"Data path in memory ({fs})", fev, fdata)
    else:
        return Finding("storage.filesystem", Severity.PASS, f"Local filesystem ({fs})", fev, fdata)


def device_finding(m: Mount, sys_root: str | os.PathLike[str] = "/sys") -> Finding:
    """The kind of block device behind the mount (virtual disk, HDD, network block device, SSD ...)."""
    dev = block_device(m.dev, sys_root) if not m.dev.startswith("0:") else None
    if dev is None:
        why = (
            "a virtual/network filesystem has no block device of its own"
            if m.dev.startswith("0:")
            else f"{sys_root}/dev/block/{m.dev} not found"
        )
        return Finding(
            "storage.device",
            Severity.INFO,
            "Block device behind the data path unknown",
            f"device {m.dev} of {m.mount_point}: {why}",
            {"dev": m.dev},
        )
    ddata = {
        "name": dev.name,
        "kind": dev.kind,
        "rotational": dev.rotational,
        "chain": dev.chain,
        "model": dev.model,
    }
    dev_ev = f"{m.dev} -> {' -> '.join(dev.chain)}; kind {dev.kind}, rotational={dev.rotational}" + (
        f", model {dev.model}" if dev.model else ""
    )
    if dev.kind in VIRTUAL_DISKS:
        # The hypervisor sets the rotational flag (virtio-blk often says 1): the host's storage is unknown.
        return Finding(
            "storage.device",
            Severity.INFO,
            f"Data on a virtual disk ({dev.name}, {dev.kind})",
            dev_ev + "; the rotational flag of a virtual disk says nothing about the host's storage",
            ddata,
            fix="Judge it by the measured read speed (storage.read_speed); ask the provider for local NVMe "
            "if that is low.",
        )
    elif dev.rotational:
        return Finding(
            "storage.device",
            Severity.WARN,
            f"Training data on a spinning disk ({dev.name})",
            dev_ev,
            ddata,
            fix="Move the dataset to SSD/NVMe, or cache it in RAM (/dev/shm) if it fits; random reads on an HDD "
            "starve the DataLoader.",
        )
    elif dev.kind == "network-block":
        return Finding(
            "storage.device",
            Severity.WARN,
            f"Training data on a network block device ({dev.name})",
            dev_ev,
            ddata,
            fix="Copy the dataset to local SSD/NVMe before training.",
        )
    else:
        label = {
            "nvme": "NVMe SSD",
            "ssd": "SSD",
            "virtio": "virtual disk (virtio)",
            "zram": "compressed RAM",
        }.get(dev.kind, dev.kind)
        return Finding("storage.device", Severity.PASS, f"Data on {label} ({dev.name})", dev_ev, ddata)


READ_METHODS = {
    "fadvise(DONTNEED)": "page cache dropped (fadvise DONTNEED, verified empty with mincore), buffered reads "
    "with readahead as a DataLoader gets",
    "O_DIRECT": "O_DIRECT (cache bypassed, one request at a time: a floor)",
}


def check_read_speed(path: str | os.PathLike[str], allow_write: bool = True, **kw: Any) -> list[Finding]:
    try:
        r = measure_read(path, allow_write=allow_write, **kw)
    except (OSError, FileNotFoundError) as e:
        return [
            Finding(
                "storage.read_speed",
                Severity.WARN,
                "Read speed not measured",
                f"{path}: {e}",
                {"path": str(path)},
                fix="Point --data at a directory with at least one large file, or a writable one "
                "(pitstop writes and deletes a temporary test file there).",
            )
        ]
    mbs = r.mb_per_s
    what = "a temporary test file" if r.temp_file else r.path
    ev = (
        f"read {units.size(r.bytes_read)} of {what} ({units.size(r.file_bytes)}) in {r.seconds:.3f} s: "
        f"{mbs:.0f} MB/s, sequential {r.block_bytes // MiB} MiB reads, {READ_METHODS.get(r.method, r.method)}"
        + (" - page cache not bypassed, the number may be cached" if r.cached_possible else "")
        + (f"; {r.note}" if r.note else "")
    )
    data = {
        "mb_per_s": round(mbs, 1),
        "bytes_read": r.bytes_read,
        "seconds": round(r.seconds, 3),
        "method": r.method,
        "file": r.path,
        "temp_file": r.temp_file,
        "may_be_cached": r.cached_possible,
    }
    if r.rough:
        return [
            Finding(
                "storage.read_speed",
                Severity.INFO,
                f"Read speed not measured reliably: largest file under the path is {units.size(r.file_bytes)}",
                ev,
                data,
                fix="Point --data at your dataset (a directory with files of 64 MiB or more), or allow the "
                "temporary test file (without --no-write, in a writable directory).",
            )
        ]
    if r.cached_possible:
        return [
            Finding(
                "storage.read_speed",
                Severity.INFO,
                f"Sequential read {mbs:.0f} MB/s (may be from page cache)",
                ev,
                data,
                fix="For the disk's own speed run as a user that may use O_DIRECT, or drop caches first "
                "(sync; echo 1 | sudo tee /proc/sys/vm/drop_caches).",
            )
        ]
    if mbs < 100:
        return [
            Finding(
                "storage.read_speed",
                Severity.WARN,
                f"Sequential read only {mbs:.0f} MB/s: the DataLoader may wait on disk",
                ev,
                data,
                fix="Use faster storage (local NVMe), cache the dataset in RAM, or store it pre-decoded/compressed "
                "so fewer bytes are read per sample.",
            )
        ]
    return [Finding("storage.read_speed", Severity.PASS, f"Sequential read {mbs:.0f} MB/s", ev, data)]


def check_free_space(path: str | os.PathLike[str]) -> list[Finding]:
    try:
        u = shutil.disk_usage(path)
    except OSError as e:
        return [
            Finding("storage.free_space", Severity.INFO, "Free space unknown", f"statvfs: {e.strerror}", {})
        ]
    if u.total == 0:
        return [
            Finding(
                "storage.free_space",
                Severity.INFO,
                "No capacity reported (virtual filesystem)",
                f"statvfs({path}): 0 bytes total",
                {"free_bytes": 0, "total_bytes": 0},
            )
        ]
    frac = u.free / u.total
    data = {"free_bytes": u.free, "total_bytes": u.total, "free_fraction": round(frac, 3)}
    ev = f"{u.free / GiB:.1f} GiB free of {u.total / GiB:.1f} GiB ({100 * frac:.0f}%) at {path}"
    if u.free < 10 * GiB or frac < 0.05:
        return [
            Finding(
                "storage.free_space",
                Severity.WARN,
                "Little free space: checkpoints and caches may fail to write",
                ev,
                data,
                fix="Free space or point checkpoints at another disk; a failed checkpoint write loses the run.",
            )
        ]
    return [Finding("storage.free_space", Severity.PASS, f"{u.free / GiB:.0f} GiB free", ev, data)]


MIN_SMALL_FILES = 20  # fewer than this: not a per-sample-file dataset, nothing to measure


def check_small_files(
    path: str | os.PathLike[str], max_seconds: float = 1.0, walked: Scan | None = None
) -> list[Finding]:
    """Datasets of many small files (one image per sample) are bound by files/s, not MB/s."""
    sc = walked if walked is not None else scan(Path(path))
    if len(sc.small_files) < MIN_SMALL_FILES:
        return [
            Finding(
                "storage.small_files",
                Severity.PASS,
                "No many-small-files dataset to measure",
                f"walked {sc.entries} entries under {path}: {sc.files} files, {len(sc.small_files)} of them "
                f"<= {SMALL_FILE // MiB} MiB (need {MIN_SMALL_FILES} to measure)",
                {"files_seen": sc.files, "small_files": len(sc.small_files), "walk_complete": sc.complete},
            )
        ]
    r = measure_small_files(sc.small_files, max_seconds)
    rate = r.files_per_s
    avg = r.bytes_read / r.files / 1024 if r.files else 0.0
    data = {
        "files_per_s": round(rate, 1),
        "files_read": r.files,
        "avg_kib": round(avg, 1),
        "seconds": round(r.seconds, 3),
        "method": r.method,
        "files_seen": sc.files,
        "walk_complete": sc.complete,
    }
    ev = (
        f"read {r.files} whole files (avg {avg:.0f} KiB, shuffled, {r.method}) in {r.seconds:.2f} s: "
        f"{rate:.0f} files/s, {r.bytes_read / r.seconds / 1e6 if r.seconds else 0:.0f} MB/s, one reader"
    )
    if rate < 200:
        return [
            Finding(
                "storage.small_files",
                Severity.WARN,
                f"Only {rate:.0f} small files/s from one reader: per-sample files will starve training",
                ev,
                data,
                fix="Pack samples into large shards (WebDataset tar, LMDB, or a few big .npy/.bin files) read "
                "sequentially, or use more DataLoader workers to overlap the latency.",
            )
        ]
    return [
        Finding("storage.small_files", Severity.PASS, f"{rate:.0f} small files/s from one reader", ev, data)
    ]
