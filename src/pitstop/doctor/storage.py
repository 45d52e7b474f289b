"""Storage probes for the training data path: the device behind it, its filesystem, and a *measured*
sequential read throughput (bounded in time and bytes, page cache bypassed or dropped where possible)."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host.sysfs import read_int, read_text

MiB = 2**20
NETWORK_FS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "9p", "afs", "davfs", "ncpfs",
    "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.goofys", "fuse.mountpoint-s3",
    "fuse.juicefs", "fuse.blobfuse", "fuse.blobfuse2", "fuse.ceph-fuse", "fuse.glusterfs",
}  # fmt: skip
PARALLEL_FS = {
    "lustre",
    "gpfs",
    "beegfs",
    "fuse.beegfs",
    "wekafs",
    "pvfs2",
    "orangefs",
}  # fast HPC shared storage
MEMORY_FS = {"tmpfs", "ramfs"}
VIRTUAL_DISKS = {"virtio", "xen"}


# --- where the path lives ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str
    dev: str  # "major:minor" as mountinfo gives it
    options: str


def _unescape(s: str) -> str:
    # mountinfo octal-escapes space, tab, newline and backslash
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        s = s.replace(code, ch)
    return s


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 2:
            continue
        mounts.append(Mount(_unescape(a[4]), b[0], _unescape(b[1]), a[2], b[2] if len(b) > 2 else ""))
    return mounts


def find_mount(path: str | os.PathLike[str], mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path``: longest mount-point prefix (the last one mounted wins on ties)."""
    p = os.path.realpath(path)
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if (p == mp or p.startswith(mp + "/") or mp == "/") and (
            best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/")
        ):
            best = m
    return best


@dataclass
class BlockDevice:
    name: str  # the whole disk(s) at the bottom, e.g. "nvme0n1", "sda", "md0 (sda, sdb)"
    kind: str  # nvme / ssd / hdd / virtio / zram / loop / network-block / unknown
    rotational: bool | None
    chain: list[str] = field(default_factory=list)  # how we got there: sda2 -> sda, dm-0 -> nvme0n1p3 ...
    model: str | None = None


def _kind(name: str, rotational: bool | None) -> str:
    for prefix, kind in (
        ("nvme", "nvme"), ("vd", "virtio"), ("xvd", "xen"), ("zram", "zram"), ("loop", "loop"),
        ("nbd", "network-block"), ("rbd", "network-block"), ("mmcblk", "sd-card"), ("pmem", "pmem"),
    ):  # fmt: skip
        if name.startswith(prefix):
            return kind
    if rotational is None:
        return "unknown"
    return "hdd" if rotational else "ssd"


def block_device(dev: str, sys_root: str | os.PathLike[str] = "/sys", _depth: int = 0) -> BlockDevice | None:
    """Walk /sys from a "major:minor" to the physical disk(s): partition -> disk, dm-*/md* -> slaves."""
    link = Path(sys_root, "dev", "block", dev)
    if not link.exists():
        return None
    node = Path(os.path.realpath(link))
    return _walk(node, sys_root, _depth)


def _walk(node: Path, sys_root: str | os.PathLike[str], depth: int) -> BlockDevice:
    chain = [node.name]
    if (node / "partition").exists():  # a partition's sysfs dir sits inside its disk's
        node = node.parent
        chain.append(node.name)
    slaves = sorted((node / "slaves").glob("*")) if (node / "slaves").is_dir() else []
    if slaves and depth < 8:  # device-mapper (LVM, LUKS) or md RAID: the disks underneath decide
        below = [_walk(Path(os.path.realpath(s)), sys_root, depth + 1) for s in slaves]
        rot = [b.rotational for b in below]
        rotational = True if any(rot) else (False if all(r is False for r in rot) else None)
        kinds = {b.kind for b in below}
        label = read_text(node / "dm" / "name") or node.name
        return BlockDevice(
            f"{label} ({', '.join(b.name for b in below)})",
            kinds.pop() if len(kinds) == 1 else "mixed",
            rotational,
            chain + [c for b in below for c in b.chain],
            next((b.model for b in below if b.model), None),
        )
    rot_int = read_int(node / "queue" / "rotational")
    rotational = None if rot_int is None else bool(rot_int)
    model = read_text(node / "device" / "model")
    backing = read_text(node / "loop" / "backing_file")
    if backing:
        chain.append(f"backing file {backing}")
    return BlockDevice(node.name, _kind(node.name, rotational), rotational, chain, model)


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


# --- read speed -------------------------------------------------------------------------------------------
@dataclass
class ReadResult:
    path: str
    file_bytes: int
    bytes_read: int
    seconds: float
    method: str  # "O_DIRECT", "fadvise(DONTNEED)", "buffered"
    temp_file: bool
    cached_possible: bool
    note: str = ""
    block_bytes: int = 4 * MiB
    rough: bool = False  # the file was smaller than min_file: latency, not throughput, dominates

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass
class Scan:
    """What a bounded walk of the data path saw."""

    largest: Path | None = None
    largest_size: int = 0
    entries: int = 0
    files: int = 0
    complete: bool = True  # False: stopped at the entry or time bound
    small_files: list[Path] = field(default_factory=list)  # a sample of sample-sized files (<= SMALL_FILE)


SMALL_FILE = 16 * MiB  # typical per-sample files (JPEGs, .npy, short audio) are far below this


def scan(root: Path, max_entries: int = 5000, max_seconds: float = 0.5, max_small: int = 256) -> Scan:
    """Walk ``root`` (hidden folders skipped) looking at no more than ``max_entries`` entries / ``max_seconds``."""
    if root.is_file():
        size = root.stat().st_size
        return Scan(root, size, 1, 1, True, [root] if 0 < size <= SMALL_FILE else [])
    out = Scan()
    deadline = time.monotonic() + max_seconds
    stack = [root]
    while stack:
        if out.entries >= max_entries or time.monotonic() > deadline:
            out.complete = False
            break
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    out.entries += 1
                    if out.entries >= max_entries:
                        break
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if not e.name.startswith("."):
                                stack.append(Path(e.path))
                        elif e.is_file(follow_symlinks=False):
                            size = e.stat(follow_symlinks=False).st_size
                            out.files += 1
                            if size > out.largest_size or out.largest is None:
                                out.largest, out.largest_size = Path(e.path), size
                            if 0 < size <= SMALL_FILE and len(out.small_files) < max_small:
                                out.small_files.append(Path(e.path))
                    except OSError:
                        continue
        except OSError:
            continue
    return out


def largest_file(root: Path, max_entries: int = 5000, max_seconds: float = 0.5) -> tuple[Path | None, int]:
    """Largest regular file under ``root``, looking at no more than ``max_entries`` entries / ``max_seconds``."""
    sc = scan(root, max_entries, max_seconds)
    return sc.largest, sc.largest_size


def _write_temp(directory: Path, size: int, max_seconds: float) -> Path:
    """A temp file of incompressible bytes, flushed to the device, so reading it measures the device."""
    fd, name = _mkstemp(directory)
    block = os.urandom(4 * MiB)
    deadline = time.monotonic() + max_seconds
    try:
        written = 0
        while written < size and time.monotonic() < deadline:
            written += os.write(fd, block)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        Path(name).unlink(missing_ok=True)
        raise
    os.close(fd)
    return Path(name)


def _mkstemp(directory: Path) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix=".pitstop-readtest-", dir=directory)


def _read_direct(path: Path, max_bytes: int, max_seconds: float, block: int) -> tuple[int, float]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
    try:
        total, t0 = 0, time.perf_counter()
        while total < max_bytes and time.perf_counter() - t0 < max_seconds:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            total += n
        return total, time.perf_counter() - t0
    finally:
        buf.close()
        os.close(fd)


def _read_buffered(path: Path, max_bytes: int, max_seconds: float, block: int) -> tuple[int, float]:
    buf = bytearray(block)
    with open(path, "rb", buffering=0) as fh:
        total, t0 = 0, time.perf_counter()
        while total < max_bytes and time.perf_counter() - t0 < max_seconds:
            n = fh.readinto(buf)
            if not n:
                break
            total += n
        return total, time.perf_counter() - t0


def drop_cache(path: Path) -> bool:
    """Ask the kernel to drop ``path``'s clean cached pages. False where fadvise is unavailable or refused."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)


def resident_fraction(path: Path, length: int | None = None) -> float | None:
    """Fraction of the first ``length`` bytes of ``path`` now in the page cache (mincore(2)), or None when
    it cannot be told (no libc mmap/mincore, empty file)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        c_mmap, c_munmap, c_mincore = libc.mmap, libc.munmap, libc.mincore
    except (OSError, AttributeError):
        return None
    c_mmap.restype = ctypes.c_void_p
    c_mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    c_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    c_mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        n = size if length is None else min(size, length)
        if n <= 0:
            return None
        addr = c_mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:  # MAP_FAILED
            return None
        try:
            pages = -(-n // mmap.PAGESIZE)
            vec = ctypes.create_string_buffer(pages)
            if c_mincore(addr, n, vec) != 0:
                return None
            return sum(b & 1 for b in vec.raw[:pages]) / pages
        finally:
            c_munmap(addr, n)
    finally:
        os.close(fd)


def measure_read(
    root: str | os.PathLike[str],
    max_bytes: int = 256 * MiB,
    max_seconds: float = 1.5,
    min_file: int = 64 * MiB,
    allow_write: bool = True,
    block: int = 4 * MiB,
    direct: bool = True,
    walked: Scan | None = None,
) -> ReadResult:
    """Sequential read of the largest file under ``root`` (or a temp file written there) from the device, not
    the page cache: cached pages dropped with posix_fadvise(DONTNEED) and verified gone with mincore, else
    bypassed with O_DIRECT, else reported as possibly cached."""
    base = Path(root)
    sc = walked if walked is not None else scan(base)
    path, size = sc.largest, sc.largest_size
    temp = False
    note = ""
    directory = base
    # A test file is written only into a data *directory*: a path naming one file is measured as it is.
    if (path is None or size < min_file) and allow_write and base.is_dir() and os.access(directory, os.W_OK):
        try:
            free = shutil.disk_usage(directory).free
            want = min(max_bytes, max(0, free // 10))  # the write is time-bounded too
            if want >= min_file // 4:
                path, temp = _write_temp(directory, want, max_seconds), True
                size = path.stat().st_size
        except OSError as e:
            note = f"could not write a test file ({e.strerror}); "
    if path is None or size == 0:
        raise FileNotFoundError(f"no readable file under {base} and no test file could be written")
    if size < min_file:
        note += f"largest file is only {_size(size)}, so the number is rough; "
    try:
        method, cached, result = "buffered", True, None
        # 1. Drop the file's cached pages and check with mincore that they are gone: then plain buffered
        #    reads (with the kernel's readahead, as a DataLoader gets) measure the device.
        dropped = drop_cache(path)
        before = resident_fraction(path, max_bytes) if dropped else None
        if before is not None and before < 0.05:
            result = _read_buffered(path, max_bytes, max_seconds, block)
            method, cached = "fadvise(DONTNEED)", False
            note += f"{100 * before:.0f}% of the range was cached before the read (mincore); "
            drop_cache(path)  # leave the page cache as we found it
        elif before is not None:
            note += f"cache drop did not take ({100 * before:.0f}% still cached); "
        # 2. Bypass the cache: one request at a time, so a floor on what the device does.
        if result is None and direct and hasattr(os, "O_DIRECT"):
            try:
                result = _read_direct(path, max_bytes, max_seconds, block)
                method, cached = "O_DIRECT", False
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                    raise
                note += "O_DIRECT not supported here; "
        # 3. Dropped but unverifiable (no mincore), or nothing worked: say so.
        if result is None:
            result = _read_buffered(path, max_bytes, max_seconds, block)
            if dropped and before is None:
                method, cached = "fadvise(DONTNEED), unverified", False
                note += "cache dropped with fadvise but not verified (advisory: pages another process holds stay); "
        nbytes, secs = result
        return ReadResult(
            str(path), size, nbytes, secs, method, temp, cached, note.strip("; "), block, size < min_file
        )
    finally:
        if temp:
            path.unlink(missing_ok=True)


@dataclass
class SmallFilesResult:
    files: int
    bytes_read: int
    seconds: float
    method: str
    sampled_from: int

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else 0.0


def _read_whole(path: Path, direct: bool) -> int:
    """Read one file end to end (open and close included, as a DataLoader worker does)."""
    if direct:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            size = os.fstat(fd).st_size
            buf = mmap.mmap(-1, max(mmap.PAGESIZE, -(-min(size, 4 * MiB) // mmap.PAGESIZE) * mmap.PAGESIZE))
            try:
                total = 0
                while (n := os.readv(fd, [buf])) > 0:
                    total += n
                return total
            finally:
                buf.close()
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        total = 0
        while chunk := os.read(fd, 4 * MiB):
            total += len(chunk)
        return total
    finally:
        os.close(fd)


def measure_small_files(files: list[Path], max_seconds: float = 1.0, direct: bool = True) -> SmallFilesResult:
    """Read whole small files in shuffled order (as a shuffling DataLoader does), cache bypassed like
    ``measure_read``: files per second is what bounds a per-sample-file dataset."""
    import random

    order = list(files)
    random.Random(0).shuffle(order)
    use_direct = direct and hasattr(os, "O_DIRECT")
    n, nbytes = 0, 0
    t0 = time.perf_counter()
    for path in order:
        if time.perf_counter() - t0 > max_seconds:
            break
        try:
            nbytes += _read_whole(path, use_direct)
        except OSError as e:
            if use_direct and e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                use_direct = False  # filesystem refuses O_DIRECT: fall back for this and the rest
                nbytes += _read_whole(path, False)
            else:
                continue  # unreadable file: skip it
        n += 1
    secs = time.perf_counter() - t0
    return SmallFilesResult(n, nbytes, secs, "O_DIRECT" if use_direct else "fadvise(DONTNEED)", len(files))


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
    out: list[Finding] = []
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
    fs = m.fstype
    fdata = {"fstype": fs, "mount_point": m.mount_point, "source": m.source, "dev": m.dev}
    fev = f"{path} is on {m.mount_point} ({fs}, source {m.source}, device {m.dev})"
    if fs in NETWORK_FS:
        out.append(
            Finding(
                "storage.filesystem",
                Severity.WARN,
                f"Training data on network storage ({fs})",
                fev,
                fdata,
                fix="Copy the dataset to local SSD/NVMe before training (or use a streaming format with large "
                "sequential reads and more DataLoader workers).",
            )
        )
    elif fs in PARALLEL_FS:
        out.append(
            Finding(
                "storage.filesystem",
                Severity.INFO,
                f"Training data on a parallel filesystem ({fs})",
                fev,
                fdata,
                fix="Fast for large sequential files, slow for many small ones: pack samples into shards "
                "(WebDataset/tar, or a few large files).",
            )
        )
    elif fs == "overlay":
        out.append(
            Finding(
                "storage.filesystem",
                Severity.INFO,
                "Data path on the container's overlay filesystem",
                fev,
                fdata,
                fix="Mount the dataset as a volume (docker -v /data:/data) so reads go straight to the disk.",
            )
        )
    elif fs in MEMORY_FS:
        out.append(Finding("storage.filesystem", Severity.PASS, f"Data path in memory ({fs})", fev, fdata))
    else:
        out.append(Finding("storage.filesystem", Severity.PASS, f"Local filesystem ({fs})", fev, fdata))

    dev = block_device(m.dev, sys_root) if not m.dev.startswith("0:") else None
    if dev is None:
        why = (
            "a virtual/network filesystem has no block device of its own"
            if m.dev.startswith("0:")
            else f"{sys_root}/dev/block/{m.dev} not found"
        )
        out.append(
            Finding(
                "storage.device",
                Severity.INFO,
                "Block device behind the data path unknown",
                f"device {m.dev} of {m.mount_point}: {why}",
                {"dev": m.dev},
            )
        )
        return out
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
        out.append(
            Finding(
                "storage.device",
                Severity.INFO,
                f"Data on a virtual disk ({dev.name}, {dev.kind})",
                dev_ev + "; the rotational flag of a virtual disk says nothing about the host's storage",
                ddata,
                fix="Judge it by the measured read speed (storage.read_speed); ask the provider for local NVMe "
                "if that is low.",
            )
        )
    elif dev.rotational:
        out.append(
            Finding(
                "storage.device",
                Severity.WARN,
                f"Training data on a spinning disk ({dev.name})",
                dev_ev,
                ddata,
                fix="Move the dataset to SSD/NVMe, or cache it in RAM (/dev/shm) if it fits; random reads on an HDD "
                "starve the DataLoader.",
            )
        )
    elif dev.kind == "network-block":
        out.append(
            Finding(
                "storage.device",
                Severity.WARN,
                f"Training data on a network block device ({dev.name})",
                dev_ev,
                ddata,
                fix="Copy the dataset to local SSD/NVMe before training.",
            )
        )
    else:
        label = {
            "nvme": "NVMe SSD",
            "ssd": "SSD",
            "virtio": "virtual disk (virtio)",
            "zram": "compressed RAM",
        }.get(dev.kind, dev.kind)
        out.append(Finding("storage.device", Severity.PASS, f"Data on {label} ({dev.name})", dev_ev, ddata))
    return out


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
        f"read {_size(r.bytes_read)} of {what} ({_size(r.file_bytes)}) in {r.seconds:.3f} s: "
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
                f"Read speed not measured reliably: largest file under the path is {_size(r.file_bytes)}",
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
    ev = f"{u.free / 2**30:.1f} GiB free of {u.total / 2**30:.1f} GiB ({100 * frac:.0f}%) at {path}"
    if u.free < 10 * 2**30 or frac < 0.05:
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
    return [Finding("storage.free_space", Severity.PASS, f"{u.free / 2**30:.0f} GiB free", ev, data)]


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
