"""Wrappers of the torch calls that mark a step's phases: ``Tensor.to``/``Tensor.cuda`` (host-to-device
copies), ``Tensor.backward``/``torch.autograd.backward``/``torch.autograd.grad`` (backward),
``Optimizer.__init__`` (optimizers built; the optimizer_impl override) and the global optimizer step
hooks (the optimizer phase); and ``torch.set_num_threads`` under the ``num_threads`` override.

Each wrapper is ``functools.wraps`` of the original (same name, signature, docstring) and calls straight
through while ``torch.compile``/``torch.export`` trace, so compiled graphs are unchanged.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import torch

from pitstop.profile.capture.where import user_location
from pitstop.recipes import optimizer_impl, threads

if TYPE_CHECKING:
    from pitstop.profile.capture.patches import Patches
    from pitstop.profile.capture.points import ProbePoints

clock = time.perf_counter
is_compiling = torch.compiler.is_compiling


def install_torch_patches(inst: ProbePoints, patches: Patches) -> None:
    for install_part in PARTS.values():
        install_part(inst, patches)
    if inst.cfg.overrides.num_threads:
        threads.inject(patches, int(inst.cfg.overrides.num_threads))


def patch_optimizer_init(inst: ProbePoints, patches: Patches) -> None:
    patches.patch(torch.optim.Optimizer, "__init__", _make_opt_init(inst, torch.optim.Optimizer.__init__))


def patch_copies(inst: ProbePoints, patches: Patches) -> None:
    patches.patch(torch.Tensor, "to", _make_to(inst, torch.Tensor.to))
    patches.patch(torch.Tensor, "cuda", _make_to(inst, torch.Tensor.cuda))


def patch_backward(inst: ProbePoints, patches: Patches) -> None:
    patches.patch(torch.Tensor, "backward", _make_backward(inst, torch.Tensor.backward, loss_arg=True))
    patches.patch(torch.autograd, "backward", _make_backward(inst, torch.autograd.backward, loss_arg=True))
    patches.patch(torch.autograd, "grad", _make_backward(inst, torch.autograd.grad, loss_arg=False))


def hook_optimizer_steps(inst: ProbePoints, patches: Patches) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    patches.handle(register_optimizer_step_pre_hook(inst.optimizer_begin))
    patches.handle(register_optimizer_step_post_hook(inst.optimizer_end))


# the parts of ``install_torch_patches``, in its order (``benchmarks/profile_overhead_layers.py`` times each)
PARTS = {
    "optinit": patch_optimizer_init,
    "to": patch_copies,
    "backward": patch_backward,
    "opthooks": hook_optimizer_steps,
}


def _make_opt_init(inst: ProbePoints, orig: Any) -> Any:
    @functools.wraps(orig)
    def __init__(self: torch.optim.Optimizer, params: Any, defaults: dict[str, Any]) -> None:
        defaults, applied = optimizer_impl.inject(defaults, inst.cfg.overrides.optimizer_impl)
        orig(self, params, defaults)
        facts = {
            "type": type(self).__name__,
            "location": user_location(3),
            "foreach": defaults.get("foreach") if isinstance(defaults, dict) else None,
            "fused": defaults.get("fused") if isinstance(defaults, dict) else None,
            "supports_foreach": isinstance(defaults, dict) and "foreach" in defaults,
            "supports_fused": isinstance(defaults, dict) and "fused" in defaults,
            "override": applied,
            "impl": None,  # filled in at the end (needs the params' device)
        }
        # an optimizer initialised twice (a subclass re-running Optimizer.__init__) is one optimizer
        for i, opt in enumerate(inst.captured.optimizers):
            if opt is self:
                inst.optimizer_facts[i] = facts
                return
        inst.captured.optimizers.append(self)
        inst.optimizer_facts.append(facts)

    return __init__


def _make_to(inst: ProbePoints, orig: Any) -> Any:
    @functools.wraps(orig)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if inst.in_next or not self.is_cpu or is_compiling():
            return orig(self, *args, **kwargs)
        dev = inst.captured.device
        start = None
        if dev is not None and dev.type == "cuda":
            # Time the copy on the GPU without a sync: the events are read once, at the end.
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        inst.copy_begin(clock())
        try:
            out = orig(self, *args, **kwargs)
        except BaseException:
            inst.copy_end(clock(), None)
            raise
        if not isinstance(out, torch.Tensor) or out.is_cpu:
            inst.copy_end(clock(), None)
            return out
        end = None
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        inst.copy_end(clock(), out.device, (start, end) if end is not None else None)
        return out

    return to


def _make_backward(inst: ProbePoints, orig: Any, loss_arg: bool) -> Any:
    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if inst.in_backward or is_compiling():  # nested (Tensor.backward calls autograd.backward)
            return orig(*args, **kwargs)
        loss = args[0] if loss_arg and args else None
        inst.backward_begin(loss if isinstance(loss, torch.Tensor) else None, clock())
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            inst.backward_end(clock(), failed=True)
            raise
        inst.backward_end(clock())
        return out

    return backward
