"""End-to-end overhead from concurrent pairs: plain and profiled fresh processes run AT THE SAME TIME,
each pinned to a core of its own, so that the drift of a shared machine falls on both runs of a pair.

On a shared VM, runs one after another drift by 5-8% between rounds (``profile_overhead.py --aa``'s
A/A floor), more than the instruments cost. Two runs side by side on two cores see the same host
contention at the same moment; their ratio keeps only what differs between them. What the pairing adds:

- cores: the runs swap cores every round (a core that is slower for the whole run falls on both arms);
- start-up: ``pitstop profile`` starts the script later than ``python`` does (its own imports, the
  bootstrap), so the profiled run is started first by ``lead`` seconds, the median lag between the two
  windows' starts in the rounds so far, so the timed windows (each script's own ms/step over its steps
  after warm-up) overlap. The windows are longer than the sequential rounds' (``PAIR_STEPS``), so the
  lag left over is a small part of them;
- pitstop's own threads and the ``pitstop profile`` parent are pinned to the profiled run's core with
  it: whatever CPU they take during the window comes out of the script's steps (conservative: on a real
  machine they could run on another core).

``--aa`` pairs two plain runs the same way each round: the concurrent A/A floor, what the pairs resolve.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOW = re.compile(r"over (\d+) steps \(([\d.]+) ms/step\)")
# steps a run: windows of 5-12 s on a quiet machine, so that a start-up lag of ~0.5 s left after the
# lead is under a tenth of the overlap
PAIR_STEPS = {"healthy.py": 450, "item_sync.py": 1400, "conv_fp32.py": 160, "slow_loader.py": 120}


@dataclass
class Run:
    """One process of a pair: its ms/step and when its timed window began (monotonic seconds)."""

    ms: float
    window_start: float


@dataclass
class Lead:
    """Seconds the first run of a pair starts before the second: the median of what the rounds so far
    measured (their lead plus the lag left between the windows' starts)."""

    seen: list[float] = field(default_factory=list)

    def now(self) -> float:
        """The lead for the next pair (negative: the second run starts first)."""
        return statistics.median(self.seen) if self.seen else 0.0

    def observe(self, used: float, first: Run, second: Run) -> None:
        self.seen.append(used + first.window_start - second.window_start)


def usable_pair() -> tuple[int, int] | None:
    """Two cores this process may run on, or None (fewer than two: the pairs cannot run)."""
    cores = sorted(os.sched_getaffinity(0))
    return (cores[0], cores[1]) if len(cores) >= 2 else None


def _start(
    cmd: list[str], core: int, env: dict[str, str]
) -> tuple[subprocess.Popen, list[Run], threading.Thread]:
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    seen: list[Run] = []

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # the window line is stamped when it arrives: the window's end
            m = WINDOW.search(line)
            if m and not seen:
                steps, ms = int(m.group(1)), float(m.group(2))
                seen.append(Run(ms, time.monotonic() - steps * ms / 1000))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return proc, seen, thread


def pair(
    first: list[str], second: list[str], cores: tuple[int, int], lead_s: float, env: dict[str, str]
) -> tuple[Run, Run]:
    """``first`` on ``cores[0]`` and ``second`` on ``cores[1]``, the second ``lead_s`` after the first
    (negative: before it); both to their end."""
    if lead_s >= 0:
        p1, r1, t1 = _start(first, cores[0], env)
        time.sleep(lead_s)
        p2, r2, t2 = _start(second, cores[1], env)
    else:
        p2, r2, t2 = _start(second, cores[1], env)
        time.sleep(-lead_s)
        p1, r1, t1 = _start(first, cores[0], env)
    codes = p1.wait(), p2.wait()
    t1.join(10)
    t2.join(10)
    if any(codes) or not r1 or not r2:
        raise RuntimeError(f"a run of the pair failed (exit codes {codes}): {first} / {second}")
    return r1[0], r2[0]


def commands(script: Path, args: list[str], out_dir: str) -> dict[str, list[str]]:
    """The plain and the profiled command lines (``pitstop profile --full --no-probes``, as in the
    sequential rounds)."""
    plain = [sys.executable, str(script), *args]
    profiled = [sys.executable, "-m", "pitstop", "profile", "--full", "--no-probes", "--quiet"]
    return {"plain": plain, "profiled": [*profiled, "--out-dir", out_dir, "--", *plain]}


def rotated(
    others: dict[str, list[str]],
    plain: list[str],
    env: dict[str, str],
    record: Callable[[str, float, float], None],
    done: Callable[[int], bool],
    max_rounds: int,
    label: str = "",
) -> None:
    """Concurrent rounds until ``done(rounds so far)`` or ``max_rounds``: each round, every command of
    ``others`` side by side with ``plain`` (the other one started first, by its kind's lead), the kinds'
    order reversed and the cores swapped every round. ``record(kind, plain_ms, other_ms)`` gets each pair
    of the counted rounds. A round 0 before them only measures the start-up lags: started together, the
    later window runs its first second or so alone, which on a memory-bound script such as slow_loader.py
    (plain 61 ms a step alone, 75-88 ms beside another run) moves that pair's ratio by 10-20%."""
    cores = usable_pair()
    if cores is None:
        raise RuntimeError("concurrent pairs need two usable cores; this process has fewer")
    kinds = list(others)
    leads = {kind: Lead() for kind in kinds}
    for r in range(max_rounds + 1):
        order = cores if r % 2 == 0 else (cores[1], cores[0])
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            lead = leads[kind].now()
            o, p = pair(others[kind], plain, order, lead, env)
            leads[kind].observe(lead, o, p)
            if r:
                record(kind, p.ms, o.ms)
            print(
                f"{label}pair {kind:8s} round {r or 'lead'}: plain {p.ms:7.2f} "
                f"(core {order[1]}), other {o.ms:7.2f} (core {order[0]}) ms/step, ratio "
                f"{o.ms / p.ms:.3f}, lead {lead:.2f} s, lag left {o.window_start - p.window_start:+.2f} s",
                flush=True,
            )
        if r and done(r):
            break


def rounds(
    script: Path,
    args: list[str],
    env: dict[str, str],
    record: Callable[[str, float, float], None],
    done: Callable[[int], bool],
    max_rounds: int,
    aa: bool = False,
    label: str = "",
) -> None:
    """``rotated`` rounds of the script: a plain/profiled pair (``pitstop profile``, started first by the
    lead), and with ``aa`` a plain/plain pair; ``record`` gets kinds "profiled" and "aa"."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = commands(script, args, tmp)
        others = {"profiled": cmd["profiled"], **({"aa": cmd["plain"]} if aa else {})}
        rotated(others, cmd["plain"], env, record, done, max_rounds, f"{label}{script.name:16s} ")
