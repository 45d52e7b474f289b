"""Measured read speed of the training data path: a bounded walk to find files, a sequential read of the
largest (page cache bypassed with O_DIRECT or dropped with fadvise where possible), and whole-file reads
of sample-sized files. Every measurement is bounded in time and bytes."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from pitstop import units
from pitstop.measure.clock import Stopwatch
from pitstop.units import MiB


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
        total, watch = 0, Stopwatch()
        while total < max_bytes and watch.elapsed() < max_seconds:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            total += n
        return total, watch.elapsed()
    finally:
        buf.close()
        os.close(fd)


def _read_buffered(path: Path, max_bytes: int, max_seconds: float, block: int) -> tuple[int, float]:
    buf = bytearray(block)
    with open(path, "rb", buffering=0) as fh:
        total, watch = 0, Stopwatch()
        while total < max_bytes and watch.elapsed() < max_seconds:
            n = fh.readinto(buf)
            if not n:
                break
            total += n
        return total, watch.elapsed()


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
        note += f"largest file is only {units.size(size)}, so the number is rough; "
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
    watch = Stopwatch()
    for path in order:
        if watch.elapsed() > max_seconds:
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
    secs = watch.elapsed()
    return SmallFilesResult(n, nbytes, secs, "O_DIRECT" if use_direct else "fadvise(DONTNEED)", len(files))
