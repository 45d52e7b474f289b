"""The measurements record the script's process writes, built from typed parts
(``record.measurements.Measurements`` and ``record.parts``): the writer and the parent that reads it
(``runs.result.RunResult.measurements``) share one definition of every field."""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Any

import torch

from pitstop.profile.capture import gpu_memory
from pitstop.profile.capture.facts import clock, model_facts, torch_facts
from pitstop.profile.record.measurements import (
    SCHEMA,
    LoaderRecord,
    Measurements,
    ModelRecord,
    SyncSite,
)
from pitstop.profile.record.parts import DeviceTime, MemoryRecord, OptimizerRecord
from pitstop.recipes.host_memory import kept


def memory_record(device: torch.device | None, final: bool, oom: dict[str, Any] | None) -> MemoryRecord:
    """The process's peak RSS; at the end on CUDA the allocator's peaks; the CUDA OOM seen, if any."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    memory: dict[str, Any] = {"peak_rss_bytes": usage.ru_maxrss * 1024}
    if final and device is not None and device.type == "cuda":
        with contextlib.suppress(Exception):
            memory["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            memory["cuda_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        memory.update(gpu_memory.memory_facts(device))
    memory["oom"] = oom
    return MemoryRecord.from_json(memory)


def measurements(inst: Any, status: str, final: bool = True) -> Measurements:
    """``inst``'s (a ``capture.hooks.Instrumentation``) record so far; ``final``: at the end, with the
    facts only the end can give (the models' parameters, torch's settings, the CUDA peaks)."""
    models = []
    for m in inst.captured.models:
        f = dict(inst.model_facts.get(id(m), {}))
        if final:
            f.update(model_facts(m))
        models.append(ModelRecord.from_json(f))
    dev = inst.captured.device
    summary = inst.device_timer.summary()
    return Measurements.build(
        version=1,
        schema=SCHEMA,
        status=status,
        warmup=inst.cfg.warmup,
        steps=inst.records,
        step_boundary=inst.clock.boundary_label(),
        totals=inst.totals(),
        sync_sites=tuple(SyncSite.from_json(r) for r in inst.sync_site_rows()),
        loaders=tuple(LoaderRecord.from_json(c.settings()) for c in inst.captured.loaders),
        models=tuple(models),
        optimizers=tuple(OptimizerRecord.from_json(f) for f in inst.optimizer_facts),
        device=str(dev) if dev is not None else None,
        torch=torch_facts() if final else {},  # at the end only: keep the periodic flush cheap
        memory=memory_record(dev, final, inst.oom),
        gpu_util=inst.gpu_sampler.summary(inst.records) if inst.gpu_sampler else None,
        device_time=DeviceTime.from_json(summary) if summary is not None else None,
        extra={
            "callback_result": inst.callback_result,
            "callback_error": inst.callback_error,
            "compile_error": inst.compile_error,
            "flush_error": inst.flush_error,
            "override_errors": inst.override_errors,
            "host_memory": str(kept()) if kept() is not None else None,  # set by the script or an override
            "wall_s": clock() - inst.t0,
            "pid": os.getpid(),
        },
    )
