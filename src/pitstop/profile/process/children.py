"""Training in ``torch.multiprocessing`` / ``multiprocessing`` children, followed like torchrun's ranks.

Hogwild-style ``mp.Process(target=train).start()`` and ``mp.spawn(fn)`` without torchrun start the
training in child processes. ``follow`` (called by ``pitstop.profile.process.bootstrap`` in the script's process)
wraps ``BaseProcess.start`` for the run: the target of each process the script starts (``fn`` inside
torch's ``spawn._wrap``) is swapped, for the length of ``start()`` only, for a picklable ``Followed`` that
carries it. The fork start method copies it into the child; spawn and forkserver pickle it with the
process, so the same object arrives whichever start method is used, and the script's Process object holds
its own target again once ``start()`` returns. Nothing runs per step: ``start`` is the only call wrapped.

In the child, ``Followed`` hands over to ``pitstop.profile.process.child_worker``, which measures the target as a
rank of a launch is measured and writes ``rank-N/`` (N: the order the children were started in) in the
run's folder. ``multiprocessing.Pool`` workers are followed too (the tasks they run are the training), and
so are a child's own children (each child follows the processes it starts, as the script's process does):
every followed process claims the next free N in the run's folder (``CLAIMS``), whichever process starts it.
DataLoader workers, executor workers, managers and other library processes are not followed, nor are
``Process`` subclasses that override ``run`` (their target is None).

When the script ends, the parent lets its live children finish as Python would (non-daemonic ones are
waited for; daemonic ones and Pool workers are sent SIGTERM, as Python's exit and ``Pool.terminate`` do, and
write their record). When pitstop stopped the script after its measured steps, a daemonic child is waited
for while it steps (it stops at its own measured steps), and sent SIGTERM once its step (none, for a
producer that never steps) has not moved for ``GRACE_S``; on Ctrl-C or a timeout
every child is sent SIGINT and given ``GRACE_S`` to write what it measured. ``pitstop.profile.runs.children_report``
(in pitstop's own process) turns the children's records into one report.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.profile.rank.rank_states import alive
from pitstop.profile.rank.rank_worker import EXIT_CODE, STATE, rank_dir

LAUNCHER = "torch.multiprocessing"
GRACE_S = 10.0  # a child sent SIGINT: time to write what it measured (the runner allows the parent 20 s)
POLL_S = 0.05
CLAIMS = ".children"  # in the run's folder: one empty file per followed process, its N (``claim_index``)
# modules whose processes are the machinery of a library, not the script's training
_NOT_FOLLOWED = ("multiprocessing", "concurrent", "torch", "pitstop", "joblib", "loky")
_follower: Follower | None = None  # the script's process: its follower (read in a forked child)


@dataclass
class Followed:
    """A process target, carried into the child (pickled by spawn and forkserver, copied by fork)."""

    target: Any
    index: int
    cfg: dict[str, Any]
    pool: bool = False  # a ``multiprocessing.Pool`` worker: its target is the pool's task loop
    parent: int | None = None  # the followed child that started it (a grandchild), None: the script

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "torch" not in sys.modules:  # a child that never imported torch does not train: untouched
            return self.target(*args, **kwargs)
        from pitstop.profile.process.child_worker import run_child

        leave_parent()  # a forked child holds a copy of the parent's instrumentation: removed first
        return run_child(self, args, kwargs, follow)


@dataclass
class Child:
    index: int
    pid: int
    daemon: bool
    name: str
    proc: Any = None  # weakref to the script's Process object
    pool: bool = False
    popen: Any = None  # the Process's own Popen: its exit code outlives the Process object

    def alive(self) -> bool:
        """Through the Process object where it still exists: it reaps the child as ``join`` would, and
        keeps the exit code for the script."""
        proc = self.proc() if self.proc is not None else None
        if proc is not None:
            with contextlib.suppress(Exception):
                return bool(proc.is_alive())
        return alive(self.pid)


@dataclass
class Follower:
    """The script's process: the children it started, and what to do with them when it ends."""

    inst: Any
    cfg: dict[str, Any]
    pid: int = field(default_factory=os.getpid)
    children: list[Child] = field(default_factory=list)
    parent: int | None = None  # in a followed child: its own index

    def start(self, orig: Any, proc: Any) -> Any:
        target = getattr(proc, "_target", None)
        spawn_wrap = _torch_spawn_wrap()
        inner = target is spawn_wrap and spawn_wrap is not None and len(proc._args) >= 1
        pool = target is not None and target is _pool_worker()
        if os.getpid() != self.pid or not (inner or pool or _user_target(target)):
            return orig(proc)
        index = claim_index(Path(self.cfg["out_dir"]))
        saved = proc._target, proc._args
        if inner:
            proc._args = (Followed(proc._args[0], index, self.cfg, parent=self.parent), *proc._args[1:])
        else:
            proc._target = Followed(target, index, self.cfg, pool, self.parent)
        try:
            return orig(proc)
        finally:  # start() deletes them once the process runs: the script's object is as without pitstop
            for name, value in zip(("_target", "_args"), saved, strict=True):
                if name in vars(proc):
                    setattr(proc, name, value)
            if proc.pid is not None:
                child = Child(index, proc.pid, bool(proc.daemon), proc.name, weakref.ref(proc), pool,
                              getattr(proc, "_popen", None))  # fmt: skip
                self.children.append(child)

    def on_done(self, status: str) -> None:
        """The script has ended (``status``, as the bootstrap reports it): its live children finish, and
        each child's exit code is left beside its record."""
        try:
            self._finish_children(status)
        finally:
            self._record_exits()

    def _record_exits(self) -> None:
        """``rank-N/exitcode`` for each child that has ended: a child killed or crashed before it could write
        its final record is reported with how it ended."""
        for c in self.children:
            folder = rank_dir(Path(self.cfg["out_dir"]), c.index)
            with contextlib.suppress(Exception):
                code = c.popen.poll()  # as Process.exitcode reads it (reaps the child if it has ended)
                if code is not None and folder.is_dir():
                    (folder / EXIT_CODE).write_text(str(code))

    def _finish_children(self, status: str) -> None:
        live = [c for c in self.children if c.alive()]
        if not live:
            return
        try:
            if status == "interrupted":
                _interrupt(live)
                return
            # Python's exit terminates daemonic children by SIGTERM; a Pool's workers wait for tasks that no
            # longer come (the pool's own finalizer terminates them)
            ended = [c for c in live if c.pool or (c.daemon and status != "stopped")]
            if ended:
                _interrupt(ended, signal.SIGTERM)
            # the script stopped after its measured steps: daemonic children that train reach theirs too;
            # one that records no step (a producer, a queue feeder) or stops stepping would never end
            waited = [c for c in live if c.daemon and not c.pool and status == "stopped"]
            progress = {c.index: (self._step(c), time.monotonic()) for c in waited}
            while any(c.alive() for c in live):  # as Python joins them at exit
                for c in [c for c in waited if c.alive()]:
                    step, since = progress[c.index]
                    now = self._step(c)
                    if now != step:
                        progress[c.index] = (now, time.monotonic())
                    elif time.monotonic() - since > GRACE_S:  # not at once: a spawned child may still import
                        waited.remove(c)
                        _interrupt([c], signal.SIGTERM, grace_s=0.0)  # as Python's exit would have
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            _interrupt(live)

    def _step(self, c: Child) -> int | None:
        """The last step child ``c`` recorded (its ``rank-N/state.json``); None: it has recorded none."""
        with contextlib.suppress(OSError, ValueError, TypeError):
            state = json.loads((rank_dir(Path(self.cfg["out_dir"]), c.index) / STATE).read_text())
            return int(state["step"]) if state.get("step") else None
        return None


def follow(inst: Any, cfg: dict[str, Any], parent: int | None = None) -> Follower:
    """Follow the processes the script (or, with ``parent``, that followed child) starts, for as long as
    ``inst`` is installed."""
    global _follower
    from multiprocessing.process import BaseProcess

    child_cfg = {
        k: cfg.get(k) for k in ("steps", "warmup", "full", "trace", "probes", "overrides", "out_dir")
    }
    follower = Follower(inst, child_cfg, parent=parent)
    orig = BaseProcess.start

    def start(proc: Any) -> Any:
        return follower.start(orig, proc)

    inst.patches.patch(BaseProcess, "start", start)
    _stop_through_pool_results(inst.patches)
    _follower = follower
    return follower


def _stop_through_pool_results(patches: Any) -> None:
    """A Pool worker's stop reaches the script as its task's error, a ``PoolStop`` (an ``Exception``, so
    the pool keeps the task): where the script reads a result (``map``, ``apply``, ``get``, ``imap``) it
    becomes a plain ``StopProfiling``, which the script's own ``except Exception:`` does not catch."""
    import multiprocessing.pool as mp_pool

    def stopping(orig: Any) -> Any:
        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return orig(self, *args, **kwargs)
            except Exception as e:
                from pitstop.profile.capture.hooks import StopProfiling
                from pitstop.profile.process.child_worker import PoolStop

                if isinstance(e, PoolStop):
                    raise StopProfiling(*e.args) from None
                raise

        return read

    patches.patch(mp_pool.ApplyResult, "get", stopping(mp_pool.ApplyResult.get))  # map, starmap, apply
    for name in ("next", "__next__"):  # imap, imap_unordered
        patches.patch(mp_pool.IMapIterator, name, stopping(getattr(mp_pool.IMapIterator, name)))


def leave_parent() -> None:
    """In a forked child: the parent's instrumentation, copied with its memory, is removed."""
    global _follower
    f, _follower = _follower, None
    if f is None or f.pid == os.getpid():
        return
    import threading

    from pitstop.profile.capture.watchdog import Watchdog

    hook = getattr(threading.excepthook, "__self__", None)
    if isinstance(hook, Watchdog):  # it would write to the parent's watchdog record
        threading.excepthook = hook._prev_excepthook
    with contextlib.suppress(Exception):
        f.inst.uninstall()


def claim_index(out: Path) -> int:
    """The next free N in the run's folder, claimed atomically: the script's process and its followed
    children number the processes they start from the same sequence."""
    claims = out / CLAIMS
    claims.mkdir(parents=True, exist_ok=True)
    for i in itertools.count():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(claims / str(i), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return i
    raise AssertionError("unreachable")


def _pool_worker() -> Any:
    mod = sys.modules.get("multiprocessing.pool")
    return getattr(mod, "worker", None)


def _torch_spawn_wrap() -> Any:
    mod = sys.modules.get("torch.multiprocessing.spawn")
    return getattr(mod, "_wrap", None)


def _user_target(target: Any) -> bool:
    if target is None or isinstance(target, Followed):
        return False
    module = getattr(target, "__module__", None) or ""
    return module.split(".")[0] not in _NOT_FOLLOWED


def _interrupt(children: list[Child], sig: int = signal.SIGINT, grace_s: float = GRACE_S) -> None:
    """``sig`` to each live child (it stops and writes what it measured), then up to ``grace_s`` for them
    to end; a second Ctrl-C stops the wait (the runner then kills the process group)."""
    for c in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if c.alive():
                os.kill(c.pid, sig)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(KeyboardInterrupt):
        while time.monotonic() < deadline and any(c.alive() for c in children):
            time.sleep(POLL_S)
