"""The optimizer's implementation (for-loop -> foreach / fused kernels), the ``foreach`` recipe: what pitstop
knows about it, in one module (``pitstop.recipes.component``'s layout; not a model component, so the
registry's entry does not name it in ``component`` and its parts are called by name).

A for-loop optimizer launches a few kernels per parameter; ``foreach=True`` batches them across
parameters, ``fused=True`` (Adam/AdamW/SGD where the device has the kernels) runs one. Which command
calls which part:

- ``pitstop.train.make_optimizer`` (and so ``fit`` and ``pitstop bench``'s ``fused`` row): ``kwargs``;
- ``pitstop profile --override optimizer_impl`` (``Knobs.optimizer_impl``, ``pitstop fix``'s runs):
  ``inject`` on every optimizer's constructor defaults (``pitstop.profile.capture.torchcalls``);
- profile's exit probe: the optimizer as it ran (``ARMS[0]``) against ``changed`` (``ARMS[1]``), stored
  under ``PROBE``; profile's rules: ``PHASES`` bound its saving;
- ``pitstop fix``: ``cannot_help`` on the recorded optimizers, ``choose`` the implementation to try;
- a finding's code: ``SNIPPET``.

torch is imported only where an optimizer is copied, so the registry reads this without torch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

NAME = "foreach"
KNOB = "optimizer_impl"  # the ``Knobs`` field: "foreach" or "fused"
FINDING = "optimizer.foreach"
PROBE = "optimizer"
ARMS = ("as_is", "foreach")
PHASES = ("optimizer_s",)  # the part of the step its saving lives in
SNIPPET = "torch.optim.{optimizer}(params, ..., {impl}=True)"
IMPLS = ("foreach", "fused")


def choose(device_type: str) -> str:
    """The implementation ``pitstop fix`` tries: fused on CUDA (one kernel), else foreach."""
    return "fused" if device_type == "cuda" else "foreach"


def kwargs(fused: bool) -> dict[str, bool]:
    """The constructor keyword ``pitstop.train.make_optimizer`` passes: fused where supported, else foreach."""
    return {"fused": True} if fused else {"foreach": True}


def inject(defaults: Any, impl: str | None) -> tuple[Any, str | None]:
    """An optimizer's constructor ``defaults`` with ``impl`` on and the other one off, and the impl set;
    as they are (and None) where the optimizer has no such option."""
    if not impl or not isinstance(defaults, dict) or impl not in defaults:
        return defaults, None
    out = dict(defaults)
    out[impl] = True
    other = "fused" if impl == "foreach" else "foreach"
    if other in out:
        out[other] = None if other == "fused" else False
    return out, impl


def changed(opt: Any) -> Any:
    """The probe's changed arm: a copy of ``opt`` (its state too) that steps with foreach."""
    new = copy.deepcopy(opt)
    for g in new.param_groups:
        g["foreach"] = True
    return new


def cannot_help(optimizers: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the change has nothing to act on: every recorded optimizer is foreach or fused already."""
    if optimizers and all(o.get("impl") in IMPLS for o in optimizers):
        return "foreach: every optimizer already uses a foreach/fused implementation"
    return None
