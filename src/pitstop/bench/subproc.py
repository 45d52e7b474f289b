"""Launch the bench worker in a subprocess (plain or under torch.distributed.run) with a timeout.

A worker may be started early and held: with ``go_file`` in its spec it warms up (compiles), writes
phase "ready", then waits until the parent writes the go file (``{"steps": n}``) before timing, so its
compilation overlaps the parent's warm-up but never the parent's timed blocks.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class WorkerResult:
    payload: dict[str, Any] | None  # what the worker wrote (possibly partial)
    returncode: int | None  # None: killed by the timeout
    seconds: float
    stderr_tail: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


class WorkerHandle:
    """A running worker. The worker runs in its own session so ending it ends every process it started."""

    def __init__(self, spec: dict[str, Any], nprocs: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pitstop-bench-"))
        self.spec_path, self.out_path = self.dir / "spec.json", self.dir / "out.json"
        self.err_path, self.go_path = self.dir / "stderr.txt", self.dir / "go.json"
        spec = dict(spec)
        if spec.pop("hold", False):
            spec["go_file"] = str(self.go_path)
        self.spec_path.write_text(json.dumps(spec))
        if nprocs:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={nprocs}",
            ]
            cmd += ["-m", "pitstop.bench.worker"]
        else:
            cmd = [sys.executable, "-m", "pitstop.bench.worker"]
        env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONWARNINGS="ignore")
        self.t0 = time.monotonic()
        self._err = open(self.err_path, "w")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [*cmd, str(self.spec_path), str(self.out_path)],
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            env=env,
            start_new_session=True,
        )

    def payload(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.out_path.read_text())
        except (OSError, ValueError):
            return None

    def phase(self) -> str | None:
        p = self.payload()
        return None if p is None else p.get("phase")

    def running(self) -> bool:
        return self.proc.poll() is None

    def go(self, steps: int) -> None:
        tmp = self.go_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"steps": steps}))
        os.replace(tmp, self.go_path)

    def wait_until(self, predicate: Any, deadline: float, poll_s: float = 0.25) -> bool:
        """Poll until ``predicate(self)`` or the process ends or time.monotonic() passes ``deadline``."""
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            if not self.running():
                return bool(predicate(self))
            time.sleep(poll_s)
        return bool(predicate(self))

    def finish(self, timeout_s: float) -> WorkerResult:
        """Wait up to ``timeout_s`` for the worker to exit (ending it after that) and collect its output."""
        try:
            rc: int | None = self.proc.wait(timeout=max(0.1, timeout_s))
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        except KeyboardInterrupt:
            self.kill()
            raise
        finally:
            self._err.close()
        seconds = time.monotonic() - self.t0
        try:
            err = self.err_path.read_text(errors="replace")[-12000:]
        except OSError:
            err = ""
        result = WorkerResult(self.payload(), rc, seconds, err)
        shutil.rmtree(self.dir, ignore_errors=True)
        return result

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


def run_worker(spec: dict[str, Any], timeout_s: float, nprocs: int | None = None) -> WorkerResult:
    """Run ``pitstop.bench.worker`` on ``spec`` to the end; ``nprocs`` launches it under torch.distributed.run."""
    return WorkerHandle(spec, nprocs).finish(timeout_s)
