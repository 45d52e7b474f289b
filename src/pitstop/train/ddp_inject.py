"""DDP settings ``pitstop fix`` injects into every rank of a launch, without editing the script.

- ``ddp_static_graph``: each ``DistributedDataParallel`` the script builds gets ``static_graph=True`` (the
  constructor's own ``_set_static_graph``). ``pitstop fix`` proposes it only when the profile saw the same
  parameters used every step on every rank (the reducer's ``_ddp_graph_static``).
- ``ddp_no_sync`` = k: gradient accumulation over k micro-batches per optimizer step, as ``no_sync()``
  would do it. After the script's first optimizer step, the forwards of each DDP model are counted; every
  one but each k-th runs with ``require_backward_grad_sync`` off (what ``model.no_sync()`` sets), so its
  backward accumulates the gradient locally, and the k-th forward's backward all-reduces the sum. DDP
  averages gradients, so the all-reduced sum of k micro-batches equals the sum of k all-reduced
  micro-batches: the step sees the same gradients. Should the script step after a forward that ran
  without sync (its accumulation count differs from k), the step's pre-hook all-reduces the gradients the
  same way DDP does (sum, divided by the group size) first, so no step ever sees a rank's local gradient.

Installed by ``pitstop.profile.rank.rank_worker`` before the communication recorder, undone after it, with the
rank's ``Overrides``; and by ``pitstop.train.no_sync_every`` in a script that asks for it.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from typing import Any

import torch

from pitstop.patching import Patches


class DDPInjection:
    """The DDP overrides of one rank; ``facts()`` says what they did (written with the rank's record)."""

    def __init__(self, every: int | None = None, static_graph: bool = False) -> None:
        self.every = every
        self.static_graph = static_graph
        self._patches = Patches()
        self._models: dict[int, dict[str, Any]] = {}  # id(ddp) -> forwards since the last step, pending
        self.steps = 0
        self.unsynced_forwards = 0
        self.synced_forwards = 0
        self.fixups = 0  # steps whose gradients pitstop all-reduced (the script's count differed from k)
        self.static_graphs = 0
        self.errors: list[str] = []

    @property
    def active(self) -> bool:
        return bool(self.every or self.static_graph)

    def install(self) -> None:
        if not self.active:
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        if self.static_graph:
            self._patches.patch(DDP, "__init__", self._wrap_init(DDP.__init__))
        if self.every:
            self._patches.patch(DDP, "forward", self._wrap_forward(DDP.forward))
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._patches.handle(register_optimizer_step_pre_hook(self._before_step))
            self._patches.handle(register_optimizer_step_post_hook(self._after_step))

    def uninstall(self) -> None:
        self._patches.undo()

    def _wrap_init(self, orig: Any) -> Any:
        inj = self

        @functools.wraps(orig)
        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            orig(ddp, *args, **kwargs)
            if getattr(ddp, "static_graph", False):
                return
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "find_unused_parameters=True is not needed"
                    ddp._set_static_graph()
                inj.static_graphs += 1
            except Exception as e:
                inj.errors.append(f"static_graph: {type(e).__name__}: {e}")

        return __init__

    def _wrap_forward(self, orig: Any) -> Any:
        inj = self
        every = int(self.every or 0)

        @functools.wraps(orig)
        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled() or not ddp.require_backward_grad_sync or inj.steps == 0:
                return orig(ddp, *args, **kwargs)  # eval, the script's own no_sync, the first step
            st = inj._models.setdefault(id(ddp), {"ref": weakref.ref(ddp), "n": 0, "pending": False})
            st["n"] += 1
            if st["n"] % every == 0:
                st["pending"] = False
                inj.synced_forwards += 1
                return orig(ddp, *args, **kwargs)
            st["pending"] = True
            inj.unsynced_forwards += 1
            ddp.require_backward_grad_sync = False
            try:
                return orig(ddp, *args, **kwargs)
            finally:
                ddp.require_backward_grad_sync = True

        return forward

    def _before_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        for st in self._models.values():
            ddp = st["ref"]()
            if ddp is not None and st["pending"]:
                self._all_reduce_grads(ddp)
                st["pending"] = False
                self.fixups += 1

    def _after_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        for st in self._models.values():
            st["n"] = 0

    @staticmethod
    def _all_reduce_grads(ddp: Any) -> None:
        """DDP's reduction of the gradients (sum over the group, divided by its size), in one call."""
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [p.grad for p in ddp.module.parameters() if p.requires_grad and p.grad is not None]
        if not grads:
            return
        group = getattr(ddp, "process_group", None)
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat /= dist.get_world_size(group)
        for g, v in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(v)

    def facts(self) -> dict[str, Any]:
        return {
            "no_sync_every": self.every,
            "unsynced_forwards": self.unsynced_forwards,
            "synced_forwards": self.synced_forwards,
            "fixup_steps": self.fixups,
            "static_graph": self.static_graph,
            "static_graph_models": self.static_graphs,
            "errors": list(self.errors),
        }

    def not_applied(self) -> list[str]:
        """Overrides that changed nothing in this run, and why (the fix judge rejects those)."""
        out = list(self.errors)
        if self.every and not self.unsynced_forwards:
            out.append("ddp_no_sync: no DDP forward ran without gradient sync (no accumulation seen)")
        elif self.every and not self.synced_forwards:
            out.append(
                f"ddp_no_sync: no step had {self.every} micro-batches; every step's gradients were "
                "all-reduced by pitstop before it instead"
            )
        if self.static_graph and not self.static_graphs and not self.errors:
            out.append("ddp_static_graph: no DDP model was built without static_graph")
        return out


def install(every: int | None = None, static_graph: bool = False) -> DDPInjection:
    """``ddp_no_sync`` = ``every`` and ``ddp_static_graph``, installed (nothing where torch.distributed
    is missing)."""
    inj = DDPInjection(every, static_graph)
    with contextlib.suppress(ImportError):
        inj.install()
    return inj
