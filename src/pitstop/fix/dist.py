"""`pitstop fix` on a launcher command (torchrun, accelerate launch): the distributed candidates, and the
step times a whole job gives the judge.

Candidates, each from its registry entry (``pitstop.recipes``) and the profile's facts of the ranks
(``pitstop.profile.runs.merge.ddp_facts``):

- ``threads``: the intra-op thread count the profile found to fit the free cores (the contention
  findings' and the thread probe's ``fit``) and each rank's share of the cores (usable cores / ranks
  on this node), whatever the script or OMP_NUM_THREADS asked for. It serves a single-process script
  too (``host.oversubscribed``, ``host.contention``): there the counts are "N threads", not per rank.
- ``no_sync``: gradient accumulation that all-reduced every micro-batch; the DDP forwards per optimizer
  step (k, the profile's median) become k-1 without sync and one with (``pitstop.recipes.step``).
- ``static_graph``: ``find_unused_parameters=True`` where the reducer saw the same parameters used every
  step on every rank; only then is ``static_graph=True`` valid, so only then is it proposed.

A child run of ``pitstop fix`` is the whole launch. Its steps for the judge are those of the rank whose
measured steps took longest in all: a synchronous job advances at the pace of its slowest rank, so that
rank's step times are the job's throughput, and they come from one clock (in a lockstep DDP job every
rank's steps are nearly the same anyway). The losses stay rank 0's: the same data shard run after run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pitstop.fix.candidate import Candidate
from pitstop.host.cpu import usable_cores
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.runs.runner import RunResult, RunSpec
from pitstop.recipes import recipe, threads

KINDS = ("threads", "no_sync", "static_graph")


def candidates(kind: str, why: str, config: dict[str, Any]) -> tuple[list[Candidate], str | None]:
    """(candidates, None) or ([], why it is skipped) for ``no_sync`` or ``static_graph`` (``threads`` has
    its own builder in fix: ``thread_candidates``)."""
    dist = config.get("distributed") or {}
    ddp = dist.get("ddp") or []
    if not ddp:
        return [], f"{kind}: the script built no DistributedDataParallel model (or was not run by a launcher)"
    if kind == "no_sync":
        k = round(float(dist.get("forwards_per_step") or 0))
        if k < 2 or float(dist.get("rounds_per_step") or 0) < 1.5:
            return [], f"{kind}: one gradient all-reduce per optimizer step already (no accumulation to skip)"
        return [Candidate("DDP no_sync", kind, Overrides(ddp_no_sync=k), why)], None
    if kind == "static_graph":
        if all(d.get("static_graph") for d in ddp):
            return [], f"{kind}: every DDP model already has static_graph=True"
        if not dist.get("graph_static"):
            return [], (
                f"{kind}: the parameters used changed between steps (or were not seen on every rank): "
                "static_graph=True would be invalid"
            )
        return [Candidate("DDP static_graph", kind, Overrides(ddp_static_graph=True), why)], None
    raise KeyError(kind)


def thread_candidates(
    why: str,
    config: dict[str, Any],
    data: dict[str, Any] | None = None,
    fit: int | None = None,
    values: tuple[int, ...] | None = None,
) -> tuple[list[Candidate], str | None]:
    """The ``threads`` candidates: the counts its component chooses (``recipes.threads.choose``) from
    ``values``, ``fit`` (the count the profile found to fit the free cores; the thread probe's in ``data``
    where none is given), the usable cores / local ranks, and the count the script already ran."""
    d = data or {}
    rec = (d.get("probes") or {}).get("threads") or {}
    launcher = bool(config.get("local_world_size"))  # set where a launch's ranks were merged
    share = max(1, usable_cores() // int(config.get("local_world_size") or 1))
    now = int(rec.get("threads") or (d.get("torch") or {}).get("num_threads") or 0)
    counts = threads.choose(fit or rec.get("fit"), share, now, values)
    if isinstance(counts, str):
        return [], counts
    per = " per rank" if launcher else ""
    return [
        Candidate(
            f"{n} thread{'s' if n != 1 else ''}{per}", threads.NAME, Overrides.setting(threads.KNOB, n), why
        )
        for n in counts
    ], None


def ddp_location(config: dict[str, Any]) -> str | None:
    """file:line where the profile saw the (first) DistributedDataParallel model built."""
    ddp = (config.get("distributed") or {}).get("ddp") or []
    return ddp[0].get("location") if ddp else None


def snippet(kind: str, overrides: dict[str, Any], config: dict[str, Any]) -> tuple[str, str | None]:
    """(code, file:line) of a distributed fix: the registry's snippet, at the DDP model's line."""
    value = overrides.get("num_threads") if kind == "threads" else overrides.get("ddp_no_sync")
    return recipe(kind).code(value=value), None if kind == "threads" else ddp_location(config)


def worker_script(launcher: str, args: list[str]) -> str | None:
    """The training script a launcher command runs in every worker (None: it runs a module or a
    non-Python program), read with the launcher's own argument parser."""
    if launcher == "torchrun":
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
    else:
        from accelerate.commands.launch import launch_command_parser

        parser = launch_command_parser()
        args = args[1:] if args[:1] == ["launch"] else args
    try:
        ns, _ = parser.parse_known_args(args)
    except SystemExit:  # argparse's way of saying the arguments are not the launcher's
        return None
    if getattr(ns, "module", False) or getattr(ns, "no_python", False):
        return None
    return getattr(ns, "training_script", None)


def slowest_rank(result: RunResult) -> int | None:
    """The rank whose measured steps took longest in all (None: not a launch, or no rank measured)."""
    ranks = getattr(result, "ranks", None) or {}
    timed = {r: sum(s.total_s for s in res.steps) for r, res in ranks.items() if res.steps}
    return max(timed, key=lambda r: timed[r]) if timed else None


def job_view(result: RunResult) -> RunResult:
    """A launch's result as the fix judge reads it: the slowest rank's steps (rank 0's losses), and every
    rank's overrides that did not apply."""
    slow = slowest_rank(result)
    if slow is None:
        return result
    ranks = result.ranks  # type: ignore[attr-defined]
    out = copy.copy(result)
    out.steps = ranks[slow].steps
    out.warmup_steps = ranks[slow].warmup_steps
    out.config = dict(result.config)
    errors: dict[str, str] = {}
    for r, res in sorted(ranks.items()):
        for msg in res.config.get("override_errors") or []:
            errors.setdefault(msg, msg if r == 0 else f"rank {r}: {msg}")
    out.config["override_errors"] = list(errors.values())
    out.config["judged_rank"] = slow
    return out


def job_runner(runner: Callable[[RunSpec], RunResult]) -> Callable[[RunSpec], RunResult]:
    """``runner`` whose launch results are seen through ``job_view``."""

    def run(spec: RunSpec) -> RunResult:
        return job_view(runner(spec))

    return run
