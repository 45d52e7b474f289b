"""Contention as a finding: the script's threads against the cores other work and its own processes
leave free, with the cost the thread probe (``pitstop.profile.probe.thread_probe``) measured; and, for every
other finding, a note where the run was measured while other work used the CPUs.

``host.oversubscribed``: the script's own threads and processes exceed the cores it may use (more
intra-op threads than usable cores; or threads plus DataLoader workers, times the local ranks).
``host.contention``: its threads fit the cores, but other processes (or the hypervisor's steal) took
enough of them that fewer threads are faster. Severity follows the probe's interval on both sides: a
warning needs the saving's lower bound at ``WARN_SHARE`` of the median step, a pass its upper bound,
plus what the part of the step the probe did not time could gain at that rate, below that; otherwise
it is info and says what would decide it. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host.load import Competition, fitting_threads
from pitstop.measure import NO_GAIN, against_bar
from pitstop.profile.analyze.confirm import judged
from pitstop.profile.analyze.probe_failures import probe_failed_finding
from pitstop.profile.analyze.registry import RunView, rule
from pitstop.profile.analyze.rulekit import WARN_SHARE, cost, ms, pct, sev
from pitstop.profile.analyze.summary import BUSY_SHARE
from pitstop.profile.record.measurements import Measurements
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import threads

OVERSUBSCRIBED = "host.oversubscribed"
CONTENTION = "host.contention"
NOTED = "measured_under_contention"  # Finding.data key of the note every other finding gets


Data = Measurements | Mapping[str, Any]  # the run's record, typed or as its JSON


def _workers(m: Measurements) -> int:
    """DataLoader workers of the loader the steps waited on most (0: the main process loads)."""
    main = max(m.used_loaders, key=lambda ld: ld.wait_s or 0.0, default=None)
    return main.workers if main is not None else 0


def _layout(threads: int, workers: int, ranks: int, usable: int) -> str:
    """'2 intra-op threads beside 4 DataLoader workers, x 2 local ranks, on 2 usable cores'."""
    beside = f" beside {workers} DataLoader worker process{'es' if workers != 1 else ''}" if workers else ""
    times = f", x {ranks} local ranks" if ranks > 1 else ""
    return f"{threads} intra-op thread{'s' if threads != 1 else ''}{beside}{times}, on {usable} usable cores"


def _fix(fit: int, workers: int) -> tuple[str, str]:
    return threads.fix_text(fit, workers)  # the threads component words it


def to_decide(fit: int) -> str:
    """What decides an undecided contention finding: the whole script timed both ways, interleaved."""
    return (
        f"To decide: `pitstop fix --candidates threads` times the whole script at {fit} "
        f"thread{'s' if fit != 1 else ''} against it as it is, in interleaved runs on this "
        f"machine (or profile again with OMP_NUM_THREADS={fit} and `pitstop compare` the two reports)."
    )


@rule(order=100)
def contention_rule(v: RunView) -> list[Finding]:
    return contention_findings(v.breakdown, v.m, v.cores)


def contention_findings(bd: Breakdown, data: Data, cores: int) -> list[Finding]:
    """``host.oversubscribed`` / ``host.contention`` from the thread probe's record and the run's facts
    (its loaders, its threads); none on a machine where the script's threads fit the free cores."""
    m = Measurements.of(data)
    probe = m.probed.result("threads")
    rec = probe.to_json() if probe is not None else {}  # the thread probe's own keys (``probe.thread_probe``)
    threads = int(rec.get("threads") or (m.torch or {}).get("num_threads") or 0)
    if threads < 1:
        return []
    if rec.get("error"):
        return [probe_failed_finding("thread (fewer intra-op threads)", str(rec["error"]))]
    workers, ranks = _workers(m), int(rec.get("local_ranks") or 1)
    usable = int(rec.get("usable_cores") or cores)
    layout = _layout(threads, workers, ranks, usable)
    own = threads > usable or ranks * (threads + workers) > usable
    if "saving_s" in rec and "base_s" in rec:
        return [_measured(bd, rec, OVERSUBSCRIBED if threads > usable else CONTENTION, layout, workers)]
    if rec.get("skipped") and rec.get("fit", threads) < threads:
        seen = Competition.from_dict(rec.get("competition") or {})
        return [
            _unmeasured(rec, CONTENTION if not own else OVERSUBSCRIBED, layout, workers, seen, rec["skipped"])
        ]
    if own and workers and "competition" in rec:
        # the probe ran after the workers stopped: it could not time the threads against them
        seen = Competition.from_dict(rec["competition"])
        why = "the exit probe ran after the DataLoader workers stopped, so it could not time fewer threads against them"
        fit = fitting_threads(usable - workers, ranks)
        return [_unmeasured({**rec, "fit": fit}, OVERSUBSCRIBED, layout, workers, seen, why)]
    return []


def untimed_rest(bd: Breakdown, hi_speedup: float, loaded: bool) -> float:
    """What the part of the step the probe did not time (all but forward and backward, and the data
    wait where the probe loaded a batch: the optimizer, data loading, the rest) could save at most, if it
    gained as much as the probe's upper bound ``hi_speedup``: its intra-op work runs on the same threads."""
    timed = ("forward_s", "backward_s", "data_wait_s") if loaded else ("forward_s", "backward_s")
    rest = max(0.0, bd.total_s - sum(bd.parts.get(k, 0.0) for k in timed))
    return rest * max(0.0, 1 - 1 / hi_speedup) if hi_speedup > 0 else rest


def _measured(bd: Breakdown, rec: dict[str, Any], fid: str, layout: str, workers: int) -> Finding:
    """The A/B's finding: a warning where the probe's saving's lower bound clears the bar; a pass where
    its upper bound, plus what the untimed rest of the step could gain at that rate, stays under it;
    else undecided (info)."""
    threads, fit = rec["threads"], rec["fit"]
    seen = Competition.from_dict(rec.get("competition") or {})
    saving, share = cost(bd, rec["saving_s"])
    step = bd.median_total_s
    lo, hi = rec.get("saving_lo_s"), rec.get("saving_hi_s")
    bounds = (lo, hi) if lo is not None and hi is not None else None
    hi_speedup = (rec.get("interval") or {}).get("hi") or float("inf")
    rest = untimed_rest(bd, hi_speedup, "loader_location" in rec)
    work = (
        f"Loading a batch as the main process did (the DataLoader at {rec['loader_location']}) and "
        "forward+backward on the script's last batch"
        if "loader_location" in rec
        else "Forward+backward on the script's last batch"
        + (f" (not loading a batch: {rec['loader_error']})" if rec.get("loader_error") else "")
    )
    evidence = (
        f"{layout}; during the exit probe {seen.text()}. {work}: "
        f"{ms(rec['base_s'])} at {threads} threads, {ms(rec['new_s'])} at {fit} (medians, interleaved rounds: "
        f"{rec.get('interval_text') or 'no interval'})"
    )
    speed = rec["base_s"] / rec["new_s"] if rec["new_s"] > 0 else float("inf")
    data = {**rec, "workers": workers, "speedup": speed, "untimed_rest_max_s": rest}
    # the pass side counts what the untimed rest could gain; the warning side, what was timed
    verdict = against_bar(lo, None if hi is None else hi + rest, WARN_SHARE * step)
    if verdict == NO_GAIN and bounds is not None:
        return Finding(
            id=fid,
            severity=Severity.PASS,
            title=f"{fit} thread{'s' if fit != 1 else ''} would not save {pct(WARN_SHARE)} of the step over "
            f"the script's {threads}",
            evidence=f"{evidence}; the saving's upper bound {ms(bounds[1])}, plus {ms(rest)} the untimed rest of "
            f"the step could gain at that rate, is under {pct(WARN_SHARE)} of the {ms(step)} median step",
            data={**data, "verdict": NO_GAIN, "saving_ci_s": list(bounds), "confirmed": False},
        )
    cause = (
        "more intra-op threads than usable cores"
        if fid == OVERSUBSCRIBED
        else "other processes took the cores its threads need"
    )
    fix, code = _fix(fit, workers)
    f = judged(
        Finding(
            id=fid,
            severity=sev(share),
            title=f"{threads} intra-op threads where {fit} fit ({cause}): the step's work {speed:.2f}x "
            f"faster at {fit}",
            evidence=evidence,
            data=data,
            fix=fix,
            fix_code=code,
            est_saving_s=saving,
            share=share,
        ),
        bounds,
        step,
        "no interval: too few probe rounds fitted the probe's budget",
    )
    f.data["verdict"] = verdict
    if f.data["confirmed"]:
        return f
    untimed = (
        f"; the rest of the step (the optimizer, data loading, other work: up to {ms(rest)} to gain at the "
        "upper bound's rate) runs on the same threads and was not timed"
        if rest >= WARN_SHARE * step
        else ""
    )
    return replace(
        f,
        evidence=f.evidence + untimed,
        fix=f"{f.fix} {to_decide(fit)}",
    )


def _unmeasured(
    rec: dict[str, Any], fid: str, layout: str, workers: int, seen: Competition, why: str
) -> Finding:
    fit = int(rec.get("fit") or 1)
    fix, code = _fix(fit, workers)
    return Finding(
        id=fid,
        severity=Severity.INFO,
        title=f"{layout.split(',')[0]} where {fit} fit: not timed",
        evidence=f"{layout}; during the exit probe {seen.text()}; not timed: {why}",
        data={**rec, "workers": workers, "confirmed": False},
        fix=f"{fix} {to_decide(fit)}",
        fix_code=code,
    )


def contention_note(data: Data) -> tuple[str, dict[str, float]]:
    """The sentence (and its numbers) saying the run was measured while other work used the CPUs:
    other processes' share over the run (the runner's), or during the exit probe where the run has none
    (in-process profiling), and the hypervisor's steal; empty under ``BUSY_SHARE``."""
    m = Measurements.of(data)
    other = m.other_cpu_share
    steal = m.steal_share or 0.0
    if other is None:
        probe = m.probed.result("threads")
        seen = probe.get("competition") if probe is not None else None
        if not seen:
            return "", {}
        c = Competition.from_dict(seen)
        other, steal = c.other_busy_cores / max(1, c.cpus), c.steal_cores / max(1, c.cpus)
    if other + steal < BUSY_SHARE:
        return "", {}
    stolen = f", and the hypervisor stole {pct(steal)}" if steal >= 0.01 else ""
    return (
        f" (measured under contention: other processes used at least {pct(other)} of the CPUs{stolen})",
        {"other_cpu_share": other, "steal_share": steal},
    )


def note_contention(found: list[Finding], data: Data) -> list[Finding]:
    """Every finding's evidence with ``contention_note`` appended where the run was contended (the
    contention findings quote the competition themselves)."""
    note, numbers = contention_note(data)
    if not note:
        return found
    return [
        f
        if f.id in (CONTENTION, OVERSUBSCRIBED) or f.area == "summary"
        else replace(f, evidence=f.evidence + note, data={**f.data, NOTED: numbers})
        for f in found
    ]
