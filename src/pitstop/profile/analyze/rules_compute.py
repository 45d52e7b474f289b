"""Rules for the compute side of a step: the exit probes' measured what-ifs (autocast, channels_last (its
component's rule), cudnn.benchmark, foreach optimizers, keeping freed host memory mapped) and the setup
facts (compile, DataParallel, GPU use). Pure functions from measurements to Findings."""

from __future__ import annotations

from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host import cpu, precision
from pitstop.host.event_costs import FAULT_COST_MULTIPLE, page_fault_bound_s
from pitstop.measure import NO_GAIN
from pitstop.profile.analyze.rulekit import (
    FAULTS_WORTH_A_RUN,
    GPU_IDLE_PCT,
    MIN_FAULTS_TO_TIME,
    MIN_SHARE,
    WARN_SHARE,
    ProbeRule,
    cost,
    ms,
    pct,
    probe_finding,
    probe_helps,
    saving_verdict,
    sev,
    undecided,
)
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import channels_last, recipe
from pitstop.train.host_memory import GLIBC_ENV

PROBE_RULES = (
    ProbeRule(
        "amp",
        title="The model trains in fp32 on hardware with fast {dtype}",
        evidence="forward+backward on the script's last batch: fp32 {base}, {dtype} autocast {new} (medians, "
        "measured after the run); this {device} has {hw}",
        fix="Run forward and loss under autocast({dtype}).{scaler}",
        pass_title="fp32 kept: {dtype} autocast measured to save under {bar} of the step here",
        pass_evidence="forward+backward: fp32 {base}, {dtype} {new}",
        at_model=True,
    ),
    channels_last.RULE,
    ProbeRule(
        "cudnn_benchmark",
        title="cudnn.benchmark is off for a conv net with fixed input shapes",
        evidence="forward+backward: benchmark off {base}, on {new}",
        fix="Let cuDNN pick the fastest convolution algorithms (input shapes must not change every step).",
    ),
)


def probe_rules(bd: Breakdown, model: dict[str, Any], probes: dict[str, Any], device: str) -> list[Finding]:
    """The findings of the model probes (``PROBE_RULES``), each from its recipe's probe result: a problem,
    a pass only where the interval rules out a saving of ``WARN_SHARE`` of the step, or undecided."""
    dtype = (probes.get(recipe("amp").probe or "") or {}).get("dtype")
    fields = {
        "device": device,
        "hw": "AVX512_BF16/AMX" if device == "cpu" else "tensor cores",
        "scaler": " With float16 on CUDA, use a GradScaler." if dtype == "float16" else "",
        "conv2d_layers": model.get("conv2d_layers"),
        "bar": pct(WARN_SHARE),
    }
    out: list[Finding] = []
    for rule in PROBE_RULES:
        if rule.recipe == "amp" and not dtype:
            continue  # not probed: this hardware has no fast low-precision path
        out += probe_finding(rule, bd, probes, model.get("first_location"), **fields)
    return out


FLOAT64 = ProbeRule(
    "float32",
    title="The model trains in float64; float32 is faster here",
    evidence="forward+backward on the script's last batch: float64 {base}, float32 {new} (medians, measured "
    "after the run on a float32 copy of the model)",
    fix="Train in float32: convert the model once, before building the optimizer, and each float64 batch "
    "(numpy arrays give float64); keep float64 only where the numerics need it.",
    pass_title="float32 measured no faster than float64 for this model here",
    pass_evidence="forward+backward: float64 {base}, float32 {new}",
    at_model=True,
)


def float64_rules(bd: Breakdown, model: dict[str, Any], probes: dict[str, Any]) -> list[Finding]:
    """A model with float64 parameters: the float32 probe's finding, or, where it did not run, an info
    finding saying why (``pitstop fix --candidates float32`` times it on the whole script)."""
    if "float64" not in (model.get("param_dtypes") or []):
        return []
    where = model.get("first_location")
    found = probe_finding(FLOAT64, bd, probes, where)
    if found:
        return found
    r = recipe(FLOAT64.recipe)
    p = probes.get(r.probe or "") or {}
    why = p.get("skipped") or p.get("error") or probes.get("error") or "the model probes did not run"
    return [
        Finding(
            id=r.finding or r.name,
            severity=Severity.INFO,
            title="The model trains in float64",
            evidence=f"float64 parameters ({', '.join(model['param_dtypes'])}); the float32 gain was not "
            f"measured in this run ({why}). `pitstop fix --candidates {r.name}` measures it",
            data={"param_dtypes": model["param_dtypes"], "probe": p or None},
            fix=FLOAT64.fix,
            fix_code=r.snippet,
            location=where,
        )
    ]


PAGE_FAULTS = recipe("host_memory").finding


def host_memory_rules(bd: Breakdown, probes: dict[str, Any]) -> list[Finding]:
    """CPU steps that page-fault their tensors in: glibc gives large freed blocks back to the kernel."""
    hm = probes.get("host_memory")
    if not hm:
        return []
    data = {**hm, "faults_per_step": bd.faults_per_step}
    if hm.get("kept"):  # the script kept freed memory itself, or jemalloc/tcmalloc is preloaded
        return [
            Finding(
                id=PAGE_FAULTS,
                severity=Severity.PASS,
                title="Freed host memory stays mapped: steps do not page-fault their tensors in",
                evidence=f"{hm['skipped']}; {bd.faults_per_step:,.0f} minor page faults per step in the run "
                "(mean)",
                data=data,
            )
        ]
    if "saving_s" not in hm:
        return []
    measured = (
        f"{bd.faults_per_step:,.0f} minor page faults per step in the run (mean); a training step on the "
        f"script's last batch: {ms(hm['base_s'])} and {hm['base_faults']:,.0f} faults with malloc as it "
        f"was, {ms(hm['new_s'])} and {hm['new_faults']:,.0f} faults with freed memory kept mapped "
        "(medians, one after the other: the change cannot be undone in the process)"
    )
    fix = (
        "Keep freed memory in the process, once at start: pitstop.train.keep_host_memory() (raises glibc's "
        "mmap/trim thresholds); or, without a code change, start the script with `pitstop launch --allocator "
        "glibc` (the same through glibc's environment variables) or `--allocator jemalloc`. Cost: the "
        "process keeps its peak heap."
    )
    env = " ".join(f"{k}={v}" for k, v in GLIBC_ENV.items())
    fix_code = f"{recipe('host_memory').snippet}\n# or: pitstop launch --allocator glibc -- train.py   (= {env} python train.py)"
    # The probe runs after the script, with the heap in another state, so its own fault count is not the
    # run's: what carries over is the time one fault costs, applied to the faults the run's steps took.
    dropped = hm["base_faults"] - hm["new_faults"]
    timed = dropped >= MIN_FAULTS_TO_TIME  # else the probe's heap took too few faults to time one
    per_fault = hm["saving_s"] / dropped if timed and probe_helps(hm) else 0.0  # below noise: ~free
    per_fault, unexplained = _bounded_per_fault(per_fault, hm.get("isolated_fault_s"), dropped)
    saving, share = cost(bd, per_fault * bd.faults_per_step)
    if timed and share >= MIN_SHARE:
        data.update(per_fault_s=per_fault, est_saving_s=saving)
        return [
            Finding(
                id=PAGE_FAULTS,
                severity=sev(share),
                title="CPU steps page-fault their tensors in: malloc returns freed memory to the kernel",
                evidence=f"{measured}{unexplained}; {per_fault * 1e6:.2f} us per fault x "
                f"{bd.faults_per_step:,.0f} faults per step = {ms(saving)} per step",
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
                id=PAGE_FAULTS,
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
            id=PAGE_FAULTS,
            severity=Severity.PASS,
            title="Page faults measured to cost under 1% of the step here"
            if timed
            else f"Steps take few page faults ({bd.faults_per_step:,.0f} per step)",
            evidence=measured,
            data=data,
        )
    ]


def _bounded_per_fault(per_fault: float, isolated: float | None, dropped: float) -> tuple[float, str]:
    """The probe's price of one fault, at most ``FAULT_COST_MULTIPLE`` x what one costs on this machine
    in isolation (``pitstop.host.event_costs``), and the evidence's words when that bound applied."""
    bound = page_fault_bound_s(isolated)
    if bound is None or per_fault <= bound:
        return per_fault, ""
    rest = (per_fault - bound) * dropped
    return bound, (
        f"; the probe's difference is {per_fault * 1e6:.1f} us per fault, but one fault costs "
        f"{(isolated or 0.0) * 1e6:.2f} us on this machine in isolation: faults are charged at most "
        f"{FAULT_COST_MULTIPLE:g}x that, and the rest of the probe's difference ({ms(rest)}) is not "
        "explained by faults (the probe's two passes differed in more than malloc, or were disturbed)"
    )


def optimizer_rules(bd: Breakdown, optimizers: list[dict[str, Any]], probes: dict[str, Any]) -> list[Finding]:
    """One finding per site (optimizer type and the line that built it) whose optimizers run a Python
    loop over their parameters; optimizers built at one line (one per model part) count together."""
    sites: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for opt in optimizers:
        if opt.get("impl") == "for-loop":
            sites.setdefault((opt.get("type"), opt.get("location")), []).append(opt)
    measured = [p for p in probes.get("optimizer", []) if "saving_s" in p]
    out: list[Finding] = []
    for (kind, where), opts in sites.items():
        # probes from before they carried a location matched by type alone
        mine = [p for p in measured if p.get("type") == kind and p.get("location", where) == where]
        p = _site_probe(mine)
        if p is not None and not probe_helps(p):
            if saving_verdict(p, bd.median_total_s) != NO_GAIN:  # no faster, but a gain not ruled out
                what = f"{opt['type']} one step: as built {ms(p['base_s'])}, foreach {ms(p['new_s'])}"
                out.append(undecided("foreach", p, bd.median_total_s, what, opt.get("location")))
            continue  # measured: foreach saves under WARN_SHARE of the step here
        saving, share = cost(bd, p["saving_s"]) if p else (None, None)
        n = len(opts)
        params = sum(o.get("params") or 0 for o in opts) or "?"
        built = f"{n} {kind} optimizers built here run" if n > 1 else f"{kind} runs"
        evidence = f"{built} a Python loop over {'their' if n > 1 else 'its'} {params} parameter tensors"
        if p:
            evidence += f"; one step{' of each' if n > 1 else ''}: as built {ms(p['base_s'])}, foreach {ms(p['new_s'])} (measured after the run)"
        else:
            evidence += f"; optimizer time {ms(bd.parts['optimizer_s'])} per step (foreach not measured)"
        data: dict[str, Any] = {"optimizer": opts[0], "probe": p}
        if n > 1:
            data["optimizers"] = opts
        out.append(
            Finding(
                id=recipe("foreach").finding,
                severity=sev(share),
                title=f"{kind} uses neither foreach nor fused kernels",
                evidence=evidence,
                data=data,
                fix="Ask for the multi-tensor implementation (fused=True where supported is faster still).",
                fix_code=recipe("foreach").code(optimizer=kind, impl="foreach"),
                location=where,
                est_saving_s=saving,
                share=share,
            )
        )
    return out


def _site_probe(probes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The foreach probe of one site: its one optimizer's, or the sum over the site's optimizers (each
    steps once a step), bounds summed too."""
    if len(probes) < 2:
        return probes[0] if probes else None
    out: dict[str, Any] = {
        "type": probes[0].get("type"),
        "location": probes[0].get("location"),
        "members": probes,
    }
    for key in ("base_s", "new_s", "saving_s", "saving_lo_s", "saving_hi_s"):
        vals = [p.get(key) for p in probes]
        if all(isinstance(v, int | float) for v in vals):
            out[key] = sum(vals)
    return out


def setup_rules(
    model: dict[str, Any], torch_facts: dict[str, Any], gpu: dict[str, Any] | None
) -> list[Finding]:
    out: list[Finding] = []
    where = model.get("first_location")
    if model and not model.get("compiled") and not torch_facts.get("dynamo_graphs"):
        out.append(
            Finding(
                id=recipe("compile").finding,
                severity=Severity.INFO,
                title="The model is not compiled",
                evidence="torch.compile was not used; its gain depends on the model and is not measured by a "
                "profile run (compiling takes minutes). `pitstop fix` measures it.",
                fix="Try torch.compile; keep it if `pitstop fix` shows a gain.",
                fix_code=recipe("compile").snippet,
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


def unprobed_precision(model: dict[str, Any], dev_type: str) -> list[Finding]:
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
            id=recipe("amp").finding,
            severity=Severity.INFO,
            title=f"The model trains in fp32 on hardware with fast {dtype}",
            evidence="autocast was off during forward; the gain could not be measured in this run "
            "(`pitstop fix` measures it)",
            fix=f"Run forward and loss under torch.autocast('{dev_type}', dtype=torch.{dtype}).",
            fix_code=recipe("amp").code(device=dev_type, dtype=dtype),
            location=model.get("first_location"),
        )
    ]
