"""``pitstop profile --verify``: the top warning's fix, measured on the script, next to its prediction.

The top-ranked warning that has a fix ``pitstop fix`` can inject (``recipes.finding_kinds``) is timed
as ``pitstop fix --candidates KIND`` would: interleaved rounds of the script as it is and with the fix,
judged by ``pitstop.measure`` within the budget. The result is one ``profile.verify`` finding that sets
the measured speed-up and its interval next to the speed-up the warning predicted. Both are throughput:
``fix``'s is steps per wall-clock second over its runs, and the prediction is the mean step over the
mean step less the saving (a step's saving is a mean; a mean step is what the clock sees), with the
saving's interval where it has one. A fix measured as no
change or hurt demotes the warning to info, as a later profile would from the verdict cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pitstop.findings import Finding, Report, Severity
from pitstop.measure import HELPED
from pitstop.profile.confirm.fix_verdicts import annotate
from pitstop.recipes import finding_kinds

DEFAULT_BUDGET_S = 120.0


def top_warning(report: Report) -> tuple[Finding, str] | None:
    """The first-ranked warning (or error) with an injectable fix, and that fix's kind."""
    kinds = finding_kinds()
    for f in report.ranked():
        if f.severity.rank >= Severity.WARN.rank and f.id in kinds:
            return f, kinds[f.id]
    return None


def predicted_speedup(f: Finding, step_s: float) -> tuple[float | None, list[float] | None]:
    """step / (step - saving): the point, and the bounds from the saving's interval (None: none)."""

    def speedup(saving: float) -> float | None:
        left = step_s - saving
        return step_s / left if left > 0 else None

    point = speedup(f.est_saving_s) if f.est_saving_s is not None and step_s > 0 else None
    ci = f.data.get("saving_ci_s")
    bounds = [speedup(ci[0]), speedup(ci[1])] if ci and step_s > 0 else None
    return point, bounds if bounds and None not in bounds else None


def fix_config(f: Finding, kind: str, budget_s: float, **kw: Any) -> Any:
    """The ``FixConfig`` that times ``f``'s own fix: for ``dataloader.workers``, the one worker count
    the finding suggests (``recipes.workers.choose_workers``) rather than every value ``fix`` would try;
    for ``host.oversubscribed`` / ``host.contention``, the thread count it found to fit."""
    from pitstop.fix.core import FixConfig
    from pitstop.profile.analyze.rules import suggested_workers

    if kind == "workers" and f.data.get("suggested_workers"):
        kw.setdefault("workers_values", (int(f.data["suggested_workers"]),))
    elif kind == "workers" and f.data.get("usable_cores"):
        kw.setdefault("workers_values", (suggested_workers(int(f.data["usable_cores"])),))
    if kind == "threads" and f.data.get("fit"):
        kw.setdefault("threads_values", (int(f.data["fit"]),))
    return FixConfig(candidates=(kind,), budget=budget_s, **kw)


def verdict_finding(f: Finding, kind: str, result: Any, step_s: float) -> Finding:
    """``profile.verify`` from a ``FixResult`` of the one candidate ``kind``."""
    point, bounds = predicted_speedup(f, step_s)
    pred = f"{point:.2f}x" if point else "no speed-up figure"
    if bounds:
        pred += f" (95% CI {bounds[0]:.2f}\u2013{bounds[1]:.2f})"
    m = next((c for c in result.candidates if c.kind == kind), None)
    data: dict[str, Any] = {"finding": f.id, "kind": kind, "predicted_speedup": point, "predicted_ci": bounds}
    if m is None or m.interval is None:
        why = "; ".join(result.skipped_candidates) or result.baseline_error or (m.reason if m else "")
        return Finding(
            id="profile.verify",
            severity=Severity.INFO,
            title=f"The fix for {f.id} could not be measured",
            evidence=f"predicted {pred}; {why or 'no run of it measured a step'}",
            data=data,
        )
    data.update(verdict=m.verdict, measured=m.interval.to_dict(), measured_text=m.interval.text())
    inside = bounds is not None and bounds[0] <= m.interval.estimate <= bounds[1]
    # the whole measured interval under the predicted one: the prediction did not come true, decided or not
    below = bounds is not None and m.verdict != HELPED and m.interval.hi < bounds[0]
    data.update(inside_prediction=inside, below_prediction=below)
    return Finding(
        id="profile.verify",
        severity=Severity.INFO,
        title=f"{f.id}: predicted {pred}, measured {m.interval.text()} ({m.verdict})",
        evidence=f"{m.name} timed against the script as it is in interleaved runs: {m.verdict}, "
        f"{m.interval.text()}; the profile predicted {pred}"
        + ("; the measured speed-up lies inside the predicted interval" if inside else "")
        + ("; the measured interval lies below the predicted one" if below else ""),
        data=data,
    )


def below_prediction(f: Finding, verdict: Finding) -> Finding:
    """``f`` at most info: its fix measured under the whole predicted interval (``verdict``)."""
    if f.severity.rank <= Severity.INFO.rank:
        return f
    note = f"; --verify measured {verdict.data['measured_text']}, below the predicted interval"
    # not disproved either (the verdict may still be open): the run's verdict lists it as unconfirmed
    return replace(f, severity=Severity.INFO, evidence=f.evidence + note, data={**f.data, "confirmed": False})


def verify(
    report: Report,
    command: list[str],
    budget_s: float = DEFAULT_BUDGET_S,
    out_dir: Any = None,
    run_fix: Callable[..., Any] | None = None,
) -> Finding:
    """Measure the top warning's fix, record the verdict for later profiles, and add ``profile.verify``
    to ``report`` (demoting the warning when the fix measured no change or hurt). Returns the finding;
    raises KeyboardInterrupt, the finding added, when Ctrl-C or SIGTERM stopped the runs."""
    from pitstop.fix import verdict_cache
    from pitstop.fix.runs import run_fix as real_run_fix

    top = top_warning(report)
    if top is None:
        found = Finding(
            id="profile.verify",
            severity=Severity.INFO,
            title="No warning with a fix to verify",
            evidence="--verify measures the top warning's fix; this run has no warning that pitstop fix can inject",
        )
        report.add(found)
        return found
    f, kind = top
    bd = report.sections.get("breakdown") or {}
    step_s = float(bd.get("mean_step_s") or bd.get("median_step_s") or 0.0)  # throughput: the mean step
    result = (run_fix or real_run_fix)(list(command), fix_config(f, kind, budget_s))
    verdict_cache.record(result, out_dir)
    found = verdict_finding(f, kind, result, step_s)
    report.findings = annotate(
        report.findings, {k: v for k, v in verdict_cache.entries(result).items() if k == kind}
    )
    if found.data.get("below_prediction"):
        report.findings = [below_prediction(g, found) if g.id == f.id else g for g in report.findings]
    report.add(found)
    if result.interrupted:  # Ctrl-C / SIGTERM stopped fix's runs: the command stops, with what they measured
        raise KeyboardInterrupt
    return found


__all__ = ["DEFAULT_BUDGET_S", "fix_config", "predicted_speedup", "top_warning", "verdict_finding", "verify"]
