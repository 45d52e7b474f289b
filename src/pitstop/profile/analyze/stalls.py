"""Steps that stalled and recovered (``profile.stall``), and what each one was as far as the run can tell.

Pure: the step records and the watchdog's record (``pitstop.profile.capture.watchdog``) in, one finding out. A
stall is a measured step (warm-up and traced steps left out: compilation, allocation and worker start
are not stalls) longer than ``STALL_FACTOR`` x the median measured step and ``STALL_MIN_S`` over it.
Each stalled step gets a cause, from what was recorded while it ran:

- ``save``: the watchdog's stack sample was in ``torch.save``, distributed checkpointing, or a function
  of the script named for saving;
- ``callback``: the sample was in a training framework's callback hook;
- ``eval``: a no-grad pass ran in the step (a validation loop, a sampling callback's ``generate``): the
  step record's ``eval``, or a sample in a function named for it. The hooks book such a pass to the step
  that trained before it (``Instrumentation.boundary``), so the step named is the one it ran in;
- ``data``: none of those, and at least half the step's extra time was data wait (a new epoch's
  DataLoader workers starting, a slow read);
- ``contention``: none of those, and while the step ran other processes held at least
  ``CONTENDED_CPUS`` CPUs (or the hypervisor stole them) and the script's threads waited on the run
  queue for a CPU (``contended``): the watchdog's ``contention`` window;
- ``periodic``: none of those, but the stalls recur every N steps: a pause the loop makes on schedule;
- ``unknown``: nothing recorded tells; the finding says so rather than guessing.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze.rulekit import WARN_SHARE
from pitstop.profile.capture.watchdog import MAX_SAMPLES, POLL_S, STALL_FACTOR, STALL_MIN_S
from pitstop.profile.record.parts import WatchdogRecord
from pitstop.units import duration

CONTENDED_CPUS = 0.5  # other processes (plus steal) held at least half a CPU ...
WAITED_SHARE = 0.25  # ... while the script's threads waited this share of the step for one (schedstat)
FULL_SHARE = 0.9  # without schedstat: they and the script together kept this share of the CPUs busy ...
MIN_OWN_CPUS = 0.25  # ... and the script was working, not sleeping
DATA_SHARE = 0.5  # a stall whose extra time is at least half data wait was waiting for its batch
SAVE_MODULES = ("torch.serialization", "torch.distributed.checkpoint", "safetensors")
_SAVE_NAME = re.compile(r"save|checkpoint|ckpt", re.I)
_EVAL_NAME = re.compile(r"eval|valid|generat|sampl", re.I)
_CALLBACK = re.compile(r"callback|(^|\.)on_[a-z_]+$", re.I)

WHAT = {
    "save": "a checkpoint save",
    "callback": "a callback",
    "eval": "a no-grad pass (evaluation or sampling)",
    "data": "waiting for data",
    "contention": "machine contention",
    "periodic": "a pause the loop makes",
    "unknown": "cause not known",
}
FIXES = {
    "save": "Save checkpoints less often, or in the background "
    "(torch.distributed.checkpoint.async_save, or a thread that writes a copied state_dict).",
    "callback": "Run the callback less often: it runs on the training thread, inside the step.",
    "eval": "Evaluate or sample less often, on fewer batches or with shorter generations.",
    "data": "The step waited for its batch: DataLoader workers started again each epoch wait for their "
    "first batches (persistent_workers=True keeps them); otherwise the dataset's reads were slow here.",
    "contention": "Other processes took the CPUs while these steps ran: not the script's own work. Run "
    "when the machine is quieter, or give the script cores of its own (`pitstop launch`), with no more "
    "threads than it has cores (torch.set_num_threads).",
    "periodic": "The loop pauses on a schedule: see what ran above, and do it less often or off the "
    "training thread.",
    "unknown": "pitstop could not tell what these steps did (no stack sample, no pattern, no load "
    "measured); `pitstop profile --full` samples more of them.",
}


def work_in(sample: dict[str, Any]) -> tuple[str, str] | None:
    """(cause, the function that names it) from a stack sample: its innermost frame that names its work."""
    for f in sample.get("frames") or []:  # innermost first
        mod, fn = f.get("module") or "", f.get("function") or ""
        if mod.startswith(SAVE_MODULES):
            return "save", f"{mod}.{fn}"
        if _CALLBACK.search(fn):
            return "callback", fn
        if f.get("user") and _SAVE_NAME.search(fn):
            return "save", fn
        if f.get("user") and _EVAL_NAME.search(fn):
            return "eval", fn
    return None


def contended(w: dict[str, Any] | None) -> bool:
    """Other processes (and steal) held CPUs the script wanted while the step ran: its threads waited
    on the run queue for ``WAITED_SHARE`` of the time (where the kernel reports it), else the CPUs were
    full and the script was working, not sleeping or blocked."""
    if not w:
        return False
    cpus = w.get("cpus") or 1
    others = (w.get("other_cpu_share", 0.0) + w.get("steal_share", 0.0)) * cpus
    if others < CONTENDED_CPUS:
        return False
    if (waited := w.get("runqueue_wait_s")) is not None:
        return waited >= WAITED_SHARE * w.get("wall_s", 0.0)
    own = w.get("own_cpus", 0.0)
    return own >= MIN_OWN_CPUS and others + own >= FULL_SHARE * cpus


def load_text(w: dict[str, Any]) -> str:
    cpus = w.get("cpus") or 1
    steal = w.get("steal_share", 0.0) * cpus
    return (
        f"other processes used {w.get('other_cpu_share', 0.0) * cpus:.1f} of {cpus} CPUs"
        + (f" and the hypervisor stole {steal:.1f}" if steal >= 0.05 else "")
        + f", the script {w.get('own_cpus', 0.0):.1f}"
        + (
            f", its threads waited {w['runqueue_wait_s']:.1f} s for a CPU"
            if w.get("runqueue_wait_s") is not None
            else ""
        )
        + f", over the {w.get('wall_s', 0.0):.1f} s measured"
    )


def period(idx: list[int]) -> int | None:
    """N when the steps recur every N steps (three or more, or two on a multiple of N), else None."""
    gaps = {b - a for a, b in itertools.pairwise(idx)}
    if len(gaps) != 1:
        return None
    g = gaps.pop()
    return g if g >= 2 and (len(idx) >= 3 or idx[0] % g == 0) else None


def classify(
    stalled: list[dict[str, Any]],
    samples: dict[int, list[dict[str, Any]]],
    windows: dict[int, dict[str, Any]],
    typical: dict[str, Any],
) -> dict[int, tuple[str, str]]:
    """Each stalled step's (cause, detail). ``typical``: the median measured step (``total_s``), its
    median data wait (``data_wait_s``) and whether steps holding a no-grad pass are the exception
    (``eval_rare``: where every step holds one, as with a frozen teacher, it says nothing)."""
    out: dict[int, tuple[str, str]] = {}
    for r in stalled:
        i = r["index"]
        named = next((w for s in samples.get(i, []) if (w := work_in(s))), None)
        if named is None and r.get("eval") and typical["eval_rare"]:
            named = ("eval", "")
        extra_wait = r.get("data_wait_s", 0.0) - typical["data_wait_s"]
        if named is None and extra_wait >= DATA_SHARE * (r["total_s"] - typical["total_s"]):
            named = ("data", f"{duration(r.get('data_wait_s', 0.0))} of it")
        if named is not None:
            out[i] = named
        elif contended(windows.get(i)):
            out[i] = ("contention", "")
        else:
            out[i] = ("unknown", "")
    rest = sorted(i for i, (c, _) in out.items() if c == "unknown")
    named_kinds = {v for v in out.values() if v[0] not in ("contention", "unknown")}
    if rest and len(named_kinds) == 1 and period(sorted(out)) is not None:
        out.update(dict.fromkeys(rest, named_kinds.pop()))  # unsampled turns of the same periodic work
    elif (g := period(rest)) is not None:
        out.update({i: ("periodic", f"every {g} steps") for i in rest})
    return out


def _list(items: list[Any], n: int = 6) -> str:
    head = ", ".join(str(i) for i in items[:n])
    return head + (f" and {len(items) - n} more" if len(items) > n else "")


def _most_common_place(seen: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first sample taken where most samples were."""
    if not seen:
        return None
    where = Counter((s["main"] or {}).get("where") for s in seen).most_common(1)[0][0]
    return next(s for s in seen if (s["main"] or {}).get("where") == where)


def _sampled_text(top: dict[str, Any] | None, seen: int, stalled: int) -> str:
    if top is None:
        return ""
    m = top["main"]
    return (
        f" What was running: {m.get('where')}"
        + (f" `{m['code']}`" if m.get("code") else "")
        + (f" in {m['call']}" if m.get("call") else "")
        + f" (sampled {duration(top['elapsed_s'])} into step {top['step']}"
        + (f"; {seen} of {stalled} stalled steps sampled" if stalled > 1 else "")
        + ")."
    )


def _unsampled_text(unsampled: list[dict[str, Any]], poll_s: float, n_samples: int) -> str:
    """Why some stalled steps have no stack sample: never 'too short' for a step longer than the poll."""
    if not unsampled:
        return ""
    idx = _list([r["index"] for r in unsampled])
    if max(r["total_s"] for r in unsampled) <= 2 * poll_s:
        return f" Step(s) {idx} not sampled: shorter than the watchdog could catch (it looks every {poll_s:g} s)."
    if n_samples >= MAX_SAMPLES:
        return f" Step(s) {idx} not sampled: the watchdog had taken its {MAX_SAMPLES} samples."
    return (
        f" Step(s) {idx} not sampled: the watchdog (every {poll_s:g} s) samples a step once it runs "
        f"{STALL_FACTOR:g}x the median of the steps before it, which was higher while these ran, or the "
        "main thread held the GIL in native code."
    )


def _groups_text(
    groups: dict[tuple[str, str], list[dict[str, Any]]], windows: dict[int, dict[str, Any]]
) -> str:
    parts = []
    for (cause, detail), rs in sorted(groups.items(), key=lambda kv: -sum(r["total_s"] for r in kv[1])):
        what = WHAT[cause] + (f" {detail}" if cause == "periodic" else f" ({detail})" if detail else "")
        busy = [r["index"] for r in rs if contended(windows.get(r["index"]))]
        if busy:  # contention's evidence; for the script's own work, the machine slowing it further
            what += (
                ", while" if cause != "contention" else ":"
            ) + f" in step {busy[0]} {load_text(windows[busy[0]])}"
        parts.append(f"step(s) {_list([r['index'] for r in rs])}: {what}")
    return "; ".join(parts)


def stall_findings(
    records: list[dict[str, Any]], watchdog: WatchdogRecord | Mapping[str, Any]
) -> list[Finding]:
    """One finding for the measured steps that stalled: when, how long, and what each was."""
    wd = WatchdogRecord.of(watchdog)
    steps = [r for r in records if r.get("index", 0) > 0 and not r.get("warmup") and not r.get("traced")]
    if len(steps) < 3:
        return []
    plain = [r for r in steps if not r.get("eval")]
    base = plain if len(plain) >= 3 else steps
    med = statistics.median(r["total_s"] for r in base)
    limit = max(STALL_FACTOR * med, med + STALL_MIN_S)
    stalled = [r for r in steps if r["total_s"] > limit]
    if not stalled:
        return []
    samples: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in wd.samples or []:
        samples[s["step"]].append(s)
    windows = {w["step"]: w for w in wd.contention or []}
    typical = {
        "total_s": med,
        "data_wait_s": statistics.median(r.get("data_wait_s", 0.0) for r in base),
        "eval_rare": len(plain) >= len(steps) / 2,
    }
    causes = classify(stalled, samples, windows, typical)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in stalled:
        groups[causes[r["index"]]].append(r)
    main_cause = max(groups, key=lambda k: sum(r["total_s"] for r in groups[k]))
    seen = [samples[r["index"]][0] for r in stalled if samples.get(r["index"])]
    top = _most_common_place(seen)
    excess = sum(r["total_s"] - med for r in stalled)
    mean = statistics.fmean(r["total_s"] for r in steps)
    saving = excess / len(steps)
    share = min(1.0, saving / mean) if mean > 0 else 0.0
    idx = [r["index"] for r in stalled]
    when = f"step {idx[0]}" if len(idx) == 1 else f"steps {_list(idx)}"
    if len(idx) > 1 and (g := period(idx)) is not None:
        when += f" (every {g} steps)"
    took = _list([duration(r["total_s"]) for r in stalled])
    unsampled = [r for r in stalled if not samples.get(r["index"])]
    poll_s = wd.poll_s or POLL_S
    headline = WHAT[main_cause[0]]
    if (g := period([r["index"] for r in groups[main_cause]])) is not None:
        headline += f" every {g} steps"
    return [
        Finding(
            id="profile.stall",
            severity=Severity.WARN if share >= WARN_SHARE else Severity.INFO,
            title=f"{len(stalled)} step(s) took over {STALL_FACTOR:g}x the median step "
            f"(longest {duration(max(r['total_s'] for r in stalled))}, median {duration(med)}): {headline}",
            evidence=f"{when} took {took} against the {duration(med)} median of {len(steps)} measured "
            f"steps (warm-up left out): {duration(excess)} in all, {duration(saving)} per step "
            f"({100 * share:.0f}% of the step time). What they were: {_groups_text(groups, windows)}."
            + _sampled_text(top, len(seen), len(stalled))
            + _unsampled_text(unsampled, poll_s, len(wd.samples or [])),
            data={
                "steps": idx,
                "step_s": [r["total_s"] for r in stalled],
                "start_s": [r["start_s"] for r in stalled],
                "median_step_s": med,
                "excess_s": excess,
                "causes": {str(r["index"]): list(causes[r["index"]]) for r in stalled},
                "samples": seen,
                "contention": [windows[i] for i in idx if i in windows],
            },
            fix=" ".join(FIXES[c] for c in dict.fromkeys(cause for cause, _ in groups)),
            location=(top["main"] or {}).get("where") if top else None,
            est_saving_s=saving,
            share=share,
        )
    ]
