"""The thread probe: the script's work at a thread count that fits the free cores vs as it ran, on its
own model and last batch, after the script stopped (CPU models only). A pass is forward+backward and,
where the script's main process loaded its batches (``num_workers=0``), loading one batch as it did:
its transforms run torch ops on the same intra-op threads.

First a window of passes at the script's thread count, while ``host.load.CompetitionMeter`` watches what
the process competes with on its CPUs (other processes' busy time, steal, the run queue). The threads
that fit are the cores left free (``host.load.fitting_threads``) over the local ranks sharing them, at
most the usable cores. Where that is fewer than the script's threads, both counts are timed in rotating
rounds through ``pitstop.measure`` (``probe_kit.timed``), giving the saving and its interval. The thread
count is process-wide, so every pass sets its own and the script's count is restored afterwards. The
probe is bounded: a pass at the script's threads slower than ``MAX_PASS_S`` skips the A/B, saying why;
a slower pass widens the rounds' budget to hold two rounds (``measure.plan.budget_for_rounds``), up to
``MAX_BUDGET_S``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from pitstop.host.cpu import usable_cores
from pitstop.host.load import CompetitionMeter, fitting_threads
from pitstop.measure.clock import time_calls
from pitstop.measure.plan import budget_for_rounds
from pitstop.profile.probe.probe_kit import as_script, fwd_bwd, saving, timed
from pitstop.profile.record.captured import CapturedLoader

WINDOW_S = 0.3  # passes at the script's threads while the meter watches, before the A/B
BUDGET_S = 6.0  # the A/B's rounds
# A busy machine is where passes are slow and this probe matters most: it allows slower passes than the
# other probes (probes.MAX_PASS_S), widening its rounds' budget to fit two rounds of them, up to a bound.
MAX_PASS_S = 8.0
MAX_BUDGET_S = 20.0


def local_ranks(env: dict[str, str] | None = None) -> int:
    """Processes of this job on this machine: torchrun's LOCAL_WORLD_SIZE, else 1."""
    try:
        return max(1, int((env if env is not None else os.environ).get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def main_process_batch(loaders: list[CapturedLoader] | None) -> tuple[Callable[[], Any], str | None] | None:
    """A call that loads one batch as the script's main process did (the loader it waited on most, with
    ``num_workers=0`` and an indexable dataset: the same first indices every call), and where that
    loader was built; None where no loader loaded in the main process."""
    main = [
        c
        for c in loaders or []
        if c.batches
        and not getattr(c.loader, "num_workers", 0)
        and getattr(c.loader, "batch_size", None)
        and not isinstance(c.dataset, torch.utils.data.IterableDataset)
        and hasattr(c.dataset, "__getitem__")
        and hasattr(c.dataset, "__len__")
    ]
    if not main:
        return None
    c = max(main, key=lambda c: c.wait_s)
    n = len(c.dataset)
    if n < 1:
        return None
    idx = [i % n for i in range(c.loader.batch_size)]
    collate, dataset = c.loader.collate_fn, c.dataset
    return (lambda: collate([dataset[i] for i in idx])), c.location


def run(
    model: torch.nn.Module | None,
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None,
    facts: dict[str, Any],
    budget_s: float = BUDGET_S,
    loaders: list[CapturedLoader] | None = None,
) -> dict[str, Any]:
    """``{"threads": record}`` for a CPU model with a last batch (else empty). The record: the script's
    ``threads``, the ``fit`` count, ``local_ranks``, ``competition`` (``Competition.to_dict``) and, where
    the A/B ran, ``probe_kit.saving``'s keys (base: as it ran, new: at ``fit``); or ``skipped``. Given the
    script's ``loaders`` (only after the script ended: loading a batch runs its dataset's code), a pass
    also loads a batch as its main process did (``loader_location`` in the record)."""
    p = next(model.parameters(), None) if model is not None else None
    if p is None or p.device.type != "cpu" or inputs is None:
        return {}
    threads = torch.get_num_threads()
    try:
        return {"threads": _probe(model, inputs, facts, threads, budget_s, main_process_batch(loaders))}
    except Exception as e:
        return {"threads": {"threads": threads, "error": f"{type(e).__name__}: {e}"}}
    finally:
        torch.set_num_threads(threads)


def _probe(
    model: torch.nn.Module,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    facts: dict[str, Any],
    threads: int,
    budget_s: float,
    load: tuple[Callable[[], Any], str | None] | None,
) -> dict[str, Any]:
    args, kwargs = inputs
    loader_error = None
    if load is not None:
        try:  # the script may have removed its data on the way out (a temporary folder)
            load[0]()
        except Exception as e:
            loader_error, load = f"loading a batch failed: {type(e).__name__}: {e}", None

    def at(n: int) -> Callable[[], None]:
        def one() -> None:
            torch.set_num_threads(n)
            if load is not None:
                load[0]()
            with as_script("cpu", facts):
                fwd_bwd(model, args, kwargs)

        return one

    meter = CompetitionMeter()
    # meter.sample between passes: the script's own threads are not all running then
    window = time_calls(at(threads), 500, budget_s=WINDOW_S, between=meter.sample)
    passes, slowest = len(window), max(window)
    seen = meter.result()
    ranks = local_ranks()
    fit = min(threads, usable_cores(), fitting_threads(seen.free_cores, ranks))
    out: dict[str, Any] = {
        "threads": threads,
        "fit": fit,
        "local_ranks": ranks,
        "usable_cores": usable_cores(),
        "window": seen.to_dict(),
        "window_passes": passes,
    }
    if load is not None:
        out["loader_location"] = load[1]
    if loader_error:
        out["loader_error"] = loader_error
    if fit >= threads:
        out["competition"] = seen.to_dict()
        return out
    if slowest > MAX_PASS_S:
        out["skipped"] = f"one pass at {threads} threads took {slowest:.1f} s (> {MAX_PASS_S} s)"
    else:
        # two rounds at least: a slow pass (the very case of a busy machine) widens the budget. A round is
        # both counts' passes, taken as twice the window's slowest: passes under load vary that much.
        budget_s = budget_for_rounds(2 * slowest, 2, budget_s, MAX_BUDGET_S)
        t = timed({"as_is": at(threads), "fit": at(fit)}, "cpu", budget_s=budget_s)
        out.update(saving(t, "as_is", "fit"))
    out["competition"] = meter.result().to_dict()  # window and A/B together
    return out
