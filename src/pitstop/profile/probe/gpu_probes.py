"""Measured what-ifs that exist only on CUDA, on the script's own model and last batch.

- fp16 autocast with a GradScaler vs the script's fp32 (bf16 autocast is ``probes.precision`` where the
  GPU has it);
- each process-wide setting's arms (``pitstop.recipes.components(PROCESS)``: cudnn.benchmark off vs on
  for a conv net that left it off; TF32 matmuls vs full fp32, on Ampere and later when the script left
  matmuls at "highest"), where its ``applies``;
- host-to-device copies of the batch: pageable and blocking vs pinned and ``non_blocking``, timed with
  CUDA events (device time) and the host clock (time the host is held).

Everything CUDA-specific goes through a ``Backend`` so the logic runs, and is tested, with fakes on a CPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pitstop.measure.clock import Stopwatch
from pitstop.recipes import components
from pitstop.recipes.component import PROCESS

if TYPE_CHECKING:
    from pitstop.recipes.component import ProcessComponent

COPY_REPS = 7


@dataclass
class Backend:
    """The CUDA calls the probes make (a ``pitstop.recipes.component.DeviceSettings`` too)."""

    event_factory: Callable[[], Any]
    synchronize: Callable[[], None]
    pin: Callable[[Any], Any]
    capability: Callable[[], tuple[int, int]]
    get_matmul_precision: Callable[[], str]
    set_matmul_precision: Callable[[str], None]
    grad_scaler: Callable[[], Any]
    get_cudnn_benchmark: Callable[[], bool]
    set_cudnn_benchmark: Callable[[bool], None]


def cuda_backend() -> Backend:
    import torch

    return Backend(
        event_factory=lambda: torch.cuda.Event(enable_timing=True),
        synchronize=torch.cuda.synchronize,
        pin=lambda t: t.pin_memory(),
        capability=torch.cuda.get_device_capability,
        get_matmul_precision=torch.get_float32_matmul_precision,
        set_matmul_precision=torch.set_float32_matmul_precision,
        grad_scaler=lambda: torch.amp.GradScaler("cuda"),
        get_cudnn_benchmark=lambda: bool(torch.backends.cudnn.benchmark),
        set_cudnn_benchmark=_set_cudnn_benchmark,
    )


def _set_cudnn_benchmark(on: bool) -> None:
    import torch

    torch.backends.cudnn.benchmark = on


def run(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    facts: dict[str, Any],
    base: Callable[[], None],
    backend: Backend | None = None,
    device_type: str = "cuda",
) -> dict[str, Any]:
    """The applicable probes; each entry has base_s, new_s and saving_s (>0: the change is faster)."""
    from pitstop.profile.probe.probe_kit import saving, timed

    be = backend or cuda_backend()
    out: dict[str, Any] = {}
    fp32 = facts.get("param_dtypes") == ["float32"] and not facts.get("autocast")
    cap = be.capability()
    if fp32 and cap >= (7, 0):
        fp16 = _fp16_step(model, args, kwargs, be, device_type)
        out["fp16_scaler"] = saving(timed({"fp32": base, "fp16": fp16}, device_type), "fp32", "fp16")
    for comp in cast("list[ProcessComponent]", components(PROCESS)):  # cudnn_benchmark, tf32
        if comp.applies(facts, be):
            arms = dict(zip(comp.ARMS, (base, comp.changed(base, be)), strict=True))
            out[comp.PROBE] = saving(timed(arms, device_type), *comp.ARMS)
    tensors = _device_tensors((args, kwargs))
    if tensors:
        out["h2d"] = h2d_probe(tensors, tensors[0].device, be)
    return out


def _fp16_step(model: Any, args: Any, kwargs: Any, be: Backend, device_type: str) -> Callable[[], None]:
    import torch

    from pitstop.profile.probe.probe_kit import first_grad_tensor

    scaler = be.grad_scaler()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=torch.float16):
            out = model(*args, **kwargs)
        t = first_grad_tensor(out)
        if t is not None:
            scaler.scale(t.float().mean()).backward()

    return step


def _device_tensors(obj: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor) and not t.is_cpu]


def h2d_probe(tensors: list[Any], device: Any, be: Backend, reps: int = COPY_REPS) -> dict[str, Any]:
    """The batch's tensors brought back to host memory (as a DataLoader hands them over), then copied to
    ``device`` again: pageable + blocking vs pinned + non_blocking. Device time from events, host time
    held from the clock; medians of interleaved repeats after one warm-up round."""
    pageable = [t.detach().to("cpu") for t in tensors]
    pinned = [be.pin(t) for t in pageable]
    nbytes = sum(t.numel() * t.element_size() for t in pageable)
    times: dict[str, list[tuple[float, float]]] = {"pageable": [], "pinned": []}
    variants = {"pageable": (pageable, False), "pinned": (pinned, True)}
    for _ in range(reps + 1):  # the first round warms up
        for name, (src, nb) in variants.items():
            be.synchronize()
            start, end = be.event_factory(), be.event_factory()
            watch = Stopwatch()  # the host's share: how long the copies hold it
            start.record()
            for t in src:
                t.to(device, non_blocking=nb)
            end.record()
            host = watch.elapsed()
            be.synchronize()
            times[name].append((host, float(start.elapsed_time(end)) / 1000.0))
    med = {
        k: (statistics.median(h for h, _ in v[1:]), statistics.median(d for _, d in v[1:]))
        for k, v in times.items()
    }
    return {
        "bytes": nbytes,
        "pageable_host_s": med["pageable"][0],
        "pageable_device_s": med["pageable"][1],
        "pinned_host_s": med["pinned"][0],
        "pinned_device_s": med["pinned"][1],
        "base_s": med["pageable"][0],
        "new_s": med["pinned"][0],
        "saving_s": med["pageable"][0] - med["pinned"][0],
    }
