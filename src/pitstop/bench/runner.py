"""`pitstop bench` end to end: set up the workload, measure the machine's matmul peak and the model's
FLOPs, run the ablation interleaved inside a time budget, then the subprocess rows (DDP, torch.compile)
and the OneCycle/StepLR comparison. Returns data; it never prints."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pitstop.bench.bounds import drop_slow_rows, measure_peaks, peak_notes, peaks_budget, slow_dtype_check
from pitstop.bench.configs import CLAIMS, BenchConfig, ablation, effective, why_not
from pitstop.bench.rows import MEASURED, SKIPPED, Row, derive
from pitstop.bench.schedules import ScheduleResult, compare_schedules
from pitstop.bench.subproc_rows import (
    COMPILE_REF,
    TIMER_WARMUP,
    NoProgress,
    ProgressSink,
    ddp_rows,
    ddp_unavailable,
    isolated_rows,
    schedule_row,
    set_ref,
)
from pitstop.bench.workloads import Workload, WorkloadSpec, build_workload, image_side, make_image_folder
from pitstop.factory import FactoryError
from pitstop.host.cpu import usable_cores
from pitstop.host.load import OtherCpu, load_average


@dataclass
class BenchOptions:
    workload: str = "vision"
    size: str = "small"
    model: str | None = None
    batch_size: int | None = None
    budget_s: float = 300.0
    repeats: int = 3
    warmup: int = 2
    steps: int | None = None  # fixed steps per block; None: scaled to fit the budget
    max_steps: int = 50
    device: str = "auto"
    workers: int = 2
    threads: int | None = None
    only: tuple[str, ...] = ()  # config names to run (baseline always runs)
    skip: tuple[str, ...] = ()
    peers: bool = True
    compile: bool = True
    ddp_procs: int | None = None  # None: 2 on CPU, all GPUs on CUDA; 0 or 1: no DDP row
    schedules: bool = True
    schedule_seeds: int = 3
    data_dir: str | None = None
    seed: int = 0


@dataclass
class BenchResult:
    options: BenchOptions
    workload: str
    device: str
    threads: int
    rows: list[Row] = field(default_factory=list)
    peaks: dict[str, float] = field(default_factory=dict)  # dtype -> measured torch.mm FLOP/s
    flops_per_sample: float | None = None
    schedules: ScheduleResult | None = None
    steps: int = 0
    repeats_done: int = 0
    phases_s: dict[str, float] = field(default_factory=dict)
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    load_avg: dict[str, float] = field(default_factory=dict)  # 1-min load average at start and end
    other_cpu_share: float = 0.0  # CPU time of processes outside the bench over wall time x CPUs

    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)


# After warm-up: fixed reserves for the DDP launches and the schedule comparison, then this share of the
# rest for the interleaved ablation; torch.compile goes last and gets whatever is left.
DDP_RESERVE_S, SCHEDULES_RESERVE_S = 70.0, 20.0
# torch.compile must have compiled (in its worker, overlapping this process's warm-up) by this share of
# the budget, or its rows report that it did not fit.
COMPILE_READY_SHARE = 0.5
# Warm-up, then calibration, must end by these shares of the budget (a loaded or slow machine makes
# every step slower than planned); DDP is not started with less than DDP_MIN_S left (two launches).
WARMUP_SHARE, CALIBRATE_SHARE, DDP_MIN_S = 0.5, 0.6, 20.0
OTHER_CPU_NOTE = 0.1  # competing CPU share above which the results carry a note


def bench_device(device: str) -> str:
    """``cpu`` or ``cuda`` for ``--device`` (cpu, cuda, auto), resolved as ``pitstop.train`` resolves it."""
    import torch

    from pitstop.train.distributed import resolve_device

    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"unknown device {device!r} (cpu, cuda, auto)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    return resolve_device(device).type


def amp_dtype_for(device: str) -> str | None:
    from pitstop.matmul import fast_amp_dtype

    return fast_amp_dtype(device)


def select_configs(opts: BenchOptions, device: str, workload: Workload) -> list[BenchConfig]:
    import torch

    # "all" uses the AMP dtype this hardware is fast at (none: it stays fp32); the AMP rows run regardless.
    configs = ablation(
        device, workload.image_input, amp_dtype_for(device), workers=opts.workers, peers=opts.peers
    )
    if not opts.compile:
        configs = [c for c in configs if not c.compile]
    if opts.only:
        configs = [c for c in configs if c.name in opts.only or c.name == "baseline"]
    configs = [c for c in configs if c.name not in opts.skip or c.name == "baseline"]
    cuda = torch.cuda.is_available()
    return [effective(c, device, cuda) for c in configs]


@dataclass
class _Run:
    """State that crosses run_bench's stages: the plan, the live rows and the held compile worker."""

    opts: BenchOptions
    progress: ProgressSink
    t_start: float
    deadline: float
    threads: int
    spec: WorkloadSpec
    workload: Workload
    own_data: str | None  # the image folder this run made (removed at the end)
    res: BenchResult
    other: OtherCpu
    configs: list[BenchConfig]
    cuda: bool
    bf16_ok: bool
    inproc: list[BenchConfig]
    isolated: list[BenchConfig]
    ddp_n: int
    extras_spec: dict[str, Any]
    lives: list[Any] = field(default_factory=list)
    compiler: Any = None  # the held torch.compile worker (subproc.WorkerHandle)
    compile_result: Any = None  # its WorkerResult once it has ended

    @property
    def device(self) -> str:
        return self.res.device


def run_bench(opts: BenchOptions, progress: ProgressSink | None = None) -> BenchResult:
    """Run the bench within ``opts.budget_s``: setup, warm-up, the interleaved ablation, then the schedule,
    DDP and torch.compile rows. Ctrl-C keeps what was measured (``interrupted``); rows that did not run
    are SKIPPED with the reason."""
    from pitstop.bench.measure_configs import close_all

    run = _plan(opts, progress or NoProgress())
    try:
        _setup(run)
        _warm_up(run)
        _ablate(run)
    except KeyboardInterrupt:
        run.res.interrupted = True
    finally:
        close_all(run.lives)
    _collect_rows(run)
    try:
        if run.res.interrupted:
            raise KeyboardInterrupt
        _run_extras(run)
    except KeyboardInterrupt:
        run.res.interrupted = True
    finally:
        if run.compiler is not None:
            run.compiler.kill()
            run.compiler.finish(0)
        if run.own_data:
            shutil.rmtree(run.own_data, ignore_errors=True)
    _finish(run)
    return run.res


def _plan(opts: BenchOptions, progress: ProgressSink) -> _Run:
    """Resolve the device and threads, build the workload (with an image folder of its own when none was
    given), select the configs and tell ``progress`` how many units the run has."""
    import torch

    t_start = time.monotonic()
    device = bench_device(opts.device)
    threads = opts.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    spec = WorkloadSpec(opts.workload, opts.size, opts.model, opts.data_dir, opts.batch_size)
    workload = build_workload(spec)
    own_data = None
    if workload.image_input and not spec.data_dir:
        own_data = tempfile.mkdtemp(prefix="pitstop-bench-images-")
        spec = replace(spec, data_dir=own_data)
        workload = build_workload(spec)
    res = BenchResult(opts, workload.describe(), device, threads)
    if (load := load_average()) is not None:
        res.load_avg["start"] = round(load, 2)
    other = OtherCpu()  # competing work, told apart from the bench's own workers
    configs = select_configs(opts, device, workload)
    cuda, bf16_ok = torch.cuda.is_available(), device != "cuda" or torch.cuda.is_bf16_supported()
    inproc = [c for c in configs if not c.isolate and why_not(c, device, cuda, bf16_ok) is None]
    isolated = [c for c in configs if c.isolate]
    ddp_n = _ddp_procs(opts, device)
    sched_units = opts.schedule_seeds if opts.schedules else 0
    progress.set_total(
        4 + len(inproc) * (1 + opts.repeats) + sched_units + (2 if ddp_n else 0) + (1 if isolated else 0)
    )
    extras_spec = {
        "workload": spec.to_dict(),
        "device": device,
        "warmup": opts.warmup,
        "repeats": opts.repeats,
        "seed": opts.seed,
    }
    return _Run(
        opts=opts,
        progress=progress,
        t_start=t_start,
        deadline=t_start + opts.budget_s,
        threads=threads,
        spec=spec,
        workload=workload,
        own_data=own_data,
        res=res,
        other=other,
        configs=configs,
        cuda=cuda,
        bf16_ok=bf16_ok,
        inproc=inproc,
        isolated=isolated,
        ddp_n=ddp_n,
        extras_spec=extras_spec,
    )


def _setup(run: _Run) -> None:
    """Write the image data, count the model's FLOPs per sample (a model that cannot train on the data
    ends the bench with a ValueError) and measure the matmul peaks."""
    from pitstop.bench.measure import flops_per_sample

    res, workload, progress = run.res, run.workload, run.progress
    t = time.monotonic()
    if workload.image_input:
        p = workload.params
        make_image_folder(
            run.spec.data_dir or "", p["images"], p["classes"], image_side(workload), seed=run.opts.seed
        )
    progress.advance("data")
    try:
        res.flops_per_sample = flops_per_sample(workload, run.device)
    except Exception as e:  # the model cannot train on this data at all: nothing to benchmark
        if run.own_data:
            shutil.rmtree(run.own_data, ignore_errors=True)
        if isinstance(e, FactoryError):
            raise
        raise ValueError(
            f"the model failed one forward/backward on the {workload.spec.name} data "
            f"({workload.describe()}): {type(e).__name__}: {e}"
        ) from e
    progress.advance("FLOPs")
    peaks = measure_peaks(run.device, peaks_budget(run.opts.budget_s))
    res.peaks = {dt: p.flops_per_s for dt, p in peaks.items()}
    res.notes += peak_notes(peaks, run.device)
    progress.advance("matmul peak")
    res.phases_s["setup"] = time.monotonic() - t


def _warm_up(run: _Run) -> None:
    """Start the torch.compile worker, warm up the in-process configs meanwhile (warm-up is not timed),
    drop rows too slow for the budget, then give the worker until its share of the budget to be ready."""
    from pitstop.bench.measure_configs import warm_up

    opts, res = run.opts, run.res
    if run.isolated:
        from pitstop.bench.subproc import WorkerHandle

        iso = [COMPILE_REF, *run.isolated]
        run.compiler = WorkerHandle(
            dict(run.extras_spec, threads=run.threads, configs=[c.to_dict() for c in iso], hold=True)
        )
    t = time.monotonic()
    run.lives = warm_up(
        run.workload,
        run.inproc,
        run.device,
        opts.warmup,
        run.threads,
        opts.seed,
        progress=run.progress.advance,
        deadline=run.t_start + WARMUP_SHARE * opts.budget_s,
        skip_if=slow_dtype_check(
            res.peaks, run.device, opts.warmup, opts.repeats, run.deadline, len(run.inproc)
        ),
    )
    res.phases_s["warm-up"] = time.monotonic() - t
    drop_slow_rows(run.lives, res.peaks, opts.repeats, run.deadline)
    if run.compiler is not None:
        t = time.monotonic()
        ready_by = run.t_start + COMPILE_READY_SHARE * opts.budget_s
        if not run.compiler.wait_until(
            lambda h: h.phase() == "ready", ready_by
        ):  # still compiling: end it now so it cannot disturb the timed blocks
            run.compile_result = run.compiler.finish(0)
            run.compiler = None
        res.phases_s["compile wait"] = time.monotonic() - t


def _ablate(run: _Run) -> None:
    """Scale the steps so the interleaved blocks (here and in the compile worker) fit what is left of the
    budget, then run the interleaved ablation."""
    from pitstop.bench.measure_configs import calibrate, time_blocks

    opts, lives = run.opts, run.lives
    worker_step_s = 0.0
    if not opts.steps:
        calibrate(
            lives,
            run.threads,
            progress=run.progress.advance,
            deadline=run.t_start + CALIBRATE_SHARE * opts.budget_s,
        )
    if run.compiler is not None:  # its configs cost about a baseline step each (compiled ones less)
        base_live = next((lv for lv in lives if lv.config.name == "baseline" and lv.session), None)
        worker_step_s = (1 + len(run.isolated)) * (base_live.estimate_s if base_live else 0.0)
    left = run.deadline - time.monotonic()
    per_step = sum(lv.estimate_s for lv in lives if lv.session is not None) + worker_step_s or 1e-3
    share = _ablation_budget(left, opts, run.ddp_n)
    # Each block also runs one untimed re-warm step (Session.block).
    steps = opts.steps or int(max(1, min(opts.max_steps, share / (opts.repeats * per_step) - TIMER_WARMUP)))
    run.res.steps = steps
    t = time.monotonic()
    run.res.repeats_done = time_blocks(
        lives,
        steps,
        opts.repeats,
        run.threads,
        progress=run.progress.advance,
        deadline=min(run.deadline, time.monotonic() + 1.5 * share),
    )
    run.res.phases_s["ablation"] = time.monotonic() - t


def _collect_rows(run: _Run) -> None:
    """The in-process rows as measured, a skipped row for each config this machine cannot run, and every
    row's reference set to the measured baseline."""
    from pitstop.bench.measure_configs import new_row

    res = run.res
    res.rows = [lv.row for lv in run.lives]
    if res.interrupted:  # time_blocks() did not return: count the repeats from what was kept
        res.repeats_done = min((len(r.block_step_s) for r in res.rows if r.block_step_s), default=0)
    for c in run.configs:
        reason = why_not(c, run.device, run.cuda, run.bf16_ok)
        if reason:
            r = new_row(c)
            r.status, r.reason = SKIPPED, reason
            res.rows.append(r)
    base = res.row("baseline")
    for r in res.rows:
        if base is not None and r is not base and base.status == MEASURED:
            set_ref(r, base)


def _run_extras(run: _Run) -> None:
    """The rows after the ablation, while the budget lasts: the schedule comparison, the DDP launches, then
    the held torch.compile worker's timed blocks."""
    opts, res, progress, deadline = run.opts, run.res, run.progress, run.deadline
    base = res.row("baseline")
    baseline_step = _median(base.block_step_s) if base and base.block_step_s else None
    run.extras_spec["steps"] = max(2, res.steps or 2)
    if opts.schedules and time.monotonic() < deadline:
        t = time.monotonic()
        res.schedules = compare_schedules(
            seeds=opts.schedule_seeds, progress=progress.advance, deadline=deadline
        )
        res.rows.append(schedule_row(res.schedules))
        res.phases_s["schedules"] = time.monotonic() - t
    if not run.ddp_n and opts.ddp_procs is None:
        res.rows.append(ddp_unavailable(run.device))
    if run.ddp_n and deadline - time.monotonic() > DDP_MIN_S:  # else its rows say the budget ran out
        t = time.monotonic()
        left = deadline - time.monotonic()
        budget = min(left, max(DDP_RESERVE_S, 0.5 * left)) if run.compiler is not None else left
        res.rows += ddp_rows(
            run.extras_spec, run.ddp_n, run.threads, run.device, budget, baseline_step, progress
        )
        res.phases_s["ddp"] = time.monotonic() - t
    if run.compiler is not None:
        t = time.monotonic()
        if run.compiler.phase() == "ready":
            run.compiler.go(res.steps or 1)
            run.compile_result = run.compiler.finish(deadline - time.monotonic() - 2)
        else:
            run.compile_result = run.compiler.finish(0)
        run.compiler = None
        res.phases_s["compile"] = time.monotonic() - t
    if run.compile_result is not None:
        res.rows += isolated_rows(run.compile_result, run.isolated, time.monotonic() - run.t_start)
        progress.advance("torch.compile")


def _finish(run: _Run) -> None:
    """A skipped row for each planned row that did not run, the rows in ablation order with their derived
    numbers, and the run's load and competing-CPU notes."""
    from pitstop.bench.measure_configs import new_row

    opts, res = run.opts, run.res
    done = {r.name for r in res.rows}
    planned = list(run.configs)
    if opts.schedules:
        planned.append(BenchConfig("onecycle", "OneCycle vs StepLR", claim=CLAIMS["onecycle"]))
    if run.ddp_n:
        planned.append(BenchConfig("ddp", f"DDP {run.ddp_n} processes", claim=CLAIMS["ddp"]))
    for c in planned:
        if c.name not in done:
            r = new_row(c)
            r.status = SKIPPED
            r.reason = (
                "interrupted before it ran" if res.interrupted else "the --budget ran out before it ran"
            )
            res.rows.append(r)
    order = {c.name: float(i) for i, c in enumerate(run.configs)}
    order[COMPILE_REF.name] = order.get("compile", len(order)) - 0.5  # the compile rows' own baseline
    res.rows.sort(key=lambda r: order.get(r.name, len(order)))
    for r in res.rows:
        derive(r, res.flops_per_sample, res.peaks)
    res.phases_s["total"] = time.monotonic() - run.t_start
    if (load := load_average()) is not None:
        res.load_avg["end"] = round(load, 2)
    res.other_cpu_share = round(run.other.share(), 3)
    if res.other_cpu_share > OTHER_CPU_NOTE:
        res.notes.append(
            f"other processes used {res.other_cpu_share:.0%} of the machine's CPU time during the run: "
            "absolute numbers are low and noisy (ratios are interleaved)"
        )


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def _ddp_procs(opts: BenchOptions, device: str) -> int:
    import torch

    if opts.ddp_procs is not None:
        return opts.ddp_procs if opts.ddp_procs > 1 else 0
    if device == "cuda":
        n = torch.cuda.device_count()
        return n if n > 1 else 0
    return 2 if usable_cores() >= 2 else 0


def _ablation_budget(left: float, opts: BenchOptions, ddp: int) -> float:
    """Seconds for the interleaved blocks (with the compile worker's, which use the same step count):
    what is left, less fixed reserves for the DDP launches (each pays interpreter + torch start-up)."""
    reserve = (DDP_RESERVE_S if ddp else 0.0) + (SCHEDULES_RESERVE_S if opts.schedules else 0.0)
    return max(0.25 * left, 0.85 * (left - reserve))
