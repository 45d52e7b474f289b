"""One child process of the script (``pitstop.profile.process.children``), measured as a rank of a launch is.

``run_child`` installs pitstop's instrumentation in the child, runs the process's target under it with a
``ChildWorker`` (a ``RankWorker``: its communication, its state file for the parent, the stop at the
measured steps agreed with the other ranks when the children form a process group) and writes
``rank-N/measurements.json``. The target's fate is the child's as without pitstop: its return value, its
exception (re-raised after the record is written, so multiprocessing prints it and sets the exit code),
its SystemExit; a SIGTERM (``Process.terminate``) still ends it by SIGTERM, and counts as a stop, not a
failure: the script ended its child. A clean stop after the
measured steps returns None from the target, so the child exits 0 and the parent goes on.

A ``multiprocessing.Pool`` worker is measured over the whole task loop it runs. Its stop after the measured
steps is a ``PoolStop``: an ``Exception`` (so the pool returns it as the task's error, rather than losing the
task and hanging the parent's ``map``); the script's process, where ``map`` raises it, gets a plain
``StopProfiling`` in its place (``children.follow`` wraps the pool's result reading), so the script's own
``except Exception:`` cannot swallow the stop. The child follows the processes it starts itself
(``pitstop.profile.process.children.follow``): grandchildren are measured as its siblings are.

The child runs the profiled process's own ``Watchdog`` (``rank-N/watchdog.json``): a child whose step stalls
gets its stacks dumped, and when pitstop stops the run (timeout, Ctrl-C) the runner asks every child for its
stacks before SIGINT (``children_report.request_stacks``), so a hung child is reported where it hung.

Exit probes run in child 0 only, after its siblings have ended (at most ``SIBLING_WAIT_S``), so they time
the model on a machine the other children no longer load. Hogwild children share the model's parameters
with the parent: a probe then runs on a copy of the model and optimizers, so nothing the parent reads
afterwards changes.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import time
from pathlib import Path
from typing import Any

from pitstop.profile.capture.hooks import StopProfiling
from pitstop.profile.process import instrumented
from pitstop.profile.rank.rank_worker import Identity, RankWorker, rank_dir

SIBLING_WAIT_S = 30.0


class PoolStop(StopProfiling, Exception):
    """A Pool worker's stop after its measured steps (see the module's docstring)."""


def run_child(followed: Any, args: tuple[Any, ...], kwargs: dict[str, Any], follow: Any) -> Any:
    """The target of child ``followed.index``, measured; returns or raises as the target does.
    ``follow``: ``pitstop.profile.process.children.follow``, for the processes the child starts."""
    from pitstop.profile.capture.hooks import Instrumentation
    from pitstop.profile.capture.watchdog import Watchdog

    cfg = followed.cfg
    out = rank_dir(Path(cfg["out_dir"]), followed.index)
    out.mkdir(parents=True, exist_ok=True)
    probes = bool(cfg.get("probes", True)) and followed.index == 0
    inst = Instrumentation(instrumented.make_config({**cfg, "probes": probes}, out))
    inst.flush_path = out / instrumented.MEASUREMENTS
    worker = ChildWorker(followed.index, out, followed.pool, followed.parent)
    instrumented.ON_PROBES[:] = [worker.probe_model]
    status, error, tb, code = "completed", None, None, 0
    raised: BaseException | None = None
    grandchildren = None
    watchdog: Watchdog | None = None
    value = None
    try:
        try:
            inst.install()
            worker.on_install(inst)
            grandchildren = follow(inst, cfg, parent=followed.index)
            watchdog = Watchdog(inst).start()  # the stacks of a hang, before pitstop stops the child
            inst.flush("running")
            value = followed.target(*args, **kwargs)
        finally:
            worker.on_end()
            if watchdog is not None:
                watchdog.stop()
    except StopProfiling:
        status = "stopped"
    except SystemExit as e:
        raised = e
        if e.code not in (0, None):
            status, code = "exited", e.code if isinstance(e.code, int) else 1
            error = f"the process exited with status {e.code}"
    except KeyboardInterrupt as e:
        raised, status, code = e, "interrupted", 130
        error = f"interrupted ({worker.signal or 'SIGINT'})"
        if worker.signal == "SIGTERM":  # Process.terminate(): the script ended it, as it may (not a failure)
            status, code, error = "stopped", 0, None
    except BaseException as e:
        raised, status, code = e, "error", 1
        error, tb = instrumented.describe_error(e)
    return _finish_child(inst, worker, grandchildren, status, error, tb, code, raised, value)


def _finish_child(inst: Any, worker: ChildWorker, grandchildren: Any, status: str, error: str | None,
                  tb: str | None, code: int, raised: BaseException | None, value: Any) -> Any:  # fmt: skip
    """The child's record written however the target ended; then the child ends as the target did."""
    from pitstop.profile.record.jsonfile import write_json_atomic

    if status == "completed" and worker.pool_stopped:  # the pool's loop returned after the stop's task
        status = "stopped"
    if status == "interrupted" and grandchildren is not None:  # its own children stop with it
        with contextlib.suppress(BaseException):
            grandchildren.on_done(status)
    ending = "interrupted" if worker.signal else status  # no probes once signalled
    try:
        data = instrumented.finalize(inst, ending)
    except BaseException as e:  # never lose the measurements over a failure while finishing
        data = inst.snapshot(status, final=False)
        data["finalize_error"] = f"{type(e).__name__}: {e}"
    data.update({"status": status, "error": error, "traceback": tb, "exit_code": code})
    with contextlib.suppress(BaseException):
        worker.on_finish(inst, data)
    for _ in range(3):  # a late signal must not lose the record
        try:
            write_json_atomic(inst.flush_path, data)
            break
        except BaseException:
            continue
    worker.restore_signals()
    if worker.signal == "SIGTERM":  # terminated: end as a terminated process does
        os.kill(os.getpid(), signal.SIGTERM)
    if raised is not None:
        raise raised
    return value


class ChildWorker(RankWorker):
    """A ``RankWorker`` whose world is the process group the child joined itself (if any), not a
    launcher's environment."""

    def __init__(self, rank: int, out: Path, pool: bool = False, parent: int | None = None) -> None:
        # one process of the script's own children: its world is read when it stops (``world_size``)
        super().__init__(Identity(rank=rank, world=1, local_rank=rank, local_world=1, node=0), out)
        self._old_signals: dict[int, Any] = {}
        self.pool = pool
        self.parent = parent
        self.pool_stopped = False  # its task stopped after the measured steps; the pool went on

    def _stop_together(self) -> None:
        try:
            super()._stop_together()
        except StopProfiling as e:
            if not self.pool:
                raise
            self.pool_stopped = True
            raise PoolStop(*e.args) from None

    def on_install(self, inst: Any) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._old_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        super().on_install(inst)

    def restore_signals(self) -> None:
        for s, handler in self._old_signals.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def world_size(self) -> int:
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            if dist.is_available() and dist.is_initialized():
                return dist.get_world_size()
        return 1

    def on_finish(self, inst: Any, data: dict[str, Any]) -> None:
        import multiprocessing

        super().on_finish(inst, data)
        dist = data["distributed"]
        world = self.world_size()
        dist["world_size"] = world if world > 1 else None  # None: the report counts the children
        dist["local_world_size"] = None
        dist["child"] = {
            "index": self.rank,
            "name": multiprocessing.current_process().name,
            "start_method": multiprocessing.get_start_method(allow_none=True),
            "process_group": world > 1,
            "pool_worker": self.pool,
            "parent": self.parent,
            "shared_parameters": any(t.is_shared() for t in self._tensors(self._model())),
        }

    def _model(self) -> Any:
        models = self.inst.captured.models if self.inst is not None else []
        return models[0] if models else None

    def _tensors(self, model: Any) -> list[Any]:
        """The parameters and buffers of ``model`` (inside DDP) and of the script's optimizers."""
        opts = self.inst.captured.optimizers if self.inst is not None else []
        tensors = [p for o in opts for g in o.param_groups for p in g["params"]]
        inner = getattr(model, "module", model)
        if inner is not None:
            tensors += [*inner.parameters(), *inner.buffers()]
        return tensors

    def probe_model(self, model: Any) -> tuple[Any, str | None]:
        """After the siblings ended: the model to probe. Parameters shared with other processes are
        probed on a copy, with the optimizers copied onto it (the host-memory probe steps them)."""
        self._wait_siblings()
        if self.comm is not None:
            self.comm.forbid = "a pitstop probe (it runs in child 0 alone)"
        opts = self.inst.captured.optimizers
        inner = getattr(model, "module", model)
        tensors = self._tensors(model)
        if not any(t.is_shared() for t in tensors):
            return super().probe_model(model)
        from pitstop.profile.probe.probe_kit import MAX_COPY_BYTES

        size = sum(t.numel() * t.element_size() for t in tensors)
        if size > MAX_COPY_BYTES:
            opts.clear()  # the optimizer probes would step the shared parameters
            return None, f"the shared model ({size / 2**20:.0f} MiB) is too large to copy for the probes"
        memo: dict[int, Any] = {}
        copied = copy.deepcopy(inner, memo) if inner is not None else None
        opts[:] = [copy.deepcopy(o, memo) for o in opts]
        return copied, None

    def _wait_siblings(self) -> None:
        from pitstop.profile.rank.rank_states import read_states

        deadline = time.monotonic() + SIBLING_WAIT_S
        while time.monotonic() < deadline:
            states = read_states(self.out.parent)
            if not any(st["alive"] for r, st in states.items() if r != self.rank):
                return
            time.sleep(0.1)
