"""One rank of a torchrun / accelerate launch, run under pitstop's instrumentation.

The launcher starts each worker as ``python -u train.py ARGS``; ``pitstop.profile.process.rank_start`` runs the
script there through ``pitstop.profile.process.bootstrap`` exactly as a single-process profile does, with this
module's ``RankWorker`` added: it measures communication (``pitstop.profile.rank.comm``) and writes
``rank-R/measurements.json`` in the run's folder. A watchdog thread keeps ``rank-R/state.json`` saying
which step the rank is in and which collective it is blocked in, so a rank whose peer died can be reported
even when it never returns.

Every rank stops after the same number of optimizer steps (``--steps`` + warm-up), and only once every
rank has reached that step boundary (``pitstop.profile.rank.rank_stop``): no rank leaves while a peer still
needs it in a collective, in lockstep (DDP) or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitstop.profile.rank import rank_share

ENV_CONFIG = "PITSTOP_RANKS_CONFIG"
ENV_PARENT = "PITSTOP_PARENT_PID"
ENV_RANK_PID = "PITSTOP_RANK_PID"
ENV_LAUNCHER_PID = "PITSTOP_LAUNCHER_PID"
ENV_SELF_RANK = "PITSTOP_SELF_RANK"  # the parent's command is the rank itself (a task of srun)
STATE = "state.json"
HEARTBEAT = "heartbeat"  # the step of the rank's last collective, read if it dies
HEARTBEAT_BYTES = 13  # b"%12d\n"
EXIT_CODE = "exitcode"  # a followed child's exit code, written by the process that started it (children.py)
WATCH_S = 0.2
STILL_S = 2.0  # no step and no collective for this long: the state says where the main thread is


@dataclass(frozen=True)
class Identity:
    """Who a rank is in its job. ``local_world``: the ranks that this node's pitstop runs (a node's ranks
    under torchrun; one, for a task of srun); ``first``: it copies the other nodes' ranks into this node's
    run folder (``pitstop.profile.rank.rank_share``)."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node: int

    @property
    def first(self) -> bool:
        return self.local_rank == 0


def identity(env: dict[str, str] | None = None) -> Identity:
    """From torchrun's variables, else Slurm's (a task of ``srun``, one rank per task); read at start-up,
    before the script can change them."""
    env = dict(os.environ) if env is None else env
    if "RANK" not in env and "SLURM_PROCID" in env:
        return Identity(rank=int(env["SLURM_PROCID"]), world=int(env.get("SLURM_NTASKS", 1)),
                        local_rank=int(env.get("SLURM_LOCALID", 0)), local_world=1,
                        node=int(env.get("SLURM_NODEID", 0)))  # fmt: skip
    world = int(env.get("WORLD_SIZE", 1))
    rank = int(env.get("RANK", 0))
    return Identity(rank=rank, world=world, local_rank=int(env.get("LOCAL_RANK", rank)),
                    local_world=int(env.get("LOCAL_WORLD_SIZE", world)), node=int(env.get("GROUP_RANK", 0)))  # fmt: skip


def rank_dir(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / f"rank-{rank}"


def _heartbeat_map(path: Path) -> Any:
    """``path`` (HEARTBEAT_BYTES long) mapped shared into memory, or None where that fails. A beat is then a
    store into the page cache, no system call, and survives the process being killed. The file is made
    under another name and renamed into place: a file someone else still maps is replaced, never truncated
    (a store into a truncated mapping would kill that process with SIGBUS)."""
    import mmap

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = -1
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        # NUL bytes until the first beat (not a step to a reader), written, not ftruncate'd: the file's block
        # is claimed here, so a full disk is an OSError now rather than a SIGBUS at the first beat
        os.write(fd, bytes(HEARTBEAT_BYTES))
        beat = mmap.mmap(fd, HEARTBEAT_BYTES)  # ValueError where the write fell short
        os.replace(tmp, path)
        return beat
    except (OSError, ValueError):
        for p in (tmp, path):  # no heartbeat rather than an earlier run's, read as this one's
            with contextlib.suppress(OSError):
                os.unlink(p)
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def process_facts() -> dict[str, Any]:
    """Threads and CPUs of this process, as the scheduler sees them."""
    import torch

    facts: dict[str, Any] = {
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_count": os.cpu_count(),
    }
    with contextlib.suppress(Exception):
        import psutil

        p = psutil.Process()
        facts["os_threads"] = p.num_threads()
        t = p.cpu_times()
        facts["cpu_s"] = t.user + t.system
    return facts


class RankWorker:
    """The rank's extensions to the bootstrap: communication, watchdog, facts about the process."""

    def __init__(self, ident: Identity, out: Path) -> None:
        self.ident = ident
        self.rank = ident.rank
        self.node = ident.node
        self.out = out
        self.comm: Any = None
        self.inject: Any = None
        self.inst: Any = None
        self.signal: str | None = None
        self.requested_threads: int | None = None
        self.stopping: int | None = None  # the step boundary this rank waits at for the others to stop
        self.stop_note: str | None = None  # why it stopped without them (None: all stopped together)
        self.stop_timeout_s = 600.0
        self.ended = False  # the script is over: reporting, stop signals no longer interrupt
        self.stop_asked = False  # a stop signal came (also once ended: the end's waits give up)
        self._progress: tuple[tuple[int, int], float] = ((-1, -1), time.time())
        self.shared: Any = None  # a job across nodes: states and records shared (pitstop.profile.rank.rank_share)
        self._stop = threading.Event()
        self._t0 = time.perf_counter()

    def on_install(self, inst: Any) -> None:
        from pitstop.profile.rank.comm import CommRecorder
        from pitstop.recipes import step

        self.inst = inst
        warmup = inst.cfg.warmup
        ov = inst.cfg.overrides
        self.inject = step.install(ov.ddp_no_sync, ov.ddp_static_graph)  # under the recorder: undone after it
        self._beaten = -1
        self._beat_map = _heartbeat_map(self.out / HEARTBEAT)
        self.comm = CommRecorder(  # the records list is cleared, never rebound: its len is the step
            step_of=inst.records.__len__, warmup_of=lambda i: i < warmup, beat=self._beat
        )
        self.comm.install()
        # a DDP model timed by its reducer's timers has no hook in its all-reduce: the rank's backward calls
        # say when it may be blocked there (``current``, read when a peer dies)
        inst.backward_listener = self.comm.timers
        if not inst.cfg.full:
            inst.cfg.on_done = self._stop_together
        if inst.cfg.overrides.num_threads:  # forced by the capture (``recipes.threads.inject``)
            self._record_threads()
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, self.on_stop)
                signal.signal(signal.SIGINT, self.on_stop)
        threading.Thread(target=self._watch, name="pitstop-rank-watchdog", daemon=True).start()
        from pitstop.profile.rank import rank_stop

        if self.ident.world > self.ident.local_world:  # ranks on other nodes: share through the store
            job = rank_stop.job_id(self.out.parent.name)
            self.shared = rank_share.Shared(job, self.rank, self.ident.world, self.node, self.out.parent)
            threading.Thread(target=self._share, name="pitstop-rank-share", daemon=True).start()

    def on_stop(self, signum: int, frame: Any) -> None:
        """SIGINT/SIGTERM: stop the script. A later signal (the launcher's SIGTERM after our SIGINT, or after a
        peer failed while this rank was already reporting its own error) must not cut the report short."""
        self.stop_asked = True
        if self.signal is not None or self.ended:
            return
        self.signal = signal.Signals(signum).name
        raise KeyboardInterrupt

    def on_end(self) -> None:
        self.ended = True

    def _stop_together(self) -> None:
        """After the measured steps: wait at this step boundary for every rank, then stop."""
        from pitstop.profile.capture.hooks import StopProfiling
        from pitstop.profile.rank import rank_stop

        step = len(self.inst.records)
        self.stopping = step
        world = self.world_size()
        if self.comm is not None:
            self.comm.current = (f"pitstop's stop after step {step} (waiting for every rank)", None,
                                 time.perf_counter())  # fmt: skip
            self.comm.current_n = None
        try:
            self.stop_note = rank_stop.agree(
                rank_stop.job_id(self.out.parent.name), step, world, self.stop_timeout_s
            )
        finally:
            if self.comm is not None:
                self.comm.current = None
        raise StopProfiling(f"measured {step - self.inst.cfg.warmup} steps")

    def world_size(self) -> int:
        """How many ranks stop together: the job's world."""
        return self.ident.world

    def _beat(self, step: int) -> None:
        if step == self._beaten:  # every collective of a step says the same
            return
        self._beaten = step
        if self._beat_map is not None:
            self._beat_map[:] = b"%12d\n" % step

    def _record_threads(self) -> None:
        """The count the script asks ``torch.set_num_threads`` for under the ``num_threads`` override
        (which keeps the override's count), for the rank's facts."""
        import torch

        orig = torch.set_num_threads

        def set_num_threads(requested: int) -> None:
            self.requested_threads = requested
            orig(requested)

        torch.set_num_threads = set_num_threads
        self.inst._extra_undo.append(lambda: setattr(torch, "set_num_threads", orig))

    def probe_model(self, model: Any) -> tuple[Any, str | None]:
        """What rank 0's exit probes may run: a copy of the model outside DDP (its forward would broadcast
        buffers, its backward all-reduce), none for FSDP (its forward all-gathers). From here on any
        collective raises, so a probe that tries one fails alone instead of waiting for absent peers."""
        if self.comm is not None:
            self.comm.forbid = "a pitstop probe (it runs on rank 0 alone)"
        if model is None:
            return None, None
        names = {type(m).__name__ for m in model.modules()}
        if any("FullyShard" in n or n.startswith("FSDP") for n in names):
            return None, "FSDP shards the parameters: a probe's forward would all-gather them"
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not isinstance(model, DDP):
            return model, None
        from pitstop.profile.probe.probe_kit import MAX_COPY_BYTES

        inner = model.module
        size = sum(p.numel() * p.element_size() for p in inner.parameters())
        if size > MAX_COPY_BYTES:
            return None, f"the model ({size / 2**20:.0f} MiB) is too large to copy out of DDP for the probes"
        import copy

        return copy.deepcopy(inner), None

    def state(self) -> dict[str, Any]:
        comm = self.comm
        step = len(self.inst.records) if self.inst is not None else 0
        mark = (step, comm.entered if comm is not None else 0)
        now = time.time()
        if mark != self._progress[0]:
            self._progress = (mark, now)
        where: dict[str, Any] = {}
        if now - self._progress[1] > STILL_S:  # no progress: where the main thread is, for a hang's report
            from pitstop.profile.capture.stacks import describe, main_thread_frames

            with contextlib.suppress(Exception):
                at = describe(main_thread_frames())
                where = {"at": at.get("where"), "call": at.get("call")}
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node": self.node,
            "time_s": now,
            "step": step,
            "progress_s": self._progress[1],  # when the step or the collectives entered last moved
            "stopping": self.stopping,
            "current": comm.current_record() if comm is not None else None,
            "entered": comm.entered if comm is not None else 0,
            **where,
        }

    def _watch(self) -> None:
        from pitstop.profile.record.jsonfile import write_json_atomic

        while not self._stop.wait(WATCH_S):
            with contextlib.suppress(Exception):
                write_json_atomic(self.out / STATE, self.state())

    def _share(self) -> None:
        """Once a second: this rank's state to the job's store; on a node's local rank 0, the other nodes'
        states into this node's run folder."""
        first = self.ident.first
        while not self._stop.wait(rank_share.EVERY_S):
            with contextlib.suppress(Exception):
                self.shared.publish_state(self.state())
                if first:
                    self.shared.copy_states()

    def _share_end(self, data: dict[str, Any]) -> None:
        """The final record to the job's store; on a node's local rank 0, the other nodes' records copied here."""
        from pitstop.profile.capture.watchdog import WATCHDOG_FILE

        watchdog = None
        with contextlib.suppress(OSError, ValueError):
            watchdog = json.loads((self.out / WATCHDOG_FILE).read_text())
        state = {**data["distributed"]["state"], "status": data.get("status")}
        with contextlib.suppress(Exception):
            self.shared.publish_record({"measurements": data, "watchdog": watchdog, "state": state})
        if self.ident.first:
            with contextlib.suppress(Exception):
                missing = self.shared.copy_records(stop=lambda: self.stop_asked)
                if missing:
                    data["distributed"]["records_missing"] = missing

    def on_finish(self, inst: Any, data: dict[str, Any]) -> None:
        self._stop.set()
        ident = self.ident
        dist: dict[str, Any] = {
            "rank": self.rank,
            "local_rank": ident.local_rank,
            "world_size": ident.world,
            "local_world_size": ident.local_world,
            "node_rank": ident.node,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "signal": self.signal,
            "stopped_at": self.stopping,
            "stop_note": self.stop_note,
            "state": self.state(),
            "process": {**process_facts(), "script_asked_threads": self.requested_threads},
            "wall_s": time.perf_counter() - self._t0,
        }
        if self.comm is not None:
            self.comm.uninstall()
            dist["comm"] = self.comm.snapshot()
        if self.inject is not None:
            self.inject.uninstall()
            if self.inject.active:
                dist["injected"] = self.inject.facts()
                data["override_errors"] = [*(data.get("override_errors") or []), *self.inject.not_applied()]
        proc = dist["process"]
        if proc.get("cpu_s") is not None and dist["wall_s"] > 0:
            proc["busy_cpus"] = proc["cpu_s"] / dist["wall_s"]
        data["distributed"] = dist
        from pitstop.profile.record.jsonfile import write_json_atomic

        with contextlib.suppress(Exception):
            write_json_atomic(self.out / STATE, {**dist["state"], "status": data.get("status")})
        if self.shared is not None:
            self._share_end(data)
