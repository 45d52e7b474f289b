"""Communication inside one rank: the collectives it calls, DDP's gradient all-reduce, and where it waits.

Installed in each worker of a torchrun / accelerate launch (``pitstop.profile.rank.rank_worker``), on top of
torch.distributed's own hooks:

- explicit collectives: the functions of ``torch.distributed`` (``all_reduce``, ``all_gather``,
  ``broadcast``, ``barrier``, ``reduce_scatter_tensor``, ...) are wrapped, so calls made through the
  module (the script's, FSDP's) are timed with their file:line and bytes; an ``async_op=True`` call is
  timed where the script waits on its ``Work``.
- DDP: a hook the script registers is wrapped, and times its bucket futures. Without a hook of the
  script's own, a model on the CPU is timed by its reducer's own timers (``pitstop.profile.rank.ddp_timers``:
  no Python on the all-reduce path); on CUDA it gets ``default_hooks.allreduce_hook`` (divide by the
  group size, all-reduce: the same arithmetic as DDP's built-in reduction), timed with CUDA events read
  at the end. Per backward, the all-reduce time is split into the part that overlapped backward (before
  the last bucket was ready) and the part exposed after it.
- every collective and bucket gets the wall-clock time this rank reached it, so the merge of all ranks
  can say how far apart the ranks arrived (skew) and who arrived last.

``current`` names the collective this rank is blocked in (what, file:line, since), read by the rank's
watchdog when a peer dies.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from pitstop.profile.capture.patches import Patches
from pitstop.profile.capture.where import user_location
from pitstop.profile.rank import ddp_timers
from pitstop.profile.rank.comm_hook import spans_of

clock = time.perf_counter
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather_single",  # FSDP2's all-gather and reduce-scatter
    "reduce_scatter_single",
    "all_reduce_coalesced",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "monitored_barrier",
)
MAX_PENDING = 10000
MAX_CALLS = 20000  # per-call records kept for the skew analysis (aggregates keep counting past it)
DDP_OP = "ddp.all_reduce"
NCCL_ENV = (
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_LAUNCH_MODE",
    "CUDA_LAUNCH_BLOCKING",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


def _nbytes(obj: Any, depth: int = 0) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if depth < 2 and isinstance(obj, list | tuple):
        return sum(_nbytes(o, depth + 1) for o in obj)
    return 0


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    for obj in (*args, *kwargs.values()):
        if isinstance(obj, list | tuple) and obj:
            obj = obj[0]
        if isinstance(obj, torch.Tensor):
            return obj.device.type
    return None


class CommRecorder:
    """One per rank. ``step()`` says which step a call belongs to; ``snapshot()`` is what the rank writes."""

    def __init__(self, step_of: Any = None, warmup_of: Any = None, beat: Any = None) -> None:
        # which step a call belongs to (an attribute, not a method: called several times a step)
        self.step: Callable[[], int] = step_of or (lambda: 0)
        self._beat = beat or (lambda step: None)  # told the step at each collective (the rank's heartbeat)
        self._warmup_of = warmup_of or (lambda i: False)
        self.wall0 = time.time() - clock()  # perf_counter -> wall clock, for skew across ranks
        self.calls: list[dict[str, Any]] = []
        self.sites: dict[tuple[str, str], dict[str, Any]] = {}
        self.per_step: dict[int, dict[str, float]] = {}
        self.rounds: list[dict[str, Any]] = []
        self.ddp: list[dict[str, Any]] = []
        self.devices: set[str] = set()
        self.backend: str | None = None
        self.current: tuple[str, str | None, float] | None = None
        # collectives this rank has entered (explicit calls and DDP all-reduce rounds, in order), and the
        # number and bytes of the one in ``current``: ranks of a job that entered fewer never reached it
        self.entered = 0
        self.current_n: tuple[int, int | None] | None = None
        self.forbid: str | None = None  # who may not communicate now (rank 0's exit probes)
        self._seq: dict[str, int] = {}
        self._local = threading.local()
        self._pending: dict[int, dict[str, Any]] = {}  # id(Work) of async calls -> their record
        self._round: dict[str, Any] | None = None
        self._patches = Patches()
        self._cuda = False
        self._ddp_state: dict[int, dict[str, Any]] = {}
        self._register: Any = None
        self.timers = ddp_timers.TimerRounds(self)

    # ------------------------------------------------------------------------------ install
    def install(self) -> None:
        import torch.distributed as dist

        for name in COLLECTIVES:
            orig = getattr(dist, name, None)
            if orig is not None:
                self._patch(dist, name, self._wrap(name, orig))
        from torch._C._distributed_c10d import Work

        self._patch(Work, "wait", self._wrap_wait(Work.wait))
        from torch.nn.parallel import DistributedDataParallel as DDP

        self._patch(DDP, "__init__", self._wrap_ddp_init(DDP.__init__))
        self._patch(DDP, "register_comm_hook", self._wrap_register(DDP.register_comm_hook))
        self._patch(DDP, "_register_builtin_comm_hook", self._wrap_builtin(DDP._register_builtin_comm_hook))
        self._patch(DDP, "_post_forward", self._wrap_post_forward(DDP._post_forward))

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self._patches.patch(owner, name, new)

    def uninstall(self) -> None:
        self._patches.undo()

    # ------------------------------------------------------------------------------ records
    def _step_totals(self, step: int) -> dict[str, float]:
        tot = self.per_step.get(step)  # not setdefault: every forward would build the dict to drop it
        if tot is None:
            tot = self.per_step[step] = {"collective_s": 0.0, "collectives": 0, "ddp_comm_s": 0.0,
                                         "ddp_exposed_s": 0.0, "ddp_rounds": 0, "ddp_timed_rounds": 0,
                                         "ddp_bytes": 0, "unused_search_s": 0.0, "ddp_forwards": 0}  # fmt: skip
        return tot

    def _record(
        self, op: str, loc: str | None, t: float, dt: float, nbytes: int, blocking: bool
    ) -> dict[str, Any]:
        step = self.step()
        seq = self._seq.get(op, 0)
        self._seq[op] = seq + 1
        rec = {"op": op, "seq": seq, "step": step, "enter_s": self.wall0 + t, "time_s": dt, "bytes": nbytes,
               "location": loc, "blocking": blocking}  # fmt: skip
        if len(self.calls) < MAX_CALLS:
            self.calls.append(rec)
        site = self.sites.setdefault(
            (op, loc or "<library>"), {"op": op, "location": loc, "count": 0, "bytes": 0, "time_s": 0.0}
        )
        site["count"] += 1
        site["bytes"] += nbytes
        site["time_s"] += dt if blocking else 0.0
        if blocking:
            tot = self._step_totals(step)
            tot["collective_s"] += dt
            tot["collectives"] += 1
        return rec

    def _wrap(self, name: str, orig: Any) -> Any:
        rec = self

        @functools.wraps(orig)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if rec.forbid:
                raise RuntimeError(
                    f"torch.distributed.{name} called by {rec.forbid}: refused, no peer takes part"
                )
            if getattr(rec._local, "inside", False):
                return orig(*args, **kwargs)  # a collective made by another one (all_gather_object, a hook)
            t = clock()
            loc = user_location(2)
            dev = _device_of(args, kwargs)
            if dev:
                rec.devices.add(dev)
            blocking = not kwargs.get("async_op", False)
            nbytes = _nbytes(args[:1] or list(kwargs.values())[:1])
            rec.entered = n = rec.entered + 1
            if blocking:
                rec.current, rec.current_n = (name, loc, t), (n, nbytes)
            rec._beat(rec.step())
            rec._local.inside = True
            try:
                out = orig(*args, **kwargs)
            finally:
                rec._local.inside = False
                if blocking:
                    rec.current = None
            entry = rec._record(name, loc, t, clock() - t, nbytes, blocking)
            entry["n"] = n
            if not blocking and out is not None:
                if len(rec._pending) > MAX_PENDING:  # Works never waited on (their futures used instead)
                    rec._pending.clear()
                rec._pending[id(out)] = entry
            rec._note_backend()
            return out

        return collective

    def _wrap_wait(self, orig: Any) -> Any:
        rec = self

        @functools.wraps(orig)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            entry = rec._pending.pop(id(work), None)
            if entry is None or getattr(rec._local, "inside", False):
                return orig(work, *args, **kwargs)
            t = clock()
            rec.current = (f"{entry['op']} (wait)", user_location(2), t)
            rec.current_n = (entry["n"], entry["bytes"])
            try:
                return orig(work, *args, **kwargs)
            finally:
                rec.current = None
                dt = clock() - t
                entry["time_s"] += dt
                tot = rec._step_totals(entry["step"])
                tot["collective_s"] += dt
                tot["collectives"] += 1
                site = rec.sites.get((entry["op"], entry["location"] or "<library>"))
                if site is not None:
                    site["time_s"] += dt

        return wait

    def _note_backend(self) -> None:
        if self.backend is not None:
            return
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                self.backend = str(dist.get_backend())

    # ---------------------------------------------------------------------------------- DDP
    def _wrap_ddp_init(self, orig: Any) -> Any:
        rec = self

        @functools.wraps(orig)
        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            orig(ddp, *args, **kwargs)
            rec._note_backend()
            params = [p for p in ddp.module.parameters() if p.requires_grad]
            dev = params[0].device.type if params else "cpu"
            rec.devices.add(dev)
            rec._cuda = rec._cuda or dev == "cuda"
            facts = {
                "location": user_location(2),
                "find_unused_parameters": bool(ddp.find_unused_parameters),
                "static_graph": bool(getattr(ddp, "static_graph", False)),
                "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
                "bucket_cap_bytes": getattr(ddp, "bucket_bytes_cap", None),
                "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", False)),
                "parameters": len(params),
                "param_bytes": sum(p.numel() * p.element_size() for p in params),
                "device": dev,
                "hook": None,
                "unused_parameters": 0,
            }
            rec.ddp.append(facts)
            group = getattr(ddp, "process_group", None)
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            # the script may still register its own hook; ours goes in at the first forward if it did not.
            # Kept here, not on the module: the script's model pickles and deep-copies as without pitstop.
            rec._ddp_state[id(ddp)] = {"facts": facts, "default": (group, default_hooks.allreduce_hook),
                                       "ref": weakref.ref(ddp)}  # fmt: skip

        return __init__

    def _wrap_register(self, orig: Any) -> Any:
        rec = self

        rec._register = orig

        @functools.wraps(orig)
        def register_comm_hook(ddp: Any, state: object, hook: Any) -> None:
            st = rec._ddp_state.get(id(ddp))
            if st is not None:
                st["default"], st["timers"] = None, False
                if st["facts"]["hook"] is None:
                    st["facts"]["hook"] = getattr(hook, "__qualname__", str(hook))
            return orig(ddp, state, rec.timed_hook(hook, ddp))

        return register_comm_hook

    def _wrap_builtin(self, orig: Any) -> Any:
        rec = self

        @functools.wraps(orig)
        def _register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
            # a C++ hook (ALLREDUCE, FP16_COMPRESS) runs inside the reducer: no bucket future to time
            st = rec._ddp_state.get(id(ddp))
            if st is not None:
                st["default"], st["timers"] = None, False
                st["facts"]["hook"] = str(comm_hook_type)
                st["facts"]["hook_untimed"] = "a built-in C++ comm hook: its buckets are not timed"
            return orig(ddp, comm_hook_type)

        return _register_builtin_comm_hook

    def _wrap_post_forward(self, orig: Any) -> Any:
        rec = self

        @functools.wraps(orig)
        def _post_forward(ddp: Any, output: Any) -> Any:
            st = rec._ddp_state.get(id(ddp))
            if st is None:
                return orig(ddp, output)
            if st["default"] is not None:
                group, hook = st["default"]
                st["default"] = None
                if getattr(ddp, "_comm_hooks", None):
                    pass  # the script registered its own hook: timed where it was registered
                elif st["facts"]["device"] == "cpu" and ddp_timers.start(ddp):
                    st["timers"] = True
                else:
                    try:
                        rec._register(ddp, group, rec.timed_hook(hook, ddp))
                    except Exception as e:  # e.g. a builtin hook registered: leave it, say why untimed
                        st["facts"]["hook_error"] = f"{type(e).__name__}: {e}"
            if not torch.is_grad_enabled():
                return orig(ddp, output)
            facts = st["facts"]
            rec._step_totals(rec.step())["ddp_forwards"] += 1
            if not st.get("timers"):
                rec._note_graph(ddp, facts)  # the reducer's record of the last backward, before it resets
            elif ddp.require_backward_grad_sync:
                rec.timers.forward(ddp, st)  # reads it with the timers, on their sample
            if not facts["find_unused_parameters"]:
                return orig(ddp, output)
            t = clock()
            try:
                return orig(ddp, output)  # with find_unused_parameters: the search of the autograd graph
            finally:
                rec._step_totals(rec.step())["unused_search_s"] += clock() - t

        return _post_forward

    def timed_hook(self, hook: Any, ddp: Any) -> Any:
        """``hook(state, bucket) -> Future`` with each bucket's launch and completion timed."""
        from pitstop.profile.rank.comm_hook import TimedHook

        return TimedHook(self, hook, ddp)

    def _open_round(self, ddp: Any, t: float) -> dict[str, Any]:
        step = self.step()
        self._beat(step)
        loc = user_location(3)
        rnd = self._new_round(step, t, loc)
        self._round = rnd
        self.enter_round(loc, t)
        return rnd

    def enter_round(self, loc: str | None, t: float) -> None:
        """A DDP gradient all-reduce begins: it is the rank's current collective (its bytes unknown yet)."""
        self.entered += 1
        self.current, self.current_n = (ddp_timers.WHAT, loc, t), (self.entered, None)

    def _new_round(self, step: int, t: float, loc: str | None) -> dict[str, Any]:
        seq = self._seq.get(DDP_OP, 0)
        self._seq[DDP_OP] = seq + 1
        rnd = {"step": step, "seq": seq, "first_launch": t, "last_launch": t, "buckets": [], "closed": False,
               "location": loc}  # fmt: skip
        self.rounds.append(rnd)
        return rnd

    def add_round(
        self, step: int, first: float, ready: float, end: float, nbytes: int, loc: str | None
    ) -> None:
        """A backward's all-reduce timed as a whole (``ddp_timers``): launched at ``first``, every gradient
        ready at ``ready``, done at ``end``."""
        rnd = self._new_round(step, first, loc)
        rnd.update(last_launch=ready, closed=True, spans=(end - first, end - ready), counted=True,
                   buckets=[{"launch": first, "done": end, "bytes": nbytes, "events": None}])  # fmt: skip

    # ------------------------------------------------------------------------------ results
    def _finish_rounds(self) -> None:
        """Per step: DDP all-reduce time (the union of bucket intervals), exposed part and rounds."""
        if self._cuda and torch.cuda.is_available():
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
        for rnd in self.rounds:
            if rnd.get("finished"):
                continue
            spans = rnd.get("spans") or spans_of(rnd)
            if spans is None:
                continue
            rnd["finished"] = True
            comm, exposed = spans
            tot = self._step_totals(rnd["step"])
            tot["ddp_comm_s"] += comm
            tot["ddp_exposed_s"] += exposed
            tot["ddp_timed_rounds"] += 1
            tot["ddp_rounds"] += 0 if rnd.get("counted") else 1  # a timers' round was counted at its backward
            tot["ddp_bytes"] += sum(b["bytes"] for b in rnd["buckets"])
            if len(self.calls) < MAX_CALLS:
                self.calls.append({"op": DDP_OP, "seq": rnd["seq"], "step": rnd["step"],
                                   "enter_s": self.wall0 + rnd["first_launch"], "last_s": self.wall0 + rnd["last_launch"],
                                   "time_s": comm, "exposed_s": exposed, "location": rnd["location"],
                                   "bytes": sum(b["bytes"] for b in rnd["buckets"]), "blocking": False})  # fmt: skip

    def _graph_facts(self) -> None:
        """From each DDP's reducer: whether the same parameters were used every step (what static_graph
        needs) and, with find_unused_parameters, how many the last backward did not use."""
        for st in self._ddp_state.values():
            self._note_graph(st["ref"](), st["facts"])

    def _note_graph(self, ddp: Any, facts: dict[str, Any]) -> None:
        reducer = getattr(ddp, "reducer", None)
        if reducer is None:
            return
        with contextlib.suppress(Exception):
            facts["graph_static"] = bool(reducer._ddp_graph_static())
        if facts["find_unused_parameters"] and self.rounds:
            with contextlib.suppress(Exception):
                facts["unused_parameters"] = int((reducer._get_local_used_map() == 0).sum())

    def current_record(self) -> dict[str, Any] | None:
        """The collective this rank is blocked in: what, file:line, since (wall clock), its number among
        the collectives the rank entered (``n``) and its bytes; None when it is in none."""
        cur, n = self.current, self.current_n
        if cur is None:
            return None
        out: dict[str, Any] = {"what": cur[0], "location": cur[1], "since_s": self.wall0 + cur[2]}
        if n is not None:
            out["n"], out["bytes"] = n
        return out

    def snapshot(self) -> dict[str, Any]:
        self.timers.finish(st for st in self._ddp_state.values() if st.get("timers"))
        self._finish_rounds()
        self._graph_facts()
        return {
            "backend": self.backend,
            "devices": sorted(self.devices),
            "ddp": self.ddp,
            "per_step": {str(k): v for k, v in sorted(self.per_step.items())},
            "sites": list(self.sites.values()),
            "calls": self.calls,
            "current": self.current_record(),
            "entered": self.entered,
            "env": {k: os.environ[k] for k in NCCL_ENV if k in os.environ},
        }
