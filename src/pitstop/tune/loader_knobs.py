"""The DataLoader tuner's two switches at the chosen worker count, each measured: ``persistent_workers``
(the worker start-up it saves each epoch) and ``pin_memory`` (the host-to-device copy it speeds, less
what pinning costs the loader). Each returns its finding; ``tune.loader`` adopts what they recommend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.recipes.dataloader import PERSISTENT_WORKERS, PIN_MEMORY
from pitstop.tune.loader_measure import (
    LoaderPoint,
    LoaderSetting,
    TuneConfig,
    describe_failure,
    make_loader,
    measure_restart,
    measure_setting,
)
from pitstop.units import MiB

# each finding is the tuner's measure of a loader component's keyword
PERSISTENT_ID = f"tune.loader.{PERSISTENT_WORKERS.KEY}"
PIN_ID = f"tune.loader.{PIN_MEMORY.KEY}"


def persistent_finding(
    dataset: Any, base_kwargs: dict[str, Any], chosen: LoaderSetting, best: LoaderPoint | None
) -> Finding | None:
    cold = measure_restart(dataset, chosen.with_value(PERSISTENT_WORKERS, False), base_kwargs)
    warm = measure_restart(dataset, chosen.with_value(PERSISTENT_WORKERS, True), base_kwargs)
    if cold is None or warm is None or best is None or not best.ok:
        return None
    saving = max(0.0, cold - warm)
    try:
        n_batches = len(make_loader(dataset, base_kwargs, chosen))
    except TypeError:
        n_batches = None
    epoch_s = n_batches / best.batches_per_s if n_batches and best.batches_per_s else None
    share = saving / (epoch_s + cold) if epoch_s else None
    recommend = saving > 0.005 and (share is None or share >= 0.01)
    epoch_txt = (
        f" = {100 * share:.1f}% of a {epoch_s:.2f} s epoch ({n_batches} batches)" if share is not None else ""
    )
    return Finding(
        id=PERSISTENT_ID,
        severity=Severity.INFO,
        title="persistent_workers=True saves worker start-up each epoch"
        if recommend
        else "persistent_workers makes no measurable difference here",
        evidence=f"new epoch to first batch: {cold * 1000:.0f} ms with fresh workers, {warm * 1000:.0f} ms "
        f"with persistent ones (median of 3, {chosen.num_workers} workers){epoch_txt}",
        data={"restart_s": cold, "persistent_restart_s": warm, "epoch_s": epoch_s, "recommend": recommend},
        est_saving_s=saving,
        fix="Pass persistent_workers=True." if recommend else "",
    )


def pin_memory_finding(
    base_kwargs: dict[str, Any],
    chosen: LoaderSetting,
    dataset: Any,
    cfg: TuneConfig,
    measure: Callable[..., LoaderPoint] = measure_setting,
) -> Finding:
    """pin_memory at the chosen setting: the copy it speeds and, when that is worth it, what pinning
    costs the loader (``measure``: how a setting is measured)."""
    import torch

    if not torch.cuda.is_available():
        return Finding(
            id=PIN_ID,
            severity=Severity.INFO,
            title="pin_memory not measured: no CUDA device",
            evidence="Pinned (page-locked) host memory only speeds up host-to-device copies; this process "
            "sees no CUDA device, so there is no copy to measure and pin_memory was left as the script set it "
            f"({PIN_MEMORY.value(base_kwargs.get(PIN_MEMORY.KEY))}).",
            data={"measured": False},
        )
    if dataset is None:
        return Finding(id=PIN_ID, severity=Severity.INFO, title="pin_memory not measured")
    from pitstop.tune.h2d import measure_h2d

    try:
        r = measure_h2d(next(iter(make_loader(dataset, base_kwargs, chosen.with_value(PIN_MEMORY, False)))))
    except Exception as e:  # a dataset that fails was reported by the sweep already
        return Finding(
            id=PIN_ID,
            severity=Severity.INFO,
            title="pin_memory not measured",
            evidence=f"could not time a copy: {describe_failure(e)}",
            data={"measured": False},
        )
    copy_saving = r["pageable_s"] - r["pinned_s"]
    evidence = (
        f"copy of one batch ({r['bytes'] / MiB:.1f} MiB) to {r['device']}: {r['pageable_s'] * 1000:.2f} ms "
        f"pageable, {r['pinned_s'] * 1000:.2f} ms pinned (median of {r['repeats']}, CUDA events)"
    )
    loader_cost = 0.0
    if copy_saving > r["pageable_s"] * cfg.min_gain:
        # Pinning is done by a thread in the training process: measure what it costs the loader.
        off = measure(dataset, chosen.with_value(PIN_MEMORY, False), base_kwargs, cfg.measure)
        on = measure(dataset, chosen.with_value(PIN_MEMORY, True), base_kwargs, cfg.measure)
        if off.ok and on.ok:
            loader_cost = max(0.0, 1 / on.batches_per_s - 1 / off.batches_per_s)  # type: ignore[operator]
            evidence += f"; the loader gives {on.batches_per_s:.1f} batches/s pinning vs {off.batches_per_s:.1f} without"
            r.update(loader_pinned_batches_per_s=on.batches_per_s, loader_batches_per_s=off.batches_per_s)
    net = copy_saving - loader_cost
    recommend = copy_saving > r["pageable_s"] * cfg.min_gain and net > 0
    return Finding(
        id=PIN_ID,
        severity=Severity.WARN if recommend and not chosen.of(PIN_MEMORY) else Severity.INFO,
        title="pin_memory=True speeds the host-to-device copy"
        if recommend
        else "pin_memory does not pay off here",
        evidence=evidence,
        data={"measured": True, "recommend": recommend, "net_saving_s": net, **r},
        est_saving_s=max(0.0, net),
        fix="Pass pin_memory=True and copy with .to(device, non_blocking=True)." if recommend else "",
    )
