"""Passes for what a profile run checked and left alone, so the report says it was looked at."""

from __future__ import annotations

from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze.registry import RunView, rule
from pitstop.recipes import recipe


@rule(order=60)
def skipped_probe_rule(v: RunView) -> list[Finding]:
    return skipped_probe_passes(v.probes, v.dev_type)


def skipped_probe_passes(probes: dict[str, Any], device: str) -> list[Finding]:
    """fp32 kept because this hardware has no fast bf16/fp16 path: the probe did not run, and why."""
    prec = probes.get(recipe("amp").probe or "") or {}
    # "slower": fast hardware by its flags whose matmuls measured slow (pitstop.profile.analyze.probe_failures)
    if prec.get("dtype") is not None or not prec.get("skipped") or prec.get("slower"):
        return []
    hw = "AVX512_BF16 or AMX" if device == "cpu" else "tensor cores"
    return [
        Finding(
            id=recipe("amp").finding,
            severity=Severity.PASS,
            title=f"fp32 kept: this {device} has no fast bf16/fp16 path",
            evidence=f"autocast not timed ({prec['skipped']}): without {hw} low precision has no "
            "hardware path to gain from here",
            data=prec,
        )
    ]
