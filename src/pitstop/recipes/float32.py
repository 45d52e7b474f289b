"""A float64 model trained in float32, as one component (``pitstop.recipes.component``) whose ``SURFACE``
is the model's dtype: the model converted, its inputs converted on the way in and its outputs back on the
way out, so the script's code around the forward sees the dtypes it made. All that pitstop knows and does
about it.

A float64 model runs every matmul and convolution at half the float32 rate or less (a quarter or worse on
GPUs without fast fp64), and moves twice the bytes. The model's float64 parameters and buffers become
float32 in place (the ``Parameter`` objects stay, so an optimizer built on them keeps working, provided it
has no state yet), and float64 batches float32; tensors of other dtypes are left as they are. Which command
calls which part:

- ``pitstop.train``: none by itself; ``pitstop.train.float32`` serves ``float32_model`` and the rest to
  scripts that call them;
- ``pitstop profile --override float32`` (``Knobs.float32``, ``pitstop fix``'s runs;
  ``pitstop.profile.capture.models``): ``apply_model`` on each model found (not one called as
  ``model.forward(x)``: its inputs cannot be converted), ``apply_input`` and ``apply_output`` at each
  top-level forward;
- profile's exit probe (``pitstop.profile.probe.probe_float64``): where ``applies``, the model as it ran
  (``ARMS[0]``) against ``apply_model`` on a copy fed ``apply_input`` (``ARMS[1]``), stored under
  ``PROBE``; profile's rules: ``RULE`` (judged by ``rulekit.probe_finding``), else ``unprobed``;
- ``pitstop fix``: a plain switch of ``KNOB``; ``fix --apply``: ``edit`` (a ``ScriptEditor``);
- a finding's code: ``SNIPPET``.

torch is imported only inside the functions that touch tensors, so the registry reads this without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.recipes.component import DTYPE, ProbeRule
from pitstop.recipes.editing import ScriptEditor
from pitstop.recipes.entries import entry

NAME = "float32"
KNOB = "float32"  # the ``Knobs`` field that turns it on (profile's injection, fix's runs)
SURFACE = DTYPE
FINDING = "precision.float64"
PROBE = "float32"
ARMS = ("float64", "float32")  # the probe's arms: as the script ran, with the change (the record's dtype)
PHASES = ("forward_s", "backward_s")  # the parts of the step its saving lives in
SNIPPET = "model = model.float()  # once, before building the optimizer\nx = x.float()  # each float64 batch"
CONVERT = "{}.float()"

RULE = ProbeRule(
    NAME,
    title="The model trains in float64; float32 is faster here",
    evidence="forward+backward on the script's last batch: float64 {base}, float32 {new} (medians, measured "
    "after the run on a float32 copy of the model)",
    fix="Train in float32: convert the model once, before building the optimizer, and each float64 batch "
    "(numpy arrays give float64); keep float64 only where the numerics need it.",
    pass_title="float32 measured no faster than float64 for this model here",
    pass_evidence="forward+backward: float64 {base}, float32 {new}",
    at_model=True,
)

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="float32 instead of float64",
    train="pitstop.train.float32.float32_model",
    apply="pitstop.fix.apply.apply_component",
    site="model",
)


def applies(facts: Mapping[str, Any]) -> bool:
    """A model with float64 parameters: the probe has something to change, the rule something to say."""
    return "float64" in (facts.get("param_dtypes") or [])


def apply_model(model: Any) -> Any:
    """``model``'s float64 parameters, their gradients and its float64 buffers as float32, in place."""
    import torch

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.dtype == torch.float64:
                t.data = t.data.float()
                if t.grad is not None:
                    t.grad = t.grad.float()
    return model


def has_float64(model: Any) -> bool:
    """Whether ``model`` has a float64 parameter or buffer."""
    import torch

    return any(t.dtype == torch.float64 for t in [*model.parameters(), *model.buffers()])


def apply_input(batch: Any) -> Any:
    """Every float64 tensor in ``batch`` (nested tuples, lists, dicts) as float32."""
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.float() if t.dtype == torch.float64 else t, batch)


def apply_output(out: Any) -> Any:
    """Every float32 tensor in ``out`` as float64: what a float64 model returned, for the loss after it."""
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.double() if t.dtype == torch.float32 else t, out)


def unprobed(model: Mapping[str, Any], probes: Mapping[str, Any]) -> Finding:
    """The info finding for a float64 model whose probe did not run (``pitstop fix`` measures it)."""
    p = probes.get(PROBE) or {}
    why = p.get("skipped") or p.get("error") or probes.get("error") or "the model probes did not run"
    return Finding(
        id=FINDING,
        severity=Severity.INFO,
        title="The model trains in float64",
        evidence=f"float64 parameters ({', '.join(model['param_dtypes'])}); the float32 gain was not "
        f"measured in this run ({why}). `pitstop fix --candidates {NAME}` measures it",
        data={"param_dtypes": model["param_dtypes"], "probe": p or None},
        fix=RULE.fix,
        fix_code=SNIPPET,
        location=model.get("first_location"),
    )


def edit(editor: ScriptEditor) -> dict[str, Any]:
    """The model converted after the line that assigns it; its first input after the line that moves it
    (else before the forward), or, where the forward indexes a tensor (``model(x_all[idx])``), that tensor
    once after the line that makes it. float64 targets and losses then compute in float64 by type
    promotion, as before."""
    editor.reassign_model(CONVERT.format)
    if editor.reassign_indexed(CONVERT.format) is None:
        editor.reassign_input(CONVERT.format)
    return {KNOB: True}
