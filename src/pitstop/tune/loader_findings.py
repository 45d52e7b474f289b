"""DataLoader tuner results -> Findings: the chosen setting and its measured speed-up, worker crashes,
memory rejections, an unpicklable or iterable dataset. Pure functions of measured points; never measure."""

from __future__ import annotations

from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.measure import HELPED, Interval, decide
from pitstop.recipes import dataloader
from pitstop.tune.loader_measure import LoaderPoint, LoaderSetting, TuneConfig, is_worker_crash


def unpicklable_finding(why: str, method: str) -> Finding:
    """The dataset fails pickle.dumps: a note under fork (workers still start), an error otherwise."""
    if method == "fork":
        return Finding(
            id="tune.loader.unpicklable",
            severity=Severity.INFO,
            title="Dataset cannot be pickled: workers only work with the 'fork' start method",
            evidence=f"pickle.dumps(dataset) failed: {why}. This Python starts workers with fork, "
            "so they work here; spawn/forkserver (macOS, Python 3.14+ on Linux) would fail.",
            data={"error": why, "start_method": method},
            fix="Keep unpicklable members (open files, lambdas, locks, DB handles) out of the "
            "dataset's __init__; open them lazily in __getitem__ or a worker_init_fn.",
        )
    return Finding(
        id="tune.loader.unpicklable",
        severity=Severity.ERROR,
        title="Dataset cannot be pickled, so DataLoader workers cannot start",
        evidence=f"start method {method!r} pickles the dataset for each worker, and "
        f"pickle.dumps(dataset) failed: {why}. Only num_workers=0 was measured.",
        data={"error": why, "start_method": method},
        fix="Make the dataset picklable: open files/handles lazily in __getitem__ or "
        "worker_init_fn, replace lambdas with module-level functions.",
    )


def iterable_finding(dataset: Any) -> Finding:
    return Finding(
        id="tune.loader.iterable",
        severity=Severity.INFO,
        title="IterableDataset: each worker runs its own copy of the iterator",
        evidence=f"{type(dataset).__name__} is an IterableDataset; batches/s with N workers counts "
        "what N iterators yield, which is only real throughput if the dataset splits its stream by "
        "torch.utils.data.get_worker_info() (otherwise every sample is loaded N times).",
        fix="Shard the stream by worker id in __iter__ before using the chosen num_workers.",
    )


def dataset_failure(p: LoaderPoint) -> Finding:
    return Finding(
        id="tune.loader.dataset_error",
        severity=Severity.ERROR,
        title="The dataset fails to produce a batch even without workers",
        evidence=f"num_workers=0: {p.reason}",
        data={"reason": p.reason},
        fix="Fix the dataset's __getitem__/collate_fn error first; nothing else was measured.",
    )


def sweep_findings(points: list[LoaderPoint]) -> list[Finding]:
    out = []
    crashed = [p for p in points if p.status == "failed"]
    if crashed:
        worker = [p for p in crashed if p.setting.num_workers > 0]
        first = crashed[0]
        out.append(
            Finding(
                id="tune.loader.worker_crash",
                severity=Severity.ERROR,
                title=f"DataLoader failed with {first.setting.label()}"
                + (" (in a worker process)" if worker and is_worker_crash(first.reason) else ""),
                evidence="; ".join(f"{p.setting.label()}: {p.reason}" for p in crashed[:3]),
                data={"failed": [{"setting": p.setting.label(), "reason": p.reason} for p in crashed]},
                fix="A worker that dies (segfault, killed for memory, os._exit) or raises takes the loader down. "
                "Run the dataset with num_workers=0 to see the error in the main process; check for "
                "non-fork-safe libraries (OpenCV threads, CUDA in workers) and per-worker memory.",
            )
        )
    rejected = [p for p in points if p.status == "rejected"]
    if rejected:
        out.append(
            Finding(
                id="tune.loader.memory",
                severity=Severity.WARN,
                title=f"{len(rejected)} setting(s) rejected: they would exhaust RAM or /dev/shm",
                evidence="; ".join(f"{p.setting.label()}: {p.reason}" for p in rejected[:3]),
                data={"rejected": [{"setting": p.setting.label(), "reason": p.reason} for p in rejected]},
                fix="Stay at or below the chosen worker count on this machine; to go higher, shrink per-worker "
                "memory (load lazily, avoid Python lists of objects) or enlarge /dev/shm (docker --shm-size).",
            )
        )
    return out


def kwargs_diff(baseline: LoaderSetting, chosen: LoaderSetting) -> dict[str, Any]:
    """The DataLoader keywords to change to go from the script's setting to the chosen one."""
    b, c = baseline.kwargs(), chosen.kwargs()
    return {k: v for k, v in c.items() if b.get(k, _DEFAULTS.get(k)) != v}


# torch's values for keywords a call leaves out: each loader component's ``DEFAULT``, and the prefetch factor
_DEFAULTS = {**{c.KEY: c.DEFAULT for c in dataloader.SETTINGS}, "prefetch_factor": None}


def best_finding(
    baseline: LoaderSetting,
    chosen: LoaderSetting,
    base_rate: float | None,
    chosen_rate: float | None,
    speedup: float | None,
    location: str | None,
    cfg: TuneConfig,
    interval: Interval | None = None,
    workers_basis: str | None = None,
) -> Finding:
    """The chosen setting against the script's. The speed-up is throughput over the confirmation rounds;
    with their interval (2 rounds or more), the gain counts when ``measure.decide`` calls it helped;
    with one round, by its estimate. ``workers_basis``: why this worker count (``recipes.workers``)."""
    changes = kwargs_diff(baseline, chosen)
    data = {
        "baseline": baseline.label(),
        "chosen": chosen.label(),
        "changes": changes,
        "baseline_batches_per_s": base_rate,
        "chosen_batches_per_s": chosen_rate,
        "speedup": speedup,
    }
    if not changes:
        rate = f" ({base_rate:.1f} batches/s)" if base_rate else ""
        return Finding(
            id="tune.loader.best",
            severity=Severity.PASS,
            title="The script's DataLoader setting is already the fastest measured",
            evidence=f"{baseline.label()}{rate}; no other setting was {cfg.min_gain:.0%} faster",
            data=data,
        )
    code = "DataLoader(..., " + ", ".join(f"{k}={v!r}" for k, v in changes.items()) + ")"
    if speedup is not None and base_rate and chosen_rate:
        ev = (
            f"{chosen_rate:.1f} vs {base_rate:.1f} batches/s ({speedup:.2f}x), batches per wall-clock second "
            f"over {cfg.confirm_rounds} interleaved rounds, {chosen.label()} vs the script's {baseline.label()}"
        )
        if interval is not None:
            ev += f"; {interval.text()}"
    else:
        ev = f"{chosen.label()} vs the script's {baseline.label()} (speed-up not confirmed)"
    if workers_basis and "num_workers" in changes:
        ev += f"; num_workers={chosen.num_workers}: {workers_basis}"
    gain = speedup is not None and speedup >= 1 + cfg.min_gain
    if interval is not None:
        gain = decide(interval, cfg.min_gain, min_rounds=2) == HELPED
    return Finding(
        id="tune.loader.best",
        severity=Severity.WARN if gain else Severity.INFO,
        title=f"Use {chosen.label()}" + (f": {speedup:.2f}x faster loading" if speedup else ""),
        evidence=ev,
        data=data,
        fix="Change the DataLoader arguments.",
        fix_code=code,
        share=None if not speedup or speedup <= 0 else max(0.0, 1 - 1 / speedup),
        location=location,
    )
