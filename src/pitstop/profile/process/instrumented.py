"""The instrumented run inside a process, shared by every way one starts: the bootstrap's ``main`` (a
profiled script), a rank of a launch (``rank_start``), a ``torch.multiprocessing`` child
(``child_worker``) and the in-process ``Profiler`` (``pitstop.integrations.profiler``). Here: the
instrumentation's ``Config`` from a run's settings, the extension points a rank or a child adds to the run,
the one-line quote of the script's error, and ``finalize`` (uninstall, read what the run left, run the exit
probes).
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pitstop.profile.record.measurements import Measurements
from pitstop.profile.record.parts import Probes, TraceRecord

if TYPE_CHECKING:  # hooks imports torch: not before main() can report an interrupted import
    from pitstop.profile.capture.hooks import Config

MEASUREMENTS = "measurements.json"
# extensions in the child (pitstop.profile.rank.rank_worker): fn(inst) after install, fn(inst, data) before the
# final record is written
ON_INSTALL: list[Any] = []
ON_FINISH: list[Any] = []
# fn() the moment the script has ended, however it ended (before the report is made)
ON_END: list[Any] = []
# fn(model) -> (model to probe or None, why not): a rank of a launch probes a copy outside DDP, or none
ON_PROBES: list[Any] = []
# fn(status) once the script's fate is known, before the report is made (its children finish: children.py)
ON_DONE: list[Any] = []


def describe_error(e: BaseException) -> tuple[str, str]:
    """A one-line quote of the exception with the innermost user file:line, and the traceback text."""
    from pitstop.profile.capture.where import is_user_file

    where = None
    for fs in reversed(traceback.extract_tb(e.__traceback__)):
        if is_user_file(fs.filename):
            where = f"{os.path.relpath(fs.filename)}:{fs.lineno}"
            break
    if isinstance(e, SyntaxError) and e.filename:
        where = f"{e.filename}:{e.lineno}"
    message = e.msg if isinstance(e, SyntaxError) and e.msg else str(e)  # its str repeats file and line
    text = f"{type(e).__name__}: {message}" + (f" (at {where})" if where else "")
    # The frames of pitstop and runpy above the user's first frame are not the user's traceback (a
    # SyntaxError has no user frame at all: only its file, line and caret remain).
    te = traceback.TracebackException.from_exception(e)
    first = next((i for i, fs in enumerate(te.stack) if is_user_file(fs.filename)), len(te.stack))
    te.stack = traceback.StackSummary.from_list(list(te.stack)[first:])
    lines = "".join(te.format()).splitlines(keepends=True)
    return text, "".join(lines[-60:])


def make_config(cfg: dict[str, Any], out_dir: Path) -> Config:
    """The instrumentation's ``Config`` from a run's settings (the run-config JSON)."""
    from pitstop.profile.capture.hooks import Config
    from pitstop.profile.record.overrides import Overrides

    return Config(
        steps=int(cfg["steps"]),
        warmup=int(cfg["warmup"]),
        full=bool(cfg["full"]),
        trace=bool(cfg["trace"]),
        overrides=Overrides.from_dict(cfg.get("overrides")),
        callback=cfg.get("callback"),
        callback_at=cfg.get("callback_at", "loader"),
        out_dir=out_dir,
        probes=bool(cfg.get("probes", True)),
    )


def finalize(inst: Any, status: str, stop_workers: bool = True) -> dict[str, Any]:
    """Uninstall, read what the run left (CUDA events, losses, facts), run the probes. ``stop_workers``
    False keeps the script's DataLoader workers (in-process profiling: the script goes on using them)."""
    import torch

    from pitstop.profile.capture.facts import finish_optimizer_facts
    from pitstop.profile.capture.loaders import shutdown_loader_workers

    inst.close_pending()
    inst.uninstall()
    if inst.captured.device is None:  # data made on the device directly: take the model's device
        for m in inst.captured.models:
            p = next(m.parameters(), None)
            if p is not None and not p.is_cpu:
                inst.captured.device = p.device
                break
    if stop_workers:
        shutdown_loader_workers(inst.loaders)
    if inst.gpu_sampler is not None:
        inst.gpu_sampler.stop()
    cuda = inst.captured.device is not None and inst.captured.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        for rec, events in zip(inst.records, inst.h2d_events, strict=False):
            if events:
                rec["h2d_gpu_s"] = sum(s.elapsed_time(e) for s, e in events) / 1000.0
    losses: list[float | None] = []
    for t in inst.losses:
        try:
            losses.append(None if t is None else float(t.float().mean()))
        except Exception:
            losses.append(None)
    finish_optimizer_facts(inst.captured.optimizers, inst.optimizer_facts)
    trace = None
    if inst.tracer is not None:
        inst.tracer.finish()
        trace = inst.tracer.summary()
    inst.device_timer.finish()  # CUDA phase events: read the rest, anchor on the host clock
    record = inst.record(status)
    if (
        status in ("completed", "stopped")
        and inst.cfg.probes
        and not inst.callback_requested
        and inst.cfg.overrides.is_empty()
        and inst.records
    ):
        record = _with_probes(inst, record, losses, stop_workers)
    return replace(
        record,
        trace=TraceRecord.from_json(trace) if trace is not None else None,
        extra={**record.extra, "losses": losses},
        nulls=record.nulls | {"trace", "probes"},  # written as null where there is none
    ).to_json()


def _with_probes(inst: Any, record: Measurements, losses: list[float | None], stop_workers: bool) -> Measurements:
    """``record`` with the exit probes' results and the MFU (the record so far is written first, as
    ``probing``, so a run stopped in the probes keeps its steps)."""
    from pitstop.profile.probe.mfu import measure as measure_mfu
    from pitstop.profile.probe.probes import run_probes
    from pitstop.profile.record.jsonfile import write_json_atomic

    if inst.flush_path is not None:
        write_json_atomic(inst.flush_path, {**record.to_json(), "status": "probing", "losses": losses})
    model = inst.captured.models[0] if inst.captured.models else None
    facts = record.model.to_json()
    why_not = None
    for fn in ON_PROBES:
        model, why_not = fn(model)
    t_probes = time.perf_counter()
    try:
        probes = run_probes(
            model,
            inst.captured.last_inputs,
            facts,
            list(zip(inst.captured.optimizers, inst.optimizer_facts, strict=False)),
            loaders=inst.captured.loaders if stop_workers else None,  # in-process: the script goes on
        )
    except Exception as e:
        probes = {"error": f"{type(e).__name__}: {e}"}
    if why_not:
        probes.setdefault("skipped", []).append(f"model: {why_not}")
    mfu = measure_mfu(model, inst.captured.last_inputs, facts, probes)  # FLOPs/step vs peak
    probes_s = time.perf_counter() - t_probes  # the MFU's matmul peak included
    return replace(record, mfu=mfu, probes=Probes.from_json(probes), extra={**record.extra, "probes_s": probes_s})
