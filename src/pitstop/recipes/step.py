"""The step loop's structure as one component (``pitstop.recipes.component``, ``SURFACE`` ``STEP``):
gradient accumulation (k micro-batches per optimizer step, the loss scaled by 1/k), DDP's ``no_sync``
among them, and DDP's ``static_graph``. Grouped in one module: the three share the step loop and the one
mechanism that injects the DDP settings into an unmodified script (``DDPInjection``), and keeping them
together keeps ``pitstop.recipes`` within its module limit. The component is the ``no_sync`` entry
(``NAME``, ``KNOB``, ``FINDING``, ``SNIPPET``); ``accumulation`` and ``static_graph`` are entries whose
parts live here too (``ACCUMULATION_*``, ``STATIC_GRAPH_*``); ``RECIPES`` declares the three entries.
Which command calls which part:

- ``pitstop.train`` (``fit``; ``TrainConfig.accum_steps``) and bench's ``accumulation`` row:
  ``accumulate``, ``scale_loss``, ``sync_context``; ``optimizer_steps_per_epoch`` sizes schedules;
- profile's injection into every rank (``pitstop.profile.rank.rank_worker``, ``Overrides.ddp_no_sync``
  and ``ddp_static_graph``, also in ``pitstop fix``'s runs): ``install``, whose ``DDPInjection`` says
  what it did (``facts``) and what changed nothing (``not_applied``: the fix judge rejects those);
- profile's rules over a launch's ranks (``pitstop.profile.analyze.dist_rules``, on the ranks' summaries,
  with profile's warning share): ``no_sync_rule`` (``FINDING``), ``static_graph_rule``
  (``STATIC_GRAPH_FINDING``: the reducer's search for unused parameters);
- ``fix --apply`` (``pitstop.fix.apply_dist.apply_no_sync``): ``EDIT_LINE`` and ``EDIT_IMPORT``, first in
  the script's main: ``no_sync_every(k)``, the mechanism fix measured;
- a finding's code: ``SNIPPET``, ``STATIC_GRAPH_SNIPPET``, ``ACCUMULATION_SNIPPET``.

Under DDP every backward all-reduces gradients; ``no_sync`` skips that on all but the last micro-batch,
so k micro-batches cost one all-reduce instead of k. The injection: ``ddp_static_graph``: each
``DistributedDataParallel`` the script builds gets ``static_graph=True`` (the constructor's own
``_set_static_graph``); ``pitstop fix`` proposes it only when the profile saw the same parameters used
every step on every rank (the reducer's ``_ddp_graph_static``). ``ddp_no_sync`` = k: after the script's
first optimizer step, the forwards of each DDP model are counted; every one but each k-th runs with
``require_backward_grad_sync`` off (what ``model.no_sync()`` sets), so its backward accumulates the
gradient locally, and the k-th forward's backward all-reduces the sum. DDP averages gradients, so the
all-reduced sum of k micro-batches equals the sum of k all-reduced micro-batches: the step sees the same
gradients. Should the script step after a forward that ran without sync (its accumulation count differs
from k), the step's pre-hook all-reduces the gradients the same way DDP does (sum, divided by the group
size) first, so no step ever sees a rank's local gradient.

torch is imported only inside the functions that use it, so the registry reads this without torch.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pitstop.findings import Finding, Severity
from pitstop.patching import Patches
from pitstop.recipes.component import STEP
from pitstop.recipes.entries import Recipe, entry
from pitstop.units import duration as ms

if TYPE_CHECKING:
    import torch

NAME = "no_sync"
KNOB = "ddp_no_sync"  # the ``Overrides`` field: micro-batches per optimizer step
SURFACE = STEP
FINDING = "ddp.no_sync"
SNIPPET = (
    "ctx = model.no_sync() if (i + 1) % {value} else contextlib.nullcontext()  # all but the last\n"
    "with ctx:\n    criterion(model(x), y).backward()"
)
EDIT_LINE = "no_sync_every({k})  # DDP all-reduces once per optimizer step"
EDIT_IMPORT = "from pitstop.train import no_sync_every"

STATIC_GRAPH = "static_graph"
STATIC_GRAPH_KNOB = "ddp_static_graph"
STATIC_GRAPH_FINDING = "ddp.find_unused_parameters"
STATIC_GRAPH_SNIPPET = (
    "DDP(model, ..., static_graph=True)  # the same parameters are used (or unused) every step"
)

ACCUMULATION = "accumulation"
ACCUMULATION_SNIPPET = (
    "loss = criterion(model(x), y) / accum_steps\nloss.backward()\n"
    "if (i + 1) % accum_steps == 0:\n    optimizer.step()\n    optimizer.zero_grad(set_to_none=True)"
)

# the registry entries, in registry order: accumulation and static_graph are entries with no component
RECIPES = (
    Recipe(
        ACCUMULATION,
        "gradient accumulation",
        ACCUMULATION_SNIPPET,
        train="TrainConfig.accum_steps",
        bench=(("accumulation", "gradient accumulation x4"),),
        bench_knob="accumulation",
    ),
    entry(
        __name__,
        title="DDP no_sync during accumulation",
        train="pitstop.recipes.step.sync_context",
        apply="pitstop.fix.apply_dist.apply_no_sync",
    ),
    Recipe(
        STATIC_GRAPH,
        "DDP static_graph",
        STATIC_GRAPH_SNIPPET,
        finding=STATIC_GRAPH_FINDING,
        override=STATIC_GRAPH_KNOB,
        apply="pitstop.fix.apply_dist.apply_static_graph",
    ),
)

T = TypeVar("T")


def sync_context(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce when ``sync`` is False: DDP's ``no_sync()``, or FSDP2's
    ``set_requires_gradient_sync(False)`` for the duration; a no-op for plain models or when syncing.

    Wrap the micro-batch's forward *and* backward in it (the reduction is triggered by backward).
    """
    if sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()  # type: ignore[operator]
    if hasattr(model, "set_requires_gradient_sync"):
        return _fsdp2_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp2_no_sync(model: torch.nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def scale_loss(loss: torch.Tensor, accum_steps: int) -> torch.Tensor:
    """Divide by k so the summed gradients equal the mean-loss gradient of one k-times-larger batch."""
    return loss / accum_steps if accum_steps > 1 else loss


def accumulate(batches: Iterable[T], accum_steps: int) -> Iterator[tuple[T, bool]]:
    """Yield ``(batch, is_last_micro_batch)``; the flag says: sync gradients and step the optimizer now.

    A trailing group shorter than k still ends with True so no gradient is left unapplied (its loss is
    then scaled by 1/k, a slightly smaller step, as in most frameworks).
    """
    if accum_steps < 1:
        raise ValueError(f"accum_steps must be >= 1, got {accum_steps}")
    it = iter(batches)
    try:
        nxt = next(it)
    except StopIteration:
        return
    i = 0
    while True:
        cur = nxt
        try:
            nxt = next(it)
        except StopIteration:
            yield cur, True
            return
        i += 1
        yield cur, i % accum_steps == 0


def optimizer_steps_per_epoch(num_batches: int, accum_steps: int) -> int:
    """Optimizer steps one epoch of ``num_batches`` micro-batches makes (a short tail still steps)."""
    return -(-num_batches // accum_steps)


def no_sync_every(every: int) -> DDPInjection:
    """Gradient accumulation without DDP's per-micro-batch all-reduce, for a loop that calls
    ``loss.backward()`` ``every`` times per ``optimizer.step()`` and never ``model.no_sync()``: from the
    first optimizer step on, every DDP forward but each ``every``-th runs as under ``no_sync()``, and a
    step reached after an unsynced forward (an uneven last accumulation) all-reduces the gradients
    first, as DDP would, so every step sees the same averaged gradients as without it. It is the
    mechanism ``pitstop fix`` measured as its ``no_sync`` candidate (``DDPInjection``); call it once
    before training. Returns the installed injection (``.uninstall()`` undoes it)."""
    return install(every=int(every))


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

        import torch

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


# ------------------------------------------------------------------------------------------- rules
# ``summaries``: one mapping per rank (``pitstop.profile.runs.merge.rank_summary``): its ``rank``, its
# ``breakdown`` (``mean_step_s``), its DDP models' records (``ddp``) and its communication per optimizer
# step (``comm_per_step``); ``warn_share``: the share of the step from which a cost is a warning.


def static_graph_rule(summaries: Sequence[Mapping[str, Any]], warn_share: float) -> Finding | None:
    """The first rank whose DDP model searches the autograd graph for unused parameters every step
    (``find_unused_parameters=True``): what the search cost and whether the flag is needed."""
    for s in summaries:
        ddp = next((d for d in s["ddp"] if d.get("find_unused_parameters")), None)
        if ddp is None or not s["breakdown"]:
            continue
        cost = s["comm_per_step"]["unused_search_s"]
        step = s["breakdown"]["mean_step_s"]
        unused = ddp.get("unused_parameters", 0)
        needed = (
            f"{unused} of {ddp['parameters']} parameters got no gradient, so the flag is needed: "
            "remove them from the model (or freeze them) to turn it off"
            if unused
            else f"every one of the {ddp['parameters']} parameters got a gradient: the flag is not needed"
        )
        return Finding(
            id=STATIC_GRAPH_FINDING,
            severity=Severity.WARN if step and cost / step >= warn_share else Severity.INFO,
            title="DDP searches the autograd graph for unused parameters every step",
            evidence=f"rank {s['rank']}: find_unused_parameters=True (at {ddp.get('location')}); the search after "
            f"each forward took {ms(cost)} per step ({100 * cost / step:.1f}% of the step); {needed}",
            data={
                "rank": s["rank"],
                "search_s": cost,
                "unused_parameters": unused,
                "parameters": ddp["parameters"],
            },
            location=ddp.get("location"),
            fix="Pass find_unused_parameters=False (the default) when every parameter gets a gradient; "
            "static_graph=True when the same ones are unused every step.",
            fix_code="DDP(model, find_unused_parameters=False)",
            est_saving_s=cost,
            share=cost / step if step else None,
        )
    return None


def no_sync_rule(summaries: Sequence[Mapping[str, Any]], warn_share: float) -> Finding | None:
    """The first rank that all-reduced gradients more than once per optimizer step (accumulation without
    ``no_sync``): the exposed part of the extra all-reduces is its cost."""
    for s in summaries:
        c = s["comm_per_step"]
        if not s["breakdown"] or c["ddp_rounds"] <= 1.05:
            continue
        rounds = c["ddp_rounds"]
        extra = rounds - 1
        cost = c["ddp_exposed_s"] * extra / rounds
        step = s["breakdown"]["mean_step_s"]
        return Finding(
            id=FINDING,
            severity=Severity.WARN if step and cost / step >= warn_share else Severity.INFO,
            title=f"Gradient accumulation all-reduces every micro-batch: {extra:.1f} extra all-reduces per step",
            evidence=f"rank {s['rank']}: {rounds:.1f} DDP gradient all-reduces per optimizer step "
            f"({c['ddp_bytes'] / rounds / 2**20:.2f} MiB each, {ms(c['ddp_comm_s'])} in all, {ms(c['ddp_exposed_s'])} "
            f"exposed per step); only the last one before optimizer.step() is needed",
            data={"rank": s["rank"], "rounds_per_step": rounds, "extra_rounds": extra, "cost_s": cost},
            fix="Wrap the backward of every micro-batch but the last in model.no_sync().",
            fix_code="ctx = model.no_sync() if (i + 1) % accum else contextlib.nullcontext()\n"
            "with ctx:\n    loss.backward()",
            est_saving_s=cost,
            share=cost / step if step else None,
        )
    return None
