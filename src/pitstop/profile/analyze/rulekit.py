"""What every profile rule shares: the thresholds that make a cost a warning, the few formatters for
the numbers findings quote, and the bound on every finding's saving (``bounded``: no more than the part
of the step the problem lives in)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pitstop.findings import Finding, Severity
from pitstop.host.event_costs import FAULT_COST_MULTIPLE, page_fault_bound_s
from pitstop.measure import NO_GAIN, UNDECIDED, against_bar
from pitstop.profile.record.parts import ProbeResult, Probes
from pitstop.profile.record.timeline import PART_LABELS
from pitstop.recipes import components, fix_kinds, recipe
from pitstop.recipes.component import ProbeRule  # a component's rule is one (served here to the rules)
from pitstop.units import duration

if TYPE_CHECKING:
    from pitstop.profile.record.timeline import Breakdown

WARN_SHARE = 0.05  # a problem costing >= 5% of the step is worth fixing first
MIN_PROBE_GAIN = 0.05  # a probed change must save >= 5% of the probed pass to count (noise)
GPU_IDLE_PCT = 70.0
MIN_SHARE = 0.01  # a finding whose whole point is its cost is left out under 1% of the step
FAULTS_WORTH_A_RUN = 256  # untimed page faults per step (1 MiB of fresh pages) worth a `pitstop fix` run
MIN_FAULTS_TO_TIME = 200  # fewer faults saved in the probe: its time difference is mostly noise
MEASURES = ("compute.mfu",)  # info findings that report a measurement, not an unmeasured problem

Probe = ProbeResult | Mapping[str, Any]  # one probe's result, typed or as its JSON


def probe_helps(probe: Probe) -> bool:
    """A probed change counts only when it saves more than MIN_PROBE_GAIN of the probed pass."""
    p = ProbeResult.of(probe)
    saving = p.saving_s or 0.0
    return saving > MIN_PROBE_GAIN * (p.base_s or 0.0) and saving > 0


def sev(share: float | None) -> Severity:
    return Severity.WARN if share is not None and share >= WARN_SHARE else Severity.INFO


def ms(s: float) -> str:
    """A duration as every report writes one (``units.duration``: ``42.5 us``, ``65.2 ms``, ``1.75 s``)."""
    return duration(s)


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def cost(bd: Breakdown, saving: float) -> tuple[float, float]:
    saving = max(0.0, saving)
    return saving, min(1.0, saving / bd.total_s) if bd.total_s > 0 else 0.0


FWD_BWD = ("forward_s", "backward_s")
# finding id -> the parts of the step its saving lives in: fixing it cannot save more than they hold
PHASE_OF: dict[str, tuple[str, ...]] = {
    "dataloader.slow": ("data_wait_s",),
    "sync.item": ("sync_s",),
    "precision.fp16": FWD_BWD,
    # autocast, channels_last, foreach, tf32, cudnn, workers, pin_memory, ...; none for one without
    # PHASES (persistent_workers: its restarts, amortised over the epoch, may fall outside the measured
    # steps' data wait)
    **{c.FINDING: c.PHASES for c in components() if c.PHASES},
}


# costs per step over steps the breakdown leaves out (a stall's own steps, holding an eval pass): the
# breakdown's mean step does not bound them
OWN_STEPS = frozenset({"profile.stall"})


def ceiling(f: Finding, bd: Breakdown, device: str) -> tuple[float, str] | None:
    """The most ``f`` can save per step, and what that is: the parts of the step it lives in
    (``PHASE_OF``), for page faults ``FAULT_COST_MULTIPLE`` x what the run's faults cost in isolation,
    else the whole step (None for ``OWN_STEPS``). On a device that runs asynchronously (CUDA) its
    compute waits wherever the host blocks, so a compute change is bounded by the step without its data
    wait."""
    if f.id in OWN_STEPS:
        return None
    if f.id == recipe("host_memory").finding and (
        bound := page_fault_bound_s(f.data.get("isolated_fault_s"))
    ):
        return bound * bd.faults_per_step, (
            f"{FAULT_COST_MULTIPLE:g}x what its {bd.faults_per_step:,.0f} faults per step cost on this machine in "
            f"isolation ({f.data['isolated_fault_s'] * 1e6:.2f} us each)"
        )
    parts = PHASE_OF.get(f.id)
    if parts is None:
        return bd.total_s, "the whole step"
    if device != "cpu" and parts in (FWD_BWD, ("optimizer_s",)):
        parts = tuple(p for p in bd.parts if p != "data_wait_s")
    return sum(bd.parts.get(p, 0.0) for p in parts), "the " + " + ".join(PART_LABELS[p] for p in parts)


def bounded(found: list[Finding], bd: Breakdown, device: str) -> list[Finding]:
    """``found`` with each finding's saving capped at its ``ceiling``: a measured difference larger than
    the part of the step the problem lives in is more than that problem (noise, other processes, the
    probe's own warm-up). A capped finding says so in its evidence and ``data["capped"]``; its interval
    is capped too, and a warning whose capped saving (or lower bound) is under ``WARN_SHARE`` is info."""
    return [_bounded(f, bd, device) for f in found]


def _bounded(f: Finding, bd: Breakdown, device: str) -> Finding:
    saved = f.est_saving_s
    if saved is None or saved <= 0 or f.severity is Severity.PASS:
        return f
    bound = ceiling(f, bd, device)
    if bound is None or saved <= bound[0] * (1 + 1e-9):
        return f
    limit, what = bound
    data = {**f.data, "capped": {"from_s": saved, "to_s": limit, "at": what}}
    ci = data.get("saving_ci_s")
    if ci:
        data["saving_ci_s"] = ci = [min(ci[0], limit), min(ci[1], limit)]
    share = min(1.0, limit / bd.total_s) if bd.total_s > 0 else 0.0
    severity = f.severity
    if severity is Severity.WARN and (
        share < WARN_SHARE or (ci is not None and ci[0] < WARN_SHARE * bd.median_total_s)
    ):
        severity = Severity.INFO
    return replace(
        f,
        severity=severity,
        evidence=f"{f.evidence}; capped at {what} ({ms(limit)} per step): the {ms(saved)} measured is more "
        "than that holds, the rest is not this problem's",
        data=data,
        est_saving_s=limit,
        share=share,
    )
def saving_verdict(probe: Probe, step_s: float) -> str:
    """``pitstop.measure.against_bar`` for a probe's saving interval (``saving_lo_s``, ``saving_hi_s``)
    against the bar a warning must clear, ``WARN_SHARE`` of the median step: HELPED, NO_GAIN (a pass
    as decisive as a warning) or UNDECIDED (no interval, or one that straddles the bar)."""
    p = ProbeResult.of(probe)
    return against_bar(p.saving_lo_s, p.saving_hi_s, WARN_SHARE * step_s)


def scaled_text(probe: Probe) -> str:
    """'; 3 rounds in a budget scaled to 11 s for passes this slow' where the probe's budget was raised."""
    p = ProbeResult.of(probe)
    if not p.budget_scaled:
        return ""
    return f"; {p.rounds or 0} rounds in a budget scaled to {p.budget_s or 0:.0f} s for passes this slow"


def ci_text(probe: Probe) -> str:
    """'95% CI 1.2 ms–3.4 ms' for the saving's bounds, or why there are none."""
    p = ProbeResult.of(probe)
    lo, hi = p.saving_lo_s, p.saving_hi_s
    if lo is None or hi is None:
        budget = f" of {p.budget_s:.0f} s" if p.budget_s else ""
        return f"no interval: too few probe rounds fitted the probe's budget{budget}"
    return f"95% CI {ms(lo)}\u2013{ms(hi)}"


def probe_finding(
    rule: ProbeRule, bd: Breakdown, probes: Probes | Mapping[str, Any], where: str | None = None, **fields: Any
) -> list[Finding]:
    """``rule``'s finding from its recipe's probe result in ``probes`` (none when the probe did not run):
    the problem when the change measured faster (``probe_helps``; ``confirm`` then judges it by its
    interval), a pass only when the interval rules out a saving of ``WARN_SHARE`` of the step, else
    info, undecided, naming the ``pitstop fix`` run that decides it."""
    r = recipe(rule.recipe)
    p = Probes.of(probes).result(r.probe)
    if p is None or not p.timed:
        return []
    js = p.to_json()
    text = {**js, **fields, "base": ms(p.base_s), "new": ms(p.new_s)}
    location = where if rule.at_model else None
    fid = r.finding or r.name
    if probe_helps(p):
        saving, share = cost(bd, p.saving_s)
        return [
            Finding(
                id=fid,
                severity=sev(share),
                title=rule.title.format(**text),
                evidence=rule.evidence.format(**text) + scaled_text(p),
                data=js,
                fix=rule.fix.format(**text),
                fix_code=r.code(**text),
                location=location,
                est_saving_s=saving,
                share=share,
            )
        ]
    step = bd.median_total_s
    if saving_verdict(p, step) == NO_GAIN:
        if rule.pass_title is None:
            return []
        return [
            Finding(
                id=fid,
                severity=Severity.PASS,
                title=rule.pass_title.format(**text),
                evidence=f"{rule.pass_evidence.format(**text)}; saving {ms(p.saving_s)} ({ci_text(p)}): "
                f"its upper bound is under the {pct(WARN_SHARE)} of the {ms(step)} median step a warning needs",
                data={**js, "verdict": NO_GAIN, "saving_ci_s": [p.saving_lo_s, p.saving_hi_s]},
            )
        ]
    evidence = rule.pass_evidence.format(**text) or rule.evidence.format(**text)
    return [undecided(r.name, p, step, evidence, location)]


def undecided(
    name: str, probe: Probe, step_s: float, evidence: str, where: str | None, measured: str = ""
) -> Finding:
    """Info for recipe ``name`` whose probe measured no gain worth a warning without ruling one out (no
    interval, or an upper bound at ``WARN_SHARE`` of the step or above): neither a problem nor a pass,
    naming the ``pitstop fix`` run that decides it. ``measured``: the saving and its bounds, as text
    (default: the probe's saving and interval)."""
    r = recipe(name)
    p = ProbeResult.of(probe)
    bounds = [p.saving_lo_s, p.saving_hi_s] if p.saving_hi_s is not None else None
    measured = measured or f"saving {ms(p.saving_s or 0.0)} ({ci_text(p)})"
    return Finding(
        id=r.finding or r.name,
        severity=Severity.INFO,
        title=f"Undecided: does {r.title} save {pct(WARN_SHARE)} of the step here?",
        evidence=f"{evidence}; {measured}: a pass needs the upper bound under {pct(WARN_SHARE)} of the "
        f"{ms(step_s)} median step",
        data={**p.to_json(), "verdict": UNDECIDED, "saving_ci_s": bounds, "confirmed": False},
        fix=f"`pitstop fix --candidates {r.name}` times it on the whole script until its interval decides."
        if r.name in fix_kinds()
        else "A longer run (`--steps`) or a quieter machine narrows the probe's interval.",
        location=where,
    )
