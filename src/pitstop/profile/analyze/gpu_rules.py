"""Findings from device-side measurements: the ``--trace`` kernel analysis, CUDA phase events, MFU,
CUDA memory and the GPU probes. Pure functions over the child's measurements record (``Measurements``).

``apply`` is what ``rules.findings_for`` calls: it adds these findings and, where CUDA events show the
device was the bottleneck, lowers the costs host-timed findings claimed (time blocked in ``.item()``
while the GPU computed is not a saving). ``sections`` gives the report's ``device_time`` and ``mfu``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze.rulekit import (
    MIN_PROBE_GAIN,
    ms,
    pct,
    probe_finding,
    probe_helps,
    sev,
)
from pitstop.profile.capture import device_time
from pitstop.profile.probe import mfu
from pitstop.profile.record.measurements import Measurements
from pitstop.profile.record.parts import MemoryRecord, ProbeResult, Probes
from pitstop.profile.record.timeline import Breakdown, StepRecord, usable_steps
from pitstop.recipes import components, recipe
from pitstop.recipes.component import PROCESS

IDLE_SHARE = 0.30  # device idle this much of the step: worth a finding
MEMCPY_SHARE = 0.10
FRAGMENTED_SHARE = 0.20
FRAGMENTED_MIN_BYTES = 256 * 2**20


# ------------------------------------------------------------------------------------------ sections


Data = Measurements | Mapping[str, Any]  # the run's record, typed or as its JSON


def _analysis(m: Measurements) -> dict[str, Any]:
    """The ``--trace`` window's kernel analysis (empty without one)."""
    return (m.trace.analysis if m.trace is not None else None) or {}


def _launch_gap_s(m: Measurements) -> float | None:
    """Launch latency per step from the trace's idle analysis (the short gaps between kernels)."""
    idle = _analysis(m).get("idle") or []
    if not idle:
        return None
    steps = max(1, _analysis(m).get("steps") or 1)
    return idle[0]["causes_us"].get("launch latency", 0.0) / steps / 1e6


def device_section(steps: list[StepRecord], data: Data) -> dict[str, Any] | None:
    m = Measurements.of(data)
    dt = m.device_time
    if dt is None or not dt.steps:
        return None
    used = [s.to_dict() for s in usable_steps(steps)]
    return device_time.device_breakdown(used, dt.steps, _launch_gap_s(m))


def sections(steps: list[StepRecord], data: Data, bd: Breakdown | None) -> dict[str, Any]:
    """The report sections this module owns: ``device_time`` (host vs device per phase, idle causes)
    and ``mfu`` (FLOPs per step, peak, dtype, mfu)."""
    m = Measurements.of(data)
    out: dict[str, Any] = {}
    if (dev := device_section(steps, m)) is not None:
        out["device_time"] = dev
    passes = mfu.passes_per_step(m.run_totals, len(m.steps or []))
    section = mfu.section(m.mfu, bd.median_total_s if bd else None, passes)
    if section:
        out["mfu"] = section
    return out


# ------------------------------------------------------------------------------------------ findings


def apply(found: list[Finding], bd: Breakdown, steps: list[StepRecord], data: Data) -> list[Finding]:
    """``found`` with device-time costs and the device findings added."""
    m = Measurements.of(data)
    out = list(found)
    dev = device_section(steps, m)
    if dev is not None:
        out = _device_costs(out, dev)
    out += trace_findings(bd, _analysis(m))
    if dev is not None:
        out += idle_from_events(dev)
    out = merge_idle(out)
    out += mfu_findings(sections(steps, m, bd).get("mfu"))
    out += memory_findings(m.memory or MemoryRecord())
    out = probe_findings(out, bd, m.probed)
    return out


def _device_costs(found: list[Finding], dev: dict[str, Any]) -> list[Finding]:
    """Host-timed costs capped at the device idle they can remove: in a device-bound step the host blocked
    in a sync or waiting for data while the device computed, and removing the wait saves only the idle."""
    caps = {
        "sync.item": dev["idle_sync_s"],
        "dataloader.workers": dev["idle_data_s"],
        "dataloader.slow": dev["idle_data_s"],
    }
    out = []
    for f in found:
        cap = caps.get(f.id)
        if cap is None or f.est_saving_s is None or f.est_saving_s <= cap:
            out.append(f)
            continue
        wall = dev["wall_s"] or 1.0
        note = (
            f" CUDA events: the GPU was busy {ms(dev['busy_s'])} of the {ms(wall)} step and idle "
            f"{ms(dev['idle_s'])}; the idle this removes is {ms(cap)} per step, so that is the cost counted "
            f"(host-timed: {ms(f.est_saving_s)})."
        )
        share = min(1.0, cap / wall)
        out.append(
            replace(
                f,
                evidence=f.evidence + note,
                est_saving_s=cap,
                share=share,
                severity=sev(share) if f.severity is not Severity.PASS else f.severity,
                data={**f.data, "host_timed_saving_s": f.est_saving_s, "device_idle_removed_s": cap},
            )
        )
    return out


def _idle(title: str, evidence: str, data: dict[str, Any], share: float) -> Finding:
    return Finding(
        id="gpu.idle",
        severity=sev(share),
        title=title,
        evidence=evidence,
        data=data,
        fix="See the findings for the main cause: data wait (workers, pinned memory), syncs (.item()), "
        "launch gaps (torch.compile, CUDA graphs).",
    )


def merge_idle(found: list[Finding]) -> list[Finding]:
    """One gpu.idle: the first (NVML's utilisation, when sampled) with the causes the others measured."""
    idle = [f for f in found if f.id == "gpu.idle"]
    if len(idle) < 2:
        return found
    first = idle[0]
    merged = replace(
        first,
        title=first.title if "mostly" in first.title else idle[1].title,
        evidence=". ".join(f.evidence for f in idle),
        data={k: v for f in idle for k, v in f.data.items()},
        severity=Severity.WARN if any(f.severity is Severity.WARN for f in idle) else first.severity,
    )
    return [merged if f is first else f for f in found if f.id != "gpu.idle" or f is first]


def idle_from_events(dev: dict[str, Any]) -> list[Finding]:
    """gpu.idle from CUDA phase events: wall - device busy, by cause."""
    wall = dev["wall_s"]
    share = dev["idle_s"] / wall if wall > 0 else 0.0
    if share < IDLE_SHARE:
        return []
    causes = {
        "data wait": dev["idle_data_s"],
        "host syncs": dev["idle_sync_s"],
        "other host work": dev["idle_other_s"],
    }
    if dev.get("idle_launch_s") is not None:
        causes["launch gaps"] = dev["idle_launch_s"]
    main = max(causes, key=lambda k: causes[k])
    text = ", ".join(f"{k} {ms(v)}" for k, v in sorted(causes.items(), key=lambda kv: -kv[1]))
    evidence = (
        f"CUDA events over {dev['steps']} steps: the GPU was idle {ms(dev['idle_s'])} of the {ms(wall)} step "
        f"({pct(share)}), busy {ms(dev['busy_s'])}; idle by cause: {text}. Main cause: {main}"
    )
    title = f"The GPU is idle {pct(share)} of each step, mostly for {main}"
    return [_idle(title, evidence, {"device_time": dev, "idle_causes_s": causes, "main_cause": main}, share)]


def trace_findings(bd: Breakdown, analysis: dict[str, Any]) -> list[Finding]:
    """gpu.launch_bound, gpu.memcpy and gpu.idle (with its cause) from the ``--trace`` analysis."""
    out: list[Finding] = []
    steps = analysis.get("steps") or 0
    for row in analysis.get("launch") or []:
        if not row.get("launch_bound"):
            continue
        out.append(
            Finding(
                id="gpu.launch_bound",
                severity=Severity.WARN,
                title="The GPU runs many short kernels and waits for the host between them",
                evidence=f"torch.profiler over {steps} steps on device {row['device']}: "
                f"{row['kernels_per_step']:.0f} kernels per step, median kernel {row['median_kernel_us']:.1f} us, "
                f"median gap between kernels {row['median_gap_us']:.1f} us, the device idle between kernels "
                f"{pct(row['gap_share'])} of the traced time ({ms(row['gap_us_per_step'] / 1e6)} per step; "
                "traced steps run slower than untraced ones). The saving of fusing them is not measured here",
                data=row,
                fix="Fuse the small kernels with torch.compile, or capture the step in a CUDA graph "
                "(torch.compile(mode='reduce-overhead')); a larger batch also amortises the launches. "
                "`pitstop fix` measures compile.",
                fix_code="model.compile()  # in place, state_dict keys unchanged; mode='reduce-overhead' for CUDA graphs",
            )
        )
    for row in analysis.get("devices") or []:
        if row.get("stream") is not None:
            continue
        if row["memcpy_share"] >= MEMCPY_SHARE:
            per_step = row["memcpy_us"] / max(1, steps) / 1e6
            out.append(
                Finding(
                    id="gpu.memcpy",
                    severity=sev(per_step / bd.total_s if bd.total_s else None),
                    title=f"Copies take {pct(row['memcpy_share'])} of the GPU's time",
                    evidence=f"torch.profiler over {steps} steps on device {row['device']}: memcpy "
                    f"{ms(row['memcpy_us'] / 1e6)} ({ms(per_step)} per step, {pct(row['memcpy_share'])} of the "
                    f"traced time), kernels {pct(row['kernel_share'])}, idle {pct(row['idle_share'])}",
                    data=row,
                    fix="Pin the loader's memory and copy with non_blocking=True so copies overlap compute; keep "
                    "data that every step reuses on the GPU; avoid .cpu()/.to('cpu') in the step.",
                    fix_code=recipe("pin_memory").snippet,
                )
            )
    for row in analysis.get("idle") or []:
        window = analysis.get("window_us") or 0.0
        share = row["idle_us"] / window if window else 0.0
        if share < IDLE_SHARE or row.get("main_cause") is None:
            continue
        causes = row["causes_us"]
        text = ", ".join(
            f"{k} {ms(v / 1e6)}" for k, v in sorted(causes.items(), key=lambda kv: -kv[1]) if v > 0
        )
        evidence = (
            f"torch.profiler over {steps} steps: device {row['device']} idle {pct(share)} of the traced time "
            f"({ms(row['idle_us_per_step'] / 1e6)} per step); while it was idle the host was in: {text}. "
            f"Main cause: {row['main_cause']}"
        )
        title = f"The GPU is idle {pct(share)} of the traced time, mostly for {row['main_cause']}"
        out.append(_idle(title, evidence, {"trace_idle": row}, share))
    return out


def mfu_findings(m: dict[str, Any] | None) -> list[Finding]:
    if m and m.get("inconsistent"):
        return [
            Finding(
                id="compute.mfu",
                severity=Severity.INFO,
                title="Model FLOPs utilisation not reported: the FLOPs counted exceed the measured peak",
                evidence=m["inconsistent"],
                data=m,
            )
        ]
    if not m or m.get("mfu") is None:
        return []
    return [
        Finding(
            id="compute.mfu",
            severity=Severity.INFO,
            title=f"Model FLOPs utilisation {100 * m['mfu']:.1f}% of the measured {m['dtype']} matmul peak",
            evidence=f"{m['flops_per_step'] / 1e9:.2f} GFLOP per step (FlopCounterMode, forward+backward x "
            f"{m['passes_per_step']:.0f}) at the {ms(m['median_step_s'])} median step = "
            f"{m['achieved_flops_per_s'] / 1e12:.3f} TFLOP/s; this {m.get('device')}'s {m['dtype']} matmul peak "
            f"measured {m['peak_flops_per_s'] / 1e12:.3f} TFLOP/s (torch.mm {m.get('peak_size')}^2)",
            data=m,
        )
    ]


def memory_findings(memory: MemoryRecord | Mapping[str, Any]) -> list[Finding]:
    mem = MemoryRecord.of(memory)
    out: list[Finding] = []
    oom = mem.oom
    if oom and oom.get("path"):
        top = oom.get("largest") or []
        where = "; ".join(
            f"{r['location']} {r['bytes'] / 2**20:.0f} MiB ({r['blocks']} blocks)" for r in top[:5]
        )
        out.append(
            Finding(
                id="memory.oom",
                severity=Severity.WARN,
                title="The script ran out of GPU memory",
                evidence=f"allocator snapshot saved to {oom['path']} (open it at https://pytorch.org/memory_viz); "
                f"largest live allocations: {where or 'no stacks recorded'}",
                data=oom,
                fix="Lower the batch size (`pitstop tune batch` finds the largest that fits), train in bf16/fp16, "
                "or checkpoint activations; free what the largest sites above keep alive.",
                location=top[0]["location"] if top and ":" in top[0]["location"] else None,
            )
        )
    res, alloc = mem.cuda_peak_reserved_bytes, mem.cuda_peak_allocated_bytes
    frag = mem.cuda_peak_fragmentation_bytes
    if res and frag is not None and frag >= FRAGMENTED_MIN_BYTES and frag >= FRAGMENTED_SHARE * res:
        out.append(
            Finding(
                id="memory.fragmentation",
                severity=Severity.INFO,
                title=f"The caching allocator holds {frag / 2**20:.0f} MiB that no tensor uses",
                evidence=f"peak reserved {res / 2**20:.0f} MiB, peak allocated {alloc / 2**20:.0f} MiB: "
                f"{pct(frag / res)} of the reserved memory is cached but free",
                data=mem.cuda(),
                fix="Let the allocator grow segments instead of caching many sizes (set before CUDA starts).",
                fix_code="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py",
            )
        )
    return out


def probe_findings(
    found: list[Finding], bd: Breakdown, results: Probes | Mapping[str, Any]
) -> list[Finding]:
    """precision.fp16 and the process components' findings (cudnn.benchmark, precision.tf32) from the GPU
    probes; the pinned-copy probe's numbers on dataloader.pin_memory."""
    out = list(found)
    probes = Probes.of(results)
    fp16 = probes.result("fp16_scaler")
    prec = probes.result("precision") or ProbeResult()
    bf16_new = prec.new_s if prec.dtype == "bfloat16" and probe_helps(prec) else None
    if (
        fp16 is not None
        and fp16.new_s is not None
        and probe_helps(fp16)
        and (bf16_new is None or fp16.new_s < (1 - MIN_PROBE_GAIN) * bf16_new)
    ):
        saving = max(0.0, (fp16.saving_s or 0.0) if bf16_new is None else bf16_new - fp16.new_s)
        share = min(1.0, saving / bd.total_s) if bd.total_s else 0.0
        out.append(
            Finding(
                id="precision.fp16",
                severity=sev(share),
                title="fp16 autocast with a GradScaler is faster here",
                evidence=f"forward+backward on the script's last batch: fp32 {ms(fp16.base_s or 0.0)}, fp16 "
                f"with GradScaler {ms(fp16.new_s)}"
                + (f", bf16 {ms(bf16_new)}" if bf16_new else "")
                + " (medians, measured after the run)",
                data={"fp16_scaler": fp16.to_json(), "bf16_s": bf16_new},
                fix="Run forward and loss under fp16 autocast and scale the loss (fp16 needs the scaler).",
                fix_code="scaler = torch.amp.GradScaler('cuda')\nwith torch.autocast('cuda', dtype=torch.float16):\n"
                "    loss = criterion(model(x), y)\nscaler.scale(loss).backward()\nscaler.step(opt)\nscaler.update()",
                est_saving_s=saving,
                share=share,
            )
        )
    for comp in components(PROCESS):  # cudnn_benchmark, tf32: its RULE on its probe's result
        if comp.PROBE:  # threads has none: its probe's result is the contention rules' to judge
            out += probe_finding(comp.RULE, bd, probes)
    probe = probes.result("h2d")
    if probe is not None and probe.to_json():
        h2d = probe.to_json()  # the pinned-copy probe's own keys (``probe.gpu_probes``)
        for i, f in enumerate(out):
            if f.id == "dataloader.pin_memory":
                saving = max(0.0, min(f.est_saving_s or 0.0, h2d["saving_s"]))
                share = min(1.0, saving / bd.total_s) if bd.total_s else 0.0
                out[i] = replace(
                    f,
                    evidence=f"{f.evidence}; the batch ({h2d['bytes'] / 2**20:.1f} MiB) measured: pageable and "
                    f"blocking {ms(h2d['pageable_host_s'])} of host time ({ms(h2d['pageable_device_s'])} on the "
                    f"GPU), pinned and non_blocking {ms(h2d['pinned_host_s'])} ({ms(h2d['pinned_device_s'])})",
                    data={**f.data, "probe": h2d},
                    est_saving_s=saving,
                    share=share,
                    severity=sev(share),
                )
    return out
