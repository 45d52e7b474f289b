"""`pitstop fix`'s output: one finding per candidate with its verdict and interval, the recommendation,
the report's JSON section, and the HTML blocks (the runs table and an interval plot per candidate)."""

from __future__ import annotations

import statistics
from typing import Any

from pitstop.findings import Finding, Report, Severity
from pitstop.fix import dist
from pitstop.fix.core import FixResult, loader_of
from pitstop.fix.judge import Measured
from pitstop.host.precision import device_type
from pitstop.measure import HELPED, HURT, NO_CHANGE, UNDECIDED
from pitstop.recipes import by_name
from pitstop.report.html import Block, table
from pitstop.report.intervals import interval_chart


def _snippet(m: Measured, config: dict[str, Any]) -> tuple[str, str | None]:
    """(code, file:line) for the fix: its recipe's snippet at the site the recipe names; the DataLoader
    keywords it set at the DataLoader call."""
    ov = m.overrides
    if m.kind in dist.KINDS:
        return dist.snippet(m.kind, ov, config)
    opts = config.get("optimizers") or []
    models = config.get("models") or []
    r = by_name(m.kind)  # None: the combination
    site = r.site if r else "loader"
    if site == "loader":
        dl = ov.get("dataloader") or {}
        return "DataLoader(..., " + ", ".join(f"{k}={v!r}" for k, v in dl.items()) + ")", loader_of(
            config
        ).get("location")
    assert r is not None
    where = {
        "model": models[0].get("first_location") if models else None,
        "optimizer": opts[0].get("location") if opts else None,
    }.get(site or "")
    code = r.code(
        device=device_type(config.get("device")),
        dtype=ov.get("autocast"),
        impl=ov.get("optimizer_impl"),
        optimizer=opts[0].get("type", "SGD") if opts else "SGD",
        value=ov.get(r.override) if r.override else None,
    )
    return code, where


def _runs_text(runs: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in runs) or "none"


TITLES = {
    HELPED: "{speedup:.2f}x faster, measured",
    HURT: "slower, measured ({speedup:.2f}x)",
    NO_CHANGE: "no change, measured ({speedup:.2f}x)",
    UNDECIDED: "undecided when the budget ended ({speedup:.2f}x so far)",
    "rejected": "measured and rejected",
    "failed": "failed",
}
FIXES = {
    HELPED: "Make this change (the speed-up was measured by re-running your script with it).",
    HURT: "Leave it as it is: it made this script slower here.",
    NO_CHANGE: "Leave it as it is: it made no difference beyond the noise here.",
    UNDECIDED: "Not proven either way: re-run with a larger --budget, on a quieter machine.",
}


def _numbers(m: Measured, result: FixResult) -> str:
    """The measured figures of one candidate: its throughput speed-up and interval, the two sides'
    throughput and runs, and the median step rate beside them."""
    base = result.baseline
    ref_runs = m.ref_runs if m.on_top_of else base.steps_per_s
    ref_tp = m.ref_throughput if m.on_top_of else base.throughput
    ref_median = m.ref_median if m.on_top_of else base.median
    against = f"{m.on_top_of} alone" if m.on_top_of else "the baseline"
    if not (m.interval and m.throughput and ref_tp):
        return f"runs failed: {'; '.join(m.errors[:2]) or 'no step measured'}"
    text = (
        f"{m.interval.text()} against {against}: {m.throughput:.3g} vs {ref_tp:.3g} steps per wall-clock "
        f"second over the runs' measured steps, spikes included (runs [{_runs_text(m.steps_per_s)}] vs "
        f"[{_runs_text(ref_runs)}], interleaved in rotating rounds)"
    )
    if m.median and ref_median:
        text += f"; median step {m.median:.3g} vs {ref_median:.3g} steps/s ({m.median / ref_median:.2f}x)"
    if m.arm.outliers:
        kinds = sorted({o.why for o in m.arm.outliers if o.why != "warm-up"})
        slow = sum(1 for o in m.arm.outliers if o.why != "warm-up")
        if slow:
            text += f"; {slow} slow step(s) ({', '.join(kinds)}) counted in the throughput, not in the median"
    return text


def _candidate_finding(m: Measured, result: FixResult) -> Finding:
    base = result.baseline
    ref_tp = m.ref_throughput if m.on_top_of else base.throughput
    ref_step = 1 / ref_tp if ref_tp else None
    step = 1 / m.throughput if m.throughput else None
    saving = ref_step - step if ref_step and step else None
    code, where = _snippet(m, result.config)
    iv = m.interval.text() if m.interval else None
    numbers = _numbers(m, result)
    name = f"{m.name} (with {m.on_top_of})" if m.on_top_of else m.name
    loss = (
        f"; mean loss {statistics.fmean(m.loss_means):.4g} vs {statistics.fmean(base.loss_means):.4g}"
        if m.loss_means and base.loss_means
        else ""
    )
    title = TITLES.get(m.verdict, m.verdict)
    title = title.format(speedup=m.speedup) if m.speedup is not None else title.split(" (")[0]
    if m.verdict == HELPED:
        return Finding(
            id=f"fix.{m.kind}",
            severity=Severity.WARN,
            title=f"{name}: {title}",
            evidence=numbers + loss + (f"; suggested by {m.why}" if m.why != "requested" else ""),
            data=m.to_dict(),
            fix=FIXES[HELPED],
            fix_code=code,
            location=where,
            est_saving_s=saving,
            share=(saving / ref_step) if saving and ref_step else None,
        )
    return Finding(
        id=f"fix.{m.kind}",
        severity=Severity.INFO,
        title=f"{name}: {title}",
        evidence=f"{m.reason}; {numbers}{loss}" if iv else f"{m.reason}{loss}",
        data=m.to_dict(),
        fix=FIXES.get(m.verdict, "Leave it as it is: it did not make this script faster here."),
        fix_code=code if m.verdict == UNDECIDED else None,
        location=where,
    )


def fix_findings(result: FixResult) -> list[Finding]:
    """The fix run's findings: one per candidate (and per skipped one), the combined speed-up or why
    there is none, and the patches that could not be made; only the baseline's failure when it did
    not run."""
    base = result.baseline
    if result.baseline_error and not base.steps_per_s:
        return [
            Finding(
                id="fix.baseline",
                severity=Severity.ERROR,
                title="The script did not run, so no fix could be measured",
                evidence=result.baseline_error,
                fix="Make `pitstop profile -- <command>` run first.",
            )
        ]
    out = [_candidate_finding(m, result) for m in result.candidates]
    for s in result.skipped_candidates:
        out.append(Finding(id="fix.skipped", severity=Severity.INFO, title="Candidate not tried", evidence=s))
    if result.chosen:
        out.append(_combined_finding(result))
    elif not result.interrupted:
        out.append(_none_finding(result))
    out.extend(_patch_findings(result))
    return out


def _combined_finding(result: FixResult) -> Finding:
    """The measured speed-up of the fixes that helped, with the diff that applies them."""
    names = " + ".join(result.chosen)
    comb = result.combined
    iv = result.interval.text() if result.interval else f"{result.speedup:.2f}x"
    ev = f"{names}: {iv} in throughput (steps per wall-clock second, spikes included) over the unmodified script"
    if comb is not None and comb.median and comb.interval:
        ev += f" (combined: {comb.interval.text()}, runs [{_runs_text(comb.steps_per_s)}])"
        single = result.final_single
        if comb.name != names and single is not None and single.interval:
            ev += (
                f"; the combination {comb.name} was not faster than {single.name} alone in the same "
                f"rounds ({comb.speedup:.2f}x vs {single.interval.text()})"
            )
    code = "".join(p.diff for p in result.patches) or (result.patch.diff if result.patch else None)
    return Finding(
        id="fix.combined",
        severity=Severity.WARN,
        title=f"Measured speed-up with the fixes that helped: {result.speedup:.2f}x",
        evidence=ev,
        data={
            "chosen": result.chosen,
            "speedup": result.speedup,
            "interval": result.interval.to_dict() if result.interval else None,
        },
        fix="Apply this change (`pitstop fix --apply` writes it, asks first and keeps a backup).",
        fix_code=code,
        location=result.patch and f"{result.patch.path}:{result.patch.line}",
    )


def _none_finding(result: FixResult) -> Finding:
    """No fix chosen in a run that finished: candidates still undecided within the budget, or none
    measurably faster."""
    if open_ := [m for m in result.candidates if m.verdict == UNDECIDED]:
        return Finding(
            id="fix.none",
            severity=Severity.INFO,
            title=f"No candidate was proven faster within the budget ({len(open_)} undecided)",
            evidence=", ".join(
                f"{m.name}: {m.interval.text() if m.interval else 'no run finished'}" for m in open_
            ),
            fix="Re-run with a larger --budget (or --skip the slow candidates, e.g. compile) on a quieter "
            "machine to decide them.",
        )
    base = result.baseline
    return Finding(
        id="fix.none",
        severity=Severity.PASS,
        title="No candidate fix made this script measurably faster",
        evidence=f"{len(result.candidates)} candidate(s) measured against the baseline "
        f"({base.throughput:.3g} steps/s)"
        if base.throughput
        else "nothing measured",
    )


def _patch_findings(result: FixResult) -> list[Finding]:
    """Fixes whose code could not be placed, and a DataLoader call that could not be edited."""
    out = [
        Finding(
            id="fix.patch",
            severity=Severity.INFO,
            title="No diff for one fix: its code could not be placed automatically",
            evidence=why,
            fix="Make the change by hand from the snippet in its finding.",
        )
        for why in result.unplaced
    ]
    if result.patch_error:
        out.append(
            Finding(
                id="fix.patch",
                severity=Severity.INFO,
                title="No diff: the DataLoader call could not be edited automatically",
                evidence=result.patch_error,
            )
        )
    return out


def fix_report(result: FixResult, meta: dict[str, Any] | None = None) -> tuple[Report, list[Block]]:
    rows = []
    for m in [result.baseline, *result.candidates, *([result.combined] if result.combined else [])]:
        rows.append(
            [
                f"{m.name} (with {m.on_top_of})" if m.on_top_of else m.name,
                m.verdict,
                _runs_text(m.steps_per_s),
                m.throughput,
                m.median,
                None if m.speedup is None else round(m.speedup, 3),
                statistics.fmean(m.loss_means) if m.loss_means else None,
                m.reason,
            ]
        )
    report = Report(
        tool="fix",
        findings=fix_findings(result),
        sections={
            "fix": {
                "baseline": result.baseline.to_dict(),
                "candidates": [m.to_dict() for m in result.candidates],
                "combined": result.combined.to_dict() if result.combined else None,
                "chosen": result.chosen,
                "speedup": result.speedup,
                "interval": result.interval.to_dict() if result.interval else None,
                "diff": "".join(p.diff for p in result.patches)
                or (result.patch.diff if result.patch else None),
                "unplaced": result.unplaced,
                "profile_findings": [f.id for f in result.profile_findings],
            }
        },
        meta={**result.settings, **(meta or {})},
        error=result.baseline_error if not result.baseline.steps_per_s else None,
    )
    if result.interrupted:
        report.error = "interrupted: the report holds the runs measured before Ctrl-C"
        report.meta["interrupted"] = True
    judged = [m for m in [*result.candidates, *([result.combined] if result.combined else [])] if m.interval]
    blocks = [
        table(
            "Runs (steps per wall-clock second per run, interleaved with the baseline)",
            [
                "configuration",
                "verdict",
                "steps/s per run",
                "throughput",
                "median step rate",
                "speed-up (throughput)",
                "mean loss",
                "note",
            ],
            rows,
        ),
        interval_chart(
            "Throughput speed-up over the baseline, with its 95% interval (dashed: no change band)",
            [
                (
                    f"{m.name} (with {m.on_top_of})" if m.on_top_of else m.name,
                    m.interval.estimate,
                    m.interval.lo,
                    m.interval.hi,
                    m.verdict,
                )
                for m in judged
                if m.interval
            ],
            band=float(result.settings.get("min_gain") or 0.0),
        ),
    ]
    return report, blocks
