"""The run's verdict when no finding warns: healthy, or undecided.

A finding that would warn by its estimate (at least ``WARN_SHARE`` of the step) is demoted to info when
no interval confirms its saving (``confirm.judged``: a noisy run, a probe that cannot be interleaved, a
fix no run can time). Such a run is not healthy: a problem may cost that much, and the measurements
could not tell. ``summary.unconfirmed`` says so and names the estimates; ``summary.healthy`` is kept for
runs where nothing estimated costs ``WARN_SHARE`` of the step. Where other processes used the CPUs
during the run (``other_cpu_share``: the runner's ``host.load.CpuOutsideSession``, a lower bound), the
verdict quotes it: their load widens every interval. Findings that change after the run (`pitstop fix`'s cached verdicts, ``--verify``)
change the verdict: ``reconcile`` gives it again from the basis kept in the report's meta. A run stopped
by Ctrl-C or SIGTERM (``interrupted``: the phase it was in) is never healthy: ``summary.interrupted``
says where it stopped and what was measured before.
"""

from __future__ import annotations

from pitstop.findings import Finding, Report, Severity
from pitstop.profile.analyze.rulekit import WARN_SHARE, ms, pct

BUSY_SHARE = 0.1  # other processes' share of the CPUs worth quoting as a cause of noise
BASIS = "verdict_basis"  # Report.meta key: what ``reconcile`` needs to give the verdict again


def unconfirmed(found: list[Finding]) -> list[Finding]:
    """Info findings whose saving no interval confirmed although it may be ``WARN_SHARE`` of the step or
    more (its estimate, or its interval's upper bound: a pass needs as firm an interval as a warning), the
    largest estimate first (``--verify``'s demotion below the predicted interval sets ``confirmed``
    False). One whose fix `pitstop fix` measured no faster (``fix_measured``) is decided, not open."""
    out = [
        f
        for f in found
        if f.severity is Severity.INFO
        and isinstance(f.data, dict)
        and f.data.get("confirmed") is False
        and "fix_measured" not in f.data
        and f.est_saving_s
        and max(f.share or 0.0, _upper_share(f)) >= WARN_SHARE
    ]
    return sorted(out, key=lambda f: (-(f.est_saving_s or 0.0), f.id))


def _bounds(f: Finding) -> tuple[object, object]:
    """The saving's interval as (lower, upper), each a number or not; (None, None) without one."""
    ci = f.data.get("saving_ci_s")
    return (ci[0], ci[1]) if isinstance(ci, list | tuple) and len(ci) == 2 else (None, None)


def _upper_share(f: Finding) -> float:
    """The upper bound of the saving's interval as a share of the step (0 without an interval)."""
    hi = _bounds(f)[1]
    if not isinstance(hi, int | float) or not f.est_saving_s or not f.share or f.est_saving_s <= 0:
        return 0.0
    return float(hi) * f.share / f.est_saving_s  # step = estimate / share


def _estimate(f: Finding) -> str:
    lo, hi = _bounds(f)
    numbers = isinstance(lo, int | float) and isinstance(hi, int | float)
    bounds = f"95% CI {ms(lo)}\u2013{ms(hi)}" if numbers else "no interval"
    rank = f" (rank {f.data['rank']})" if "rank" in f.data else ""
    return f"{f.id}{rank} {ms(f.est_saving_s or 0.0)} a step ({pct(f.share or 0.0)}; {bounds})"


def busy_text(other_cpu_share: float | None) -> str:
    """A sentence on other processes' CPU use during the run, where it was worth quoting."""
    if other_cpu_share is None or other_cpu_share < BUSY_SHARE:
        return ""
    return (
        f" Other processes used at least {pct(other_cpu_share)} of the CPUs during the run, which widens "
        "every interval."
    )


def verdict(
    found: list[Finding],
    healthy_title: str,
    measured: str,
    other_cpu_share: float | None = None,
    interrupted: str | None = None,
    **data: object,
) -> Finding | None:
    """The summary finding for ``found``: ``summary.interrupted`` when Ctrl-C or SIGTERM stopped the run
    during ``interrupted`` (a phase, e.g. "the fresh confirmation runs"); else None when a finding warns
    or errs, ``summary.unconfirmed`` where estimates of ``WARN_SHARE`` or more were not confirmed, else
    ``summary.healthy``. ``measured``: what the run measured (steps, median, the step's parts)."""
    busy = busy_text(other_cpu_share)
    extra = {**data, "other_cpu_share": other_cpu_share}
    if interrupted:
        return _interrupted(found, interrupted, measured + busy, extra)
    if any(f.severity.rank >= Severity.WARN.rank for f in found):
        return None
    open_ = unconfirmed(found)
    if not open_:
        return Finding(
            id="summary.healthy",
            severity=Severity.INFO,
            title=healthy_title,
            evidence=measured + (f".{busy}" if busy else ""),
            data=extra,
        )
    n = len(open_)
    return Finding(
        id="summary.unconfirmed",
        severity=Severity.INFO,
        title=f"Nothing confirmed at {pct(WARN_SHARE)} of the step, but {n} estimate"
        f"{'s' if n > 1 else ''} that may reach it {'were' if n > 1 else 'was'} not confirmed",
        evidence=f"{measured}. Not confirmed: {'; '.join(_estimate(f) for f in open_)}.{busy}",
        data={**extra, "unconfirmed": [f.id for f in open_]},
        fix="Each estimate's evidence says why it has no interval, or why its lower bound is under "
        f"{pct(WARN_SHARE)} of the step. `pitstop fix` times the fixes it can apply against the script as "
        "it is, in rounds, until their intervals decide; a longer run (`--steps`) or a quieter machine "
        "narrows the intervals.",
        est_saving_s=None,
    )


def _interrupted(found: list[Finding], phase: str, measured: str, data: dict) -> Finding:
    open_ = unconfirmed(found)
    warned = sum(f.severity.rank >= Severity.WARN.rank for f in found)
    return Finding(
        id="summary.interrupted",
        severity=Severity.INFO,
        title=f"Interrupted during {phase}: no verdict on the whole run",
        evidence=f"Measured before the stop: {measured}. {warned} finding(s) warn on what was measured"
        + (f"; not confirmed: {', '.join(f.id for f in open_)}" if open_ else "")
        + ". A problem the stop cut short may be missing, so nothing here says the run is healthy.",
        data={**data, "interrupted": phase, "unconfirmed": [f.id for f in open_]},
        fix="Run it again to the end (fewer `--steps`, or `--no-probes` to skip the measured what-ifs).",
    )


def basis(healthy_title: str, measured: str, other_cpu_share: float | None = None, **data: object) -> dict:
    """``verdict``'s arguments other than the findings, for ``Report.meta[BASIS]``."""
    return {"healthy_title": healthy_title, "measured": measured, "other_cpu_share": other_cpu_share, **data}


def reconcile(report: Report) -> None:
    """The report's verdict given again for its findings as they are now (a finding that `pitstop fix`
    confirmed or disproved, a warning ``--verify`` demoted), from ``report.meta[BASIS]``; a report
    without a basis is left as it is."""
    b = report.meta.get(BASIS)
    if not isinstance(b, dict):
        return
    report.findings = [f for f in report.findings if f.area != "summary"]
    last = verdict(report.findings, **b)
    if last is not None:
        report.add(last)
