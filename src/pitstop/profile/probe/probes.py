"""Measured what-ifs, run in the user's process after the script stopped, on its own model and last batch.

A rule may only claim a saving that was measured here: forward+backward of the top-level model in fp32
vs autocast, float64 vs float32 (each dtype component: ``probe_float64``), as it ran vs each component's change (NCHW vs
channels_last: ``pitstop.recipes.channels_last``), on CUDA each process-wide setting off vs on
(cudnn.benchmark, TF32: ``pitstop.profile.probe.gpu_probes``), the optimizer's step as it ran vs foreach,
and (CPU) glibc's malloc as it was vs freed memory kept mapped. Variants are timed in rotating
rounds by ``pitstop.measure``, so each saving comes with the bounds of its 95% interval
(``saving_lo_s``, ``saving_hi_s``), except the malloc one, which cannot be undone in the process and so
runs last, before then after, and is marked ``confirmed: False``. Each probe is bounded in time and
skipped (with the reason) when the model is too large to copy or a single pass is too slow.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils._pytree import tree_map_only

from pitstop import matmul
from pitstop.host import precision
from pitstop.measure.clock import Stopwatch, time_block, time_calls
from pitstop.profile.probe import gpu_probes
from pitstop.profile.probe.probe_kit import (
    MAX_COPY_BYTES,
    PROBE_BUDGET_CAP_S,
    PROBE_BUDGET_S,
    PROBE_ROUNDS,
    Timed,
    as_script,
    fwd_bwd,
    probe_budget,
    saving,
    sync,
    timed,
)
from pitstop.recipes import autocast, components, model_components, optimizer_impl
from pitstop.recipes.component import DTYPE, ModelComponent
from pitstop.train import optim

if TYPE_CHECKING:
    from pitstop.recipes.component import DtypeComponent

MAX_PASS_S = 5.0  # one forward+backward slower than this: not worth probing at exit
BUDGET_S = 20.0  # all probes together (more for slow passes: ``PASSES_IN_BUDGET``)
PASSES_IN_BUDGET = 24  # the model probes time about this many passes at their sequential first look


def all_probes_budget(pass_s: float | None) -> float:
    """Seconds for all probes together: ``BUDGET_S``, or ``PASSES_IN_BUDGET`` of the model's passes
    where one is slow (the model probes' budgets scale with it), capped at that many passes of
    ``MAX_PASS_S`` (the slowest pass probed)."""
    return min(PASSES_IN_BUDGET * MAX_PASS_S, max(BUDGET_S, PASSES_IN_BUDGET * (pass_s or 0.0)))


def run_probes(
    model: torch.nn.Module | None,
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None,
    model_facts: dict[str, Any],
    optimizers: list[tuple[torch.optim.Optimizer, dict[str, Any]]],
    loaders: list[Any] | None = None,
) -> dict[str, Any]:
    """All applicable probes; each entry has the medians and 'saving_s' (>0 = the change is faster).
    ``loaders``: the script's (``CapturedLoader``), once it has ended: the thread probe loads a batch."""
    from pitstop.profile.probe import thread_probe  # it times through this module

    spent = Stopwatch()  # the probes' budget
    # threads vs the cores left free, first: the probes after it run on the script's threads as they were
    out: dict[str, Any] = thread_probe.run(model, inputs, model_facts, loaders=loaders)
    if model is not None and inputs is not None:
        try:
            out.update(_model_probes(model, inputs, model_facts))
        except Exception as e:
            out["error"] = f"model probes failed: {type(e).__name__}: {e}"
    budget = all_probes_budget(out.get("pass_s"))
    for opt, facts in optimizers:
        if spent.elapsed() > budget:
            out.setdefault("skipped", []).append("optimizer: time budget spent")
            break
        if facts.get("impl") == "for-loop" and facts.get("supports_foreach"):
            try:
                res = _optimizer_probe(opt, facts)
            except Exception as e:
                res = {"type": facts.get("type"), "error": f"{type(e).__name__}: {e}"}
            out.setdefault("optimizer", []).append({**res, "location": facts.get("location")})
    # Last: it changes malloc for the rest of the process.
    p = next(model.parameters(), None) if model is not None else None
    if p is not None and p.device.type == "cpu" and inputs is not None and out.get("pass_s", 0) <= MAX_PASS_S:
        if spent.elapsed() > budget:
            out.setdefault("skipped", []).append("host_memory: time budget spent")
        else:
            try:
                out["host_memory"] = _host_memory_probe(
                    model, inputs, model_facts, [o for o, _ in optimizers]
                )
            except Exception as e:
                out["host_memory"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _model_probes(
    model: torch.nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], facts: dict[str, Any]
) -> dict[str, Any]:
    args, kwargs = inputs
    p = next(model.parameters(), None)
    if p is None:
        return {}
    dev = p.device.type
    out: dict[str, Any] = {"device_type": dev}
    script_autocast = facts.get("autocast_dtype") if facts.get("autocast") else None

    def autocast_of_script() -> contextlib.AbstractContextManager[Any]:
        return as_script(dev, facts)

    def base() -> None:
        with autocast_of_script():
            fwd_bwd(model, args, kwargs)

    one = time_block(base, 1, lambda: sync(dev))
    out["pass_s"] = one
    if one > MAX_PASS_S:
        out["skipped"] = [f"one forward+backward took {one:.1f} s (> {MAX_PASS_S} s)"]
        return out

    # precision: only when the script runs fp32 and this hardware has a fast low-precision path
    amp_dtype = precision.preferred_amp_dtype(dev) if dev in ("cpu", "cuda") else None
    fp32 = facts.get("param_dtypes") == ["float32"] and not script_autocast
    slow = _slow_amp(amp_dtype, dev, one) if fp32 and amp_dtype else None
    if slow:
        out["precision"] = {"dtype": None, "skipped": slow, "slower": True}
    elif fp32 and amp_dtype:

        def amp() -> None:
            with autocast.context(dev, amp_dtype):
                fwd_bwd(model, args, kwargs)

        fp32_arm, amp_arm = autocast.ARMS
        out[autocast.PROBE] = {
            "dtype": amp_dtype,
            **saving(timed({fp32_arm: base, amp_arm: amp}, dev), fp32_arm, amp_arm),
        }
    elif fp32:
        why = matmul.cpu_bf16_line() if dev == "cpu" else f"no fast bf16/fp16 path on this {dev}"
        out["precision"] = {"dtype": None, "skipped": why}

    for dt in cast("list[DtypeComponent]", components(DTYPE)):  # float32 for a float64 model
        if dt.applies(facts):
            from pitstop.profile.probe import probe_float64

            out[dt.PROBE] = probe_float64.run(dt, model, args, kwargs, facts, base, dev)

    for comp in model_components():  # channels_last, ...: the model as it ran vs a changed copy
        if comp.applies(facts):
            _component_probe(comp, model, inputs, facts, base, out)

    if dev == "cuda":  # fp16+GradScaler, cudnn.benchmark, TF32, pinned/non_blocking copies (gpu_probes)
        out.update(gpu_probes.run(model, args, kwargs, facts, base))
    return out


def _component_probe(
    comp: ModelComponent,
    model: torch.nn.Module,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    facts: dict[str, Any],
    base: Callable[[], None],
    out: dict[str, Any],
) -> None:
    """``comp``'s probe (``pitstop.recipes.component``): ``base`` (the model as it ran) against a copy
    changed by ``comp.apply_model`` and fed ``comp.apply_input``, under the script's autocast; its result
    in ``out[comp.PROBE]``, or a ``skipped`` line when the model is too large to copy."""
    if facts.get("param_bytes", 0) * 2 > MAX_COPY_BYTES:
        out.setdefault("skipped", []).append(f"{comp.NAME}: model too large to copy for the probe")
        return
    dev = next(model.parameters()).device.type
    args, kwargs = comp.apply_input(inputs[0]), comp.apply_input(inputs[1])
    changed_model = comp.apply_model(copy.deepcopy(model))

    def changed() -> None:
        with as_script(dev, facts):
            fwd_bwd(changed_model, args, kwargs)

    t = timed({comp.ARMS[0]: base, comp.ARMS[1]: changed}, dev)
    out[comp.PROBE] = saving(t, *comp.ARMS)


def _slow_amp(dtype: str, dev: str, fp32_pass_s: float) -> str | None:
    """Why the autocast probe would not fit its bound: its matmuls measured slower than fp32 here (a
    bounded torch.mm check first), so a pass could take up to the ratio times the fp32 pass."""
    lp = matmul.low_precision(dtype, dev)
    amp_pass = matmul.predicted_s(fp32_pass_s, lp.fp32.flops_per_s, lp.peak.flops_per_s)
    if lp.slower and (amp_pass > MAX_PASS_S or 4 * (fp32_pass_s + amp_pass) > BUDGET_S / 2):
        return f"{lp.summary()}: one {dtype} pass could take {amp_pass:.1f} s, over the probes' bound"
    return None


def _host_memory_probe(
    model: torch.nn.Module,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    facts: dict[str, Any],
    optimizers: list[torch.optim.Optimizer],
) -> dict[str, Any]:
    """A training step on the script's last batch (fresh copy, forward+backward, the optimizers' step)
    with malloc as the script left it, then with ``keep_host_memory``; page faults of each pass counted.
    Before/after, not interleaved: mallopt cannot be undone, so this probe runs last (the model's
    parameters move with the steps; nothing reads them afterwards)."""
    from pitstop.host import event_costs
    from pitstop.recipes import host_memory

    # "kept": freed memory already stays mapped, so there is nothing to probe and the rules say so.
    if lib := host_memory.preloaded_allocator():
        return {"skipped": f"{lib} is preloaded and keeps freed memory", "kept": True}
    if (done := host_memory.kept()) is not None:
        return {"skipped": f"the script already called keep_host_memory: {done.detail}", "kept": done.applied}
    if reason := host_memory.blocker():
        return {"skipped": reason, "kept": False}
    args, kwargs = inputs
    closing = any(optim.needs_closure(opt) for opt in optimizers)

    def series(reps: int = 7, budget_s: float = 4.0) -> tuple[float, float]:
        faults: list[int] = []

        def counted() -> None:  # the fault counter is one getrusage call: noise against a pass
            f0 = host_memory.minor_page_faults()
            _fwd_bwd_as_script()
            faults.append(host_memory.minor_page_faults() - f0)

        _fwd_bwd_as_script()  # warm-up: after the switch, this pass fills the heap the rest reuse
        times = time_calls(counted, reps, budget_s=budget_s, min_calls=3)
        return statistics.median(times), statistics.median(faults)

    def _fwd_bwd_as_script() -> None:
        # A fresh copy of the batch each pass, as the DataLoader makes one each step: its pages count too.
        a, k = tree_map_only(torch.Tensor, torch.clone, (args, kwargs))

        def closure() -> torch.Tensor:
            with as_script("cpu", facts):
                return fwd_bwd(model, a, k)

        if not closing:
            closure()
        for opt in optimizers:
            optim.step(opt, closure)  # a closure optimizer (LBFGS) runs it itself, as in the script

    base_s, base_faults = series()
    result = host_memory.keep_host_memory()
    if not result.applied:
        return {"skipped": result.detail, "base_s": base_s, "base_faults": base_faults}
    new_s, new_faults = series()
    return {
        "base_s": base_s,
        "new_s": new_s,
        "saving_s": base_s - new_s,
        "base_faults": base_faults,
        "new_faults": new_faults,
        "detail": result.detail,
        "isolated_fault_s": event_costs.page_fault_s(),  # the bound on what one fault may be charged
        # before/after in one process: whatever warmed up in between counts as saving, so no interval
        "confirmed": False,
    }


def _optimizer_probe(opt: torch.optim.Optimizer, facts: dict[str, Any]) -> dict[str, Any]:
    if optim.needs_closure(opt):  # its step re-evaluates the model: not an optimizer step alone
        return {"type": facts.get("type"), "skipped": "its step() runs the model again (closure)"}
    params = [p for g in opt.param_groups for p in g["params"]]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    if nbytes * 4 > MAX_COPY_BYTES:
        return {"type": facts.get("type"), "skipped": "model too large to copy for the probe"}
    for p in params:  # a step needs gradients; the script's are gone after zero_grad
        if p.grad is None:
            p.grad = torch.randn_like(p) * 1e-3
    base, new = optimizer_impl.ARMS
    as_is, changed = copy.deepcopy(opt), optimizer_impl.changed(opt)
    dev = params[0].device.type if params else "cpu"
    t = timed({base: as_is.step, new: changed.step}, dev, reps=7)
    return {"type": facts.get("type"), **saving(t, base, new)}


# the timing of one probe lives in probe_kit; served here too, where callers have always found it
__all__ = [
    "BUDGET_S",
    "MAX_PASS_S",
    "PASSES_IN_BUDGET",
    "PROBE_BUDGET_CAP_S",
    "PROBE_BUDGET_S",
    "PROBE_ROUNDS",
    "Timed",
    "all_probes_budget",
    "probe_budget",
    "run_probes",
    "saving",
    "timed",
]
