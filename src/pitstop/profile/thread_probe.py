"""The thread probe: the script's forward+backward at a thread count that fits the free cores vs as it
ran, on its own model and last batch, after the script stopped (CPU models only).

First a window of passes at the script's thread count, while ``host.load.CompetitionMeter`` watches what
the process competes with on its CPUs (other processes' busy time, steal, the run queue). The threads
that fit are the cores left free (``host.load.fitting_threads``) over the local ranks sharing them, at
most the usable cores. Where that is fewer than the script's threads, both counts are timed in rotating
rounds through ``pitstop.measure`` (``probes.timed``), giving the saving and its interval. The thread
count is process-wide, so every pass sets its own and the script's count is restored afterwards. The
probe is bounded: a pass slower than ``MAX_PASS_S`` or a budget too small for two passes of each count
skips the A/B, saying why.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from pitstop.host.cpu import usable_cores
from pitstop.host.load import CompetitionMeter, fitting_threads
from pitstop.profile.probes import MAX_PASS_S, _as_script, _fwd_bwd, saving, timed

WINDOW_S = 0.3  # passes at the script's threads while the meter watches, before the A/B
BUDGET_S = 6.0  # the A/B's rounds


def local_ranks(env: dict[str, str] | None = None) -> int:
    """Processes of this job on this machine: torchrun's LOCAL_WORLD_SIZE, else 1."""
    try:
        return max(1, int((env if env is not None else os.environ).get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def run(
    model: torch.nn.Module | None,
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None,
    facts: dict[str, Any],
    budget_s: float = BUDGET_S,
) -> dict[str, Any]:
    """``{"threads": record}`` for a CPU model with a last batch (else empty). The record: the script's
    ``threads``, the ``fit`` count, ``local_ranks``, ``competition`` (``Competition.to_dict``) and, where
    the A/B ran, ``probes.saving``'s keys (base: as it ran, new: at ``fit``); or ``skipped``."""
    p = next(model.parameters(), None) if model is not None else None
    if p is None or p.device.type != "cpu" or inputs is None:
        return {}
    threads = torch.get_num_threads()
    try:
        return {"threads": _probe(model, inputs, facts, threads, budget_s)}
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
) -> dict[str, Any]:
    args, kwargs = inputs

    def at(n: int) -> Any:
        def one() -> None:
            torch.set_num_threads(n)
            with _as_script("cpu", facts):
                _fwd_bwd(model, args, kwargs)

        return one

    meter = CompetitionMeter()
    start, passes, slowest = time.perf_counter(), 0, 0.0
    while passes < 1 or (time.perf_counter() - start < WINDOW_S and passes < 50):
        t = time.perf_counter()
        at(threads)()
        slowest = max(slowest, time.perf_counter() - t)
        passes += 1
        meter.sample()  # between passes: the script's own threads are not all running
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
    if fit >= threads:
        out["competition"] = seen.to_dict()
        return out
    if slowest > MAX_PASS_S:
        out["skipped"] = f"one forward+backward at {threads} threads took {slowest:.1f} s (> {MAX_PASS_S} s)"
    elif 4 * slowest > budget_s:
        out["skipped"] = f"one forward+backward took {slowest:.1f} s: two rounds do not fit {budget_s:.0f} s"
    else:
        t = timed({"as_is": at(threads), "fit": at(fit)}, "cpu", budget_s=budget_s)
        out.update(saving(t, "as_is", "fit"))
    out["competition"] = meter.result().to_dict()  # window and A/B together
    return out
