"""Profile every rank of a launcher command: torchrun, ``python -m torch.distributed.run``, accelerate.

The launcher runs untouched, in its own session, with two additions to its environment: PYTHONPATH starts
with ``pitstop/profile/process/rankhook`` (a ``sitecustomize`` that hands each worker to
``pitstop.profile.rank.rank_worker``) and ``PITSTOP_RANKS_CONFIG`` names the run's settings. Each rank writes
``rank-R/`` in the run's folder; this parent watches them, and merges them into one report
(``pitstop.profile.runs.merge``) when the launcher ends.

While the ranks run, the parent stops the whole launch (every rank gets SIGINT, then SIGKILL after the
grace period) on Ctrl-C, on ``--timeout``, or when one rank has ended while another has been blocked in a
collective for ``STUCK_S``: a peer that died leaves it waiting forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pitstop.host.load import CpuOutsideSession
from pitstop.profile.rank import rank_worker as rw
from pitstop.profile.rank.rank_states import collective_name, read_states
from pitstop.profile.runs.merge import RanksResult, collect_ranks
from pitstop.profile.runs.result import RunSpec, note_other_cpu
from pitstop.profile.runs.supervise import GRACE_S, grace_s, supervise, wait_or_kill

STUCK_S = 10.0  # a rank blocked this long in a collective after a peer ended is not coming back
HOOK_DIR = Path(__file__).resolve().parents[1] / "process" / "rankhook"
CONFIG = "ranks-config.json"
# between reads of the ranks' state files: a hang is called after STUCK_S, progress shows once a second,
# and every wake-up of this parent takes CPU from the ranks when they have every core
TICK_S = 1.0


def launcher_command(kind: str, target: str, args: list[str]) -> list[str]:
    """The launcher as the user would run it, with pitstop's interpreter."""
    return [sys.executable, *(["-m", target] if kind == "module" else [target]), *args]


def run_ranks(
    spec: RunSpec,
    kind: str,
    target: str,
    args: list[str],
    launcher: str,
    out_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RanksResult:
    """Run the launcher with every worker instrumented; never raises for the script's failures."""
    start = time.perf_counter()
    out = Path(tempfile.mkdtemp(prefix="pitstop-ranks-")) if out_dir is None else Path(out_dir)
    _write_config(spec, out)
    env = _launch_env(out, launcher, spec.env)
    files = []
    stdout: Any = sys.stderr.fileno() if spec.stdout_to_stderr else None
    stderr: Any = None
    if spec.quiet:
        stdout = open(out / "stdout.txt", "wb")  # noqa: SIM115 - closed below
        stderr = open(out / "stderr.txt", "wb")  # noqa: SIM115
        files = [stdout, stderr]
    cmd = launcher_command(kind, target, args)
    other = CpuOutsideSession()
    try:
        proc = subprocess.Popen(
            cmd, cwd=spec.cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
    except OSError as e:
        for fh in files:
            fh.close()
        return RanksResult(2, f"could not start {launcher}: {e}", [], [], {}, None, 0.0, "not_started",
                           command=list(spec.command), spec=spec, launcher=launcher)  # fmt: skip
    watch = _Watch(out, proc, progress, spec.warmup + spec.steps)
    try:
        status = supervise(proc, watch.tick, spec.timeout, watch.stop, TICK_S)
    finally:
        for fh in files:
            fh.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    rc = proc.returncode if proc.returncode is not None else -9
    result = collect_ranks(spec, out, rc, status, watch.hang, launcher, time.perf_counter() - start)
    note_other_cpu(result, other, proc.pid)  # the launcher's session holds every rank
    if out_dir is None and not spec.trace:
        shutil.rmtree(out, ignore_errors=True)
        result.out_dir = None
    return result


def _write_config(spec: RunSpec, out: Path) -> None:
    """The run's settings, in ``CONFIG``, for every rank's worker hook."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"steps": spec.steps, "warmup": spec.warmup, "full": spec.full, "trace": spec.trace}
    cfg["timeout"] = spec.timeout
    cfg["probes"] = spec.probes
    cfg["overrides"] = spec.overrides.to_dict()
    cfg["out_dir"] = str(out.resolve())
    (out / CONFIG).write_text(json.dumps(cfg, indent=2))


def _launch_env(out: Path, launcher: str, extra: dict[str, str]) -> dict[str, str]:
    """The launcher's environment: ours plus ``extra``, the rank hook and this pitstop first on
    PYTHONPATH, and the variables that lead each worker to the run's config and to this parent."""
    env = {**os.environ, **extra}
    src = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), src, env.get("PYTHONPATH")) if p)
    env[rw.ENV_CONFIG] = str((out / CONFIG).resolve())
    env[rw.ENV_PARENT] = str(os.getpid())
    env.pop(rw.ENV_RANK_PID, None)
    if launcher == "srun":  # the command is the rank itself, not a launcher of ranks
        env[rw.ENV_SELF_RANK] = "1"
    return env


class _Watch:
    """``supervise``'s tick and stop for a launch: progress from the slowest rank's step, a hang called
    by ``stuck``, and on a timeout where the ranks were waiting; ``hang`` says it for the result."""

    def __init__(
        self,
        out: Path,
        proc: subprocess.Popen[bytes],
        progress: Callable[[int, int], None] | None,
        total: int,
    ) -> None:
        self.out = out
        self.proc = proc
        self.progress = progress
        self.total = total
        self.seen = -1
        self.hang: str | None = None

    def tick(self) -> str | None:
        states = read_states(self.out)
        if self.progress is not None and states:
            done = min(s.get("step", 0) for s in states.values())
            if done != self.seen:
                self.seen = done
                self.progress(done, self.total)
        self.hang = stuck(states)
        return "hung" if self.hang is not None else None

    def stop(self, status: str) -> None:
        if status == "timeout":
            self.hang = waiting(read_states(self.out))
        stop_group(self.proc, grace_s(status))


def stop_group(proc: subprocess.Popen[bytes], grace: float = GRACE_S) -> None:
    """SIGINT to the launcher and every rank (each writes what it measured), SIGKILL after ``grace``
    seconds or at a second Ctrl-C."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGINT)
    wait_or_kill(proc, grace)


def _node(st: dict[str, Any]) -> str:
    return f" on {st['host']}" if st.get("remote") and st.get("host") else ""


def _describe(rank: int, st: dict[str, Any], now: float | None = None) -> str:
    cur = st.get("current")
    now = time.time() if now is None else now
    if cur:
        where = f" at {cur['location']}" if cur.get("location") else ""
        waited = max(0.0, now - cur["since_s"])
        return (
            f"rank {rank}{_node(st)} waiting in {collective_name(cur)}{where} for {waited:.1f} s "
            f"(step {st.get('step', 0)})"
        )
    at = f", at {st['at']}" + (f" in {st['call']}" if st.get("call") else "") if st.get("at") else ""
    return f"rank {rank}{_node(st)} at step {st.get('step', 0)}{at}"


def _behind(st: dict[str, Any], blocked: dict[int, dict[str, Any]], now: float) -> list[int]:
    """The blocked ranks whose collective this live rank never entered, when it has made no progress (no
    step, no collective) for STUCK_S: it is what they wait for."""
    if st.get("current") or now - st.get("progress_s", now) <= STUCK_S:
        return []
    return [r for r, b in blocked.items() if st.get("entered", 0) < (b["current"].get("n") or 0)]


def waiting(states: dict[int, dict[str, Any]]) -> str | None:
    """Where each rank is when the run is stopped from outside (timeout)."""
    parts = [_describe(r, st) for r, st in sorted(states.items())]
    return "; ".join(parts) or None


def stuck(states: dict[int, dict[str, Any]], now: float | None = None) -> str | None:
    """A rank has ended and another has been blocked in one collective for STUCK_S: say who and where."""
    now = time.time() if now is None else now
    # a rank waiting at pitstop's stop for the others is as gone, for a peer blocked in a collective
    ended = {r: st for r, st in states.items() if not st["alive"] or st.get("stopping") is not None}
    blocked = {
        r: st
        for r, st in states.items()
        if st["alive"]
        and st.get("stopping") is None
        and st.get("current")
        and now - st["current"]["since_s"] > STUCK_S
    }
    if not blocked:
        return None
    behind = {
        r: waits
        for r, st in states.items()
        if st["alive"]
        and st.get("stopping") is None
        and r not in blocked
        and (waits := _behind(st, blocked, now))
    }
    if not ended and not behind:
        return None
    gone = [
        f"rank {r}{_node(st)} measured its steps and waits to stop after step {st['stopping']}"
        if st["alive"]
        else f"rank {r}{_node(st)} ended ({st.get('status') or 'process gone'}) at step {st.get('step', 0)}"
        for r, st in sorted(ended.items())
    ]
    late = [
        f"{_describe(r, states[r], now)}, {states[r].get('entered', 0)} collectives entered: it never entered "
        + " nor ".join(f"rank {b}'s collective #{blocked[b]['current']['n']}" for b in waits)
        for r, waits in sorted(behind.items())
    ]
    return (
        "; ".join([*gone, *late])
        + ", while "
        + "; ".join(_describe(r, st, now) for r, st in sorted(blocked.items()))
    )
