"""Measurements of one run -> ranked Findings. Pure functions: nothing here measures or prints.

Every finding's ``est_saving_s`` is what the problem measurably cost per step in this run (time waiting
for data, time blocked in syncs, the difference a probe timed on the script's own model), and ``share``
that cost over the mean step. A finding costing at least ``WARN_SHARE`` of the step is a warning; less,
or not measurable here, is info. So ``Report.ranked()`` puts the costliest measured problem first, and
a run where nothing costs that much says so (``summary.healthy``) instead of inventing a problem.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pitstop.findings import Finding, Report, Severity
from pitstop.host import cpu, precision
from pitstop.profile import confirm, gpu_rules
from pitstop.profile.pass_rules import skipped_probe_passes
from pitstop.profile.probe_failures import probe_failure_rules
from pitstop.profile.rules_progress import progress_rules
from pitstop.profile.timeline import PART_LABELS, Breakdown, StepRecord, breakdown
from pitstop.train.host_memory import GLIBC_ENV
from pitstop.train.host_memory import SNIPPET as KEEP_SNIPPET

if TYPE_CHECKING:
    from pitstop.profile.runner import RunResult

WARN_SHARE = 0.05  # a problem costing >= 5% of the step is worth fixing first
MIN_PROBE_GAIN = 0.05  # a probed change must save >= 5% of the probed pass to count (noise)
GPU_IDLE_PCT = 70.0
MIN_SHARE = 0.01  # a finding whose whole point is its cost is left out under 1% of the step
FAULTS_WORTH_A_RUN = 256  # untimed page faults per step (1 MiB of fresh pages) worth a `pitstop fix` run
MIN_FAULTS_TO_TIME = 200  # fewer faults saved in the probe: its time difference is mostly noise
MEASURES = ("compute.mfu",)  # info findings that report a measurement, not an unmeasured problem


def _probe_helps(probe: dict[str, Any]) -> bool:
    """A probed change counts only when it saves more than MIN_PROBE_GAIN of the probed pass."""
    return probe["saving_s"] > MIN_PROBE_GAIN * probe["base_s"]


def _sev(share: float | None) -> Severity:
    return Severity.WARN if share is not None and share >= WARN_SHARE else Severity.INFO


def _ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _cost(bd: Breakdown, saving: float) -> tuple[float, float]:
    saving = max(0.0, saving)
    return saving, min(1.0, saving / bd.total_s) if bd.total_s > 0 else 0.0


# ------------------------------------------------------------------------------------------- data


def dataloader_rules(
    bd: Breakdown, loaders: list[dict[str, Any]], cores: int, device: str | None
) -> list[Finding]:
    out: list[Finding] = []
    used = [ld for ld in loaders if ld.get("batches_seen")]
    if not used:
        return out
    main = max(used, key=lambda ld: ld.get("wait_s", 0.0))
    wait = bd.parts["data_wait_s"]
    share = bd.share("data_wait_s")
    workers = main.get("num_workers") or 0
    where = main.get("location")
    evidence = (
        f"data wait {_ms(wait)} per step, {_pct(share)} of the {_ms(bd.total_s)} step, over {bd.n} steps; "
        f"DataLoader with num_workers={workers}, {cores} usable cores"
    )
    if share >= WARN_SHARE and workers < cores:
        suggest = max(1, min(cores, 8))
        out.append(
            Finding(
                id="dataloader.workers",
                severity=_sev(share),
                title="Training waits for data: the DataLoader has fewer workers than cores",
                evidence=evidence,
                data={"data_wait_s": wait, "num_workers": workers, "usable_cores": cores, "steps": bd.n},
                fix=f"Load batches in {suggest} worker processes and keep them between epochs "
                "(`pitstop tune loader` measures the best count on your data).",
                fix_code=f"DataLoader(..., num_workers={suggest}, persistent_workers=True"
                + (", pin_memory=True" if device and device.startswith("cuda") else "")
                + ")",
                location=where,
                est_saving_s=wait,
                share=share,
            )
        )
    elif share >= WARN_SHARE:
        out.append(
            Finding(
                id="dataloader.slow",
                severity=_sev(share),
                title="Training waits for data although every core loads it",
                evidence=evidence,
                data={"data_wait_s": wait, "num_workers": workers, "usable_cores": cores, "steps": bd.n},
                fix="The input pipeline is CPU-bound: decode smaller images, move augmentation to the GPU, "
                "or pre-process once and cache the tensors.",
                location=where,
                est_saving_s=wait,
                share=share,
            )
        )
    if device and device.startswith("cuda") and not main.get("pin_memory"):
        h2d = bd.parts["h2d_s"]
        saving, sh = _cost(bd, h2d)
        out.append(
            Finding(
                id="dataloader.pin_memory",
                severity=_sev(sh),
                title="Batches are copied to the GPU from pageable memory",
                evidence=f"host-to-device copies block {_ms(h2d)} per step ({_pct(sh)}); the loader has "
                "pin_memory=False",
                data={"h2d_s": h2d},
                fix="Pin the loader's memory and copy with non_blocking=True so copies overlap compute.",
                fix_code="DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
                location=where,
                est_saving_s=saving,
                share=sh,
            )
        )
    for ld in used:
        if (ld.get("num_workers") or 0) > 0 and not ld.get("persistent_workers"):
            first = ld.get("first_batch_s") or []
            per_epoch = ld.get("batches_per_epoch") or ld.get("batches_seen") or 1
            avg_wait = ld.get("wait_s", 0.0) / max(1, ld.get("batches_seen", 1))
            spawn = max(0.0, (sum(first) / len(first) if first else 0.0) - avg_wait)
            saving, sh = _cost(bd, spawn / max(1, per_epoch))
            if sh < MIN_SHARE:
                continue  # long epochs amortise the restart: not worth a line
            out.append(
                Finding(
                    id="dataloader.persistent_workers",
                    severity=_sev(sh),
                    title="DataLoader workers are started again every epoch",
                    evidence=f"the first batch of a fresh worker pool waited {_ms(spawn)} more than an average "
                    f"batch; over {per_epoch} batches per epoch that is {_ms(saving)} per step "
                    f"({ld.get('iterators', 0)} worker pool(s) started in this run)",
                    data={
                        "first_batch_s": first,
                        "batches_per_epoch": per_epoch,
                        "epochs_seen": ld.get("iterators"),
                    },
                    fix="Keep the workers alive between epochs.",
                    fix_code="DataLoader(..., persistent_workers=True)",
                    location=ld.get("location"),
                    est_saving_s=saving,
                    share=sh,
                )
            )
    return out


# -------------------------------------------------------------------------------------------- sync


def sync_rules(bd: Breakdown, sites: list[dict[str, Any]], device: str | None, n_steps: int) -> list[Finding]:
    """Cost: the step's sync part, i.e. the time blocked in the calls plus, for per-element loops of them
    (syncs less than ``LOOP_GAP_S`` apart), the loop's time between the calls, which one ``.tolist()`` or
    a vectorised expression would also remove."""
    measured = [dict(s) for s in sites if s.get("measured_count")]
    if not measured or bd.syncs_per_step <= 0:
        return []
    steps = max(1, n_steps)
    for s in measured:
        s["cost_per_step_s"] = (s.get("time_s", 0.0) + s.get("loop_gap_s", 0.0)) / steps
    # costs under 10 us a step (CPU syncs: their first call's time only) are a tie: the most calls lead
    measured.sort(key=lambda s: (-round(s["cost_per_step_s"], 5), -s["measured_count"]))
    top = measured[0]
    # the step's sync part already holds both: time inside the calls and the per-element loops around them
    loops = sum(s.get("loop_gap_s", 0.0) for s in measured) / steps
    inside = sum(s.get("time_s", 0.0) for s in measured) / steps
    saving, share = _cost(bd, bd.parts["sync_s"])
    on_cpu = not device or device == "cpu"
    where = ", ".join(
        f"{s['location']} .{s['method'].strip('_')}() x{s['measured_count'] / steps:.3g}/step"
        for s in measured[:3]
    )
    meaning = (
        "On CPU these calls cost their own time only; on a GPU each one also stalls until the GPU catches up."
        if on_cpu
        else "Each one blocks the host until the GPU has finished all queued work."
    )
    parts = []
    if inside >= 0.00005 or loops < 0.0001:
        parts.append(f"{_ms(inside)} blocked inside them")
    if loops >= 0.0001:
        parts.append(f"{_ms(loops)} in the per-element loop that makes them")
    spent = " plus ".join(parts)
    per_element = top["measured_count"] / steps >= 8
    fix = (
        "Read the whole tensor once with `.tolist()` instead of an `.item()` per element, or keep the values "
        "on the device and read them every N steps."
        if per_element
        else "Keep values on the device and read them every N steps (each read waits for the GPU)."
    )
    code = (
        "values = tensor.detach().tolist()   # one sync instead of one per element"
        if per_element
        else "running = running + loss.detach()   # no sync\nif step % 50 == 0:\n    print(running.item() / 50)"
    )
    return [
        Finding(
            id="sync.item",
            severity=_sev(share),
            title=f"{bd.syncs_per_step:.3g} host-device syncs per step (.item(), .cpu(), printing tensors ...)",
            evidence=f"{bd.syncs_per_step:.3g} syncs per step, {spent} "
            f"({_pct(share)} of the step) over {bd.n} steps, from {where}. {meaning}",
            data={
                "syncs_per_step": bd.syncs_per_step,
                "sync_s": inside,
                "loop_s": loops,
                "sites": measured[:10],
            },
            fix=fix,
            fix_code=code,
            location=top["location"],
            est_saving_s=saving,
            share=share,
        )
    ]


# ---------------------------------------------------------------------------------------- compute


def probe_rules(bd: Breakdown, model: dict[str, Any], probes: dict[str, Any], device: str) -> list[Finding]:
    out: list[Finding] = []
    where = model.get("first_location")
    prec = probes.get("precision")
    if prec and prec.get("dtype"):
        dtype = prec["dtype"]
        hw = "AVX512_BF16/AMX" if device == "cpu" else "tensor cores"
        if _probe_helps(prec):
            saving, share = _cost(bd, prec["saving_s"])
            out.append(
                Finding(
                    id="precision.amp",
                    severity=_sev(share),
                    title=f"The model trains in fp32 on hardware with fast {dtype}",
                    evidence=f"forward+backward on the script's last batch: fp32 {_ms(prec['base_s'])}, "
                    f"{dtype} autocast {_ms(prec['new_s'])} (medians, measured after the run); this {device} "
                    f"has {hw}",
                    data=prec,
                    fix=f"Run forward and loss under autocast({dtype})."
                    + (" With float16 on CUDA, use a GradScaler." if dtype == "float16" else ""),
                    fix_code=f"with torch.autocast('{device}', dtype=torch.{dtype}):\n"
                    "    loss = criterion(model(x), y)\nloss.backward()",
                    location=where,
                    est_saving_s=saving,
                    share=share,
                )
            )
        else:
            out.append(
                Finding(
                    id="precision.amp",
                    severity=Severity.PASS,
                    title=f"fp32 is as fast as {dtype} autocast for this model here",
                    evidence=f"forward+backward: fp32 {_ms(prec['base_s'])}, {dtype} {_ms(prec['new_s'])}",
                    data=prec,
                )
            )
    cl = probes.get("channels_last")
    if cl:
        if _probe_helps(cl):
            saving, share = _cost(bd, cl["saving_s"])
            out.append(
                Finding(
                    id="memory_format.channels_last",
                    severity=_sev(share),
                    title="The conv net runs in NCHW; channels_last is faster here",
                    evidence=f"forward+backward on the script's last batch: NCHW {_ms(cl['base_s'])}, channels_last "
                    f"{_ms(cl['new_s'])} (medians, measured after the run); {model.get('conv2d_layers')} Conv2d layers",
                    data=cl,
                    fix="Convert the model and its image batches to channels_last once.",
                    fix_code="model = model.to(memory_format=torch.channels_last)\n"
                    "x = x.to(device, memory_format=torch.channels_last)",
                    location=where,
                    est_saving_s=saving,
                    share=share,
                )
            )
        else:
            out.append(
                Finding(
                    id="memory_format.channels_last",
                    severity=Severity.PASS,
                    title="channels_last measured no faster than NCHW for this model",
                    evidence=f"NCHW {_ms(cl['base_s'])}, channels_last {_ms(cl['new_s'])}",
                    data=cl,
                )
            )
    cb = probes.get("cudnn_benchmark")
    if cb and _probe_helps(cb):
        saving, share = _cost(bd, cb["saving_s"])
        out.append(
            Finding(
                id="cudnn.benchmark",
                severity=_sev(share),
                title="cudnn.benchmark is off for a conv net with fixed input shapes",
                evidence=f"forward+backward: benchmark off {_ms(cb['base_s'])}, on {_ms(cb['new_s'])}",
                data=cb,
                fix="Let cuDNN pick the fastest convolution algorithms (input shapes must not change every step).",
                fix_code="torch.backends.cudnn.benchmark = True",
                est_saving_s=saving,
                share=share,
            )
        )
    return out


def host_memory_rules(bd: Breakdown, probes: dict[str, Any]) -> list[Finding]:
    """CPU steps that page-fault their tensors in: glibc gives large freed blocks back to the kernel."""
    hm = probes.get("host_memory")
    if not hm:
        return []
    data = {**hm, "faults_per_step": bd.faults_per_step}
    if hm.get("kept"):  # the script kept freed memory itself, or jemalloc/tcmalloc is preloaded
        return [
            Finding(
                id="host.page_faults",
                severity=Severity.PASS,
                title="Freed host memory stays mapped: steps do not page-fault their tensors in",
                evidence=f"{hm['skipped']}; {bd.faults_per_step:,.0f} minor page faults per step in the run "
                "(median)",
                data=data,
            )
        ]
    if "saving_s" not in hm:
        return []
    measured = (
        f"{bd.faults_per_step:,.0f} minor page faults per step in the run (median); a training step on the "
        f"script's last batch: {_ms(hm['base_s'])} and {hm['base_faults']:,.0f} faults with malloc as it "
        f"was, {_ms(hm['new_s'])} and {hm['new_faults']:,.0f} faults with freed memory kept mapped "
        "(medians, one after the other: the change cannot be undone in the process)"
    )
    fix = (
        "Keep freed memory in the process, once at start: pitstop.train.keep_host_memory() (raises glibc's "
        "mmap/trim thresholds); or, without a code change, start the script with `pitstop launch --allocator "
        "glibc` (the same through glibc's environment variables) or `--allocator jemalloc`. Cost: the "
        "process keeps its peak heap."
    )
    env = " ".join(f"{k}={v}" for k, v in GLIBC_ENV.items())
    fix_code = (
        f"{KEEP_SNIPPET}\n# or: pitstop launch --allocator glibc -- train.py   (= {env} python train.py)"
    )
    # The probe runs after the script, with the heap in another state, so its own fault count is not the
    # run's: what carries over is the time one fault costs, applied to the faults the run's steps took.
    dropped = hm["base_faults"] - hm["new_faults"]
    timed = dropped >= MIN_FAULTS_TO_TIME  # else the probe's heap took too few faults to time one
    per_fault = hm["saving_s"] / dropped if timed and _probe_helps(hm) else 0.0  # below noise: ~free
    saving, share = _cost(bd, per_fault * bd.faults_per_step)
    if timed and share >= MIN_SHARE:
        data.update(per_fault_s=per_fault, est_saving_s=saving)
        return [
            Finding(
                id="host.page_faults",
                severity=_sev(share),
                title="CPU steps page-fault their tensors in: malloc returns freed memory to the kernel",
                evidence=f"{measured}; {per_fault * 1e6:.2f} us per fault x {bd.faults_per_step:,.0f} faults "
                f"per step = {_ms(saving)} per step",
                data=data,
                fix=fix,
                fix_code=fix_code,
                est_saving_s=saving,
                share=share,
            )
        ]
    if not timed and bd.faults_per_step >= FAULTS_WORTH_A_RUN:
        # The run's faults are known but not their cost.
        return [
            Finding(
                id="host.page_faults",
                severity=Severity.INFO,
                title=f"CPU steps page-fault {bd.faults_per_step:,.0f} pages each; the probe could not time it",
                evidence=measured + ". `pitstop fix --candidates host_memory` times it on the whole script",
                data=data,
                fix=fix,
                fix_code=fix_code,
            )
        ]
    return [
        Finding(
            id="host.page_faults",
            severity=Severity.PASS,
            title="Page faults measured to cost under 1% of the step here"
            if timed
            else f"Steps take few page faults ({bd.faults_per_step:,.0f} per step)",
            evidence=measured,
            data=data,
        )
    ]


def optimizer_rules(bd: Breakdown, optimizers: list[dict[str, Any]], probes: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    probed = {p.get("type"): p for p in probes.get("optimizer", []) if "saving_s" in p}
    for opt in optimizers:
        if opt.get("impl") != "for-loop":
            continue
        p = probed.get(opt.get("type"))
        if p is not None and not _probe_helps(p):
            continue  # measured: foreach is no faster here
        saving, share = _cost(bd, p["saving_s"]) if p else (None, None)
        evidence = f"{opt['type']} runs a Python loop over its {opt.get('params', '?')} parameter tensors"
        if p:
            evidence += (
                f"; one step: as built {_ms(p['base_s'])}, foreach {_ms(p['new_s'])} (measured after the run)"
            )
        else:
            evidence += f"; optimizer time {_ms(bd.parts['optimizer_s'])} per step (foreach not measured)"
        out.append(
            Finding(
                id="optimizer.foreach",
                severity=_sev(share),
                title=f"{opt['type']} uses neither foreach nor fused kernels",
                evidence=evidence,
                data={"optimizer": opt, "probe": p},
                fix="Ask for the multi-tensor implementation (fused=True where supported is faster still).",
                fix_code=f"torch.optim.{opt['type']}(params, ..., foreach=True)",
                location=opt.get("location"),
                est_saving_s=saving,
                share=share,
            )
        )
    return out


def setup_rules(
    model: dict[str, Any], torch_facts: dict[str, Any], gpu: dict[str, Any] | None
) -> list[Finding]:
    out: list[Finding] = []
    where = model.get("first_location")
    if model and not model.get("compiled") and not torch_facts.get("dynamo_graphs"):
        out.append(
            Finding(
                id="compile.none",
                severity=Severity.INFO,
                title="The model is not compiled",
                evidence="torch.compile was not used; its gain depends on the model and is not measured by a "
                "profile run (compiling takes minutes). `pitstop fix` measures it.",
                fix="Try torch.compile; keep it if `pitstop fix` shows a gain.",
                fix_code="model = torch.compile(model)",
                location=where,
            )
        )
    if model.get("dataparallel"):
        out.append(
            Finding(
                id="parallel.dataparallel",
                severity=Severity.WARN,
                title="nn.DataParallel is in use",
                evidence="DataParallel runs one Python thread per GPU, scatters the batch and gathers outputs on "
                "GPU 0 every step; DistributedDataParallel runs one process per GPU",
                fix="Use DistributedDataParallel, launched with torchrun (`pitstop launch`).",
                fix_code="model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])",
                location=where,
            )
        )
    if gpu and gpu.get("mean_util_pct") is not None and gpu["mean_util_pct"] < GPU_IDLE_PCT:
        out.append(
            Finding(
                id="gpu.idle",
                severity=Severity.WARN,
                title=f"The GPU was busy {gpu['mean_util_pct']:.0f}% of the time",
                evidence=f"NVML utilization of GPU {gpu.get('index')} averaged {gpu['mean_util_pct']:.0f}% over "
                f"{gpu.get('samples')} samples ({gpu.get('window')}); below {GPU_IDLE_PCT:.0f}% the GPU waits "
                "for the host (data, syncs, Python)",
                data=gpu,
                fix="See the findings above for where the host time goes.",
            )
        )
    return out


# -------------------------------------------------------------------------------------------- all


def findings_for(
    steps: list[StepRecord], data: dict[str, Any], cores: int | None = None
) -> tuple[list[Finding], Breakdown | None]:
    """All findings for one run's measurements (``data`` is the child's measurements record)."""
    bd = breakdown(steps)
    found: list[Finding] = progress_rules(data)  # hang, timeout, stalls, dead workers
    if bd is None:
        totals = data.get("totals", {})
        found.append(
            Finding(
                id="profile.no_step",
                severity=Severity.WARN,
                title="No training step was seen",
                evidence=f"{totals.get('batches', 0)} batches loaded ({totals.get('data_wait_s', 0.0):.3f} s waiting), "
                f"{totals.get('forwards', 0)} forward calls ({totals.get('forward_s', 0.0):.3f} s), "
                f"{totals.get('backwards', 0)} backward calls ({totals.get('backward_s', 0.0):.3f} s), but "
                "neither optimizer.step() nor enough backward() calls to delimit steps by "
                "(or the script stopped before them)",
                data=totals,
                fix="pitstop delimits steps by optimizer.step(), or by backward() in loops without an optimizer; "
                "profile the training script, or run longer.",
            )
        )
        found += gpu_rules.memory_findings(data.get("memory") or {})  # a CUDA OOM before the first step
        return found, None
    cores = cores if cores is not None else cpu.usable_cores()
    device = data.get("device") or "cpu"
    models = data.get("models") or []
    model = models[0] if models else {}
    probes = data.get("probes") or {}
    found += dataloader_rules(bd, data.get("loaders", []), cores, data.get("device"))
    found += sync_rules(bd, data.get("sync_sites", []), data.get("device"), bd.n)
    dev_type = device.split(":")[0] if data.get("device") else (model.get("device") or "cpu").split(":")[0]
    found += probe_rules(bd, model, probes, dev_type)
    found += skipped_probe_passes(probes, dev_type)
    if model and not probes.get("precision") and not model.get("autocast"):
        found += _unprobed_precision(model, dev_type)
    found += optimizer_rules(bd, data.get("optimizers", []), probes)
    found += host_memory_rules(bd, probes)
    found += probe_failure_rules(probes)
    found += setup_rules(model, data.get("torch", {}), data.get("gpu_util"))
    found = gpu_rules.apply(found, bd, steps, data)  # trace analysis, CUDA events, MFU, memory, GPU probes
    found = confirm.apply(found, bd)  # probe predictions: a warning only when the interval confirms it
    if not any(f.severity.rank >= Severity.WARN.rank for f in found):
        unmeasured = sorted(
            {
                f.id
                for f in found
                if f.est_saving_s is None and f.severity is Severity.INFO and f.id not in MEASURES
            }
        )
        found.append(
            Finding(
                id="summary.healthy",
                severity=Severity.INFO,
                title="No measured problem costs 5% of the step or more",
                evidence=f"{bd.n} steps, {_ms(bd.median_total_s)} median. Step: "
                + ", ".join(f"{PART_LABELS[k]} {_pct(bd.share(k))}" for k in bd.parts if bd.share(k) >= 0.005)
                + (
                    f". Not measurable in this run: {', '.join(unmeasured)} (see `pitstop fix`)"
                    if unmeasured
                    else ""
                ),
                data={"median_step_s": bd.median_total_s, "steps": bd.n, "unmeasured": unmeasured},
            )
        )
    return found, bd


def _unprobed_precision(model: dict[str, Any], dev_type: str) -> list[Finding]:
    """fp32 on fast-low-precision hardware, where the probe could not run (no inputs captured, too slow)."""
    if model.get("param_dtypes") != ["float32"]:
        return []
    if dev_type == "cpu" and not cpu.cpu_has_fast_bf16():
        return []
    if dev_type not in ("cpu", "cuda"):
        return []
    dtype = precision.preferred_amp_dtype(dev_type)
    if not dtype:
        return []
    return [
        Finding(
            id="precision.amp",
            severity=Severity.INFO,
            title=f"The model trains in fp32 on hardware with fast {dtype}",
            evidence="autocast was off during forward; the gain could not be measured in this run "
            "(`pitstop fix` measures it)",
            fix=f"Run forward and loss under torch.autocast('{dev_type}', dtype=torch.{dtype}).",
            fix_code=f"with torch.autocast('{dev_type}', dtype=torch.{dtype}):\n    loss = criterion(model(x), y)",
            location=model.get("first_location"),
        )
    ]


def build_report(result: RunResult) -> Report:
    """The ``pitstop profile`` report of one run: findings, the per-step timeline and the run's config."""
    data = result.data
    if result.status == "not_started":
        return Report(tool="profile", error=result.error, meta={"command": " ".join(result.command)})
    findings, bd = findings_for(result.steps, data)
    sections: dict[str, Any] = {
        "steps": [s.to_dict() for s in result.warmup_steps + result.steps],
        "losses": result.losses,
        "loaders": data.get("loaders", []),
        "models": data.get("models", []),
        "optimizers": data.get("optimizers", []),
        "sync_sites": data.get("sync_sites", []),
        "torch": data.get("torch", {}),
        "memory": data.get("memory", {}),
        "totals": data.get("totals", {}),
    }
    if bd is not None:
        sections["breakdown"] = {
            "steps": bd.n,
            "mean_step_s": bd.total_s,
            "median_step_s": bd.median_total_s,
            **bd.parts,
            "boundary": data.get("step_boundary"),
        }
    if data.get("probes"):
        sections["probes"] = data["probes"]
    if data.get("trace"):
        sections["trace"] = data["trace"]
    if data.get("gpu_util"):
        sections["gpu_util"] = data["gpu_util"]
    sections.update(gpu_rules.sections(result.steps, data, bd))  # device_time, mfu
    if result.callback_result is not None:
        sections["callback_result"] = result.callback_result
    meta: dict[str, Any] = {
        "command": " ".join(result.command),
        "status": result.status,
        "returncode": result.returncode,
        "measured_steps": len(result.steps),
        "warmup_steps": len(result.warmup_steps),
        "steps_per_s": round(result.steps_per_s(), 4),
        "wall_s": round(result.wall_s, 2),
        "device": data.get("device") or "cpu",
        "usable_cores": cpu.usable_cores(),
        "step_boundary": data.get("step_boundary"),
    }
    mem = data.get("memory") or {}
    if mem.get("peak_rss_bytes"):
        meta["peak_rss_mib"] = round(mem["peak_rss_bytes"] / 2**20, 1)
    if mem.get("cuda_peak_allocated_bytes"):
        meta["cuda_peak_allocated_mib"] = round(mem["cuda_peak_allocated_bytes"] / 2**20, 1)
    if result.trace_path:
        meta["trace"] = result.trace_path
    if not result.spec or not result.spec.overrides.is_empty():
        meta["overrides"] = result.spec.overrides.describe() if result.spec else None
    error = result.error
    tb = data.get("traceback")
    if tb and error:
        error = f"{error}\n\n{tb}"
    return Report(tool="profile", findings=findings, sections=sections, meta=meta, error=error)
