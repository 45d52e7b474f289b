"""Findings for the exit probes that could not give a measurement: one that raised
(``profile.probe_failed``, with the error) and an autocast probe skipped by its time bound, so a check
the report would otherwise show is never dropped in silence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze.registry import RunView, rule
from pitstop.profile.record.parts import Probes
from pitstop.recipes import recipe


def probe_failed_finding(probe: str, error: str) -> Finding:
    return Finding(
        id="profile.probe_failed",
        severity=Severity.INFO,
        title=f"The {probe} probe failed, so its check is missing from this report",
        evidence=error,
        data={"probe": probe, "error": error},
        fix="The training run itself is unaffected; `pitstop fix` measures the same changes by re-running "
        "the script. If the error looks like a pitstop bug, please report it with this message.",
    )


@rule(order=110)
def probe_failure_rule(v: RunView) -> list[Finding]:
    return probe_failure_rules(v.m.probed)


def probe_failure_rules(results: Probes | Mapping[str, Any]) -> list[Finding]:
    probes = Probes.of(results)
    out = []
    if probes.error:
        out.append(probe_failed_finding("model (autocast, channels_last, cudnn.benchmark)", str(probes.error)))
    for o in probes.optimizer:
        if o.error:
            out.append(probe_failed_finding(f"optimizer ({o.type} foreach)", str(o.error)))
    hm = probes.result("host_memory")
    if hm is not None and hm.error:
        out.append(probe_failed_finding("host-memory", str(hm.error)))
    prec = probes.result("precision")
    if prec is not None and prec.slower:
        out.append(
            Finding(
                id=recipe("amp").finding,
                severity=Severity.INFO,
                title="Autocast was not probed: its matmuls measured slower than fp32 here",
                evidence=str(prec.skipped),
                data=prec.to_json(),
                fix="Keep fp32 on this hardware.",
            )
        )
    return out
