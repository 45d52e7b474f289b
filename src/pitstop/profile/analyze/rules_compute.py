"""Rules for the compute side of a step: the exit probes' measured what-ifs (autocast, channels_last,
foreach and keeping freed host memory mapped, each through its component's rules; cudnn.benchmark and
TF32 are ``gpu_rules``') and the setup facts (compile through its component, DataParallel, GPU use).
Pure functions from measurements to Findings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze import rulekit
from pitstop.profile.analyze.registry import RunView, rule
from pitstop.profile.analyze.rulekit import (
    GPU_IDLE_PCT,
    WARN_SHARE,
    pct,
    probe_finding,
)
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import components, host_memory
from pitstop.recipes.component import DTYPE, FORWARD, MODEL, OPTIMIZER, WRAP

if TYPE_CHECKING:
    from pitstop.recipes.component import (
        DtypeComponent,
        ForwardComponent,
        HostJudge,
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
    return optimizer_rules(v.breakdown, [o.to_json() for o in v.m.optimizers], v.probes)


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


def host_memory_rules(bd: Breakdown, probes: dict[str, Any]) -> list[Finding]:
    """CPU steps that page-fault their tensors in: the host-memory component's ``rules`` on its probe's
    result, judged by this package's thresholds (``rulekit``)."""
    return host_memory.rules(bd, probes.get(host_memory.PROBE), cast("HostJudge", rulekit))


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
