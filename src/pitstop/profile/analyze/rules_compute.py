"""Rules for the compute side of a step: the exit probes' measured what-ifs (autocast, channels_last and
foreach through their components' rules, keeping freed host memory mapped; cudnn.benchmark and TF32 are
``gpu_rules``') and the setup
facts (compile through its component, DataParallel, GPU use). Pure functions from measurements to Findings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from pitstop.findings import Finding, Severity
from pitstop.host.event_costs import FAULT_COST_MULTIPLE, page_fault_bound_s
from pitstop.profile.analyze import rulekit
from pitstop.profile.analyze.registry import RunView, rule
from pitstop.profile.analyze.rulekit import (
    FAULTS_WORTH_A_RUN,
    GPU_IDLE_PCT,
    MIN_FAULTS_TO_TIME,
    MIN_SHARE,
    WARN_SHARE,
    cost,
    ms,
    pct,
    probe_finding,
    probe_helps,
    sev,
)
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import components, recipe
from pitstop.recipes.component import DTYPE, FORWARD, MODEL, OPTIMIZER, WRAP
from pitstop.recipes.host_memory import GLIBC_ENV

if TYPE_CHECKING:
    from pitstop.recipes.component import (
        DtypeComponent,
        ForwardComponent,
        Judge,
        OptimizerComponent,
        ProbedComponent,
        WrapComponent,
    )

# the components whose probe times the model's forward+backward (autocast, channels_last, ...), each
# with its RULE and the fields its texts take (``rule_fields``), in registry order
PROBED = (FORWARD, MODEL)
PROBE_RULES = tuple(c.RULE for c in components(*PROBED))


@rule(order=40)
def model_probe_rule(v: RunView) -> list[Finding]:
    return probe_rules(v.breakdown, v.model.to_json(), v.probes, v.dev_type)


@rule(order=50)
def dtype_rule(v: RunView) -> list[Finding]:  # float32
    return dtype_rules(v.breakdown, v.model.to_json(), v.probes)


@rule(order=70)
def unprobed_precision_rule(v: RunView) -> list[Finding]:
    return unprobed_precision(v.model.to_json(), v.probes, v.dev_type)


@rule(order=80)
def optimizer_rule(v: RunView) -> list[Finding]:
    return optimizer_rules(v.breakdown, v.m.optimizers or [], v.probes)


@rule(order=90)
def host_memory_rule(v: RunView) -> list[Finding]:
    return host_memory_rules(v.breakdown, v.probes)


@rule(order=120)
def setup_rule(v: RunView) -> list[Finding]:
    return setup_rules(v.model.to_json(), v.m.torch or {}, v.m.gpu_util)


def probe_rules(bd: Breakdown, model: dict[str, Any], probes: dict[str, Any], device: str) -> list[Finding]:
    """The findings of the model probes, each from its recipe's probe result: every ``PROBED``
    component's ``RULE`` (with its ``rule_fields``; none where they are None): a problem, a pass only
    where the interval rules out a saving of ``WARN_SHARE`` of the step, or undecided."""
    where = model.get("first_location")
    fields = {"device": device, "bar": pct(WARN_SHARE)}
    out: list[Finding] = []
    for c in cast("list[ProbedComponent]", components(*PROBED)):
        own = c.rule_fields(model, probes.get(c.PROBE) or {}, device)
        if own is not None:
            out += probe_finding(c.RULE, bd, probes, where, **fields, **own)
    return out


def dtype_rules(bd: Breakdown, model: dict[str, Any], probes: dict[str, Any]) -> list[Finding]:
    """For each dtype component with something to change in the model (float32: float64 parameters): its
    probe's finding (``RULE``), or, where the probe did not run, its ``unprobed`` info finding (``pitstop
    fix`` times it on the whole script)."""
    out: list[Finding] = []
    for c in cast("list[DtypeComponent]", components(DTYPE)):
        if c.applies(model):
            out += probe_finding(c.RULE, bd, probes, model.get("first_location")) or [
                c.unprobed(model, probes)
            ]
    return out


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
    """The findings of every optimizer component (``components(OPTIMIZER)``: foreach), each its own
    ``rules`` (one finding per site) judged by this package's verdicts (``rulekit``)."""
    judge = cast("Judge", rulekit)
    found = cast("list[OptimizerComponent]", components(OPTIMIZER))
    return [f for c in found for f in c.rules(bd, optimizers, probes, judge)]


def setup_rules(
    model: dict[str, Any], torch_facts: dict[str, Any], gpu: dict[str, Any] | None
) -> list[Finding]:
    where = model.get("first_location")
    # compile: its info finding where the model ran uncompiled (``pitstop fix`` times it)
    out = [f for c in cast("list[WrapComponent]", components(WRAP)) for f in c.findings(model, torch_facts)]
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


def unprobed_precision(model: dict[str, Any], probes: dict[str, Any], dev_type: str) -> list[Finding]:
    """What a ``FORWARD`` component (autocast) says where its probe did not run (``unprobed``)."""
    return [
        f
        for c in cast("list[ForwardComponent]", components(FORWARD))
        if not probes.get(c.PROBE)
        for f in c.unprobed(model, dev_type)
    ]
