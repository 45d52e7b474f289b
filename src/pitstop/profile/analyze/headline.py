"""The profile report's headline, the same words on the terminal and in the HTML: the largest measured
part of the step first (what it is, its share of the mean step), then the largest finding's cost and
whether an interval confirmed it, then what is confirmed.

Built from ``Report.sections["breakdown"]`` (means over the measured steps) and the findings as the
rules left them: a warning or error with a cost is confirmed (a prediction no interval confirmed is
demoted to info with ``data["confirmed"] = False``).
"""

from __future__ import annotations

from pitstop.findings import Finding, Report, Severity
from pitstop.profile.analyze.rulekit import WARN_SHARE, pct
from pitstop.profile.record.timeline import PART_LABELS, PARTS
from pitstop.units import duration


def costed(report: Report) -> list[Finding]:
    """Findings with a measured per-step cost, the largest cost first (the order of the cost bars)."""
    out = [f for f in report.findings if f.est_saving_s and f.est_saving_s > 0 and f.area != "summary"]
    return sorted(out, key=lambda f: (-(f.est_saving_s or 0.0), f.id))


def confirmed(f: Finding) -> bool:
    return f.severity in (Severity.WARN, Severity.ERROR) and bool(f.est_saving_s)


def headline(report: Report) -> list[str]:
    """Up to three sentences; empty when the run measured no steps."""
    bd = report.sections.get("breakdown") or {}
    mean = float(bd.get("mean_step_s") or 0.0)
    if mean <= 0:
        return []
    name, part = max(((PART_LABELS[p], float(bd.get(p) or 0.0)) for p in PARTS), key=lambda kv: kv[1])
    lines = [
        f"{name[0].upper()}{name[1:]} is {pct(part / mean)} of the step: {duration(part)} of the "
        f"{duration(mean)} mean over {bd.get('steps')} measured steps."
    ]
    ranked = costed(report)
    if ranked:
        top = ranked[0]
        share = f", {pct(top.share)} of the step" if top.share is not None else ""
        state = "confirmed" if confirmed(top) else "not confirmed by an interval"
        lines.append(f"Largest finding: {top.id} costs {duration(top.est_saving_s)} a step{share}; {state}.")
    sure = [f for f in ranked if confirmed(f)]
    if sure:
        lines.append(
            "Confirmed: " + ", ".join(f"{f.id} ({duration(f.est_saving_s)} a step)" for f in sure) + "."
        )
    else:
        lines.append(f"Confirmed: nothing at {pct(WARN_SHARE)} of the step or more.")
    return lines
