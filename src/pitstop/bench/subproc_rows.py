"""Rows measured outside the bench's own process: the DDP launches and the torch.compile worker (each a
``pitstop.bench.subproc`` run), and the OneCycle/StepLR comparison; how a subprocess's result becomes a
row's status and reason."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Protocol

from pitstop.bench.configs import BASELINE, CLAIMS, BenchConfig
from pitstop.bench.rows import FAILED, MEASURED, SKIPPED, TIMEOUT, Row, derive
from pitstop.bench.schedules import ScheduleResult

TIMER_WARMUP = 1  # untimed steps Session.block runs before each timed block
COMPILE_REF = replace(BASELINE, name="baseline_compile_ref", title="baseline (compile worker)")


class ProgressSink(Protocol):
    def set_total(self, total: int) -> None: ...
    def advance(self, description: str) -> None: ...


class NoProgress:
    def set_total(self, total: int) -> None:
        pass

    def advance(self, description: str) -> None:
        pass


def set_ref(row: Row, ref: Row) -> None:
    """Point ``row``'s ratios at ``ref`` (derive() recomputes them from these numbers)."""
    derive(ref, None, {})
    row.ref = ref.name if not row.ref else row.ref
    row.ref_samples_per_s = ref.samples_per_s
    row.ref_block_step_s = list(ref.block_step_s)
    row.ref_samples_per_step = ref.samples_per_step
    row.ref_peak_mem_bytes = ref.peak_mem_bytes
    row.ref_activation_bytes = ref.activation_bytes


def ddp_unavailable(device: str) -> Row:
    row = Row("ddp", "DDP", "1 vs N processes", status=SKIPPED, claim=CLAIMS["ddp"])
    row.reason = (
        "only one CUDA device: DDP scaling needs 2 or more"
        if device == "cuda"
        else "only one usable CPU core: DDP scaling needs 2 or more"
    )
    return row


def schedule_row(s: ScheduleResult) -> Row:
    one, step = s.median_steps("onecycle"), s.median_steps("steplr")
    row = Row(
        "onecycle",
        "OneCycle vs StepLR",
        f"shortest run (40-{s.horizon} steps, x1.5 apart) to {100 * s.target_accuracy:.0f}% held-out accuracy on {s.task}",
        claim=CLAIMS["onecycle"],
    )
    row.extra = {
        "steps_to_target": s.steps_to_target,
        "median_steps_onecycle": one,
        "median_steps_steplr": step,
        "horizon": s.horizon,
        "seconds": s.seconds,
    }
    if one and step:
        row.extra["steps"] = one / step
    else:
        row.status, row.reason = FAILED, "no runs"
    return row


def _worker_rows(payload: dict[str, Any] | None) -> dict[str, Row]:
    from pitstop.bench.worker import config_from_dict

    rows = {}
    for name, d in ((payload or {}).get("rows") or {}).items():
        d = dict(d)
        if d.get("claim"):
            d["claim"] = config_from_dict({"name": "x", "title": "x", "claim": d["claim"]}).claim
        rows[name] = Row(**{k: v for k, v in d.items() if k in Row.__dataclass_fields__})
    return rows


def ddp_rows(
    spec: dict[str, Any],
    n: int,
    threads: int,
    device: str,
    budget_s: float,
    baseline_step: float | None,
    progress: ProgressSink,
) -> list[Row]:
    from pitstop.bench.subproc import run_worker

    per_proc = max(1, threads // n) if device == "cpu" else threads
    backend = "nccl" if device == "cuda" else "gloo"
    base_cfg = replace(BASELINE, name="ddp_1", title=f"DDP reference: 1 process x {per_proc} threads")
    ddp_cfg = replace(BASELINE, name="ddp", title=f"DDP {n} processes ({backend})", claim=CLAIMS["ddp"])
    rows = []
    results = {}
    for procs, cfg in ((1, base_cfg), (n, ddp_cfg)):
        s = dict(spec, threads=per_proc, configs=[cfg.to_dict()], memory=False)
        if baseline_step:  # keep the two launches inside the budget: at most ~1/3 of it timing steps each
            s["steps"] = int(
                max(
                    2,
                    min(
                        s["steps"],
                        budget_s / 6 / (s["repeats"] * baseline_step * threads / per_proc) - TIMER_WARMUP,
                    ),
                )
            )
        left = budget_s - sum(r.seconds for r in results.values())
        results[procs] = r = run_worker(
            s, timeout_s=max(10.0, left if procs == n else left / 2), nprocs=procs
        )
        row = _worker_rows(r.payload).get(cfg.name) or Row(cfg.name, cfg.title, cfg.knobs(), claim=cfg.claim)
        row.knobs = f"{procs} process(es) x {per_proc} threads, torch.distributed.run, {backend}"
        if procs > 1:
            row.samples_per_step *= procs  # every rank trains its own batch: global samples per step
        row.extra.update({"processes": procs, "threads_per_process": per_proc, "backend": backend})
        _finish_worker_row(row, r, f"DDP with {procs} process(es)")
        rows.append(row)
        progress.advance(f"DDP {procs} process(es)")
    one, many = rows
    derive(one, None, {})
    if one.status == MEASURED and many.status == MEASURED:
        many.ref = one.name
        set_ref(many, one)
        derive(many, None, {})
        if many.speedup:
            many.extra["efficiency"] = many.speedup / n
    return rows


def isolated_rows(r: Any, configs: list[BenchConfig], elapsed_s: float) -> list[Row]:
    """Rows of the compile worker: each against the baseline the worker timed interleaved with it."""
    got = _worker_rows(r.payload)
    rows = []
    ref = got.get(COMPILE_REF.name)
    if ref is not None:
        _finish_worker_row(ref, r, "baseline in the compile worker")
        derive(ref, None, {})
    for c in configs:
        row = got.get(c.name) or Row(c.name, c.title, c.knobs(), claim=c.claim, dtype=c.amp or "float32")
        _finish_worker_row(row, r, "torch.compile")
        if row.status == MEASURED:
            row.extra["compile_warmup_s"] = row.warmup_s[0] if row.warmup_s else None
            row.reason = "measured in a subprocess against its own interleaved baseline"
            if ref is not None and ref.status == MEASURED:
                set_ref(row, ref)
        rows.append(row)
    return ([ref] if ref is not None else []) + rows


def error_line(stderr: str) -> str:
    """The exception line of the (first) Python traceback in a subprocess's stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*:", ln) and "ChildFailedError" not in ln:
            return ln
    return lines[-1] if lines else "no output"


def _finish_worker_row(row: Row, r: Any, what: str) -> None:
    """Status of a row measured by a subprocess: timed out, crashed, or measured."""
    if row.status == FAILED:
        return
    if r.timed_out and not row.block_step_s:
        row.status = TIMEOUT
        warm = (
            f" (warm-up steps so far: {', '.join(f'{w:.1f}' for w in row.warmup_s)} s)"
            if row.warmup_s
            else ""
        )
        hint = " (torch.compile's cache makes later runs faster)" if "compile" in what else ""
        row.reason = (
            f"{what} did not finish within its {r.seconds:.0f} s share of the budget{warm}; "
            f"rerun with a larger --budget{hint}"
        )
    elif not row.block_step_s:
        row.status = FAILED
        row.reason = f"{what} exited with code {r.returncode}: {error_line(r.stderr_tail)[:300]}"
    elif r.timed_out and not (r.payload or {}).get("done"):
        row.reason = f"timed out after {len(row.block_step_s)} timed blocks; the measured blocks are kept"
