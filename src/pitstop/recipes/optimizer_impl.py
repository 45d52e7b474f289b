"""The optimizer's implementation (for-loop -> foreach / fused kernels), the ``foreach`` recipe, as one
component (``pitstop.recipes.component``) whose ``SURFACE`` is the optimizer: all that pitstop knows and
does about it.

A for-loop optimizer launches a few kernels per parameter; ``foreach=True`` batches them across
parameters, ``fused=True`` (Adam/AdamW/SGD where the device has the kernels) runs one. Which command
calls which part:

- ``pitstop.train.make_optimizer`` (and so ``fit`` and ``pitstop bench``'s ``fused`` row): ``kwargs``;
- ``pitstop profile --override optimizer_impl`` (``Knobs.optimizer_impl``, ``pitstop fix``'s runs):
  ``inject`` on every optimizer's constructor defaults (``pitstop.profile.capture.torchcalls``);
- profile's exit probe: the optimizer as it ran (``ARMS[0]``) against ``changed`` (``ARMS[1]``), stored
  under ``PROBE``; profile's rules: ``rules`` (one finding per site, with ``RULE``'s texts and profile's
  verdicts), ``PHASES`` bound its saving;
- ``pitstop fix``: ``cannot_help`` on the recorded optimizers, ``choose`` the implementation to try;
  ``fix --apply``: ``edit`` (the implementation's keyword on every recorded optimizer's constructor);
- a finding's code: ``SNIPPET``.

torch is imported only where an optimizer is copied, so the registry reads this without torch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pitstop.findings import Finding
from pitstop.measure import NO_GAIN
from pitstop.recipes.component import OPTIMIZER, Judge, ProbeRule
from pitstop.recipes.editing import OptimizerEditor
from pitstop.recipes.entries import entry
from pitstop.units import duration as ms

NAME = "foreach"
KNOB = "optimizer_impl"  # the ``Knobs`` field: "foreach" or "fused"
SURFACE = OPTIMIZER
FINDING = "optimizer.foreach"
PROBE = "optimizer"
ARMS = ("as_is", "foreach")
PHASES = ("optimizer_s",)  # the part of the step its saving lives in
SNIPPET = "torch.optim.{optimizer}(params, ..., {impl}=True)"
IMPLS = ("foreach", "fused")

# ``rules``' texts, for one site: ``{type}`` the optimizer class; ``{built}``, ``{their}``, ``{params}``,
# ``{timed}`` the evidence's parts; ``{base}``, ``{new}`` the probe's medians
RULE = ProbeRule(
    NAME,
    title="{type} uses neither foreach nor fused kernels",
    evidence="{built} a Python loop over {their} {params} parameter tensors; {timed}",
    fix="Ask for the multi-tensor implementation (fused=True where supported is faster still).",
    pass_evidence="{type} one step: as built {base}, foreach {new}",
)

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="foreach / fused optimizer",
    train="pitstop.train.optim.make_optimizer",
    bench=(("fused", "fused optimizer"),),
    apply="pitstop.fix.apply.apply_component",
    site="optimizer",
)


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


def rules(bd: Any, optimizers: list[dict[str, Any]], probes: dict[str, Any], judge: Judge) -> list[Finding]:
    """One finding per site (optimizer type and the line that built it) whose optimizers run a Python
    loop over their parameters; optimizers built at one line (one per model part) count together. A
    site whose probe measured no gain has none (NO_GAIN) or an undecided one; ``bd``: the run's
    ``Breakdown``, ``judge``: profile's verdicts."""
    sites: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for opt in optimizers:
        if opt.get("impl") == "for-loop":
            sites.setdefault((opt.get("type"), opt.get("location")), []).append(opt)
    measured = [p for p in probes.get(PROBE, []) if "saving_s" in p]
    out: list[Finding] = []
    for (kind, where), opts in sites.items():
        # probes from before they carried a location matched by type alone
        mine = [p for p in measured if p.get("type") == kind and p.get("location", where) == where]
        p = site_probe(mine)
        text: dict[str, Any] = {
            "type": kind,
            **({"base": ms(p["base_s"]), "new": ms(p["new_s"])} if p else {}),
        }
        if p is not None and not judge.probe_helps(p):
            if judge.saving_verdict(p, bd.median_total_s) != NO_GAIN:  # no faster, but a gain not ruled out
                what = RULE.pass_evidence.format(**text)
                out.append(judge.undecided(NAME, p, bd.median_total_s, what, where))
            continue  # measured: foreach saves under the warning's share of the step here
        saving, share = judge.cost(bd, p["saving_s"]) if p else (None, None)
        n = len(opts)
        text.update(
            built=f"{n} {kind} optimizers built here run" if n > 1 else f"{kind} runs",
            their="their" if n > 1 else "its",
            params=sum(o.get("params") or 0 for o in opts) or "?",
            timed=f"one step{' of each' if n > 1 else ''}: as built {text['base']}, foreach {text['new']} "
            "(measured after the run)"
            if p
            else f"optimizer time {ms(bd.parts['optimizer_s'])} per step (foreach not measured)",
        )
        data: dict[str, Any] = {"optimizer": opts[0], "probe": p}
        if n > 1:
            data["optimizers"] = opts
        out.append(
            Finding(
                id=FINDING,
                severity=judge.sev(share),
                title=RULE.title.format(**text),
                evidence=RULE.evidence.format(**text),
                data=data,
                fix=RULE.fix,
                fix_code=SNIPPET.format(optimizer=kind, impl="foreach"),
                location=where,
                est_saving_s=saving,
                share=share,
            )
        )
    return out


def site_probe(probes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The foreach probe of one site: its one optimizer's, or the sum over the site's optimizers (each
    steps once a step), bounds summed too."""
    if len(probes) < 2:
        return probes[0] if probes else None
    out: dict[str, Any] = {
        "type": probes[0].get("type"),
        "location": probes[0].get("location"),
        "members": probes,
    }
    for key in ("base_s", "new_s", "saving_s", "saving_lo_s", "saving_hi_s"):
        vals = [p.get(key) for p in probes]
        if all(isinstance(v, int | float) for v in vals):
            out[key] = sum(vals)
    return out


def edit(editor: OptimizerEditor) -> dict[str, Any]:
    """The fix's implementation (foreach where it names none) as a keyword of every recorded optimizer's
    constructor call."""
    impl = editor.setting or "foreach"
    editor.keywords({impl: True})
    return {"optimizer": {impl: True}}
