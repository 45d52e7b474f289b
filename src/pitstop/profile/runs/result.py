"""One run's result: what the script's process measured (its measurements record, read into a
``RunResult`` by ``collect_data``) and the ``pitstop profile`` report of it (``build_report``, from the
rules' findings). ``RunSpec`` is what was asked for. ``runner`` makes them; a launch's result
(``merge.RanksResult``) and a run whose training ran in children (``children_report``) extend them.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.findings import Report
from pitstop.host.load import CpuOutsideSession
from pitstop.profile.capture.watchdog import hang_summary, read_watchdog
from pitstop.profile.record.measurements import Measurements, NewerRecord, check_schema
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import StepRecord, steps_from_log, steps_per_s

MEASUREMENTS = "measurements.json"


@dataclass
class RunSpec:
    command: list[str]
    steps: int = 30
    warmup: int = 5
    full: bool = False
    timeout: float | None = None
    trace: bool = False
    overrides: Overrides = field(default_factory=Overrides)
    callback: str | None = None
    callback_at: str = "loader"
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    probes: bool = True
    quiet: bool = False
    stdout_to_stderr: bool = False


@dataclass
class RunResult:
    returncode: int
    error: str | None
    steps: list[StepRecord]
    losses: list[float]
    config: dict[str, Any]
    callback_result: Any
    wall_s: float
    status: str = "completed"
    warmup_steps: list[StepRecord] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None
    command: list[str] = field(default_factory=list)
    spec: RunSpec | None = None
    hang: dict[str, Any] | None = None  # the watchdog's dump when the run was stopped hung (runner doc)

    @property
    def ok(self) -> bool:
        return self.status in ("completed", "stopped")

    @property
    def trace_path(self) -> str | None:
        trace = self.data.get("trace") or {}
        return trace.get("path")

    def steps_per_s(self) -> float:
        """Throughput: the measured steps over their wall seconds, slow ones included (0.0 when none)."""
        return steps_per_s(self.steps)

    def median_step_s(self) -> float | None:
        return statistics.median(s.total_s for s in self.steps) if self.steps else None

    def report(self) -> Report:
        return build_report(self)

    def measurements(self) -> Measurements:
        """The run's measurements record, typed: what the rules read (``data``, with what the parent
        added to it since)."""
        return Measurements.from_json(self.data)


def note_other_cpu(result: RunResult, other: CpuOutsideSession, session: int) -> None:
    """Other processes' share of the CPUs over the run (at least: ``CpuOutsideSession``), and the
    hypervisor's steal, into ``result.data`` and each rank's (its findings are built from its own);
    ``session``: the script's, whose processes are its own."""
    shares = {"other_cpu_share": round(other.share(session), 4), "steal_share": round(other.steal_share(), 4)}
    result.data.update(shares)
    for rank in (getattr(result, "ranks", None) or {}).values():
        rank.data.update(shares)


def read_measurements(
    spec: RunSpec, path: Path, returncode: int, status_override: str | None, wall: float
) -> RunResult:
    """A RunResult from the child's measurements file at ``path`` (``collect_data``; nothing read: killed;
    a record from a newer pitstop: an error saying so)."""
    try:
        data = json.loads(path.read_text())
        check_schema(data)
        data = steps_from_log(data, path.parent)
    except NewerRecord as e:
        data = {"status": "error", "error": str(e)}
    except (OSError, ValueError, AttributeError):
        data = {}
    return collect_data(spec, data, returncode, status_override, wall, out_dir=path.parent)


def collect_data(
    spec: RunSpec,
    data: dict[str, Any],
    returncode: int,
    status_override: str | None,
    wall: float,
    out_dir: Path | None = None,
) -> RunResult:
    """A RunResult from a measurements record (the child's file, or an in-process Profiler's snapshot).
    ``out_dir``: the run folder, where the child's watchdog left its record (none in-process)."""
    status = data.get("status", "killed")
    error = data.get("error")
    if status in ("running", "probing") or not data:
        # the child never wrote its final record: killed, crashed hard, or hung past the grace period
        status = "killed"
        error = f"the script ended abruptly (exit status {returncode}, e.g. os._exit or a crash in native code); partial measurements shown"
        if returncode < 0:
            with contextlib.suppress(ValueError):
                error = (
                    f"the script was killed by {signal.Signals(-returncode).name}; partial measurements shown"
                )
        if not data:
            error = f"the script ended (exit status {returncode}) before pitstop could measure anything"
    if status_override == "timeout":
        status = "timeout"
        error = f"timed out after {spec.timeout:g} s; stopped the script" + (
            "" if data.get("status") not in (None, "running", "probing") else " (partial measurements)"
        )
    elif status_override == "interrupted":
        status, error = "interrupted", "interrupted (Ctrl-C or SIGTERM)"
    data["watchdog"] = read_watchdog(out_dir, status) if out_dir is not None else {}
    hung = hang_summary(data["watchdog"])
    error = f"{hung}; {error}" if hung and error else hung or error
    records = [StepRecord.from_dict(r) for r in data.get("steps", [])]
    warm = [r for r in records if r.warmup]
    measured = [r for r in records if not r.warmup]
    losses_all = data.get("losses") or []
    losses = [v for r, v in zip(records, losses_all, strict=False) if not r.warmup]
    if status in ("completed", "stopped") and not records and not spec.callback:
        error = "no optimizer step was seen, nor enough backward() calls to delimit steps by"
    if data.get("callback_error"):
        error = data["callback_error"] if error is None else f"{error}; {data['callback_error']}"
    config = {
        "loaders": data.get("loaders", []),
        "models": data.get("models", []),
        "optimizers": data.get("optimizers", []),
        "device": data.get("device"),
        "torch": data.get("torch", {}),
        "memory": data.get("memory", {}),
        "overrides": spec.overrides.to_dict(),
        "compile_error": data.get("compile_error"),
        "flush_error": data.get("flush_error"),
        "override_errors": data.get("override_errors") or [],
        "host_memory": data.get("host_memory"),
    }
    return RunResult(
        returncode=returncode,
        error=error,
        steps=measured,
        losses=[float("nan") if v is None else float(v) for v in losses],
        config=config,
        callback_result=data.get("callback_result"),
        wall_s=wall,
        status=status,
        warmup_steps=warm,
        data=data,
        command=list(spec.command),
        spec=spec,
        hang=data["watchdog"].get("hang"),
    )


def build_report(result: RunResult) -> Report:
    """The ``pitstop profile`` report of one run: findings, the per-step timeline and the run's config.
    The rules are imported here, when a report is asked for: reading a result does not need them."""
    from pitstop.host import cpu
    from pitstop.profile.analyze import gpu_rules, summary
    from pitstop.profile.analyze.rules import problem_findings, verdict_basis

    data = result.data
    if result.status == "not_started":
        return Report(tool="profile", error=result.error, meta={"command": " ".join(result.command)})
    m = result.measurements()  # the one place the parent's report reads the record into its type
    findings, bd = problem_findings(result.steps, m)
    basis = verdict_basis(findings, bd, m) if bd is not None else None
    if basis is not None and result.status == "interrupted":  # Ctrl-C / SIGTERM: never healthy
        probing = data.get("status") == "probing" or "KeyboardInterrupt" in str(data.get("finalize_error"))
        basis["interrupted"] = (
            "the measured what-ifs after the script (exit probes)" if probing else "the script run"
        )
    if basis is not None and (last := summary.verdict(findings, **basis)) is not None:
        findings.append(last)
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
    sections.update(gpu_rules.sections(result.steps, m, bd))  # device_time, mfu
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
    if basis is not None:
        meta[summary.BASIS] = basis
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
