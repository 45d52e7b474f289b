"""Why pitstop doctor bypasses the page cache: a naive read test vs the doctor's, side by side in one run.

On one test file (256 MiB by default, written under --dir and deleted afterwards) we time the same
sequential 4 MiB-block read three ways, interleaved per repeat, with pitstop's own read functions
(`pitstop.doctor.storage`):

  buffered, warm cache     what a naive `open().read()` test reports after the file was just read
  fadvise(DONTNEED)        the doctor's default: drop the file's cached pages (verified with mincore), then
                           read buffered, with the kernel's readahead, as a DataLoader does
  O_DIRECT                 the doctor's fallback: bypass the page cache, one request at a time

and report MB/s min/median over repeats and the ratio naive / O_DIRECT (how much a naive test overstates
the disk). It also times the whole audit (`run_doctor()` in a fresh process, so torch's import counts),
median over repeats. Writes benchmarks/results/doctor_read_speed.md.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/doctor_read_speed.py [--dir .] [--repeats 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "doctor_read_speed.md"
MiB = 2**20


def read_once(path: Path, method: str, size: int, resident: list[float]) -> float:
    """MB/s of one full sequential read of ``path`` by ``method`` (the doctor's own read functions)."""
    from pitstop.doctor.storage_read import _read_buffered, _read_direct, drop_cache, resident_fraction

    block = 4 * MiB
    if method == "O_DIRECT":
        n, secs = _read_direct(path, size, 60.0, block)
    else:
        if method == "fadvise(DONTNEED)":
            drop_cache(path)
            frac = resident_fraction(path)
            resident.append(-1.0 if frac is None else frac)
        else:  # warm the cache the way a naive test does by running twice
            _read_buffered(path, size, 60.0, block)
        n, secs = _read_buffered(path, size, 60.0, block)
    assert n == size, (method, n, size)
    return n / secs / 1e6


def audit_seconds() -> float:
    code = (
        "import time; t = time.perf_counter(); from pitstop.doctor import run_doctor; "
        "r = run_doctor(); print(time.perf_counter() - t, len(r.findings))"
    )
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t
    return wall if out.strip() else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".", help="directory on the disk to test (a temp file is written there)")
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--audits", type=int, default=3, help="fresh-process runs of the whole audit")
    args = ap.parse_args()

    from pitstop.doctor.storage_read import _write_temp
    from pitstop.host.load import load_average, load_line
    from pitstop.host.machine import machine_line

    load0 = load_average()
    size = args.size_mib * MiB
    methods = ["buffered, warm cache", "fadvise(DONTNEED)", "O_DIRECT"]
    speeds: dict[str, list[float]] = {m: [] for m in methods}
    resident: list[float] = []  # page-cache fraction left after each drop (mincore); -1: unknown
    path = _write_temp(Path(args.dir), size, max_seconds=120.0)
    try:
        size = path.stat().st_size
        for r in range(args.repeats):
            order = methods[r % 3 :] + methods[: r % 3]  # rotate so no method always runs first
            for m in order:
                speeds[m].append(read_once(path, m, size, resident))
                print(f"repeat {r + 1}/{args.repeats} {m:22s} {speeds[m][-1]:8.0f} MB/s", flush=True)
    finally:
        path.unlink(missing_ok=True)
    audits = [audit_seconds() for _ in range(args.audits)]

    direct = statistics.median(speeds["O_DIRECT"])
    rows = [
        f"| {m} | {min(v):.0f} | {statistics.median(v):.0f} | {max(v):.0f} | {statistics.median(v) / direct:.2f}x |"
        for m, v in speeds.items()
    ]
    table = "\n".join(
        [
            "| read method | min MB/s | median MB/s | max MB/s | median vs O_DIRECT |",
            "| --- | --- | --- | --- | --- |",
            *rows,
        ]
    )
    drop_line = (
        f"Page cache left after each fadvise drop (mincore): max {100 * max(resident):.1f}% of the file."
        if resident and min(resident) >= 0
        else "mincore unavailable: the fadvise drop was not verified."
    )
    audit_line = (
        f"Whole audit (`run_doctor()` in a fresh process, torch import included): median "
        f"{statistics.median(audits):.2f} s, min {min(audits):.2f} s over {len(audits)} runs."
    )
    text = (
        "# doctor: page-cache-bypassing read test vs a naive one\n\n"
        f"Machine: {machine_line()}  \nDate: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}  \n"
        f"Command: `flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/doctor_read_speed.py "
        f"--dir {args.dir} --size-mib {args.size_mib} --repeats {args.repeats}`  \n"
        f"Test file: {size / MiB:.0f} MiB under `{Path(args.dir).resolve()}`, sequential 4 MiB reads, "
        f"{args.repeats} interleaved repeats.  \n"
        f"Machine load: {load_line(load0)}; absolute numbers move with other I/O on the "
        "machine, the ratio is the point.\n\n"
        f"{table}\n\n{drop_line}  \n{audit_line}\n\n"
        "A naive read test (buffered, file already in the page cache) reports memory speed, not the disk. "
        "`pitstop doctor` drops the file's cached pages with posix_fadvise(DONTNEED), checks with mincore that "
        "they are gone, and reads buffered (readahead on, as a DataLoader reads); where the drop does not take "
        "it falls back to O_DIRECT, which issues one request at a time and so gives a floor; where neither "
        "works it says the number may be cached.\n"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(table)
    print(drop_line)
    print(audit_line)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
