"""Probe-based predictions are warnings only when their interval confirms them.

A probe (autocast, channels_last, foreach, cudnn.benchmark, the malloc thresholds, TF32, fp16) times the
change on the script's own model after the run, and its saving is a prediction: "fix this and save X ms
a step". ``pitstop.measure`` gives that saving a 95% interval when the probe's variants were interleaved
in rounds (``saving_lo_s``, ``saving_hi_s`` in the probe's record). A prediction is a warning only when
the interval's lower bound is at least ``WARN_SHARE`` of the median step; otherwise, or when there is no
interval (a before/after probe that cannot be interleaved in one process, or too few rounds), it is at
most info and its evidence says it was not confirmed. Each probe-based finding carries
``saving_ci_s: [lo, hi]`` (None where there is no interval), ``confirmed`` and ``verdict`` in its
``data``: ``pitstop.measure.against_bar`` of the interval against that bar (helped, no gain: the upper
bound under it, or undecided). Slow steps whose fresh runs fitted too few rounds for an interval are
decided by blocks of steps within those runs where the in-process probe's interval agrees
(``agreeing_blocks``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host.event_costs import page_fault_bound_s
from pitstop.measure import HELPED, NO_GAIN, UNDECIDED, against_bar
from pitstop.measure.within_runs import PER_BLOCK, RUN_SPREAD
from pitstop.profile.analyze.rulekit import MIN_PROBE_GAIN, WARN_SHARE, ms, undecided
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import by_finding, recipe


def _fp16(f: Finding) -> dict[str, Any] | None:
    return f.data.get("fp16_scaler")


def _optimizer(f: Finding) -> dict[str, Any] | None:
    return f.data.get("probe")


def _self(f: Finding) -> dict[str, Any]:
    return f.data


def _fresh_or_self(f: Finding) -> dict[str, Any]:
    """The fresh runs' measurement when it measured a saving (``pitstop.profile.confirm.fresh_confirm``), else
    the in-process probe."""
    two = f.data.get("two_process") or {}
    return two if "saving_s" in two else f.data


# finding id -> the probe record its saving was predicted from
PROBE_OF: dict[str, Callable[[Finding], dict[str, Any] | None]] = {
    recipe("amp").finding: _fresh_or_self,
    recipe("channels_last").finding: _fresh_or_self,
    recipe("float32").finding: _fresh_or_self,
    recipe("cudnn_benchmark").finding: _self,
    recipe("host_memory").finding: _fresh_or_self,
    recipe("tf32").finding: _self,
    "precision.fp16": _fp16,
    recipe("foreach").finding: _optimizer,
}


def saving_bounds(f: Finding, probe: dict[str, Any]) -> tuple[float, float] | None:
    """The finding's per-step saving interval, or None when its probe has none.

    A finding may scale the probe's saving (host.page_faults: seconds per fault in the probe times the
    run's faults per step) or offset it (precision.fp16 against bf16's time); the bounds move with the
    point estimate: scaled by the same factor, or shifted by the same offset. The two-process page-fault
    measurement times the script's whole step, so its bounds are the finding's as they are.
    """
    lo, hi, point = probe.get("saving_lo_s"), probe.get("saving_hi_s"), probe.get("saving_s")
    if lo is None or hi is None or point is None or f.est_saving_s is None:
        return None
    if probe is f.data.get("two_process"):
        return lo, hi  # measured on the whole step of the script: no scaling
    if f.id == recipe("host_memory").finding:
        factor = f.est_saving_s / point if point > 0 else 0.0
        return lo * factor, hi * factor
    shift = f.est_saving_s - point  # 0 where the finding's saving is the probe's own
    return lo + shift, hi + shift


def _no_interval_reason(probe: dict[str, Any], fresh: bool = False) -> str:
    if probe.get("confirmed") is False:
        return "no interval: the probe ran before then after in one process, which cannot be interleaved"
    got = f"{probe['rounds']} round(s)" if probe.get("rounds") is not None else ""
    got += f" in {probe['budget_s']:.0f} s" if probe.get("budget_s") else ""
    what = "rounds of fresh runs fitted their" if fresh else "probe rounds fitted the probe's"
    return f"no interval: too few {what} budget" + (f" ({got.strip()})" if got else "")


def agreeing_blocks(f: Finding, two: dict[str, Any]) -> tuple[float, float] | None:
    """The fresh runs' saving bounds from blocks of steps within the runs (``pitstop.measure.within_runs``),
    where too few rounds fitted for an interval over rounds, when the in-process probe's own interval
    agrees that the change helps (its lower bound above ``MIN_PROBE_GAIN`` of the probed pass): two
    independent measurements of one saving. None otherwise."""
    lo, hi = two.get("blocks_saving_lo_s"), two.get("blocks_saving_hi_s")
    if lo is None or hi is None or not in_process_agrees(f.data):
        return None
    return lo, hi


def in_process_agrees(probe: dict[str, Any]) -> bool:
    """The in-process ``probe``'s own interval says the change helps: its lower bound above
    ``MIN_PROBE_GAIN`` of the probed pass (what lets one round of fresh runs decide: ``agreeing_blocks``)."""
    own_lo, base = probe.get("saving_lo_s"), probe.get("base_s")
    return own_lo is not None and bool(base) and own_lo > MIN_PROBE_GAIN * base


def _measured_in_two_processes(f: Finding, probe: dict[str, Any], bd: Breakdown) -> Finding:
    """The fresh processes' saving replaces the prediction scaled from the in-process probe."""
    saved = max(0.0, probe["saving_s"])
    scaled = (
        f" ({probe.get('steps')} steps a run, a budget of {probe.get('budget_s', 0):.0f} s scaled with the step)"
        if probe.get("budget_scaled")
        else ""
    )
    text = (
        f"; fresh runs of the script, as it is vs {probe.get('variant') or 'with the fix'}, "
        f"{probe.get('rounds', 0)} rounds{scaled}: median step {ms(probe['base_s'])} vs {ms(probe['new_s'])}"
    )
    share = min(1.0, saved / bd.total_s) if bd.total_s > 0 else 0.0
    return replace(f, evidence=f.evidence + text, est_saving_s=saved, share=share)


def confirm(f: Finding, bd: Breakdown) -> Finding:
    """``f`` with its interval in ``data``, at most info unless the interval's lower bound confirms it."""
    get = PROBE_OF.get(f.id)
    if get is None or f.severity is Severity.PASS or f.est_saving_s is None:
        return f
    probe = get(f)
    if not probe or "saving_s" not in probe:
        return f
    bounds = saving_bounds(f, probe)
    step = bd.median_total_s
    if probe is f.data.get("two_process"):
        f = _measured_in_two_processes(f, probe, bd)
    two = f.data.get("two_process")
    why_none = _no_interval_reason(probe, fresh=bool(two) and probe is two)
    if two and probe is two and bounds is None and (agreed := agreeing_blocks(f, two)) is not None:
        bounds = agreed
        iv = two.get("blocks_interval") or {}
        f = replace(
            f,
            evidence=f"{f.evidence}; {two.get('rounds', 0)} round(s) of fresh runs fitted their "
            f"{two.get('budget_s', 0):.0f} s budget, so the interval is from blocks of "
            f"{PER_BLOCK} steps within the runs ({iv.get('estimate', 0):.2f}x, a {RUN_SPREAD:.0%} allowance "
            "for each run's own speed), decided where the in-process probe's interval "
            f"({f.data.get('interval_text') or 'its rounds'}) agrees",
            data={**f.data, "decided_by": "fresh runs' blocks + in-process rounds"},
        )
    if two and probe is not two:
        # the fresh runs were to decide and measured nothing: the in-process interval does not stand in
        bounds = None
        why_none = (
            f"the fresh runs with the fix measured nothing ({'; '.join(two.get('errors') or ['no step'])}); "
            + why_none
        )
    return judged(f, bounds, step, why_none)


def judged(f: Finding, bounds: tuple[float, float] | None, step: float, why_none: str) -> Finding:
    """``f`` with ``saving_ci_s`` and ``confirmed`` in its data: kept as it is when the interval's lower
    bound is at least ``WARN_SHARE`` of the median ``step``, else at most info, saying why (``why_none``
    where there is no interval)."""
    verdict = against_bar(*(bounds or (None, None)), WARN_SHARE * step) if step > 0 else UNDECIDED
    confirmed = verdict == HELPED
    data = {**f.data, "saving_ci_s": list(bounds) if bounds else None, "confirmed": confirmed}
    data["verdict"] = verdict
    if bounds is not None:
        ci = f"saving {ms(f.est_saving_s or 0.0)} (95% CI {ms(bounds[0])}\u2013{ms(bounds[1])})"
    else:
        ci = f"saving {ms(f.est_saving_s or 0.0)}, {why_none}"
    if confirmed:
        return replace(f, evidence=f"{f.evidence}; confirmed: {ci}", data=data)
    severity = Severity.INFO if f.severity.rank > Severity.INFO.rank else f.severity
    bar = f"; a warning needs the lower bound at {WARN_SHARE:.0%} of the {ms(step)} median step"
    if verdict == NO_GAIN:
        bar += ", and the upper bound is under it: measured not to save that much"
    return replace(f, severity=severity, evidence=f"{f.evidence}; not confirmed: {ci}{bar}", data=data)


# finding id -> why its saving cannot be measured with its fix applied: such a finding is at most info
UNTIMED: dict[str, str] = {
    "dataloader.slow": "its fix is a change to the input pipeline (smaller decodes, cached tensors) that "
    "pitstop cannot inject, so no run has measured it",
    recipe("pin_memory").finding: "pinning alone (what pitstop can inject) does not overlap the copies; "
    "the non_blocking=True copy is a code change no run here has measured",
    recipe("persistent_workers").finding: "the saving is read off the first batch of each fresh worker "
    "pool, not measured with the fix (`pitstop fix --candidates persistent_workers` times it)",
}


def untimed(f: Finding, bd: Breakdown) -> Finding:
    """``f`` at most info when its fix cannot be timed (``UNTIMED``), with the reason in its evidence."""
    why = UNTIMED.get(f.id)
    if why is None or f.severity.rank <= Severity.INFO.rank or f.est_saving_s is None:
        return f
    return judged(f, None, bd.median_total_s, f"no interval: {why}")


# the most one minor page fault can cost: it maps at most a 2 MiB huge page, zeroed at >= 10 GB/s
MAX_FAULT_S = 200e-6


def pass_bounds(f: Finding) -> tuple[tuple[float, float] | None, str]:
    """The saving interval a probe-based pass is decided by, and how to say it: its own ``saving_ci_s``;
    for the page faults without one, 0 to the run's faults per step at the most one fault may cost (the
    bound from its cost measured alone on this machine, ``host.event_costs``, else ``MAX_FAULT_S``): a
    bound, not a guess."""
    ci = f.data.get("saving_ci_s")
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(isinstance(v, int | float) for v in ci):
        return (ci[0], ci[1]), ""
    faults = f.data.get("faults_per_step")
    if f.id == recipe("host_memory").finding and isinstance(faults, int | float):
        measured = page_fault_bound_s(f.data.get("isolated_fault_s"))
        per_fault = measured or MAX_FAULT_S
        why = "the most one may cost, from its cost alone on this machine" if measured else "the most one can cost"
        hi = faults * per_fault
        return (0.0, hi), f"at most {ms(hi)} a step: {faults:,.0f} faults at {per_fault * 1e6:.1f} us, {why}"
    return None, ""


def decided_pass(f: Finding, bd: Breakdown) -> Finding:
    """A pass from a measured probe (``PROBE_OF``) stands only where an interval rules out a saving of
    ``WARN_SHARE`` of the step (``pass_bounds``); else it is info, undecided, saying what decides it
    (``rulekit.undecided``). Passes that measured nothing (a hardware or configuration fact) stand."""
    r = by_finding(f.id)
    if f.severity is not Severity.PASS or f.id not in PROBE_OF or "saving_s" not in f.data or r is None:
        return f
    step = bd.median_total_s
    bounds, said = pass_bounds(f)
    if step > 0 and against_bar(*(bounds or (None, None)), WARN_SHARE * step) == NO_GAIN:
        return replace(f, data={**f.data, "verdict": NO_GAIN, "saving_ci_s": list(bounds or ())})
    probe = {**f.data, "saving_lo_s": bounds[0], "saving_hi_s": bounds[1]} if bounds else f.data
    return undecided(r.name, probe, step, f"{f.title}: {f.evidence}", f.location, said)


def apply(found: list[Finding], bd: Breakdown) -> list[Finding]:
    """Every probe-based finding in ``found`` confirmed by its interval, or demoted to info; those whose
    fix cannot be timed (``UNTIMED``) at most info; a probe's pass without an interval that decides it
    undecided (``decided_pass``)."""
    return [decided_pass(untimed(confirm(f, bd), bd), bd) for f in found]
